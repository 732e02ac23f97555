"""Training examples: an edit sequence plus everything about it that does not depend on weights.

Rendering is the expensive part of a training step, and most of it does not depend on the model:
the Stage I preprocessing renders of the source asset, the per-Gaussian edit signals and view
tokens (computed against the ground truth before each edit: teacher forcing), and the ground-truth
renders at the loss views.  `build_example` computes them once per sequence; `ensure_cache` builds
a cache of them on disk in spawned worker processes (OpenMP is not fork-safe after a numba
render), one atomically written file per seed, so an interrupted build resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import warnings
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from appshell.inputs import InputFileError, load_torch
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.camera import Camera
from splatpainter.model.stage1 import PreprocessViews, Stage1Config, render_preprocess_views
from splatpainter.model.stage2 import (
    COLOR_MAPS,
    EditSample,
    GaussianSignals,
    SignalSettings,
    hint_maps,
)
from splatpainter.train.data import (
    HINT_OF_KIND,
    SequenceSpec,
    make_sequence,
)

EXAMPLE_VERSION = 6  # 2: signals carry the least-squares solve; 3: SH rest, graph, suites;
# 4: Stage I normals cached (voted by their own views, weight squared x cosine); 5: a bulky
# Gaussian's normal fitted to its neighbours' centres; 6: colour maps fitted on view colours
# (SH bands included), the affine one clamp-aware, and an HSV recolour


def _render_rgb(asset: GaussianAsset, cams: list[Camera]) -> torch.Tensor:
    from splatpainter.render import render

    with torch.no_grad():
        return torch.stack([render(asset, c).rgb for c in cams])


def build_example(
    seed: int,
    spec: SequenceSpec,
    stage1: Stage1Config,
    loss_view_size: int,
    settings: SignalSettings = SignalSettings(),
    graph: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Everything a training step needs for one sequence, as plain tensors and dicts.

    graph: (k, anchors) of the k-NN graph a propagating editor walks (model/propagate.py)."""
    from splatpainter.edit.methods import build_edit_sample
    from splatpainter.model.stage1 import Stage1Latent, asset_normals, voxelize

    seq = make_sequence(seed, spec)
    pre = render_preprocess_views(seq.source, stage1)
    # Signals and view tokens depend on the voxel frame only through the Plücker normalisation.
    vox = voxelize(seq.source.means, stage1.grid_size)
    # Stage I's normals (a fixed function of the asset, so computed once here, not every step);
    # the shading fit needs them too.
    normals = asset_normals(seq.source, stage1)
    shading_normals = normals if settings.fit_maps else None
    frame = Stage1Latent(vox, torch.zeros(0), torch.zeros(0), shading_normals)
    loss_cams = [c.resized(loss_view_size, loss_view_size) for c in seq.heldout]
    before = seq.source
    before_loss = _render_rgb(before, loss_cams)
    steps = []
    for k, step in enumerate(seq.steps):
        sample = build_edit_sample(
            before,
            step.views,
            frame,
            settings=settings,
            fit_maps=COLOR_MAPS if settings.fit_maps else (),  # a step's hint picks later
        )
        gt = seq.asset_at(k)
        edit_cam = step.views[0].camera.resized(loss_view_size, loss_view_size)
        gt_loss = _render_rgb(gt, [*loss_cams, edit_cam])
        before_edit = _render_rgb(before, [edit_cam])
        steps.append(
            {
                "kind": step.kind,
                "hint": HINT_OF_KIND[step.kind],
                "colors_in": sample.colors,
                "colors_gt": step.colors,
                # the view-dependent bands before and after (empty at SH degree 0)
                "rest_in": before.sh[:, 1:, :].to(torch.float16),
                "rest_gt": gt.sh[:, 1:, :].to(torch.float16),
                "changed": step.changed,
                "views": [v.to(torch.float16) for v in sample.views],
                "signals": {
                    k: getattr(sample.signals, k)
                    for k in (
                        "residual",
                        "abs_residual",
                        "support",
                        "in_mask_weight",
                        "weight",
                        "solved",
                        "affine",
                        "shading",
                        "hsv",
                        "solved_affine",
                        "solved_shading",
                    )
                },
                "loss_cameras": [c.to_dict() for c in [*loss_cams, edit_cam]],
                "loss_gt": gt_loss.to(torch.float16),
                "loss_before": torch.cat([before_loss, before_edit]).to(torch.float16),
            }
        )
        before = gt
        before_loss = gt_loss[:-1]
    if graph is not None:
        from splatpainter.model.propagate import build_graph

        graph_dict = build_graph(seq.source, *graph).to_dict()
    else:
        graph_dict = None
    return {
        "version": EXAMPLE_VERSION,
        "seed": int(seed),
        "graph": graph_dict,
        "source": {k: v.contiguous() for k, v in seq.source.tensors().items()},
        "normals": normals,
        "pre": {
            "rgb": pre.rgb.to(torch.float16),
            "alpha": pre.alpha.to(torch.float16),
            "weights": pre.weights,
            "cameras": [c.to_dict() for c in pre.cameras],
        },
        "steps": steps,
    }


def example_source(ex: dict[str, Any]) -> GaussianAsset:
    return GaussianAsset(**ex["source"])


def example_preprocess(ex: dict[str, Any]) -> PreprocessViews:
    p = ex["pre"]
    return PreprocessViews(
        p["rgb"].float(),
        p["alpha"].float(),
        p["weights"],
        [Camera.from_dict(c) for c in p["cameras"]],
    )


def example_sample(step: dict[str, Any], latent, hint: str) -> EditSample:
    """The editor's input for one cached step under `hint`; colour maps the hint would not have
    fitted at inference are dropped (fitted to the solved change instead), as there."""
    s = dict(step["signals"])
    for name in COLOR_MAPS:
        if name not in hint_maps(hint):
            s[name] = None
            s[f"solved_{name}"] = None  # the solve centred on it
            if name == "affine":  # the HSV recolour stands in for the affine map
                s["hsv"] = None
    return EditSample(
        latent=latent,
        views=[v.float() for v in step["views"]],
        signals=GaussianSignals(**s),
        colors=step["colors_in"],
        hint=hint,
    )


# ------------------------------------------------------------------------ the cache
def cache_key(
    spec: SequenceSpec,
    stage1: Stage1Config,
    loss_view_size: int,
    settings: SignalSettings = SignalSettings(),
    graph: tuple[int, int] | None = None,
) -> str:
    """Examples depend on the data spec, the preprocessing settings, the loss view size and
    the settings behind the signals (solve steps and prior, pixel-fitted colour maps, the
    solves centred on them)."""
    d = {
        **({"solve_iters": settings.solve_iters} if settings.solve_iters else {}),
        **({"solve_prior_px": settings.solve_prior_px} if settings.solve_prior_px else {}),
        **({"fit_maps": True} if settings.fit_maps else {}),
        **({"map_solves": True} if settings.map_solves else {}),
        **({"graph": list(graph)} if graph is not None else {}),
        "version": EXAMPLE_VERSION,
        "spec": asdict(spec),
        "grid": stage1.grid_size,
        "views": [stage1.num_views, stage1.view_size],
        "normal_views": [stage1.normal_views, stage1.normal_view_size],
        "loss_view_size": loss_view_size,
    }
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def _build_one(args: tuple) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # The workers are the parallelism: one thread each for torch and the numba renderer (two
    # workers of two renderer threads on 2 cores built examples 4-5x slower).
    torch.set_num_threads(1)
    import numba

    numba.set_num_threads(1)
    return _write_example(args)


def _write_example(args: tuple) -> int:
    from appshell.atomic import atomic_write_with

    seed, spec, stage1, loss_view_size, settings, graph, path = args
    ex = build_example(seed, spec, stage1, loss_view_size, settings, graph)
    atomic_write_with(path, lambda f: torch.save(ex, f))
    return seed


def ensure_cache(
    seeds: list[int],
    spec: SequenceSpec,
    stage1: Stage1Config,
    loss_view_size: int,
    cache_dir: str | os.PathLike[str],
    *,
    settings: SignalSettings = SignalSettings(),
    graph: tuple[int, int] | None = None,
    workers: int = 2,
    progress=None,
) -> dict[int, Path]:
    """Build missing examples (in `workers` spawned processes) and return seed -> file."""
    root = Path(cache_dir) / cache_key(spec, stage1, loss_view_size, settings, graph)
    root.mkdir(parents=True, exist_ok=True)
    paths = {s: root / f"{s}.pt" for s in seeds}
    for s, p in paths.items():
        _RECIPES[p] = (s, spec, stage1, loss_view_size, settings, graph, p)
        if p.exists() and not zipfile.is_zipfile(p):  # reads only the tail: cheap for 1000s
            _discard(p, "truncated or not a torch archive")
    todo = [_RECIPES[p] for p in paths.values() if not p.exists()]
    if todo:
        if workers <= 1:
            for a in todo:
                _build_one(a)
                if progress:
                    progress(1)
        else:
            with mp.get_context("spawn").Pool(workers) as pool:
                for _ in pool.imap_unordered(_build_one, todo):
                    if progress:
                        progress(1)
    return paths


class CacheRebuiltWarning(UserWarning):
    """A cached example was unreadable (an interrupted write, a full disk) and is rebuilt."""


class CacheEntryError(InputFileError):
    """A cached example that cannot be read and cannot be rebuilt here."""


# How ensure_cache built each cache file (its _build_one arguments), so that load_example can
# rebuild one found corrupt in the middle of a run.
_RECIPES: dict[Path, tuple] = {}


def _discard(path: Path, why: str) -> None:
    warnings.warn(f"{path}: corrupt cached example ({why}); rebuilding it", CacheRebuiltWarning,
                  stacklevel=3)  # fmt: skip
    path.unlink(missing_ok=True)


def _read_example(path: Path) -> dict[str, Any]:
    ex = load_torch(path, what="cached training example")
    if not isinstance(ex, dict) or not isinstance(ex.get("steps"), list):
        raise InputFileError(f"{path}: not a cached training example")
    return ex


def load_example(path: Path) -> dict[str, Any]:
    """A cached example (weights-only load); a corrupt one that ensure_cache made is deleted and
    rebuilt with a CacheRebuiltWarning, any other is one CacheEntryError line naming it."""
    try:
        return _read_example(path)
    except InputFileError as e:
        recipe = _RECIPES.get(path)
        if recipe is None:
            raise CacheEntryError(str(e)) from None
        _discard(path, str(e).removeprefix(f"{path}: "))
    _write_example(recipe)  # in this process: leave its thread settings alone
    try:
        return _read_example(path)
    except InputFileError as e:
        raise CacheEntryError(f"{e} (after a rebuild)") from None
