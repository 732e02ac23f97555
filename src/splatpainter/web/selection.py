"""Selecting Gaussians in 3D for the browser editor, and the exact edits of a selection.

A selection is a boolean mask over the asset's Gaussians (the asset's order never changes, so it
stays valid across edits): a box or a sphere in world coordinates, or a brush in screen space
(every Gaussian whose centre projects under the painted pixels of a view, hidden ones too, as
a floater behind the object must be reachable).  What it is for: an edit limited to it (the
other Gaussians keep their bits), an exact colour adjustment, and deleting floaters.  None of
this needs the editor model; it is arithmetic on the asset.

Hide is represented in the asset itself: a hidden Gaussian's opacity logit is `HIDDEN_LOGIT`
(transparent to every renderer), and its own opacity stays in the history entries before the
hide.  So hide and unhide are ordinary history entries: undo, redo, the session file, the
server's frames and the page's WebGL view (a colour delta carries opacity) all handle them with
no second record to keep aligned, and unhide takes each Gaussian's opacity back, bit for bit,
from the last entry in which it was visible.  Hidden Gaussians are not edited (`visible_only`).
The web export writes them with that opacity by default (hiding is a view aid; an export never
loses a Gaussian) or, asked to, as deleted (`for_export`); the session file itself holds the
hidden value, which every reader takes for a transparent Gaussian.
"""

from __future__ import annotations

import math

import torch

from splatpainter.assets.colorspace import adjust_hsv_colors, hsv_matrix
from splatpainter.assets.gaussians import SH_C0
from splatpainter.web.views import WebInputError

MODES = ("replace", "add", "subtract")
DELETED_LOGIT = -30.0  # opacity ~1e-13: below the renderer's 1/255 cut, in every viewer
HIDDEN_LOGIT = -31.0  # hidden (not deleted): also transparent, told apart from a deletion
HIGHLIGHT = (1.0, 0.8, 0.0)  # what a selected Gaussian's colour is mixed with in a view
HIDDEN_EXPORT = ("keep", "delete")


def _vec3(value, what: str) -> torch.Tensor:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise WebInputError(f"{what} must be a list of 3 numbers, got {value!r}")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise WebInputError(f"{what} must hold 3 finite numbers, got {value!r}")
        out.append(float(x))
    return torch.tensor(out, dtype=torch.float64)


def select_box(means: torch.Tensor, lo, hi) -> torch.Tensor:
    """Gaussians whose centre lies in the axis-aligned box [lo, hi] (world coordinates)."""
    lo, hi = _vec3(lo, "box.min"), _vec3(hi, "box.max")
    if bool((lo > hi).any()):
        raise WebInputError(f"box.min must not exceed box.max, got {lo.tolist()} > {hi.tolist()}")
    m = means.detach().double().cpu()
    return ((m >= lo) & (m <= hi)).all(-1)


def select_sphere(means: torch.Tensor, centre, radius) -> torch.Tensor:
    """Gaussians whose centre lies within `radius` of `centre` (world coordinates)."""
    c = _vec3(centre, "sphere.centre")
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or not radius >= 0:
        raise WebInputError(f"sphere.radius must be a number >= 0, got {radius!r}")
    if not math.isfinite(radius):
        raise WebInputError("sphere.radius must be finite")
    m = means.detach().double().cpu()
    return ((m - c) ** 2).sum(-1) <= float(radius) ** 2


def select_brush(means: torch.Tensor, camera, mask: torch.Tensor) -> torch.Tensor:
    """Gaussians in front of `camera` whose centre projects onto a painted pixel of `mask`
    [H, W] (values in 0..1; painted: >= 0.5), whatever is in front of them."""
    h, w = mask.shape
    uv, z = camera.project(means.detach().to(torch.float64).cpu())
    col, row = torch.floor(uv[:, 0]), torch.floor(uv[:, 1])
    inside = (z > 0) & (col >= 0) & (col < w) & (row >= 0) & (row < h)
    out = torch.zeros(means.shape[0], dtype=torch.bool)
    idx = inside.nonzero().squeeze(-1)
    out[idx] = mask[row[idx].long(), col[idx].long()] >= 0.5
    return out


def combine(current: torch.Tensor | None, new: torch.Tensor, mode: str) -> torch.Tensor:
    """The selection after `mode` (replace, add, subtract) with `new`."""
    if mode not in MODES:
        raise WebInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "replace" or current is None:
        return new.clone() if mode != "subtract" else torch.zeros_like(new)
    return current | new if mode == "add" else current & ~new


def restrict(before, after, selected: torch.Tensor):
    """`after` where `selected`, `before` (bit for bit) elsewhere: an edit limited to it."""
    from splatpainter.edit.methods import write_back

    names = ("means", "quats", "log_scales", "opacity_logits", "sh")
    return write_back(
        before, selected.to(before.means.device), **{n: getattr(after, n) for n in names}
    )


def delete(asset, selected: torch.Tensor):
    """The selected Gaussians made fully transparent (kept, so the asset's order and every
    history entry stay aligned; undo brings them back)."""
    from splatpainter.edit.methods import write_back

    gone = torch.full_like(asset.opacity_logits, DELETED_LOGIT)
    return write_back(asset, selected.to(asset.means.device), opacity_logits=gone)


def check_hsv(hue, saturation, brightness) -> tuple[float, float, float]:
    """The adjustment's numbers, range-checked (hue in degrees, the others factors)."""
    out = []
    for name, v, lo, hi in (
        ("hue", hue, -360.0, 360.0),
        ("saturation", saturation, 0.0, 10.0),
        ("brightness", brightness, 0.0, 10.0),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise WebInputError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")
        out.append(float(v))
    return out[0], out[1], out[2]


def adjust_hsv(asset, selected: torch.Tensor, hue: float, saturation: float, brightness: float):
    """The selected Gaussians' base colour (0.5 + C0 * SH DC, negatives as 0) moved exactly in
    HSV: hue + `hue` degrees, saturation x `saturation` (at most 1), value x `brightness` (not
    capped: a 3D colour may exceed 1); the higher SH bands by `hsv_matrix`.  The others keep
    their bits."""
    from splatpainter.assets.gaussians import map_sh_bands
    from splatpainter.edit.methods import write_back

    sel = selected.to(asset.sh.device)
    rows = sel.nonzero().squeeze(-1)
    dc = asset.sh[rows, 0, :].double()
    moved = adjust_hsv_colors(0.5 + SH_C0 * dc, hue, saturation, brightness)
    sh = asset.sh.clone()
    sh[rows, 0, :] = ((moved - 0.5) / SH_C0).to(sh.dtype)
    if sh.shape[1] > 1:
        m = hsv_matrix(hue, saturation, brightness).expand(len(rows), 3, 3)
        sh[rows, 1:, :] = map_sh_bands(asset.sh[rows, 1:, :].double(), m).to(sh.dtype)
    return write_back(asset, sel, sh=sh)


def hidden_mask(asset) -> torch.Tensor:
    """bool [N]: the Gaussians hidden in `asset` (cpu)."""
    return (asset.opacity_logits.detach().cpu().reshape(-1) == HIDDEN_LOGIT).clone()


def visible_only(before, after, allowed: torch.Tensor | None = None):
    """`after` limited to the Gaussians visible in `before` (and in `allowed`, when given):
    the hidden ones, and the others outside `allowed`, keep their bits."""
    keep = ~hidden_mask(before)
    if allowed is not None:
        keep &= allowed.cpu()
    if bool(keep.all()):
        return after
    return restrict(before, after, keep)


def hide(asset, selected: torch.Tensor):
    """The selected Gaussians hidden (opacity logit `HIDDEN_LOGIT`; see the module doc)."""
    from splatpainter.edit.methods import write_back

    gone = torch.full_like(asset.opacity_logits, HIDDEN_LOGIT)
    return write_back(asset, selected.to(asset.means.device), opacity_logits=gone)


def unhide(history: list, selected: torch.Tensor | None = None):
    """The last asset of `history` (the session's entries up to the current one, oldest
    first) with its hidden Gaussians (those in `selected`, or all) shown again: each takes the
    opacity logit it had in the last entry where it was not hidden (a Gaussian hidden from the
    start keeps its value, so the result is bit-exact either way)."""
    from splatpainter.edit.methods import write_back

    asset = history[-1]
    todo = hidden_mask(asset)
    if selected is not None:
        todo &= selected.cpu()
    if not bool(todo.any()):
        return asset
    ops = asset.opacity_logits.detach().cpu().reshape(-1).clone()
    wanted = todo.clone()
    for older in reversed(history[:-1]):
        old = older.opacity_logits.detach().cpu().reshape(-1)
        found = todo & (old != HIDDEN_LOGIT)
        ops[found] = old[found]
        todo &= ~found
        if not bool(todo.any()):
            break
    device = asset.opacity_logits.device
    return write_back(asset, wanted.to(device), opacity_logits=ops.to(device))


def for_export(history: list, hidden: str):
    """The asset an export writes: hidden Gaussians with their own opacity (`keep`: hiding is
    a view aid, an export never loses them) or as deleted (`delete`: fully transparent, still
    in their place, so the file keeps the asset's order)."""
    if hidden not in HIDDEN_EXPORT:
        raise WebInputError(f"hidden must be one of {', '.join(HIDDEN_EXPORT)}, got {hidden!r}")
    if hidden == "keep":
        return unhide(history)
    asset = history[-1]
    from splatpainter.edit.methods import write_back

    gone = torch.full_like(asset.opacity_logits, DELETED_LOGIT)
    return write_back(asset, hidden_mask(asset).to(asset.means.device), opacity_logits=gone)


def tinted(asset, selected: torch.Tensor):
    """`asset` with the selected Gaussians' base colour mixed half and half with `HIGHLIGHT`
    and their view-dependent bands halved: how a view shows the selection (never stored)."""
    sel = selected.to(asset.sh.device)
    if not bool(sel.any()):
        return asset
    sh = asset.sh.clone()
    rows = sel.nonzero().squeeze(-1)
    mark = torch.tensor(HIGHLIGHT, dtype=sh.dtype, device=sh.device)
    colour = 0.5 * (0.5 + SH_C0 * sh[rows, 0, :]) + 0.5 * mark
    sh[rows, 0, :] = (colour - 0.5) / SH_C0
    sh[rows, 1:, :] *= 0.5
    return asset.replace(sh=sh)
