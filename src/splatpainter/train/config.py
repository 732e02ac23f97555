"""Typed training configs, read from TOML files kept in the repository (configs/splatpainter/).

A config file has four tables, each mapping onto a dataclass; a key that the dataclass does not
have, or a value of the wrong type, is a `ConfigError` naming it:

    [model.stage1]  / [model.stage2]   EditorConfig (architecture)
    [data]                             DataConfig (which sequences, how many, cache)
    [optim]                            OptimConfig (AdamW, schedule, clipping, steps)
    [loss]                             LossConfig (weights of the loss terms)

An optional array of `[[phase]]` tables makes the config a curriculum trained by one command:
each phase overrides keys of the tables as resolved for the phase before it (its `data`, `optim`,
`loss` and the signal settings of `stage2`) and starts from that phase's weights with a fresh
optimiser and LR schedule.  Only the signal settings may change between phases, so the
architecture, and the weights, carry through; the one exception is `propagate`, which grows the
editor by its propagation module (new weights start where the previous function is unchanged):

    [[phase]]
    name = "base"
    [[phase]]
    name = "solve"
    stage2 = { solve_iters = 6 }
    data = { first_seed = 300000, max_gaussians = 20000 }
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appshell.tables import check_keys, dataclass_from_table, limited
from splatpainter.model.editor import EditorConfig
from splatpainter.model.stage1 import Stage1Config
from splatpainter.model.stage2 import Stage2Config
from splatpainter.train.data import SequenceSpec

# Seeds below this are reserved for evaluation: training never draws them.
EVAL_SEED_LIMIT = 100_000
MAX_GAUSSIANS = 10_000_000  # per training sequence


class ConfigError(ValueError):
    """A training config that cannot be used; the message names the key."""


@dataclass
class DataConfig:
    num_sequences: int = limited(1200, ge=1)  # distinct training sequences (cached on disk)
    first_seed: int = EVAL_SEED_LIMIT  # training seeds are first_seed .. first_seed + n - 1
    min_gaussians: int = limited(3000, ge=1, le=MAX_GAUSSIANS)
    max_gaussians: int = limited(8000, ge=1, le=MAX_GAUSSIANS)
    min_edits: int = limited(1, ge=1, le=64)
    max_edits: int = limited(3, ge=1, le=64)
    kinds: tuple[str, ...] = ("paint", "recolor", "global", "relight", "detail")
    # edit-data suites (train/data.py SUITES); sequence i is drawn from suites[i % len]
    suites: tuple[str, ...] = ("procedural",)
    max_views: int = limited(3, ge=1, le=64)
    view_size: int = limited(128, ge=1, le=2048)
    num_heldout: int = limited(4, ge=0, le=64)
    fuzzy_prob: float = limited(0.5, ge=0, le=1)
    overlap_prob: float = limited(0.3, ge=0, le=1)
    auto_hint_prob: float = limited(0.5, ge=0, le=1)  # share of edits trained with the "auto" hint
    # held-out views rendered for the loss per edit (plus one edit view)
    loss_views: int = limited(2, ge=0, le=64)
    loss_view_size: int = limited(64, ge=1, le=2048)
    cache_dir: str = ".cache/splatpainter-train"
    workers: int = limited(2, ge=0, le=256)

    def __post_init__(self) -> None:
        if self.first_seed < EVAL_SEED_LIMIT:
            raise ConfigError(
                f"data.first_seed must be >= {EVAL_SEED_LIMIT} (lower seeds are evaluation "
                f"seeds), got {self.first_seed}"
            )
        if self.num_sequences < 1:
            raise ConfigError("data.num_sequences must be >= 1")
        if not 0 <= self.loss_views <= self.num_heldout:
            raise ConfigError("data.loss_views must be in [0, data.num_heldout]")
        if not self.suites:
            raise ConfigError("data.suites must name at least one suite")
        for suite in dict.fromkeys(self.suites):
            self.sequence_spec(suite)  # validates kinds, sizes and suite names

    def sequence_spec(self, suite: str = "procedural") -> SequenceSpec:
        try:
            return SequenceSpec(
                suite=suite,
                min_gaussians=self.min_gaussians,
                max_gaussians=self.max_gaussians,
                min_edits=self.min_edits,
                max_edits=self.max_edits,
                kinds=tuple(self.kinds),
                max_views=self.max_views,
                view_size=self.view_size,
                num_heldout=self.num_heldout,
                fuzzy_prob=self.fuzzy_prob,
                overlap_prob=self.overlap_prob,
            )
        except ValueError as e:
            raise ConfigError(f"data: {e}") from None


@dataclass
class OptimConfig:
    # 0 only in a [[phase]] after the first: one that changes inference settings of the weights
    # before it (e.g. the walk's length) and trains nothing
    steps: int = limited(3000, ge=0)
    lr: float = limited(1e-3, gt=0)
    stage1_lr_scale: float = limited(0.3, ge=0)
    weight_decay: float = limited(0.01, ge=0)
    warmup_steps: int = limited(100, ge=0)
    final_lr_fraction: float = limited(0.1, ge=0, le=1)
    grad_clip: float = limited(1.0, gt=0)
    seed: int = 0
    checkpoint_every: int = limited(100, ge=1)
    log_every: int = limited(1, ge=1)
    threads: int = limited(0, ge=0, le=1024)  # torch threads (0: leave torch's default)
    init_from: str = ""  # start from these weights (.safetensors of the same architecture)

    def __post_init__(self) -> None:
        if self.steps < 0 or self.lr <= 0 or self.grad_clip <= 0:
            raise ConfigError("optim.lr and optim.grad_clip must be positive, optim.steps >= 0")
        if self.checkpoint_every < 1 or self.log_every < 1:
            raise ConfigError("optim.checkpoint_every and optim.log_every must be >= 1")


@dataclass
class LossConfig:
    # "log": each term is log(mse + eps), i.e. the terms are PSNRs (what evaluation measures):
    # a small error on the unchanged Gaussians still has a strong gradient, so preservation is
    # pushed toward exact.  "mse": plain weighted mean squared errors.
    form: str = "log"
    # 40 dB: no reward for pushing a term further (else "do nothing" wins)
    eps: float = limited(1e-4, gt=0)
    # per-Gaussian colour error, Gaussians the edit changed
    gauss_changed: float = limited(1.0, ge=0)
    gauss_unchanged: float = limited(1.0, ge=0)  # ... and those it did not (preservation)
    # rendered error on the changed pixels (edit + held-out views)
    render_changed: float = limited(0.5, ge=0)
    render_unchanged: float = limited(0.5, ge=0)  # ... and on the unchanged pixels
    # Binary cross-entropy of the gate against "changed" on the Gaussians no edit view sees
    # (changed and unchanged as two means): there the gate alone decides where the edit goes.
    unseen_gate_bce: float = limited(0.0, ge=0)

    def __post_init__(self) -> None:
        if self.form not in ("log", "mse"):
            raise ConfigError(f"loss.form must be 'log' or 'mse', got {self.form!r}")
        if not self.eps > 0:
            raise ConfigError("loss.eps must be positive")


@dataclass
class TrainConfig:
    model: EditorConfig = field(default_factory=EditorConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    phases: tuple[PhaseConfig, ...] = ()  # a curriculum: trained in turn, in place of the above

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Stage II keys a phase may change: how the signals are computed, the priors on the choice
# between hypotheses, the walk's step counts and its reach (no weights), not the architecture.
# `propagate` may be switched on by a phase: it grows the editor by the propagation module,
# whose new weights start at their initialisation (see loop.grow_state).
PHASE_STAGE2_KEYS = (
    "solve_iters", "solve_prior_px", "fit_maps", "map_solves", "centre_share", "centre_map_fit",
    "propagate", "seen_prior_px", "map_prior", "commit", "prop_coarse_steps", "prop_fine_steps",
    "prop_reach_steps", "prop_reach_share", "untold_hints", "seen_corrections", "relight_share",
    "relight_fit",
)  # fmt: skip
PHASE_KEYS = ("name", "data", "optim", "loss", "stage2")


@dataclass
class PhaseConfig:
    name: str
    config: TrainConfig  # fully resolved; itself without phases


# ------------------------------------------------------------------------ parsing
def _build(cls: type, table: Any, name: str) -> Any:
    try:
        return dataclass_from_table(cls, table, name, ConfigError)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # the dataclass's own range checks
        raise ConfigError(f"[{name}]: {e}") from None


def config_from_dict(d: dict[str, Any]) -> TrainConfig:
    unknown = sorted(set(d) - {"model", "data", "optim", "loss", "phase"})
    if unknown:
        raise ConfigError(f"unknown table(s) {unknown}; use model, data, optim, loss, phase")
    cfg = _tables_from_dict(d)  # first: the phases build on these tables
    cfg.phases = _phases_from_dict(d)
    first = cfg.phases[0].config if cfg.phases else cfg
    if first.optim.steps == 0:
        where = f"[[phase]] 1 ({cfg.phases[0].name!r}): " if cfg.phases else ""
        raise ConfigError(
            f"{where}optim.steps = 0 trains nothing: only a later [[phase]] may have no steps "
            "(it takes the weights of the phase before with its own settings)"
        )
    return cfg


def _phases_from_dict(d: dict[str, Any]) -> tuple[PhaseConfig, ...]:
    raw = d.get("phase", [])
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        raise ConfigError("phase must be an array of tables ([[phase]])")
    tables = {k: copy.deepcopy(d.get(k, {})) for k in ("model", "data", "optim", "loss")}
    phases: list[PhaseConfig] = []
    for i, p in enumerate(raw):
        name = p.get("name")
        where = f"[[phase]] {i + 1}" + (f" ({name!r})" if isinstance(name, str) else "")
        check_keys(p, PHASE_KEYS, f"phase[{i + 1}]", ConfigError, header="[[phase]]")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", name):
            raise ConfigError(f"{where}: name must be a short lowercase word, e.g. 'base'")
        if name in {q.name for q in phases}:
            raise ConfigError(f"{where}: phase names must differ")
        for key in ("data", "optim", "loss", "stage2"):
            if not isinstance(p.get(key, {}), dict):
                raise ConfigError(f"{where}: {key} must be a table")
        bad = sorted(set(p.get("stage2", {})) - set(PHASE_STAGE2_KEYS))
        if bad:
            raise ConfigError(
                f"{where}: stage2 key(s) {bad} change the architecture; a phase may set only "
                f"{list(PHASE_STAGE2_KEYS)}"
            )
        if i > 0 and "init_from" in p.get("optim", {}):
            raise ConfigError(f"{where}: optim.init_from is set: a phase starts from the last")
        for key in ("data", "optim", "loss"):
            tables[key] = {**tables[key], **p.get(key, {})}
        model = tables["model"]  # (a table, with a stage2 table: _tables_from_dict checked it)
        tables["model"] = {**model, "stage2": {**model.get("stage2", {}), **p.get("stage2", {})}}
        if i > 0:
            tables["optim"].pop("init_from", None)
        try:
            phases.append(PhaseConfig(name, _tables_from_dict(tables)))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    return tuple(phases)


def _tables_from_dict(d: dict[str, Any]) -> TrainConfig:
    model = d.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError("[model] must be a table")
    check_keys(model, ("stage1", "stage2"), "model", ConfigError)
    s1 = _build(Stage1Config, model.get("stage1", {}), "model.stage1")
    s2 = _build(Stage2Config, model.get("stage2", {}), "model.stage2")
    try:
        editor = EditorConfig(stage1=s1, stage2=s2)
    except ValueError as e:
        raise ConfigError(f"[model]: {e}") from None
    return TrainConfig(
        model=editor,
        data=_build(DataConfig, d.get("data", {}), "data"),
        optim=_build(OptimConfig, d.get("optim", {}), "optim"),
        loss=_build(LossConfig, d.get("loss", {}), "loss"),
    )


def load_config(path: str | os.PathLike[str]) -> TrainConfig:
    """Read a TOML training config; every problem is a ConfigError naming the file and key."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    if p.stat().st_size > 1 << 20:
        raise ConfigError(f"{p}: config file is larger than 1 MiB")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None
    except RecursionError:
        raise ConfigError(f"{p}: TOML nested too deeply") from None
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
