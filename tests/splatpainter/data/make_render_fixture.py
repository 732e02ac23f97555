"""Writes ``render_fixture.npz``: a small scene and its image, rendered from the specification.

This is an independent implementation of 3D Gaussian Splatting rendering written from the
published rules (INRIA 3DGS / gsplat), in float64 numpy, per pixel and without tiles. It
imports nothing from splatpainter, so a rule changed consistently in both of splatpainter's
backends (an alpha clamp, an SH constant, a depth order) no longer matches the committed image.

The rules:
- camera: OpenCV (x right, y down, looking along +z), pixel (i, j) has its centre at
  (i + 0.5, j + 0.5); u = fx x / z + cx, v = fy y / z + cy.
- Gaussians with view-space depth z < 0.2 (INRIA's near plane) are not drawn.
- 3D covariance R(q) diag(exp(2 log_scale)) R(q)^T, q = (w, x, y, z) normalised; the view
  covariance is projected with the perspective Jacobian at the mean, x/z and y/z clamped to
  the image extent plus 0.3 half fields of view; 0.3 px^2 is added to the 2D diagonal.
- colour: 0.5 + sum_k Y_k(d) sh_k, clamped at 0, d the unit direction camera centre -> mean,
  Y_k the real SH basis with INRIA's constants and signs (degree 3, written out below).
- per pixel, Gaussians in increasing depth: power = -1/2 d^T conic d (skipped if > 0),
  alpha = min(0.99, opacity exp(power)), skipped if alpha < 1/255; if T (1 - alpha) < 1e-4
  the pixel stops (that Gaussian not drawn); else C += T alpha c, T *= 1 - alpha.
  Output colour C + T background, alpha 1 - T, expected depth sum(T alpha z) / (1 - T).

Run ``python tests/splatpainter/data/make_render_fixture.py`` to rewrite the file.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

C0 = 0.28209479177387814
C1 = 0.4886025119029199
C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
      0.5462742152960396)  # fmt: skip
C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
      -0.4570457994644658, 1.445305721320277, -0.5900435899266435)  # fmt: skip

W, H = 48, 40
OUT = Path(__file__).with_name("render_fixture.npz")


def sh_basis(d: np.ndarray) -> np.ndarray:
    """The 16 real SH basis functions at unit direction d (INRIA's eval_sh order and signs)."""
    x, y, z = d
    xx, yy, zz = x * x, y * y, z * z
    return np.array([
        C0,
        -C1 * y, C1 * z, -C1 * x,
        C2[0] * x * y, C2[1] * y * z, C2[2] * (2 * zz - xx - yy), C2[3] * x * z,
        C2[4] * (xx - yy),
        C3[0] * y * (3 * xx - yy), C3[1] * x * y * z, C3[2] * y * (4 * zz - xx - yy),
        C3[3] * z * (2 * zz - 3 * xx - 3 * yy), C3[4] * x * (4 * zz - xx - yy),
        C3[5] * z * (xx - yy), C3[6] * x * (xx - 3 * yy),
    ])  # fmt: skip


def rotation(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip


def render(scene: dict, background: np.ndarray) -> dict[str, np.ndarray]:
    w2c, K = scene["world_to_cam"], scene["K"]
    Rw, tw = w2c[:3, :3], w2c[:3, 3]
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    campos = -Rw.T @ tw
    lim_x = ((W - cx) / fx + 0.15 * W / fx, cx / fx + 0.15 * W / fx)
    lim_y = ((H - cy) / fy + 0.15 * H / fy, cy / fy + 0.15 * H / fy)
    splats = []
    for i in range(scene["means"].shape[0]):
        m = scene["means"][i]
        x, y, z = Rw @ m + tw
        if z < 0.2:
            continue
        tx = z * min(max(x / z, -lim_x[1]), lim_x[0])
        ty = z * min(max(y / z, -lim_y[1]), lim_y[0])
        J = np.array([[fx / z, 0, -fx * tx / z**2], [0, fy / z, -fy * ty / z**2]])
        M = rotation(scene["quats"][i]) * np.exp(scene["log_scales"][i])[None, :]
        cov = J @ Rw @ M @ M.T @ Rw.T @ J.T + 0.3 * np.eye(2)
        conic = np.linalg.inv(cov)
        d = (m - campos) / np.linalg.norm(m - campos)
        color = np.maximum(0.5 + sh_basis(d) @ scene["sh"][i], 0.0)
        opacity = 1 / (1 + math.exp(-scene["opacity_logits"][i]))
        mean2d = np.array([fx * x / z + cx, fy * y / z + cy])
        splats.append((z, i, mean2d, conic, color, opacity))
    splats.sort(key=lambda s: (s[0], s[1]))
    rgb = np.zeros((H, W, 3))
    alpha = np.zeros((H, W))
    depth = np.zeros((H, W))
    for py in range(H):
        for px in range(W):
            pix = np.array([px + 0.5, py + 0.5])
            T, C, D = 1.0, np.zeros(3), 0.0
            for z, _, mean2d, conic, color, opacity in splats:
                dd = mean2d - pix
                power = -0.5 * dd @ conic @ dd
                if power > 0:
                    continue
                a = min(0.99, opacity * math.exp(power))
                if a < 1 / 255:
                    continue
                if T * (1 - a) < 1e-4:
                    break
                C += T * a * color
                D += T * a * z
                T *= 1 - a
            rgb[py, px] = C + T * background
            alpha[py, px] = 1 - T
            depth[py, px] = D / (1 - T) if T < 1 else 0.0
    return {"rgb": rgb, "alpha": alpha, "depth": depth}


def make_scene(seed: int = 7) -> dict[str, np.ndarray]:
    """~70 Gaussians in front of a tilted camera: opaque, translucent, anisotropic, SH 3."""
    rng = np.random.default_rng(seed)
    n = 70
    means = rng.normal(size=(n, 3)) * np.array([0.6, 0.5, 0.4])
    means[:8] = [[x, y, 0.5] for x, y in rng.uniform(-0.4, 0.4, size=(8, 2))]  # opaque layer
    log_scales = rng.uniform(-3.0, -1.2, size=(n, 3))
    log_scales[8:20, 2] = -5.0  # flat splats
    logits = rng.normal(size=n) * 1.5
    logits[:8] = 6.0  # raw alpha above 0.99 at their centres: the clamp matters
    sh = rng.normal(size=(n, 16, 3)) * 0.3
    c, s = math.cos(0.3), math.sin(0.3)
    w2c = np.eye(4)
    w2c[:3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]
    w2c[:3, 3] = [0.1, -0.05, 3.0]
    K = np.array([[52.0, 0, 23.7], [0, 50.0, 20.4], [0, 0, 1]])
    return {
        "means": means,
        "quats": rng.normal(size=(n, 4)),
        "log_scales": log_scales,
        "opacity_logits": logits,
        "sh": sh,
        "world_to_cam": w2c,
        "K": K,
    }


def main() -> None:
    scene = {k: v.astype(np.float32).astype(np.float64) for k, v in make_scene().items()}
    background = np.array([0.1, 0.2, 0.3])
    out = render(scene, background)
    arrays = {k: v.astype(np.float32) for k, v in scene.items()}
    arrays.update({f"expected_{k}": v.astype(np.float32) for k, v in out.items()})
    arrays["background"] = background.astype(np.float32)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
