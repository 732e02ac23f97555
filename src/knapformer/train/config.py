"""Typed trainer configuration: TOML files in the repo plus command-line overrides.

Pure: a dict (from TOML) in, frozen dataclasses out, every unknown key, wrong type or value
outside its field's stated range (``limited``: NaN and infinities never pass) rejected with one
line naming it (``train.lr: expected a number, got 'fast'``, ``config key 'train.lr': must be a
finite number > 0, got inf``). Overrides use
dotted keys with TOML values (``--set train.lr=3e-4``); the trainer's named flags (``--steps``,
``--balancer``, ...) are sugar for the same overrides.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from appshell.inputs import InputFileError, read_text
from appshell.tables import dataclass_from_table, limited
from knapformer.models.mmdit import MMDiTConfig, MMDiTInputError, mmdit_config
from knapformer.planning.layout import BagLayout, LayoutError
from knapformer.sim.datacodes import DataCodeError, parse_data_codes

__all__ = [
    "MAX_RANK_SEQUENCES",
    "MAX_RANK_TOKENS",
    "RESUMABLE_KEYS",
    "BalanceConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "LogConfig",
    "TrainConfig",
    "TrainLoopConfig",
    "apply_overrides",
    "check_world",
    "config_changes",
    "load_config",
    "parse_override",
]


class ConfigError(ValueError):
    """A config file or override that cannot be used, naming the key."""


#: Stated limits of the synthetic data, checked before anything is built: tokens and
#: sequences one rank may hold in a step (the planner, the batch and the activations scale
#: with them; a real mixture is far below: 2^15-2^16 tokens per GPU).
MAX_RANK_TOKENS = 1 << 22
MAX_RANK_SEQUENCES = 1 << 16
MAX_SEED = (1 << 63) - 1


@dataclass(frozen=True)
class DataConfig:
    codes: str = "g1b3i128f1s0,g1b1i128f68s1"
    text_tokens_max: int = limited(32, ge=0, le=1 << 20)
    patch_px: int = limited(16, ge=1, le=1 << 16)
    seed: int = limited(0, ge=0, le=MAX_SEED)  # numpy's SeedSequence takes no negative seed


LR_SCHEDULES = ("constant", "cosine", "linear")
MIXED_PRECISION = ("none", "bf16")


@dataclass(frozen=True)
class TrainLoopConfig:
    steps: int = limited(20, ge=1, le=1 << 40)
    lr: float = limited(1e-3, gt=0)  # the peak rate: reached after warm-up, then scheduled
    weight_decay: float = limited(0.0, ge=0)
    seed: int = limited(0, ge=0, le=MAX_SEED)
    dtype: str = "float32"  # of the parameters (with mixed_precision: the fp32 master weights)
    activation_checkpointing: bool = False
    threads: int = limited(1, ge=1, le=1024)
    timeout_s: float = limited(600.0, gt=0, le=7 * 86400.0)
    lr_schedule: str = "constant"  # constant | cosine | linear (after the warm-up)
    warmup_steps: int = limited(0, ge=0)  # linear warm-up from lr / warmup_steps to lr
    grad_clip: float = limited(0.0, ge=0)  # clip the global gradient norm (0: off; logged)
    ema_decay: float = limited(0.0, ge=0, lt=1)  # EMA of the parameters, in checkpoints (0: off)
    mixed_precision: str = "none"  # none | bf16 (FSDP2: bf16 compute, fp32 master + reduce)


@dataclass(frozen=True)
class BalanceConfig:
    balancer: str = "auto"  # none | auto | a bag spec such as g1n2+g2n1
    cost: str = "flops"  # flops | calibrate | path to a cost profile JSON
    gamma: float = limited(1.0, ge=0)
    solver: str = "local-search"  # local-search (alias: ours) | reference | exact
    # online refit of the cost model from the measured per-rank times every K steps (0: off)
    refit_steps: int = limited(0, ge=0)


@dataclass(frozen=True)
class LogConfig:
    path: str = ""
    progress: bool = True


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = ""
    every: int = limited(0, ge=0)
    resume: bool = False
    overwrite: bool = False  # a fresh run may replace the checkpoints already in dir


#: Keys a resumed run may change (shell patterns): how long it runs, how it logs and
#: checkpoints, how long collectives wait, and the cost model it would build (a resumed run
#: plans with the checkpoint's). Any other difference is refused (see `config_changes`).
RESUMABLE_KEYS = (
    "train.steps",
    "train.threads",
    "train.timeout_s",
    "log.*",
    "checkpoint.*",
    "balance.cost",
)


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
    """What the per-field ranges (`limited`, checked while the sections are read) cannot say:
    choices, keys that depend on each other, the data codes and the model."""
    t, c, d = cfg.train, cfg.checkpoint, cfg.data
    if t.lr_schedule not in LR_SCHEDULES:
        raise ConfigError(
            f"config key 'train.lr_schedule': expected one of {', '.join(LR_SCHEDULES)}, "
            f"got {t.lr_schedule!r}"
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
    if (c.every or c.resume) and not c.dir:
        raise ConfigError("checkpointing or --resume needs checkpoint.dir (--checkpoint-dir)")
    if c.resume and c.overwrite:
        raise ConfigError(
            "--resume continues the checkpoints in checkpoint.dir and --overwrite replaces "
            "them: pass one of the two"
        )
    try:
        mixture = parse_data_codes(d.codes)
    except DataCodeError as exc:
        raise ConfigError(f"config key 'data.codes': {exc}") from None
    _check_data_size(mixture.codes, d)
    cfg.model_config()


def rank_tokens_bound(code: Any, data: DataConfig) -> int:
    """The most tokens a rank of ``code`` can hold in one step (widest jitter, longest text):
    integer arithmetic, so a huge code costs nothing to check."""
    from knapformer.data.synthetic import sample_grid

    t, h, w = sample_grid(code, data.patch_px, 1.04)
    return code.batch * (t * h * w + data.text_tokens_max)


def _check_data_size(codes: Any, data: DataConfig) -> None:
    for code in codes:
        if code.batch > MAX_RANK_SEQUENCES:
            raise ConfigError(
                f"config key 'data.codes': {code.code!r} gives a rank {code.batch:,} sequences "
                f"per step; the limit is {MAX_RANK_SEQUENCES:,}"
            )
        tokens = rank_tokens_bound(code, data)
        if tokens > MAX_RANK_TOKENS:
            raise ConfigError(
                f"config key 'data.codes': {code.code!r} gives a rank up to {tokens:,} tokens "
                f"per step; the limit is {MAX_RANK_TOKENS:,}"
            )


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
        kwargs[name] = dataclass_from_table(
            cls, raw.get(name, {}), name, ConfigError, label="config key '{key}'"
        )
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


def _flat(cfg: TrainConfig) -> dict[str, Any]:
    """Dotted key -> value; the model as its resolved fields (a preset and the same explicit
    fields are the same model)."""
    out: dict[str, Any] = {}
    for section in _SECTIONS:
        for k, v in dataclasses.asdict(getattr(cfg, section)).items():
            out[f"{section}.{k}"] = v
    for k, v in cfg.model_config().to_dict().items():
        out[f"model.{k}"] = v
    return out


def config_changes(saved: TrainConfig, now: TrainConfig) -> list[str]:
    """The keys (``section.key``) whose values differ between a checkpoint's config and the
    one asked for, outside `RESUMABLE_KEYS`, each as ``key (checkpoint X, now Y)``."""
    a, b = _flat(saved), _flat(now)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(fnmatch.fnmatchcase(key, pat) for pat in RESUMABLE_KEYS):
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key} (checkpoint {a.get(key)!r}, now {b.get(key)!r})")
    return out
