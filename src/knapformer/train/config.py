"""Typed trainer configuration: TOML files in the repo plus command-line overrides.

Pure: a dict (from TOML) in, frozen dataclasses out, every unknown key or wrong type rejected with
one line naming it (``train.lr: expected a number, got 'fast'``). Overrides use
dotted keys with TOML values (``--set train.lr=3e-4``); the trainer's named flags (``--steps``,
``--balancer``, ...) are sugar for the same overrides.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from appshell.inputs import InputFileError, read_text
from appshell.tables import dataclass_from_table
from knapformer.models.mmdit import MMDiTConfig, MMDiTInputError, mmdit_config
from knapformer.planning.layout import BagLayout, LayoutError
from knapformer.sim.datacodes import DataCodeError, parse_data_codes

__all__ = [
    "BalanceConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "LogConfig",
    "TrainConfig",
    "TrainLoopConfig",
    "apply_overrides",
    "check_world",
    "load_config",
    "parse_override",
]


class ConfigError(ValueError):
    """A config file or override that cannot be used, naming the key."""


@dataclass(frozen=True)
class DataConfig:
    codes: str = "g1b3i128f1s0,g1b1i128f68s1"
    text_tokens_max: int = 32
    patch_px: int = 16
    seed: int = 0


LR_SCHEDULES = ("constant", "cosine", "linear")
MIXED_PRECISION = ("none", "bf16")


@dataclass(frozen=True)
class TrainLoopConfig:
    steps: int = 20
    lr: float = 1e-3  # the peak rate: reached after warm-up, then scheduled
    weight_decay: float = 0.0
    seed: int = 0
    dtype: str = "float32"  # of the parameters (with mixed_precision: the fp32 master weights)
    activation_checkpointing: bool = False
    threads: int = 1
    timeout_s: float = 600.0
    lr_schedule: str = "constant"  # constant | cosine | linear (after the warm-up)
    warmup_steps: int = 0  # linear warm-up from lr / warmup_steps to lr
    grad_clip: float = 0.0  # clip the global gradient norm to this (0: off; logged either way)
    ema_decay: float = 0.0  # EMA of the parameters, saved in checkpoints (0: off)
    mixed_precision: str = "none"  # none | bf16 (FSDP2: bf16 compute, fp32 master + reduce)


@dataclass(frozen=True)
class BalanceConfig:
    balancer: str = "auto"  # none | auto | a bag spec such as g1n2+g2n1
    cost: str = "flops"  # flops | calibrate | path to a cost profile JSON
    gamma: float = 1.0
    solver: str = "local-search"  # local-search (alias: ours) | reference | exact
    # online refit of the cost model from the measured per-rank times every K steps (0: off)
    refit_steps: int = 0


@dataclass(frozen=True)
class LogConfig:
    path: str = ""
    progress: bool = True


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = ""
    every: int = 0
    resume: bool = False


@dataclass(frozen=True)
class TrainConfig:
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "cpu"})
    data: DataConfig = DataConfig()
    train: TrainLoopConfig = TrainLoopConfig()
    balance: BalanceConfig = BalanceConfig()
    log: LogConfig = LogConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    def model_config(self) -> MMDiTConfig:
        m = dict(self.model)
        preset = m.pop("preset", "cpu")
        try:
            return mmdit_config(preset, **m)
        except (MMDiTInputError, TypeError) as exc:
            raise ConfigError(f"config section 'model': {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {
    "data": DataConfig,
    "train": TrainLoopConfig,
    "balance": BalanceConfig,
    "log": LogConfig,
    "checkpoint": CheckpointConfig,
}


def _validate(cfg: TrainConfig) -> None:
    t, b, c, d = cfg.train, cfg.balance, cfg.checkpoint, cfg.data
    if t.steps < 1:
        raise ConfigError(f"config key 'train.steps': must be >= 1, got {t.steps}")
    if not math.isfinite(t.lr) or t.lr <= 0:
        raise ConfigError(f"config key 'train.lr': must be a finite number > 0, got {t.lr}")
    if not math.isfinite(t.weight_decay) or t.weight_decay < 0:
        raise ConfigError(
            f"config key 'train.weight_decay': must be a finite number >= 0, got {t.weight_decay}"
        )
    if t.lr_schedule not in LR_SCHEDULES:
        raise ConfigError(
            f"config key 'train.lr_schedule': expected one of {', '.join(LR_SCHEDULES)}, "
            f"got {t.lr_schedule!r}"
        )
    if t.warmup_steps < 0:
        raise ConfigError(f"config key 'train.warmup_steps': must be >= 0, got {t.warmup_steps}")
    if not math.isfinite(t.grad_clip) or t.grad_clip < 0:
        raise ConfigError(
            f"config key 'train.grad_clip': must be a finite number >= 0 (0: off), "
            f"got {t.grad_clip}"
        )
    if not math.isfinite(t.ema_decay) or not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(
            f"config key 'train.ema_decay': must be in [0, 1) (0: off), got {t.ema_decay}"
        )
    if t.mixed_precision not in MIXED_PRECISION:
        raise ConfigError(
            f"config key 'train.mixed_precision': expected none or bf16, got {t.mixed_precision!r}"
        )
    if t.mixed_precision == "bf16" and t.dtype != "float32":
        raise ConfigError(
            "config key 'train.mixed_precision': bf16 keeps fp32 master weights, so it needs "
            f'train.dtype = "float32", got {t.dtype!r}'
        )
    if t.dtype not in ("float32", "float64", "bfloat16"):
        raise ConfigError(
            f"config key 'train.dtype': expected float32, float64 or bfloat16, got {t.dtype!r}"
        )
    if t.threads < 1 or t.timeout_s <= 0:
        raise ConfigError("config keys 'train.threads' must be >= 1 and 'train.timeout_s' > 0")
    if c.every < 0:
        raise ConfigError(f"config key 'checkpoint.every': must be >= 0, got {c.every}")
    if (c.every or c.resume) and not c.dir:
        raise ConfigError("checkpointing or --resume needs checkpoint.dir (--checkpoint-dir)")
    if b.gamma < 0:
        raise ConfigError(f"config key 'balance.gamma': must be >= 0, got {b.gamma}")
    if b.refit_steps < 0:
        raise ConfigError(f"config key 'balance.refit_steps': must be >= 0, got {b.refit_steps}")
    if d.text_tokens_max < 0 or d.patch_px < 1:
        raise ConfigError("config keys 'data.text_tokens_max' >= 0 and 'data.patch_px' >= 1")
    try:
        parse_data_codes(d.codes)
    except DataCodeError as exc:
        raise ConfigError(f"config key 'data.codes': {exc}") from None
    cfg.model_config()


def build_config(raw: dict[str, Any]) -> TrainConfig:
    """Typed, validated config from a (TOML-shaped) dict."""
    if not isinstance(raw, dict):
        raise ConfigError("config must be a table of sections")
    unknown = sorted(set(raw) - {"model", *_SECTIONS})
    if unknown:
        raise ConfigError(
            f"unknown config section {unknown[0]!r} (known: model, {', '.join(_SECTIONS)})"
        )
    model = raw.get("model", {"preset": "cpu"})
    if not isinstance(model, dict):
        raise ConfigError(f"config section 'model' must be a table, got {model!r}")
    kwargs: dict[str, Any] = {"model": dict(model)}
    for name, cls in _SECTIONS.items():
        kwargs[name] = dataclass_from_table(cls, raw.get(name, {}), name, ConfigError)
    cfg = TrainConfig(**kwargs)
    _validate(cfg)
    return cfg


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value`` with a TOML value (bare words are strings)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or "." not in key or not all(key.split(".")):
        raise ConfigError(f"bad override {text!r}: expected section.key=value")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    except RecursionError:
        raise ConfigError(f"bad override {key!r}: value nested too deeply") from None
    return key, parsed


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``raw`` with dotted-key overrides set (creates missing sections)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if not name or "." in name:
            raise ConfigError(f"bad override key {key!r}: expected section.key")
        sec = out.setdefault(section, {})
        if not isinstance(sec, dict):
            raise ConfigError(f"config section {section!r} must be a table")
        sec[name] = value
    return out


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a TOML config (or start from defaults), apply overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            if not p.exists():
                raise FileNotFoundError(p)
            raw = tomllib.loads(read_text(p, max_bytes=1 << 20, what="config file"))
        except FileNotFoundError:
            raise ConfigError(f"config file {str(p)!r} does not exist") from None
        except (OSError, UnicodeDecodeError, InputFileError) as exc:
            raise ConfigError(f"config file {str(p)!r} is not readable: {exc}") from None
        except RecursionError:
            raise ConfigError(f"config file {str(p)!r} is nested too deeply") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    return build_config(apply_overrides(raw, overrides or {}))


def check_world(cfg: TrainConfig, world_size: int) -> None:
    """Errors that need the world size: the data mixture and a fixed bag spec must fit it."""
    if world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {world_size}")
    try:
        parse_data_codes(cfg.data.codes).rank_codes(world_size)
    except DataCodeError as exc:
        raise ConfigError(f"data.codes does not fit {world_size} ranks: {exc}") from None
    spec = cfg.balance.balancer.strip()
    if spec.lower() in ("none", "auto"):
        return
    try:
        BagLayout.parse(spec, world_size, cfg.model_config().num_heads)
    except LayoutError as exc:
        raise ConfigError(
            f"balance.balancer {spec!r} does not fit {world_size} ranks: {exc}"
        ) from None
