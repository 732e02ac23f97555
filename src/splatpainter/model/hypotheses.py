"""Closed-form edit hypotheses fitted to what the edit views show, offered to Stage II.

The edit views constrain only the Gaussians they see; a recolour or a relight must also reach the
ones they do not.  For each edit we fit, on the seen Gaussians (weighted by their in-mask
compositing weight), two small models of *what the edit does to a colour*:

- an affine colour map  c -> A [c; 1]  (ridge-regularised toward the identity), or an HSV
  adjustment where that explains the views' pixels better: recolours;
- a Lambertian shading  c -> c (a + d max(0, n.l))  over the Gaussians' normals: relights;

and evaluate them on every Gaussian.  With `Stage2Config.fit_maps` the two maps are fitted to
the edit views' pixels instead (edit/solve.py `fit_color_maps`: the per-Gaussian change is noisy
where Gaussians overlap, the pixels are not).  New colours stay in the colour box, as the
8-bit edit's do.  Together with the seen Gaussians' own change (what the
views say about them: the least-squares solve or the back-projected residual) these are the
candidate deltas between which Stage II's
learned per-Gaussian weights choose.  The fit quality and a colour-bin statistic ("what share of
the seen Gaussians of this colour did the edit change") are features for that choice.

Everything here is plain, differentiable-free tensor maths on [N, ...] inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from splatpainter.assets.colorspace import adjust_hsv_colors

NUM_HYPOTHESES = 3  # the seen Gaussians' own change, affine recolour, relight
EDIT_STATS_DIM = 6
BIN_STATS_DIM = 2
COLOR_BINS = 6


# A Gaussian the views see with less compositing weight than this (pixels, summed) is seen only
# through the surface in front of it: its own vote for a side is not to be trusted.
NORMAL_MIN_WEIGHT = 0.2
NORMAL_NEIGHBOURS = 16  # trusted neighbours that orient a faintly seen Gaussian
# A Gaussian whose shortest axis is below this share of its middle one is flat: that axis is its
# surface normal.  A bulkier one (captures have many) says little about the surface it sits
# on alone, so its normal comes from its SURFACE_NEIGHBOURS nearest: the spread of their centres
# and what their own shortest axes agree on (`surface_fit_normals`).
FLAT_RATIO = 0.3
SURFACE_NEIGHBOURS = 16
AXIS_SPREAD_WEIGHT = 1.0  # the centres' spread against the axes' agreement (each per its trace)
# The axes are overruled where the centres lie on a clear plane (least spread below AXIS_PLANAR
# of the middle one) and the axes agree on a direction along it (spread above AXIS_MAX_SPREAD
# of the middle one): splats standing edge-on in a surface say nothing of its normal.
AXIS_PLANAR = 0.1
AXIS_MAX_SPREAD = 0.5
SURFACE_FIT_ROWS = 1 << 18  # rows per chunk of the fit ([rows, k, 3] float64 twice)


def estimate_normals(
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    means: torch.Tensor,
    view_weights: torch.Tensor | None = None,
    view_centers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Unit normals [N, 3]: each Gaussian's surface axis (`surface_axes`: its shortest axis, or
    for a bulky one a fit to its neighbours' centres), oriented toward the views that see it
    (weights [V, N], camera centres [V, 3]), or away from the asset centre when none does.

    Each view votes with its weight squared times the cosine between the axis and the direction
    to the camera: at low resolution a splat seen edge-on through its own surface's silhouette,
    or faintly through a semi-transparent front, can gather more weight from behind than a view
    that sees it face-on.  (Share of the visible weight wrongly oriented on procedural seeds 0-7:
    weight x sign 1.0% with 6 views, this vote 0.6% with 6 views and 0.2% with 16.)  A flat
    Gaussian behind a semi-transparent surface is seen faintly and from its back, so it would
    vote for the wrong side; it takes the side of the well-seen Gaussians of its own sheet
    instead (`orient_by_neighbours`)."""
    n = surface_axes(quats, log_scales, means)
    vote = torch.zeros_like(n[:, 0])
    seen = torch.zeros_like(vote)
    if view_weights is not None and view_centers is not None and view_weights.numel():
        to_cam = view_centers[:, None, :].to(means) - means[None]  # [V, N, 3]
        cos = (to_cam * n[None]).sum(-1) / to_cam.norm(dim=-1).clamp_min(1e-12)
        w = view_weights.to(means)
        vote = (cos * w * w).sum(0)
        seen = w.sum(0)
    outward = torch.sign(((means - means.mean(0)) * n).sum(-1))
    sign = torch.where(vote != 0, torch.sign(vote), outward)
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    n = n * sign[:, None]
    if view_weights is not None and view_weights.numel():
        n = orient_by_neighbours(n, means, seen >= NORMAL_MIN_WEIGHT, log_scales)
    return n


def surface_axes(
    quats: torch.Tensor, log_scales: torch.Tensor, means: torch.Tensor
) -> torch.Tensor:
    """Unoriented unit normals [N, 3]: a flat Gaussian's shortest axis, a bulky one's
    (`FLAT_RATIO`) local surface fit.  On the capture suite's Gaussians (seeds 0-7 of its
    relights, floaters left out) the shortest axis was 20.6 degrees off the surface normal
    (median; 90th percentile 44.8); these normals are 6.5 off (24.6; with the bulky ones'
    fit by their centres' spread alone: 10.9, 36.2)."""
    from splatpainter.assets.gaussians import quat_to_rotmat

    rot = quat_to_rotmat(torch.nn.functional.normalize(quats, dim=-1))
    axis = log_scales.argmin(-1)
    n = torch.gather(rot, 2, axis[:, None, None].expand(-1, 3, 1))[..., 0]
    s = log_scales.sort(-1).values
    bulky = ((s[:, 0] - s[:, 1]) >= math.log(FLAT_RATIO)).nonzero().squeeze(1)
    if bulky.numel() and means.shape[0] >= 3:
        n[bulky] = surface_fit_normals(means, bulky, SURFACE_NEIGHBOURS, axes=n).to(n)
    return n


def surface_fit_normals(
    means: torch.Tensor, rows: torch.Tensor, k: int, axes: torch.Tensor | None = None
) -> torch.Tensor:
    """[R, 3] unit normals at `rows` of means [N, 3] from each row's k nearest centres (itself
    included), in float64.  Without `axes`: their least-variance direction, the classic
    point-cloud normal.  With axes [N, 3] (each Gaussian's shortest axis): the direction d that
    maximises  mean_j (d . a_j)^2 - AXIS_SPREAD_WEIGHT * d^T C d / tr C  over the neighbours j
    (C the scatter of their centres).  A capture's bulky Gaussians are tilted off their surface
    each its own way and jittered off it, and their axes agree on its normal better than their
    centres do; where the centres lie on a clear plane and the axes agree on a direction in it
    (edge-on splats), the centres' normal is kept (AXIS_PLANAR, AXIS_MAX_SPREAD)."""
    from scipy.spatial import cKDTree

    pts = means.detach().cpu().double()
    k = min(k, pts.shape[0])
    _, idx = cKDTree(pts.numpy()).query(pts[rows.cpu()].numpy(), k=k, workers=-1)
    idx = torch.from_numpy(idx).reshape(-1, k)
    ax = None if axes is None else axes.detach().cpu().double()
    out = []
    for chunk in idx.split(SURFACE_FIT_ROWS):
        near = pts[chunk]  # [R, k, 3]
        centred = near - near.mean(1, keepdim=True)
        scatter = centred.transpose(1, 2) @ centred
        if ax is None:
            out.append(torch.linalg.eigh(scatter)[1][..., 0])  # (ascending eigenvalues)
            continue
        spread = torch.linalg.eigvalsh(scatter)
        a = ax[chunk]
        agree = a.transpose(1, 2) @ a / k
        share = scatter / spread.sum(-1).clamp_min(1e-300)[:, None, None]
        fit = torch.linalg.eigh(agree - AXIS_SPREAD_WEIGHT * share)[1][..., -1]
        consensus = a[:, 0]  # (the row's own axis) -> agree's leading direction
        for _ in range(8):
            consensus = torch.nn.functional.normalize((agree @ consensus[..., None])[..., 0], dim=1)
        along = torch.einsum("ri,rij,rj->r", consensus, scatter, consensus)
        planar = spread[:, 0] < AXIS_PLANAR * spread[:, 1]
        edge_on = (planar & (along > AXIS_MAX_SPREAD * spread[:, 1])).nonzero().squeeze(1)
        if edge_on.numel():
            fit[edge_on] = torch.linalg.eigh(scatter[edge_on])[1][..., 0]
        out.append(fit)
    return torch.cat(out).to(means.device)


def orient_by_neighbours(
    n: torch.Tensor, means: torch.Tensor, trusted: torch.Tensor, log_scales: torch.Tensor
) -> torch.Tensor:
    """Flip each untrusted normal that disagrees with its nearest trusted neighbours on the same
    sheet: nearly parallel normals (|cos| > 0.8) and an offset along the normal of at most a
    quarter of the distance (the far wall of a thin part lies above, not beside)."""
    faint = (~trusted).nonzero().squeeze(1)
    good = trusted.nonzero().squeeze(1)
    if faint.numel() == 0 or good.numel() == 0:
        return n
    k = min(NORMAL_NEIGHBOURS, good.numel())
    out = n.clone()
    pg = means[good]
    for chunk in faint.split(1024):
        d = torch.cdist(means[chunk], pg)  # [F, T]
        dist, j = d.topk(k, largest=False)
        j = good[j]
        out[chunk] = sheet_vote(n[chunk], means[chunk], log_scales[chunk], n[j], means[j], dist)
    return out


def sheet_vote(
    n: torch.Tensor,
    means: torch.Tensor,
    log_scales: torch.Tensor,
    n_near: torch.Tensor,
    means_near: torch.Tensor,
    dist: torch.Tensor,
) -> torch.Tensor:
    """`orient_by_neighbours`' rule for rows [F] with their trusted neighbours [F, k] (normals,
    centres, distances): each normal, flipped where the neighbours on its sheet disagree."""
    ni = n[:, None, :]
    cos = (n_near * ni).sum(-1)
    offset = ((means_near - means[:, None, :]) * ni).sum(-1).abs()
    # on one (smooth) sheet a neighbour lies mostly beside; the far wall lies above
    reach = 0.25 * dist + log_scales.exp().amin(-1)[:, None]
    same_sheet = (cos.abs() > 0.8) & (offset <= reach)
    agree = (torch.sign(cos) * same_sheet.to(cos.dtype)).sum(-1)
    return torch.where((agree < 0)[:, None], -n, n)


def ridge_solve(
    xtx: torch.Tensor, xty: torch.Tensor, prior: torch.Tensor, reg: float
) -> torch.Tensor:
    """argmin_B |X B - T|^2 + reg |B - prior|^2 from the normal equations X^T X, X^T T."""
    eye = torch.eye(xtx.shape[0], dtype=xtx.dtype, device=xtx.device)
    return torch.linalg.solve(xtx + reg * eye, xty + reg * prior)


def _ridge(x: torch.Tensor, t: torch.Tensor, w: torch.Tensor, prior: torch.Tensor, lam: float):
    """argmin_B sum_i w_i |x_i B - t_i|^2 + lam' |B - prior|^2 (lam' = lam * sum w + 1e-6)."""
    xw = x * w[:, None]
    return ridge_solve(xw.T @ x, xw.T @ t, prior, lam * float(w.sum()) + 1e-6)


def _weighted_rows(w: torch.Tensor, *ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """w and ts at the rows where w != 0: the others add nothing to a weighted fit, and an
    edit weighs a few thousand Gaussians of a million (the fits ran on all of them)."""
    keep = (w != 0).nonzero().squeeze(1)
    if keep.numel() == w.numel():
        return (w, *ts)
    return (w[keep], *(t[keep] for t in ts))


def fit_affine(colors: torch.Tensor, targets: torch.Tensor, w: torch.Tensor, lam: float = 1e-2):
    """Affine colour map [4, 3] (rows: R, G, B, bias) with targets ~ [c, 1] @ map."""
    w, colors, targets = _weighted_rows(w, colors, targets)
    x = torch.cat([colors, torch.ones_like(colors[:, :1])], -1)
    prior = torch.cat([torch.eye(3, dtype=colors.dtype), torch.zeros(1, 3, dtype=colors.dtype)])
    return _ridge(x, targets, w, prior.to(colors.device), lam)


def fit_shading(
    colors: torch.Tensor,
    targets: torch.Tensor,
    normals: torch.Tensor,
    w: torch.Tensor,
    iters: int = 8,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ambient, diffuse, light dir) of targets ~ colors * (a + d max(0, n.l)).

    Per-Gaussian brightness ratio r = <t, c> / <c, c> (targets at the top of the colour box
    are left out: they may be clipped). With v = d l the model is r = a + max(0, n.v): a linear
    fit r ~ a + n.v over all Gaussians starts it, then each step refits a + n.v on the
    Gaussians the current light reaches (the rest only set a) until that set stops changing.
    """
    w, colors, targets, normals = _weighted_rows(w, colors, targets, normals)
    cc = (colors * colors).sum(-1)
    ok = (cc > 1e-3) & (targets.amax(-1) < 1.0 - 1e-3)
    r = torch.where(ok, (targets * colors).sum(-1) / cc.clamp_min(1e-3), torch.ones_like(cc))
    wr = w * cc * ok.to(w.dtype)
    ones = torch.ones_like(r[:, None])
    prior = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=r.dtype, device=r.device)
    av = _ridge(torch.cat([ones, normals], -1), r[:, None], wr, prior, 1e-3)[:, 0]
    lit = None
    for _ in range(iters):
        new_lit = (normals @ av[1:]) > 0
        if lit is not None and bool((new_lit == lit).all()):
            break
        lit = new_lit
        x = torch.cat([ones, normals * lit[:, None].to(normals.dtype)], -1)
        av = _ridge(x, r[:, None], wr, prior, 1e-5)[:, 0]
    d = av[1:].norm()
    light = av[1:] / d.clamp_min(1e-8)
    return av[0], d, light


def color_bins(colors: torch.Tensor) -> torch.Tensor:
    """[N] each colour's bin of a COLOR_BINS^3 grid over the colour box."""
    b = COLOR_BINS
    q = (colors.clamp(0, 1) * (b - 1e-4)).floor().long()
    return (q[:, 0] * b + q[:, 1]) * b + q[:, 2]


def _bin_share(idx: torch.Tensor, seen_weight: torch.Tensor, changed_weight: torch.Tensor):
    """(changed share of the seen weight, seen weight) per colour bin [COLOR_BINS^3] each."""
    seen = seen_weight.new_zeros(COLOR_BINS**3).index_add_(0, idx, seen_weight)
    changed = seen_weight.new_zeros(COLOR_BINS**3).index_add_(0, idx, changed_weight)
    share = changed / seen.clamp_min(1e-6)
    share = torch.where(seen > 0, share, torch.full_like(share, -1.0))  # -1: colour never seen
    return share, seen


def color_bin_stats(
    colors: torch.Tensor, seen_weight: torch.Tensor, changed_weight: torch.Tensor
) -> torch.Tensor:
    """Per Gaussian [N, 2]: the changed share of the seen weight in its colour bin, and
    log(1 + seen weight of the bin): "were the seen Gaussians that look like me edited?"."""
    idx = color_bins(colors)
    share, seen = _bin_share(idx, seen_weight, changed_weight)
    return torch.stack([share[idx], torch.log1p(seen[idx])], -1)


def changed_weight(
    in_mask_weight: torch.Tensor, abs_residual: torch.Tensor, change_tau: float = 0.05
) -> torch.Tensor:
    """[N] how much of each Gaussian's in-mask weight changed (its residual against tau)."""
    return in_mask_weight * (abs_residual / change_tau).clamp(0, 1)


@dataclass(frozen=True)
class EditTotals:
    """What an edit's per-Gaussian inputs read from every Gaussian of the asset: the total
    seen weight and the colour-bin statistics per bin ([COLOR_BINS^3, BIN_STATS_DIM], as
    `color_bin_stats` gives them per Gaussian).  `edit_hypotheses` takes them to run on some
    Gaussians alone (a restricted edit, model/restricted.py)."""

    seen_total: torch.Tensor  # []
    bin_stats: torch.Tensor  # [COLOR_BINS^3, BIN_STATS_DIM]


def edit_totals(
    colors: torch.Tensor,
    abs_residual: torch.Tensor,
    in_mask_weight: torch.Tensor,
    weight: torch.Tensor,
    change_tau: float = 0.05,
) -> EditTotals:
    """`EditTotals` of an edit over every Gaussian (the arguments as `edit_hypotheses`')."""
    share, seen = _bin_share(
        color_bins(colors), weight, changed_weight(in_mask_weight, abs_residual, change_tau)
    )
    return EditTotals(weight.sum(), torch.stack([share, torch.log1p(seen)], -1))


def recolor(colors: torch.Tensor, affine: torch.Tensor, hsv: torch.Tensor | None = None):
    """[N, 3] the recolour's new colours (before the colour box): the affine map, or the HSV
    adjustment (hue degrees, saturation, brightness) when one was fitted in its place."""
    if hsv is not None:
        h, sat, val = (float(x) for x in hsv)
        return adjust_hsv_colors(colors.double(), h, sat, val).to(colors.dtype)
    return torch.cat([colors, torch.ones_like(colors[:, :1])], -1) @ affine.to(colors)


def fit_hypothesis_maps(
    colors: torch.Tensor,
    seen_delta: torch.Tensor,
    w: torch.Tensor,
    normals: torch.Tensor,
    affine: torch.Tensor | None = None,
    shading: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The affine recolour [4, 3] and shading (ambient, diffuse, light) of an edit: the given
    ones (fitted to the views' pixels), else fitted to the seen change with weights w [N]."""
    targets = colors + seen_delta
    aff = fit_affine(colors, targets, w) if affine is None else affine.to(colors)
    if shading is None:
        shading = fit_shading(colors, targets, normals, w)
    return aff, shading


# pull of the SH bands' colour map toward the identity, per unit of colour variance (see band_map)
REST_RIDGE = 1e-3
CHANGE_TAU = 2.0 / 255.0  # a seen Gaussian "changed" if its change exceeds this


def band_map(
    colors: torch.Tensor, recolored: torch.Tensor, seen_delta: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """[3, 3] the recolour's map for the view-dependent SH bands (on a colour column vector).

    recolored [N, 3]: the recolour's new colours before the colour box (`recolor`).  The bands
    take the linear part of the recolour where the changed colours pin it down: a map fitted
    to pixels is free in the colour directions they do not span, and there its linear part
    can be wild (gains of -7), harmless on the base colours it was fitted to, ruinous on the
    SH bands.  So the bands take an affine refit of the recolour on the seen changed
    Gaussians, ridge-regularised toward the identity: directions in which their colours vary
    by less than about sqrt(REST_RIDGE) keep the identity (an HSV recolour gets its best
    linear fit there)."""
    changed_w = w * (seen_delta.abs().amax(-1) > CHANGE_TAU).to(w.dtype)
    return fit_affine(colors, recolored, changed_w, lam=REST_RIDGE)[:3].T


def box_colors(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """New colours kept in the colour box, as an 8-bit edit keeps them; colours already outside
    it (fitted real assets) keep their own range, so a zero change stays exactly zero."""
    return torch.minimum(torch.maximum(new, old.clamp_max(0.0)), old.clamp_min(1.0))


def hsv_band_maps(colors: torch.Tensor, hsv: torch.Tensor) -> torch.Tensor:
    """[N, 3, 3] what an HSV recolour does to small colour deviations around each colour (the
    SH bands): its Jacobian there, the colour box included (central differences)."""
    c = colors.double()
    h, sat, val = (float(x) for x in hsv)
    eps = 1e-4
    cols = []
    for j in range(3):
        e = torch.zeros(3, dtype=c.dtype, device=c.device)
        e[j] = eps
        hi, lo = c + e, c - e
        moved = [box_colors(adjust_hsv_colors(x, h, sat, val), x) for x in (hi, lo)]
        cols.append((moved[0] - moved[1]) / (2 * eps))
    return torch.stack(cols, -1).to(colors.dtype)


def recolor_band_maps(
    colors: torch.Tensor,
    affine: torch.Tensor,
    hsv: torch.Tensor | None,
    seen_delta: torch.Tensor,
    w: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The recolour's map of the SH bands, [3, 3] or [n, 3, 3] for the `rows` (default all):
    the affine map's (`band_map`), or each colour's own under an HSV recolour (not linear)."""
    if hsv is not None:
        return hsv_band_maps(colors if rows is None else colors[rows], hsv)
    return band_map(colors, recolor(colors, affine), seen_delta, w)


def hypothesis_rest_maps(
    band: torch.Tensor, shade: torch.Tensor, normals: torch.Tensor
) -> torch.Tensor:
    """[N, NUM_HYPOTHESES, 3, 3]: what each hypothesis does to the view-dependent SH bands
    (rest' = map @ rest): the seen change keeps them, the recolour applies its band maps
    (`recolor_band_maps`, [3, 3] or [N, 3, 3]), the relight scales them by the Gaussian's
    shading factor `shade` [N]."""
    n = normals.shape[0]
    eye = torch.eye(3, dtype=normals.dtype, device=normals.device)
    return torch.stack(
        [eye.expand(n, 3, 3), band.to(normals).expand(n, 3, 3), shade[:, None, None] * eye], 1
    )


def shading_factor(
    shading: tuple[torch.Tensor, torch.Tensor, torch.Tensor], normals: torch.Tensor
) -> torch.Tensor:
    """[N] a + d max(0, n.l): what the Lambertian relight multiplies each colour by."""
    a, d, light = shading
    return a + d * (normals @ light.to(normals)).clamp_min(0)


def edit_hypotheses(
    colors: torch.Tensor,
    seen_delta: torch.Tensor,
    abs_residual: torch.Tensor,
    in_mask_weight: torch.Tensor,
    support: torch.Tensor,
    weight: torch.Tensor,
    normals: torch.Tensor,
    change_tau: float = 0.05,
    *,
    affine: torch.Tensor | None = None,
    shading: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    hsv: torch.Tensor | None = None,
    totals: EditTotals | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidate colour deltas [N, NUM_HYPOTHESES, 3], edit statistics [EDIT_STATS_DIM] and
    colour-bin statistics [N, BIN_STATS_DIM] for one edit (all zeros-safe when nothing is seen).

    totals: `edit_totals` of the whole asset, when these are some of its Gaussians, every one
    with in-mask weight among them (then the statistics are the whole asset's, to rounding).

    seen_delta [N, 3]: what the views say each seen Gaussian's change is (zero elsewhere).
    affine / shading: maps already fitted to the views' pixels (edit/solve.py), used instead of
    fitting them to seen_delta here; hsv: an HSV recolour fitted there, used in the affine's
    place (`recolor`)."""
    w = in_mask_weight * support
    aff, shading = fit_hypothesis_maps(colors, seen_delta, w, normals, affine, shading)
    cand_aff, cand_shade = map_candidates(colors, aff, hsv, shading, normals)
    d = shading[1]
    cand = torch.stack([seen_delta, cand_aff.clamp(-1, 1), cand_shade.clamp(-1, 1)], 1)
    wsum = w.sum().clamp_min(1e-6)

    def rmse(c: torch.Tensor) -> torch.Tensor:
        return (((c - seen_delta) ** 2).sum(-1) * w).sum().div(wsum).sqrt()

    changed_w = changed_weight(in_mask_weight, abs_residual, change_tau)
    seen_w = weight
    seen_total = seen_w.sum() if totals is None else totals.seen_total
    stats = torch.stack(
        [
            changed_w.sum() / seen_total.clamp_min(1e-6),  # share of the view that changed
            rmse(cand_aff),
            rmse(cand_shade),
            (abs_residual * w).sum() / wsum,
            torch.log1p(w.sum()),
            d,
        ]
    )
    if totals is None:
        bins = color_bin_stats(colors, seen_w, changed_w)
    else:
        bins = totals.bin_stats[color_bins(colors)]
    return cand, stats, bins


def with_seen_solve(
    delta: torch.Tensor, in_mask_weight: torch.Tensor, solved: torch.Tensor | None
) -> torch.Tensor:
    """A change [N, 3] with each seen Gaussian's replaced by `solved` [N, 3] (the least-squares
    change centred on a map, edit/solve.py `solve_color_delta` centers; None: kept): the map
    where the views leave the change undetermined (a part seen through a few pixels), the
    views where they say otherwise."""
    if solved is None:
        return delta
    return torch.where((in_mask_weight > 0)[:, None], solved.to(delta), delta)


def map_candidates(
    colors: torch.Tensor,
    affine: torch.Tensor,
    hsv: torch.Tensor | None,
    shading: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    normals: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recolour's and the relight's colour deltas [N, 3] on every Gaussian, new colours kept
    in the colour box (an asset's colours outside it keep theirs, so a delta may exceed 1)."""
    cand_aff = box_colors(recolor(colors, affine, hsv), colors) - colors
    shade = shading_factor(shading, normals)
    cand_shade = box_colors(colors * shade[:, None], colors) - colors
    return cand_aff, cand_shade
