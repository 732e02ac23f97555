"""Stage I: a compact, feature-rich latent on a voxel grid (runs once per asset, then cached).

Pipeline for one asset (several assets are concatenated and processed together):

1. Voxelise: positions are normalised to the asset's bounding cube (centre 0, side 1) and binned
   on a `grid_size`^3 grid; each Gaussian belongs to one occupied voxel.
2. Per-Gaussian input = its own attributes (normalised position, rotation, log-scale relative to
   the cube, opacity, colour, higher SH bands padded to degree 3) + a Fourier encoding of its
   position + image features pooled from a few preprocessing renders.  The image features play
   the role of the paper's LRM: a small learned conv encoder runs on orbit renders, and each
   Gaussian samples the feature map at its projected centre in the views where it is visible
   (mean over those views, plus the visible fraction).  Visibility is the renderer's own: the
   Gaussian's total compositing weight in that view (occlusion and opacity included) must reach
   `vis_min_weight` pixels.  (A depth test against the rendered depth was tried first; with
   large flat splats the alpha-blended depth disagrees with per-Gaussian depth too often.)
3. A local transformer attends among the Gaussians of each voxel.  Big voxels are split into
   groups of at most `max_group` members so the padded batch stays small whatever the density.
4. Voxel latent = MLP(mean of member features) (+ a mix of the 26-neighbourhood); per-Gaussian
   feature = a linear read-out of its transformer output.
5. A decoder maps (voxel latent, Gaussian feature) back to appearance attributes; it is what the
   Stage I auto-encoding loss trains, and Stage II's heads consume the same two inputs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from appshell.tables import check_limits, limited
from splatpainter.assets.gaussians import sh_dc_to_rgb
from splatpainter.model.layers import MLP, TransformerBlock, fourier_encode, segment_mean
from splatpainter.model.propagate import SplatGraph

MAX_WIDTH = 4096  # the widest layer a config may ask for (memory: MAX_WIDTH**2 per weight)
MAX_SH_REST = 15  # coefficients beyond DC at degree 3
ATTR_DIM = 3 + 4 + 3 + 1 + 3 + 3 * MAX_SH_REST


@dataclass
class Stage1Config:
    """Sizes of the Stage I encoder/decoder; each bounded so a file's config cannot ask for
    more memory than any sensible editor needs."""

    grid_size: int = limited(20, ge=1, le=256)
    dim: int = limited(64, ge=1, le=MAX_WIDTH)  # per-Gaussian width inside the local transformer
    # voxel latent width (= Stage II token width)
    latent_dim: int = limited(128, ge=1, le=MAX_WIDTH)
    gauss_feat_dim: int = limited(32, ge=1, le=MAX_WIDTH)
    num_layers: int = limited(2, ge=0, le=64)
    num_heads: int = limited(4, ge=1, le=64)
    fourier_freqs: int = limited(6, ge=0, le=32)
    max_group: int = limited(64, ge=1, le=MAX_WIDTH)
    neighbor_mix: bool = True
    image_feat_dim: int = limited(16, ge=0, le=MAX_WIDTH)
    num_views: int = limited(6, ge=0, le=64)
    view_size: int = limited(64, ge=1, le=1024)
    # compositing weight (pixels) for "visible in this view"
    vis_min_weight: float = limited(0.1, ge=0)
    # weight-only orbit views whose votes orient the normals (`asset_normals`): more views than
    # the encoder's, since a side that no face-on view decides is often wrong (share of the
    # visible weight wrongly oriented on procedural seeds 0-7, 48 px: 16 views 0.2%, 6 views 0.6%)
    normal_views: int = limited(16, ge=0, le=256)
    normal_view_size: int = limited(48, ge=1, le=1024)
    decode_sh_rest: bool = False
    decode_opacity: bool = False

    def __post_init__(self) -> None:
        check_limits(self, "stage1")  # (grid_size, max_group and view counts: their ranges)
        if self.dim % self.num_heads != 0:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")


# ------------------------------------------------------------------------- voxelisation
@dataclass
class Voxelization:
    """How an asset's Gaussians map to voxels (all tensors on the asset's device)."""

    center: torch.Tensor  # [3] bounding-cube centre
    extent: torch.Tensor  # [] bounding-cube side
    gauss_voxel: torch.Tensor  # [N] voxel index of each Gaussian (0..V-1)
    voxel_ijk: torch.Tensor  # [V, 3] integer grid coordinates (sorted by linear id)
    grid_size: int

    @property
    def num_voxels(self) -> int:
        return int(self.voxel_ijk.shape[0])

    def normalize(self, points: torch.Tensor) -> torch.Tensor:
        """World points -> bounding-cube coordinates in [-0.5, 0.5]."""
        return (points - self.center) / self.extent

    def voxel_centers(self) -> torch.Tensor:
        """Voxel centres in normalised coordinates [V, 3]."""
        return (self.voxel_ijk.to(self.center.dtype) + 0.5) / self.grid_size - 0.5


def voxelize(means: torch.Tensor, grid_size: int) -> Voxelization:
    """Bin Gaussian centres on a grid over their bounding cube."""
    if means.shape[0] == 0:
        raise ValueError("cannot voxelise an asset with no Gaussians")
    m = means.detach()
    lo, hi = m.min(0).values, m.max(0).values
    center = (lo + hi) / 2
    extent = (hi - lo).max().clamp_min(1e-6)
    ijk = (((m - center) / extent + 0.5) * grid_size).floor().long().clamp(0, grid_size - 1)
    lin = (ijk[:, 0] * grid_size + ijk[:, 1]) * grid_size + ijk[:, 2]
    uniq, inverse = torch.unique(lin, sorted=True, return_inverse=True)
    g2 = grid_size * grid_size
    voxel_ijk = torch.stack([uniq // g2, (uniq // grid_size) % grid_size, uniq % grid_size], -1)
    return Voxelization(center, extent, inverse, voxel_ijk, grid_size)


def gaussian_attributes(asset, vox: Voxelization) -> torch.Tensor:
    """Per-Gaussian attribute vector [N, ATTR_DIM] in the asset's normalised frame."""
    n = asset.num_gaussians
    q = F.normalize(asset.quats, dim=-1)
    q = q * torch.where(q[:, :1] < 0, -1.0, 1.0)  # q and -q are the same rotation
    rest = asset.sh[:, 1:, :].reshape(n, -1)
    rest = F.pad(rest, (0, 3 * MAX_SH_REST - rest.shape[1]))
    return torch.cat(
        [
            vox.normalize(asset.means) * 2.0,
            q,
            asset.log_scales - vox.extent.log(),
            torch.sigmoid(asset.opacity_logits)[:, None],
            sh_dc_to_rgb(asset.sh[:, 0, :], clamp=False),
            rest,
        ],
        dim=-1,
    )


def asset_content_hash(asset) -> str:
    """sha256 over the asset's tensors: the Stage I cache key."""
    h = hashlib.sha256()
    for name, t in asset.tensors().items():
        a = t.detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(tuple(a.shape)).encode() + str(a.dtype).encode())
        h.update(a.numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------- image features
@dataclass
class PreprocessViews:
    """Renders of an asset used for image features: rgb [V,H,W,3], alpha [V,H,W], and each
    Gaussian's total compositing weight per view, weights [V,N]."""

    rgb: torch.Tensor
    alpha: torch.Tensor
    weights: torch.Tensor
    cameras: list

    @property
    def num_views(self) -> int:
        return len(self.cameras)


def orbit_views(asset, n: int, size: int) -> list:
    """n square cameras around the asset: half from above, half from below, so undersides are
    seen too."""
    from splatpainter.camera import orbit_cameras

    if n == 0:
        return []
    square = {"width": size, "height": size}
    up = orbit_cameras(asset, (n + 1) // 2, elevation_deg=25.0, **square)
    below = {"elevation_deg": -30.0, "azimuth_start_deg": 180.0 / n}
    down = orbit_cameras(asset, n // 2, **below, **square) if n > 1 else []
    return [c.to(asset.device) for c in up + down]


def render_preprocess_views(asset, config: Stage1Config) -> PreprocessViews:
    """Orbit renders of the asset (the inputs of the image encoder) and visibility weights."""
    from splatpainter.render.api import render_and_weights

    n, s = config.num_views, config.view_size
    a = asset.detach()
    if n == 0:
        z = a.means.new_zeros(0, s, s)
        return PreprocessViews(z[..., None].expand(0, s, s, 3), z, a.means.new_zeros(0, len(a)), [])
    rgbs, alphas, weights = [], [], []
    cams = orbit_views(a, n, s)
    for cam in cams:
        out, w = render_and_weights(a, cam)  # = render(a, cam), splat_weights(a, cam)
        rgbs.append(out.rgb)
        alphas.append(out.alpha)
        weights.append(w)
    return PreprocessViews(torch.stack(rgbs), torch.stack(alphas), torch.stack(weights), cams)


class ImageEncoder(nn.Module):
    """A small conv net on rgb+alpha renders -> feature maps at half resolution."""

    def __init__(self, out_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 16, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(32, out_dim, 3, padding=1),
        )

    def forward(self, rgb: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        x = torch.cat([rgb, alpha[..., None]], dim=-1).permute(0, 3, 1, 2)
        return self.net(x)


def pool_image_features(
    feats: torch.Tensor, views: PreprocessViews, means: torch.Tensor, vis_min_weight: float
) -> torch.Tensor:
    """Mean feature over the views where each Gaussian is visible, + the visible fraction.

    feats: [V, C, h, w] feature maps of the renders; sampled (bilinear) at the projected centre.
    Returns [N, C + 1].
    """
    n, c = means.shape[0], feats.shape[1]
    acc = means.new_zeros(n, c)
    count = means.new_zeros(n)
    for i, cam in enumerate(views.cameras):
        uv, _ = cam.project(means.detach())
        grid = torch.stack([uv[:, 0] / cam.width * 2 - 1, uv[:, 1] / cam.height * 2 - 1], -1)
        f = F.grid_sample(
            feats[i : i + 1], grid[None, :, None, :].to(feats.dtype), align_corners=False
        )
        vis = (views.weights[i] >= vis_min_weight).to(means.dtype)
        acc = acc + f.view(c, n).T * vis[:, None]
        count = count + vis
    pooled = acc / count.clamp_min(1)[:, None]
    frac = count / max(views.num_views, 1)
    return torch.cat([pooled, frac[:, None]], dim=-1)


def side_by_side() -> int:
    """Threads for independent per-view or per-chunk calls: torch's thread count (the kernels'
    serial parts, binning and sorting, and torch's small calls then fill the cores), at most 4
    (each call is parallel itself).  One unless numba's threading layer takes concurrent
    calls (omp, tbb; its "workqueue" fallback aborts on them), or none is chosen yet."""
    import numba

    try:
        safe = numba.threading_layer() in ("omp", "tbb")
    except ValueError:  # no parallel kernel has run in this process yet
        safe = False
    return max(1, min(4, torch.get_num_threads())) if safe else 1


# Above this many (faint x trusted) distance pairs the faint normals are oriented region by
# region (`orient_faint_locally`); below it, by the one all-pairs call, as always.
LOCAL_ORIENT_PAIRS = 1 << 27


def asset_normals(asset, config: Stage1Config) -> torch.Tensor:
    """Oriented per-Gaussian normals, oriented by the votes of `config.normal_views` weight-only
    orbit views (the compositing weight each Gaussian has in each).

    `estimate_normals` turns faint normals by their nearest trusted neighbours with an all-pairs
    distance matrix: O(faint x trusted) time and a [1024, trusted] block of memory (minutes and
    gigabytes at 1M Gaussians).  For large assets it is called with every view weight scaled by
    the same power of two so small that no Gaussian is trusted (exact: each vote's sign is
    unchanged, and no neighbour pass runs), and the faint ones are then turned region by region
    (`orient_faint_locally`: the same rule, each one's neighbours by exact distances)."""
    from concurrent.futures import ThreadPoolExecutor

    from splatpainter.model.hypotheses import NORMAL_MIN_WEIGHT, estimate_normals
    from splatpainter.render.api import splat_weights

    a = asset.detach()
    cams = orbit_views(a, config.normal_views, config.normal_view_size)
    if not cams:
        return estimate_normals(a.quats, a.log_scales, a.means)
    centers = torch.stack([c.camera_center().to(a.means) for c in cams])
    with ThreadPoolExecutor(side_by_side()) as pool:  # the kernels' serial parts, side by side
        weights = torch.stack(list(pool.map(lambda c: splat_weights(a, c), cams)))
    seen = weights.to(a.means).sum(0)
    trusted = seen >= NORMAL_MIN_WEIGHT
    n_trusted = int(trusted.sum())
    if n_trusted * (len(seen) - n_trusted) <= LOCAL_ORIENT_PAIRS:
        return estimate_normals(a.quats, a.log_scales, a.means, weights, centers)
    top = float(seen.max())
    shift = max(0, int(torch.tensor(top / NORMAL_MIN_WEIGHT).log2().ceil()) + 1)
    scaled = weights * 2.0**-shift  # a power of two: every product and sum scales exactly
    voted = estimate_normals(a.quats, a.log_scales, a.means, scaled, centers)
    return orient_faint_locally(voted, a.means, trusted, a.log_scales)


ORIENT_CELL_MEMBERS = 32  # faint Gaussians per cell whose candidates one ball query finds


def orient_faint_locally(
    n: torch.Tensor,
    means: torch.Tensor,
    trusted: torch.Tensor,
    log_scales: torch.Tensor,
) -> torch.Tensor:
    """`hypotheses.orient_by_neighbours` for many faint Gaussians: each one's 16 nearest
    trusted found within a ball around its cell, then the same vote (`hypotheses.sheet_vote`,
    in float64 by a compiled kernel, `_kernels.sheet_flips`).

    The ball: with c the centre of a cell's ~32 faint members, R their largest distance to c and
    D the distance from c to its 16th nearest trusted, every member has 16 trusted within
    D + R, so its 16 nearest lie within D + 2R of c.  One k-d tree query per cell and, per
    faint Gaussian, exact float64 distances to the trusted in its cell's ball (a compiled
    kernel, `_kernels.nearest_in_balls`: nearest first, ties to the lower index) replace the
    all-pairs float32 distance matrix.  That matrix rounds distances (its matrix-product form),
    so in tight clusters it can take another 16th neighbour: the tests check that this search
    turns each normal as the all-pairs call in float64 does.  On the 1M tiled asset (9.8k
    trusted, 1.01M faint) it gave the same normals as the float32 call, in one comparison, and
    took 3.9 s against 8.6 s for the version that re-ran the all-pairs call on each chunk's
    candidates (2026-12-04, a slow day).  The vote in float64 by the kernel instead of torch's
    float32 gathers turned the same normals there (2026-12-06: the whole call 1.0-1.3 s against
    1.3 s, the vote itself 0.17 s against about 0.6 s)."""
    import numpy as np
    from scipy.spatial import cKDTree

    from splatpainter.model._kernels import nearest_in_balls, sheet_flips
    from splatpainter.model.hypotheses import NORMAL_NEIGHBOURS, orient_by_neighbours

    faint = (~trusted).nonzero().squeeze(1)
    good = trusted.nonzero().squeeze(1)
    k = NORMAL_NEIGHBOURS
    if faint.numel() == 0 or good.numel() <= k:
        return orient_by_neighbours(n, means, trusted, log_scales)
    code = morton_codes(means[faint])
    order = torch.argsort(code, stable=True)
    faint, code = faint[order], code[order]  # each cell's members together
    cell = _morton_cells(code, ORIENT_CELL_MEMBERS)
    pts = means.detach().cpu().double()
    fp = pts[faint]
    cells = int(cell[-1]) + 1
    lo = torch.full((cells, 3), float("inf"), dtype=torch.float64).scatter_reduce(
        0, cell[:, None].expand(-1, 3), fp, "amin"
    )
    hi = torch.full((cells, 3), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, cell[:, None].expand(-1, 3), fp, "amax"
    )
    centre = (lo + hi) / 2
    reach = torch.zeros(cells, dtype=torch.float64).scatter_reduce(
        0, cell, (fp - centre[cell]).norm(dim=1), "amax"
    )
    tree = cKDTree(pts[good].numpy())
    d_k, _ = tree.query(centre.numpy(), k=k, workers=-1)
    radius = (d_k[:, -1] + 2 * reach.numpy()) * (1 + 1e-9) + 1e-12  # (rounding of the bound)
    balls = tree.query_ball_point(centre.numpy(), radius, workers=-1)
    sizes = torch.tensor([len(b) for b in balls], dtype=torch.int64)
    flat = torch.from_numpy(np.concatenate([np.asarray(b, dtype=np.int64) for b in balls]))
    starts = torch.cumsum(sizes, 0) - sizes
    nearest = nearest_in_balls(fp, cell, pts[good], starts, sizes, flat, k)
    near = torch.where(nearest >= 0, good.cpu()[nearest.clamp_min(0)], -1)
    turned = faint[sheet_flips(faint, near, n, means, log_scales).to(faint.device)]
    out = n.clone()
    out[turned] = -n[turned]
    return out


def _morton_cells(sorted_codes: torch.Tensor, members: int) -> torch.Tensor:
    """[N] cell ids 0.. (ascending) of sorted Morton codes: the code with its low 3*s bits
    dropped, s the coarsest level whose cells hold about `members` points on average."""
    n = sorted_codes.numel()
    best = sorted_codes
    for s in range(1, 11):
        cut = sorted_codes >> (3 * s)
        count = 1 + int((cut[1:] != cut[:-1]).sum()) if n else 0
        if count * members < n:
            break
        best = cut
    change = torch.zeros(n, dtype=torch.int64)
    if n > 1:
        change[1:] = (best[1:] != best[:-1]).to(torch.int64)
    return torch.cumsum(change, 0)


def morton_codes(points: torch.Tensor, bits: int = 10) -> torch.Tensor:
    """[N] int64 Z-order codes of points on a 2^bits grid over their bounding cube: sorting by
    them keeps nearby points together (chunks of a sorted list are compact in space)."""
    lo = points.min(0).values
    side = float((points.max(0).values - lo).max().clamp_min(1e-12))
    q = ((points - lo) / side * ((1 << bits) - 1)).round().long().clamp(0, (1 << bits) - 1)
    code = torch.zeros(points.shape[0], dtype=torch.int64, device=points.device)
    for b in range(bits):
        for axis in range(3):
            code |= ((q[:, axis] >> b) & 1) << (3 * b + axis)
    return code


# ------------------------------------------------------------------------- grouping
def member_groups(gauss_voxel: torch.Tensor, max_group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad members of each voxel into groups of <= max_group: (index [S, L], valid [S, L]).

    Index entries of padding slots are 0 (masked out by `valid`).
    """
    n = gauss_voxel.shape[0]
    order = torch.argsort(gauss_voxel, stable=True)
    sorted_vox = gauss_voxel[order]
    counts = torch.bincount(sorted_vox)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=gauss_voxel.device) - starts[sorted_vox]
    sub = rank // max_group
    slot = rank % max_group
    max_sub = int(sub.max()) + 1
    key = sorted_vox * max_sub + sub
    _, group = torch.unique(key, sorted=True, return_inverse=True)
    num_groups = int(group.max()) + 1
    width = min(max_group, int(counts.max()))
    index = torch.zeros(num_groups, width, dtype=torch.long, device=gauss_voxel.device)
    valid = torch.zeros(num_groups, width, dtype=torch.bool, device=gauss_voxel.device)
    index[group, slot] = order
    valid[group, slot] = True
    return index, valid


def neighbor_mean(voxel_lin: torch.Tensor, voxel_ijk: torch.Tensor, values: torch.Tensor, g: int):
    """Mean of `values` over each voxel's occupied 26-neighbourhood (0 where none).

    voxel_lin must be sorted ascending (unique linear ids, offset per asset so assets never mix).
    """
    acc = torch.zeros_like(values)
    cnt = values.new_zeros(values.shape[0])
    base = voxel_lin - ((voxel_ijk[:, 0] * g + voxel_ijk[:, 1]) * g + voxel_ijk[:, 2])
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dz in (-1, 0, 1):
                if dx == dy == dz == 0:
                    continue
                nb = voxel_ijk + torch.tensor([dx, dy, dz], device=voxel_ijk.device)
                ok = ((nb >= 0) & (nb < g)).all(-1)
                lin = base + (nb[:, 0] * g + nb[:, 1]) * g + nb[:, 2]
                pos = torch.searchsorted(voxel_lin, lin).clamp_max(voxel_lin.shape[0] - 1)
                ok = ok & (voxel_lin[pos] == lin)
                acc = acc + values[pos] * ok[:, None].to(values.dtype)
                cnt = cnt + ok.to(values.dtype)
    return acc / cnt.clamp_min(1)[:, None]


# ------------------------------------------------------------------------- the model
@dataclass
class Stage1Latent:
    """Stage I output for one asset."""

    vox: Voxelization
    voxel_latent: torch.Tensor  # [V, latent_dim]
    gauss_feat: torch.Tensor  # [N, gauss_feat_dim]
    normals: torch.Tensor | None = None  # [N, 3] oriented normals (see hypotheses)
    graph: SplatGraph | None = None  # the k-NN graph Stage II propagates over (when it does)

    def detach(self) -> Stage1Latent:
        return Stage1Latent(
            self.vox, self.voxel_latent.detach(), self.gauss_feat.detach(), self.normals,
            self.graph,
        )  # fmt: skip

    def to_dict(self) -> dict:
        v = self.vox
        return {
            "center": v.center.cpu(),
            "extent": v.extent.cpu(),
            "gauss_voxel": v.gauss_voxel.cpu(),
            "voxel_ijk": v.voxel_ijk.cpu(),
            "grid_size": v.grid_size,
            "voxel_latent": self.voxel_latent.detach().cpu(),
            "gauss_feat": self.gauss_feat.detach().cpu(),
            "normals": None if self.normals is None else self.normals.cpu(),
            "graph": None if self.graph is None else self.graph.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict, device: torch.device | str = "cpu") -> Stage1Latent:
        vox = Voxelization(
            d["center"].to(device),
            d["extent"].to(device),
            d["gauss_voxel"].to(device),
            d["voxel_ijk"].to(device),
            int(d["grid_size"]),
        )
        normals = d.get("normals")
        graph = d.get("graph")
        return cls(
            vox,
            d["voxel_latent"].to(device),
            d["gauss_feat"].to(device),
            None if normals is None else normals.to(device),
            None if graph is None else SplatGraph.from_dict(graph, device),
        )


class Stage1Encoder(nn.Module):
    """Asset (+ preprocessing renders) -> voxel latents and per-Gaussian features."""

    def __init__(self, config: Stage1Config) -> None:
        super().__init__()
        self.config = config
        c = config
        in_dim = ATTR_DIM + 3 * 2 * c.fourier_freqs + c.image_feat_dim + 1
        self.image_encoder = ImageEncoder(c.image_feat_dim)
        self.embed = nn.Linear(in_dim, c.dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.dim, c.num_heads) for _ in range(c.num_layers)
        )
        self.norm = nn.LayerNorm(c.dim)
        self.to_latent = MLP(c.dim, 2 * c.latent_dim, c.latent_dim)
        self.neighbor = nn.Linear(c.latent_dim, c.latent_dim) if c.neighbor_mix else None
        self.to_gauss = nn.Linear(c.dim, c.gauss_feat_dim)
        out_dim = 3 + (3 * MAX_SH_REST if c.decode_sh_rest else 0) + int(c.decode_opacity)
        self.decoder = MLP(c.latent_dim + c.gauss_feat_dim, 2 * c.latent_dim, out_dim)

    def gaussian_inputs(self, asset, vox: Voxelization, views: PreprocessViews) -> torch.Tensor:
        cfg = self.config
        attrs = gaussian_attributes(asset, vox)
        pos = fourier_encode(vox.normalize(asset.means) * 2.0, cfg.fourier_freqs)
        if views.num_views > 0:
            feats = self.image_encoder(views.rgb, views.alpha)
            img = pool_image_features(feats, views, asset.means, cfg.vis_min_weight)
        else:
            img = asset.means.new_zeros(asset.num_gaussians, cfg.image_feat_dim + 1)
        return torch.cat([attrs, pos, img], dim=-1)

    def forward(
        self,
        assets: list,
        views: list[PreprocessViews],
        normals: list[torch.Tensor] | None = None,
    ) -> list[Stage1Latent]:
        """Encode a batch of assets with different Gaussian counts (concatenated, segmented).
        normals: each asset's `asset_normals`, when already computed (training caches them)."""
        cfg = self.config
        g = cfg.grid_size
        voxs = [voxelize(a.means, g) for a in assets]
        parts = [self.gaussian_inputs(a, v, w) for a, v, w in zip(assets, voxs, views, strict=True)]
        x = parts[0] if len(parts) == 1 else torch.cat(parts)  # (one asset: no 1M-row copy)
        # Global voxel ids: assets occupy disjoint id ranges so groups never mix assets.
        offsets, lins, total = [], [], 0
        for v in voxs:
            offsets.append(total)
            ijk = v.voxel_ijk
            lins.append(((ijk[:, 0] * g + ijk[:, 1]) * g + ijk[:, 2]) + len(lins) * g**3)
            total += v.num_voxels
        gvox = torch.cat([v.gauss_voxel + o for v, o in zip(voxs, offsets, strict=True)])
        index, valid = member_groups(gvox, cfg.max_group)
        h = self.embed(x)
        tokens = h[index]  # [S, L, dim]
        for block in self.blocks:
            tokens = block(tokens, valid)
        h = torch.zeros_like(h).index_put_((index[valid],), tokens[valid])
        h = self.norm(h)
        latent = self.to_latent(segment_mean(h, gvox, total))
        if self.neighbor is not None:
            lin = torch.cat(lins)
            ijk = torch.cat([v.voxel_ijk for v in voxs])
            latent = latent + self.neighbor(neighbor_mean(lin, ijk, latent, g))
        gfeat = self.to_gauss(h)
        out, n0 = [], 0
        if normals is None:
            normals = [asset_normals(a, cfg) for a in assets]
        for nrm, v, o in zip(normals, voxs, offsets, strict=True):
            n = v.gauss_voxel.shape[0]
            out.append(Stage1Latent(v, latent[o : o + v.num_voxels], gfeat[n0 : n0 + n], nrm))
            n0 += n
        return out

    def decode(self, latent: Stage1Latent) -> dict[str, torch.Tensor]:
        """(voxel latent, Gaussian feature) -> appearance: sh_dc [N,3] (+ sh_rest, opacity)."""
        z = torch.cat([latent.voxel_latent[latent.vox.gauss_voxel], latent.gauss_feat], dim=-1)
        y = self.decoder(z)
        out = {"sh_dc": y[:, :3]}
        i = 3
        if self.config.decode_sh_rest:
            out["sh_rest"] = y[:, i : i + 3 * MAX_SH_REST].reshape(-1, MAX_SH_REST, 3)
            i += 3 * MAX_SH_REST
        if self.config.decode_opacity:
            out["opacity_logits"] = y[:, i]
        return out
