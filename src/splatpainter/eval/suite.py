"""The evaluation suites behind `splatpainter evaluate`.

For every suite, edit kind and evaluation seed, `make_sequence` draws a random asset and one edit
with 3D ground truth; every method edits the source asset from the edit views, and is scored at
the held-out cameras (never edit inputs) against ground-truth renders.  Suites (train.data):
"procedural" (a unique palette colour per part: a colour rule can win there), "distractor"
(twins, colours shared across parts, partial-part edits: colour misleads) and "capture"
(capture-like statistics, SH degree 3).  Metrics:

- psnr_changed / ssim_changed: on the pixels the ground truth changed (max-channel |GT render -
  source render| > 2/255), MSE pooled over all held-out views of a seed, then the mean over seeds;
- psnr_unchanged: on object pixels (GT alpha > 0.5) the ground truth did not change;
  psnr_unchanged_back: the same at held-out view 0 alone, the back of the first edit view (does
  paint show through to the back?);
- psnr_bleed: on the held-out pixels that show the edit's bleed Gaussians (`EditStep.bleed`: ones
  the edit did not change that are at risk of wrongly taking it, e.g. a twin or a part of the
  same colour): an indicator render of the source asset (bleed Gaussians white, the rest black,
  no view dependence, black background) above 0.5, less the pixels the ground truth changed;
  pooled over views like psnr_changed.  NaN for a seed without such pixels (global recolour
  and relight have no bleed set: everything changes);
- unseen_color_error: mean |base colour - GT colour| over RGB of the Gaussians the edit changed
  that no edit view sees (total compositing weight over the edit views < 0.01 pixel);
- seconds_per_edit: the time of `EditSession.apply` (the session, hence Stage I, made before);
- forgetting (sequences of 5 paint/recolour edits, per suite): the PSNR of edit 1's region
  (pixels edit 1 changed at the held-out views, less those later edits changed again) after
  edit 1 against the GT after edit 1, and after the last edit against the GT after the last
  edit; drop = first - last.  Without the exclusion a later recolour of the same part would
  count its own error as forgetting; region_kept_fraction says how much of edit 1's region was
  left.

Methods (`METHODS`): "model" (the editor, kind hint per `EvalConfig.hint`: "auto" by default,
as users run it); the baselines "backproject", "optimize", "rule" (the hand-written fits with no
network), "diffusion" (spatial propagation over a k-NN graph; edit/rules.py) and
"diffusion_centred" (the same, the seen Gaussians of a recolour or relight on the solve centred
on the map, as the shipped model reads a recolour: edit/solve.py `centers`); and the
ablations "model_kind" (the same model told the true kind, `HINT_OF_KIND[kind]`) and
"model_init" (the same architecture at its seeded initialisation: no learned weights, kind
auto).  "none" (no edit) is always evaluated as the reference row.  The rules read the edit with
the loaded model's `SignalSettings` and get the same hint as "model".

PSNR is capped at `PSNR_CAP_DB` so that means stay finite; a metric with nothing to measure (no
changed held-out pixel, no bleed pixel, no unseen changed Gaussian) is NaN for that seed,
skipped in the mean, and null in the report when no seed had it.  `run_suite` returns plain
data (`EvalResult.report`, JSON-ready) plus the grid images.

Report schema ("splatpainter-evaluate/2"):

    {"schema",
     "config": {seeds, suites, methods, kinds, min_gaussians, max_gaussians, view_size,
       num_heldout, optimize_steps, hint, forgetting, forgetting_edits, psnr_cap_db,
       changed_threshold, unseen_weight},
     "model": null | {"trained", "fingerprint", "weights", "init_fingerprint"},
     "roles": {METHOD: "reference" | "method" | "baseline" | "ablation"},
     "baselines": [METHOD, ...], "ablations": [METHOD, ...],   (those evaluated)
     "suites": {SUITE: {
        "kinds": {KIND: {"seeds", "changed_gaussians", "unseen_changed_fraction",
                         "changed_pixel_fraction", "bleed_pixel_fraction",
                         "methods": {METHOD: {psnr_changed, ssim_changed, psnr_unchanged,
                                              psnr_unchanged_back, psnr_bleed,
                                              unseen_color_error, seconds_per_edit}}}},
        "forgetting": null | {"seeds", "edits", "methods": {METHOD: {psnr_after_first,
                              psnr_after_last, drop, seconds_per_edit,
                              region_kept_fraction}}}}},
     "per_seed": [{"suite", "kind", "seed", "method", **the per-kind metrics}],
     "grids": {SUITE: {KIND: path}}}

Metric values are floats or null; "grids" is filled by whoever writes the PNGs.
Changes from "splatpainter-evaluate/1": one section per suite under "suites" (were top-level
"suite", "kinds" and "forgetting"), psnr_bleed and bleed_pixel_fraction, "roles", "baselines",
"ablations", per_seed rows name their suite, grids are per suite, and the default hint is auto.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from splatpainter.edit.methods import EditMethod
from splatpainter.eval.grid import GridRow
from splatpainter.eval.metrics import (
    CHANGED_THRESHOLD,
    MaskedMean,
    SquaredError,
    changed_mask,
    color_error,
    nanmean,
    object_mask,
    ssim_map,
)
from splatpainter.train import data as train_data
from splatpainter.train.data import (
    ALL_KINDS,
    HINT_OF_KIND,
    SequenceSpec,
    base_colors,
    make_sequence,
)

SCHEMA = "splatpainter-evaluate/2"
SUITES = ("procedural", "distractor", "capture")
# The suites train.data can generate (it names them in SUITES; before that, procedural only).
AVAILABLE_SUITES = tuple(getattr(train_data, "SUITES", ("procedural",)))
DEFAULT_SUITES = tuple(s for s in SUITES if s in AVAILABLE_SUITES)
# diffusion_centred: diffusion with the seen Gaussians of a recolour or relight on the solve
# centred on its map (SignalSettings.map_solves), the shipped model's hand-written fit.
BASELINES = ("backproject", "optimize", "rule", "diffusion", "diffusion_centred")
ABLATIONS = ("model_kind", "model_init")
MODEL_METHODS = ("model", *ABLATIONS)  # the ones that need an editor model
METHODS = ("model", *BASELINES, *ABLATIONS)  # what --methods may name
# optimize stays available by name: it is slow
DEFAULT_METHODS = (
    "model", "backproject", "rule", "diffusion", "diffusion_centred", "model_kind", "model_init"
)  # fmt: skip
REFERENCE = "none"  # the no-edit row, always evaluated
HINT_MODES = ("kind", "auto")  # kind: the model gets HINT_OF_KIND[kind]; auto: it infers it
EVAL_SEED_LIMIT = 100_000  # training draws seeds >= this, so evaluation never sees them
PSNR_CAP_DB = 100.0
UNSEEN_WEIGHT = 0.01  # compositing weight (pixels) below which an edit view does not see a splat
BLEED_LEVEL = 0.5  # a pixel shows the bleed Gaussians where their indicator render exceeds this
METRICS = ("psnr_changed", "ssim_changed", "psnr_unchanged", "psnr_unchanged_back",
           "psnr_bleed", "unseen_color_error", "seconds_per_edit")  # fmt: skip
FORGET_METRICS = ("psnr_after_first", "psnr_after_last", "drop", "seconds_per_edit",
                  "region_kept_fraction")  # fmt: skip


def role(method: str) -> str:
    """ "reference", "baseline", "ablation" or "method" (the editor as users run it)."""
    if method == REFERENCE:
        return "reference"
    return "baseline" if method in BASELINES else "ablation" if method in ABLATIONS else "method"


class EvalError(ValueError):
    """A bad evaluation request (unknown method or kind, a training seed, ...)."""


# ------------------------------------------------------------------------------ parsing
def parse_seeds(text: str) -> tuple[int, ...]:
    """'A-B' (inclusive), 'A' or a comma list of those -> sorted unique seeds."""
    seeds: set[int] = set()
    for part in (p.strip() for p in str(text).split(",")):
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise EvalError(f"--seeds: {part!r} is not a seed or range A-B (e.g. 0-31)") from None
        if hi < lo:
            raise EvalError(f"--seeds: range {part!r} is empty (end before start)")
        seeds.update(range(lo, hi + 1))
    return check_seeds(sorted(seeds))


def check_seeds(seeds) -> tuple[int, ...]:
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise EvalError("no evaluation seeds given")
    if min(seeds) < 0:
        raise EvalError(f"evaluation seeds must be >= 0, got {min(seeds)}")
    if max(seeds) >= EVAL_SEED_LIMIT:
        raise EvalError(
            f"seed {max(seeds)} is a training seed: evaluation seeds must be < {EVAL_SEED_LIMIT} "
            "(training draws seeds from there on)"
        )
    return seeds


def parse_names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Comma list -> names in the given order, duplicates dropped; unknown names are an error."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise EvalError(f"--{what}: empty; use some of {','.join(allowed)}")
    bad = [n for n in names if n not in allowed]
    if bad:
        raise EvalError(f"--{what}: unknown {', '.join(map(repr, bad))}; use {','.join(allowed)}")
    return tuple(dict.fromkeys(names))


# ------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate; the defaults are sized for a 2-core CPU."""

    seeds: tuple[int, ...] = tuple(range(8))
    methods: tuple[str, ...] = DEFAULT_METHODS
    kinds: tuple[str, ...] = ALL_KINDS
    suites: tuple[str, ...] = DEFAULT_SUITES
    min_gaussians: int = 5000
    max_gaussians: int = 8000
    view_size: int = 128
    num_heldout: int = 8
    optimize_steps: int = 500
    hint: str = "auto"
    forgetting: bool = True
    forgetting_edits: int = 5
    grid_rows: int = 3

    def validate(self) -> EvalConfig:
        bad = [s for s in self.suites if s not in SUITES]
        if bad or not self.suites:
            raise EvalError(f"unknown suite(s) {bad}; use {','.join(SUITES)}")
        missing = [s for s in self.suites if s not in AVAILABLE_SUITES]
        if missing:
            raise EvalError(
                f"suite(s) {','.join(missing)} not available: train.data generates only "
                f"{','.join(AVAILABLE_SUITES)}"
            )
        check_seeds(self.seeds)
        allowed = (REFERENCE, *METHODS)
        bad = [m for m in self.methods if m not in allowed]
        if bad:
            raise EvalError(f"unknown method(s) {bad}; use {','.join(METHODS)}")
        bad = [k for k in self.kinds if k not in ALL_KINDS]
        if bad or not self.kinds:
            raise EvalError(f"unknown edit kind(s) {bad}; use {','.join(ALL_KINDS)}")
        if self.hint not in HINT_MODES:
            raise EvalError(f"unknown hint mode {self.hint!r}; use {' or '.join(HINT_MODES)}")
        if not 1000 <= self.min_gaussians <= self.max_gaussians:
            raise EvalError(
                f"need 1000 <= min gaussians <= max gaussians, got "
                f"{self.min_gaussians}-{self.max_gaussians}"
            )
        if self.view_size < 16:
            raise EvalError(f"view size must be >= 16 pixels, got {self.view_size}")
        if self.num_heldout < 1:
            raise EvalError(f"need at least one held-out view, got {self.num_heldout}")
        if self.optimize_steps < 1:
            raise EvalError(f"optimize steps must be >= 1, got {self.optimize_steps}")
        if self.grid_rows < 0:
            raise EvalError(f"grid rows must be >= 0, got {self.grid_rows}")
        if self.forgetting_edits < 2:
            raise EvalError(f"forgetting needs >= 2 edits, got {self.forgetting_edits}")
        return self

    @property
    def all_methods(self) -> tuple[str, ...]:
        """The reference row first, then the chosen methods."""
        return (REFERENCE, *(m for m in self.methods if m != REFERENCE))

    @property
    def needs_model(self) -> bool:
        return any(m in MODEL_METHODS for m in self.methods)

    def _spec(self, suite: str | None, **kw: Any) -> SequenceSpec:
        if hasattr(train_data, "SUITES"):  # before train.data knows suites: procedural only
            kw["suite"] = suite or self.suites[0]
        return SequenceSpec(
            min_gaussians=self.min_gaussians,
            max_gaussians=self.max_gaussians,
            view_size=self.view_size,
            num_heldout=self.num_heldout,
            **kw,
        )

    def edit_spec(self, kind: str, suite: str | None = None) -> SequenceSpec:
        """One edit of `kind` in `suite` (default: the first suite)."""
        return self._spec(suite, min_edits=1, max_edits=1, first_kind=kind)

    def forgetting_spec(self, suite: str | None = None) -> SequenceSpec:
        return self._spec(
            suite,
            min_edits=self.forgetting_edits,
            max_edits=self.forgetting_edits,
            kinds=("paint", "recolor"),
            first_kind="paint",
        )

    def num_units(self) -> int:
        """Progress units: per suite, one per (kind, seed) plus one per forgetting seed."""
        return len(self.suites) * len(self.seeds) * (len(self.kinds) + int(self.forgetting))


# ------------------------------------------------------------------------------ methods
class NoEditMethod(EditMethod):
    """The reference: the asset as it was before the edit."""

    name = REFERENCE

    def apply(self, asset, views, state: Any):
        return asset, state


def build_methods(config: EvalConfig, model=None) -> dict[str, EditMethod]:
    """The chosen methods by name; the model ones (and the rules' signal settings) need
    `model`."""
    from splatpainter.edit import BackprojectMethod, ModelMethod, OptimizeMethod
    from splatpainter.edit.rules import DEFAULT_SETTINGS, DiffusionMethod, RuleMethod

    rules: dict[str, Any] = {"settings": DEFAULT_SETTINGS}
    if model is not None:  # read the edit as the loaded model does
        rules = {"settings": model.stage2.config.signal_settings(), "stage1": model.config.stage1}
    # rule and diffusion keep the plain solve (centred, the rule loses 1.3-8.6 dB on global
    # recolours and relights); diffusion_centred takes the centred one
    plain = {**rules, "settings": dataclasses.replace(rules["settings"], map_solves=False)}
    centred = {**rules, "settings": dataclasses.replace(rules["settings"], map_solves=True)}
    out: dict[str, EditMethod] = {}
    for name in config.all_methods:
        if name == REFERENCE:
            out[name] = NoEditMethod()
        elif name == "backproject":
            out[name] = BackprojectMethod()
        elif name == "optimize":
            out[name] = OptimizeMethod(steps=config.optimize_steps)
        elif name == "rule":
            out[name] = RuleMethod(**plain)
        elif name == "diffusion":
            out[name] = DiffusionMethod(**plain)
        elif name == "diffusion_centred":
            out[name] = DiffusionMethod(**centred)
        else:
            if model is None:
                raise EvalError(f"method {name!r} needs an editor model (load_editor)")
            if name == "model_init":  # the architecture without its learned weights
                from splatpainter.model.editor import EditorModel

                out[name] = ModelMethod(EditorModel.initial(model.config), kind="auto")
            else:
                out[name] = ModelMethod(model, kind="auto")
    return out


def load_model(weights=None):
    """(EditorModel, label): `weights`, else the shipped weights, else seeded untrained ones
    (`model.trained` says which; the label names the file or says "seeded-untrained")."""
    from splatpainter.model.editor import DEFAULT_WEIGHTS, load_editor

    model = load_editor(weights)
    if weights is not None:
        label = str(weights)
    elif DEFAULT_WEIGHTS.exists():
        label = str(DEFAULT_WEIGHTS)
    else:
        label = "seeded-untrained"
    return model, label


def _set_hint(name: str, method: EditMethod, kind: str, mode: str) -> None:
    """The kind hint of the next edit (the session keeps one method across edits): model_kind
    is told the true kind, model_init infers it; the model and the rules follow `mode`."""
    from splatpainter.edit import ModelMethod
    from splatpainter.edit.rules import FitMethod

    if not isinstance(method, ModelMethod | FitMethod):
        return
    if name == "model_kind":
        method.kind = HINT_OF_KIND[kind]
    elif name == "model_init":
        method.kind = "auto"
    else:
        method.kind = "auto" if mode == "auto" else HINT_OF_KIND[kind]


# ------------------------------------------------------------------------------ one scene
@dataclass
class _Truth:
    """Ground-truth renders at the held-out cameras and the masks derived from them."""

    rgb: list[torch.Tensor]
    changed: list[torch.Tensor]
    unchanged_object: list[torch.Tensor]
    bleed: list[torch.Tensor] | None = None  # pixels showing the bleed Gaussians, unchanged


def _renders(asset, cameras) -> list:
    from splatpainter.render import render

    with torch.no_grad():
        return [render(asset, cam) for cam in cameras]


def bleed_masks(source, bleed: torch.Tensor, cameras, changed: list[torch.Tensor]):
    """Per camera, the pixels [H, W] that show the `bleed` [N] Gaussians and that the ground
    truth did not change: an indicator render (bleed Gaussians white, the rest black, no view
    dependence, black background) above BLEED_LEVEL, less `changed`."""
    from splatpainter.render import render

    ind = bleed.to(source.means.dtype)[:, None]
    with torch.no_grad():
        shown = [render(source, cam, colors=ind).rgb[..., 0] > BLEED_LEVEL for cam in cameras]
    return [m & ~c for m, c in zip(shown, changed, strict=True)]


def _truth(seq, k: int) -> _Truth:
    """Renders of the ground truth after edit k; "changed" is relative to the source."""
    gt = _renders(seq.asset_at(k), seq.heldout)
    source = [r.rgb for r in _renders(seq.source, seq.heldout)]
    changed = [changed_mask(g.rgb, s) for g, s in zip(gt, source, strict=True)]
    unchanged = [object_mask(g.alpha) & ~c for g, c in zip(gt, changed, strict=True)]
    bleed = getattr(seq.steps[k], "bleed", None)
    masks = None if bleed is None else bleed_masks(seq.source, bleed, seq.heldout, changed)
    return _Truth([g.rgb for g in gt], changed, unchanged, masks)


def _unseen_changed(seq, k: int) -> torch.Tensor:
    """Gaussians edit k changed that its edit views (together) do not see."""
    from splatpainter.render import splat_weights

    weight = torch.zeros(seq.source.num_gaussians, dtype=torch.float64)
    for view in seq.steps[k].views:
        weight += splat_weights(seq.source, view.camera).double()
    return seq.steps[k].changed & (weight < UNSEEN_WEIGHT)


def _score(asset, truth: _Truth, cameras) -> dict[str, float]:
    se_c, se_u, ssim = SquaredError(), SquaredError(), MaskedMean()
    back, se_b = SquaredError(), SquaredError()
    for i, (out, gt, chg, unc) in enumerate(
        zip(_renders(asset, cameras), truth.rgb, truth.changed, truth.unchanged_object, strict=True)
    ):
        se_c.add(out.rgb, gt, chg)
        se_u.add(out.rgb, gt, unc)
        if i == 0:  # held-out view 0 looks at the back of the first edit view
            back.add(out.rgb, gt, unc)
        if truth.bleed is not None:
            se_b.add(out.rgb, gt, truth.bleed[i])
        if bool(chg.any()):
            ssim.add(ssim_map(out.rgb, gt), chg)
    return {
        "psnr_changed": se_c.psnr(PSNR_CAP_DB),
        "ssim_changed": ssim.mean,
        "psnr_unchanged": se_u.psnr(PSNR_CAP_DB),
        "psnr_unchanged_back": back.psnr(PSNR_CAP_DB),
        "psnr_bleed": se_b.psnr(PSNR_CAP_DB),  # NaN without bleed pixels
    }


def _timed_apply(session, views) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = session.apply(views)
    return out, time.perf_counter() - t0


def evaluate_edit(
    seq, methods: dict[str, EditMethod], hint_mode: str = "auto", grid: bool = False
) -> tuple[dict[str, dict[str, float]], dict[str, float], GridRow | None]:
    """Score every method on edit 0 of `seq`: (per-method metrics, scene facts, grid row)."""
    from splatpainter.edit import EditSession

    step = seq.steps[0]
    truth = _truth(seq, 0)
    unseen = _unseen_changed(seq, 0)
    gt_colors = step.colors
    n_changed = int(step.changed.sum())
    pixels = sum(int(c.numel()) for c in truth.changed)
    facts = {
        "changed_gaussians": float(n_changed),
        "unseen_changed_fraction": int(unseen.sum()) / n_changed if n_changed else math.nan,
        "changed_pixel_fraction": sum(int(c.sum()) for c in truth.changed) / pixels,
        "bleed_pixel_fraction": math.nan
        if truth.bleed is None
        else sum(int(b.sum()) for b in truth.bleed) / pixels,
    }
    best = max(range(len(truth.changed)), key=lambda i: int(truth.changed[i].sum()))
    row = GridRow(seq.seed, step.views[0].image, truth.rgb[best], {}, best) if grid else None
    scores: dict[str, dict[str, float]] = {}
    for name, method in methods.items():
        _set_hint(name, method, step.kind, hint_mode)
        session = EditSession(seq.source, method)  # Stage I happens here, outside the timing
        out, seconds = _timed_apply(session, step.views)
        s = _score(out, truth, seq.heldout)
        s["unseen_color_error"] = color_error(base_colors(out), gt_colors, unseen)
        s["seconds_per_edit"] = seconds
        scores[name] = s
        if row is not None:
            row.methods[name] = _renders(out, [seq.heldout[best]])[0].rgb
    return scores, facts, row


def evaluate_forgetting(
    seq, methods: dict[str, EditMethod], hint_mode: str = "auto"
) -> dict[str, dict[str, float]]:
    """PSNR of edit 1's held-out region after edit 1 and after the last edit, per method."""
    from splatpainter.edit import EditSession

    last = len(seq.steps) - 1
    first = _truth(seq, 0)
    gt_last = [r.rgb for r in _renders(seq.asset_at(last), seq.heldout)]
    # Edit 1's region, less the pixels later edits painted over: there the ground truth after
    # the last edit equals the one after edit 1, so a lower PSNR is forgetting, not a later
    # edit's own error.
    region = [
        c & ~changed_mask(g_last, g_first)
        for c, g_first, g_last in zip(first.changed, first.rgb, gt_last, strict=True)
    ]
    kept = sum(int(r.sum()) for r in region) / max(1, sum(int(c.sum()) for c in first.changed))
    out: dict[str, dict[str, float]] = {}
    for name, method in methods.items():
        session = EditSession(seq.source, method)
        seconds = 0.0
        after_first = math.nan
        for k, step in enumerate(seq.steps):
            _set_hint(name, method, step.kind, hint_mode)
            asset, dt = _timed_apply(session, step.views)
            seconds += dt
            if k == 0:
                after_first = _region_psnr(asset, first.rgb, region, seq.heldout)
        after_last = _region_psnr(session.asset, gt_last, region, seq.heldout)
        out[name] = {
            "psnr_after_first": after_first,
            "psnr_after_last": after_last,
            "drop": after_first - after_last,
            "seconds_per_edit": seconds / len(seq.steps),
            "region_kept_fraction": kept,
        }
    return out


def _region_psnr(asset, gt_rgb, region, cameras) -> float:
    se = SquaredError()
    for r, gt, m in zip(_renders(asset, cameras), gt_rgb, region, strict=True):
        se.add(r.rgb, gt, m)
    return se.psnr(PSNR_CAP_DB)


# ------------------------------------------------------------------------------ the suite
@dataclass
class EvalResult:
    report: dict[str, Any]  # JSON-ready (see the module docstring)
    grids: dict[str, dict[str, list[GridRow]]] = field(default_factory=dict)  # suite -> kind


ProgressFn = Callable[[str, int], None]  # (description, units just finished: 0 or 1)


def _json_float(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


def _mean_metrics(rows: list[dict[str, float]], keys) -> dict[str, float | None]:
    return {k: _json_float(nanmean([r[k] for r in rows])[0]) for k in keys}


def _run_kinds(config, suite, methods, step, per_seed, grids) -> dict[str, Any]:
    """The per-kind section of one suite (appends its per-seed rows and grid rows)."""
    kinds_out: dict[str, Any] = {}
    for kind in config.kinds:
        spec = config.edit_spec(kind, suite)
        scores_by_method: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
        facts: list[dict[str, float]] = []
        for i, seed in enumerate(config.seeds):
            desc = f"{suite} {kind} seed {seed}"
            step(desc, 0)
            seq = make_sequence(seed, spec)
            scores, f, row = evaluate_edit(seq, methods, config.hint, i < config.grid_rows)
            facts.append(f)
            for name, s in scores.items():
                scores_by_method[name].append(s)
                per_seed.append(
                    {"suite": suite, "kind": kind, "seed": seed, "method": name}
                    | {k: _json_float(s[k]) for k in METRICS}
                )
            if row is not None:
                grids.setdefault(kind, []).append(row)
            step(desc, 1)
        kinds_out[kind] = {
            "seeds": len(config.seeds),
            **_mean_metrics(facts, facts[0].keys()),
            "methods": {m: _mean_metrics(rows, METRICS) for m, rows in scores_by_method.items()},
        }
    return kinds_out


def _run_forgetting(config, suite, methods, step) -> dict[str, Any]:
    spec = config.forgetting_spec(suite)
    rows_by_method: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for seed in config.seeds:
        desc = f"{suite} forgetting seed {seed}"
        step(desc, 0)
        seq = make_sequence(seed, spec)
        for name, r in evaluate_forgetting(seq, methods, config.hint).items():
            rows_by_method[name].append(r)
        step(desc, 1)
    return {
        "seeds": len(config.seeds),
        "edits": config.forgetting_edits,
        "methods": {m: _mean_metrics(rows, FORGET_METRICS) for m, rows in rows_by_method.items()},
    }


def run_suite(
    config: EvalConfig,
    model=None,
    progress: ProgressFn | None = None,
    weights_label: str | None = None,
) -> EvalResult:
    """Evaluate `config.methods` (plus "none") on every suite, kind and seed; see the module
    docstring.

    `model`: the EditorModel of the model methods (required when one is chosen; the rules then
    read edits with its signal settings); `weights_label` says where its weights came from
    (see `load_model`).
    """
    config.validate()
    methods = build_methods(config, model)
    step = progress or (lambda desc, n: None)
    per_seed: list[dict[str, Any]] = []
    suites_out: dict[str, Any] = {}
    grids: dict[str, dict[str, list[GridRow]]] = {}
    for suite in config.suites:
        suite_grids: dict[str, list[GridRow]] = {}
        kinds = _run_kinds(config, suite, methods, step, per_seed, suite_grids)
        forgetting = _run_forgetting(config, suite, methods, step) if config.forgetting else None
        suites_out[suite] = {"kinds": kinds, "forgetting": forgetting}
        if suite_grids:
            grids[suite] = suite_grids
    model_info = None
    if config.needs_model:
        model_info = {
            "trained": bool(getattr(model, "trained", False)),
            "fingerprint": model.weights_fingerprint(),
            "weights": weights_label,
            "init_fingerprint": methods["model_init"].model.weights_fingerprint()
            if "model_init" in methods
            else None,
        }
    report = {
        "schema": SCHEMA,
        "config": {
            "seeds": list(config.seeds),
            "suites": list(config.suites),
            "methods": list(methods),
            "kinds": list(config.kinds),
            "min_gaussians": config.min_gaussians,
            "max_gaussians": config.max_gaussians,
            "view_size": config.view_size,
            "num_heldout": config.num_heldout,
            "optimize_steps": config.optimize_steps,
            "hint": config.hint,
            "forgetting": config.forgetting,
            "forgetting_edits": config.forgetting_edits,
            "psnr_cap_db": PSNR_CAP_DB,
            "changed_threshold": CHANGED_THRESHOLD,
            "unseen_weight": UNSEEN_WEIGHT,
        },
        "model": model_info,
        "roles": {m: role(m) for m in methods},
        "baselines": [m for m in methods if role(m) == "baseline"],
        "ablations": [m for m in methods if role(m) == "ablation"],
        "suites": suites_out,
        "per_seed": per_seed,
        "grids": {},
    }
    return EvalResult(report, grids)


def write_outputs(result: EvalResult, out_dir) -> dict[str, dict[str, str]]:
    """Write grid_SUITE_KIND.png per suite and kind and report.json into `out_dir`
    (atomically); returns the grid paths ({suite: {kind: path}}), also recorded in
    `result.report["grids"]`."""
    import json
    from pathlib import Path

    from appshell.atomic import atomic_write_text
    from splatpainter.eval.grid import write_grid

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    methods = result.report["config"]["methods"]
    paths: dict[str, dict[str, str]] = {}
    for suite, by_kind in result.grids.items():
        for kind, rows in by_kind.items():
            path = out / f"grid_{suite}_{kind}.png"
            write_grid(path, rows, methods)
            paths.setdefault(suite, {})[kind] = str(path)
    result.report["grids"] = paths
    atomic_write_text(out / "report.json", json.dumps(result.report, indent=2) + "\n")
    return paths
