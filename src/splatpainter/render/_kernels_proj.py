"""numba kernels of the per-Gaussian stages (EWA projection, SH colour), forward and backward.

Fused per Gaussian (``prange`` over Gaussians, each writes only its own row), computed in
float64 internally and stored as float32. They implement exactly the maths of
``project.project_gaussians`` / ``project.sh_to_color``, whose autograd they replace: on two
cores the dozens of small tensor ops (and their autograd graph) cost more than the rasteriser.

Every constant of the maths (SH basis constants, near/far planes, eps2d, alpha cut-off, box
cap, overflow guard) arrives as an argument, never as a module global: numba freezes globals
into its on-disk cache, so an edited constant would otherwise keep its old value in the
compiled path until the cache was cleared. ``fast.py`` builds these argument arrays.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

CHUNK = 256  # Gaussians per parallel work item (scratch buffers are allocated per chunk)


@njit(cache=True, inline="always")
def _mm(a, b, out):  # pragma: no cover - compiled
    """out = a @ b for tiny matrices (BLAS calls would dominate)."""
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc = 0.0
            for k in range(a.shape[1]):
                acc += a[i, k] * b[k, j]
            out[i, j] = acc


@njit(cache=True, inline="always")
def _mtm(a, b, out):  # pragma: no cover
    """out = a^T @ b."""
    for i in range(a.shape[1]):
        for j in range(b.shape[1]):
            acc = 0.0
            for k in range(a.shape[0]):
                acc += a[k, i] * b[k, j]
            out[i, j] = acc


@njit(cache=True, inline="always")
def _rotmat(qw, qx, qy, qz, r):  # pragma: no cover
    r[0, 0] = 1.0 - 2.0 * (qy * qy + qz * qz)
    r[0, 1] = 2.0 * (qx * qy - qw * qz)
    r[0, 2] = 2.0 * (qx * qz + qw * qy)
    r[1, 0] = 2.0 * (qx * qy + qw * qz)
    r[1, 1] = 1.0 - 2.0 * (qx * qx + qz * qz)
    r[1, 2] = 2.0 * (qy * qz - qw * qx)
    r[2, 0] = 2.0 * (qx * qz - qw * qy)
    r[2, 1] = 2.0 * (qy * qz + qw * qx)
    r[2, 2] = 1.0 - 2.0 * (qx * qx + qy * qy)


@njit(cache=True, inline="always")
def _rotmat_vjp(qw, qx, qy, qz, v):  # pragma: no cover
    """Gradient w.r.t. (w, x, y, z) of sum(v * rotmat(q)), q taken as already normalised."""
    g_w = -qz * v[0, 1] + qy * v[0, 2] + qz * v[1, 0] - qx * v[1, 2]
    g_w += -qy * v[2, 0] + qx * v[2, 1]
    g_x = qy * v[0, 1] + qz * v[0, 2] + qy * v[1, 0] - 2.0 * qx * v[1, 1]
    g_x += -qw * v[1, 2] + qz * v[2, 0] + qw * v[2, 1] - 2.0 * qx * v[2, 2]
    g_y = -2.0 * qy * v[0, 0] + qx * v[0, 1] + qw * v[0, 2] + qx * v[1, 0]
    g_y += qz * v[1, 2] - qw * v[2, 0] + qz * v[2, 1] - 2.0 * qy * v[2, 2]
    g_z = -2.0 * qz * v[0, 0] - qw * v[0, 1] + qx * v[0, 2] + qw * v[1, 0]
    g_z += -2.0 * qz * v[1, 1] + qy * v[1, 2] + qx * v[2, 0] + qy * v[2, 1]
    return 2.0 * g_w, 2.0 * g_x, 2.0 * g_y, 2.0 * g_z


@njit(cache=True, inline="always")
def _cam_cov(quat, log_scale, max_log_scale, rw, rq, s, wm, sc):  # pragma: no cover
    """Fills R_q, scales, W R_q S and the camera covariance; returns the normalised quat."""
    q0 = np.float64(quat[0])
    q1 = np.float64(quat[1])
    q2 = np.float64(quat[2])
    q3 = np.float64(quat[3])
    n = max(math.sqrt(q0 * q0 + q1 * q1 + q2 * q2 + q3 * q3), 1e-12)
    qw, qx, qy, qz = q0 / n, q1 / n, q2 / n, q3 / n
    _rotmat(qw, qx, qy, qz, rq)
    for j in range(3):
        s[j] = math.exp(min(np.float64(log_scale[j]), max_log_scale))
    for i in range(3):
        for j in range(3):
            acc = 0.0
            for k in range(3):
                acc += rw[i, k] * rq[k, j]
            wm[i, j] = acc * s[j]
    for i in range(3):
        for j in range(3):
            acc = 0.0
            for k in range(3):
                acc += wm[i, k] * wm[j, k]
            sc[i, j] = acc
    return n, qw, qx, qy, qz


@njit(cache=True, inline="always")
def _jacobian(x, y, z, fx, fy, lims, j):  # pragma: no cover
    """Fills the perspective Jacobian with x/z, y/z clamped; returns tx, ty and the clamp flags."""
    rx = x / z
    ry = y / z
    cl_x = 0
    cl_y = 0
    if rx < -lims[1]:
        rx, cl_x = -lims[1], 1
    elif rx > lims[0]:
        rx, cl_x = lims[0], 1
    if ry < -lims[3]:
        ry, cl_y = -lims[3], 1
    elif ry > lims[2]:
        ry, cl_y = lims[2], 1
    tx = rx * z if cl_x else x
    ty = ry * z if cl_y else y
    j[0, 0] = fx / z
    j[0, 1] = 0.0
    j[0, 2] = -fx * tx / (z * z)
    j[1, 0] = 0.0
    j[1, 1] = fy / z
    j[1, 2] = -fy * ty / (z * z)
    return tx, ty, cl_x, cl_y


@njit(cache=True, inline="always")
def _lims(width, height, fx, fy, cx, cy):  # pragma: no cover
    """Clamp limits (x+, x-, y+, y-) of x/z, y/z: the image extent plus 0.3x the half FOV."""
    tan_x = 0.5 * width / fx
    tan_y = 0.5 * height / fy
    lims = np.empty(4)
    lims[0] = (width - cx) / fx + 0.3 * tan_x
    lims[1] = cx / fx + 0.3 * tan_x
    lims[2] = (height - cy) / fy + 0.3 * tan_y
    lims[3] = cy / fy + 0.3 * tan_y
    return lims


@njit(cache=True, inline="always")
def _cam_point(means, i, rw, tw):  # pragma: no cover
    m0 = np.float64(means[i, 0])
    m1 = np.float64(means[i, 1])
    m2 = np.float64(means[i, 2])
    x = rw[0, 0] * m0 + rw[0, 1] * m1 + rw[0, 2] * m2 + tw[0]
    y = rw[1, 0] * m0 + rw[1, 1] * m1 + rw[1, 2] * m2 + tw[1]
    z = rw[2, 0] * m0 + rw[2, 1] * m1 + rw[2, 2] * m2 + tw[2]
    return x, y, z


# Layout of the ``opts`` float64 array of the projection kernels (built by ``fast.proj_opts``).
O_NEAR, O_FAR, O_EPS2D, O_RCLIP, O_AA, O_ALPHA_MIN, O_EXTEND, O_MAX_SIGMA, O_MAX_LOGS = range(9)
N_OPTS = 9


@njit(cache=True, inline="always")
def _cov2d(j, sc, js):  # pragma: no cover
    """Undilated 2D covariance (a, b, c) = J Sigma_cam J^T."""
    _mm(j, sc, js)
    a = js[0, 0] * j[0, 0] + js[0, 1] * j[0, 1] + js[0, 2] * j[0, 2]
    b = js[0, 0] * j[1, 0] + js[0, 1] * j[1, 1] + js[0, 2] * j[1, 2]
    c = js[1, 0] * j[1, 0] + js[1, 1] * j[1, 1] + js[1, 2] * j[1, 2]
    return a, b, c


@njit(cache=True, inline="always")
def _cov_ok(a0, b, c0, opts):  # pragma: no cover
    """Overflow guard: False for a non-finite or absurdly large 2D covariance."""
    mv = opts[O_MAX_SIGMA] * opts[O_MAX_SIGMA]
    return a0 <= mv and c0 <= mv and abs(b) <= mv


@njit(parallel=True, cache=True)
def project_forward(
    means, quats, log_scales, opacities, w2c, intr, width, height, opts
):  # pragma: no cover
    """means2d [N,2], conics [N,3], depths [N], extents [N,2] int32 (0 = culled), comps [N].

    ``opacities`` [N] make the boxes opacity-aware (an empty array: 3.33-sigma boxes).
    """
    n = means.shape[0]
    means2d = np.zeros((n, 2), dtype=np.float32)
    conics = np.zeros((n, 3), dtype=np.float32)
    depths = np.ones(n, dtype=np.float32)
    extents = np.zeros((n, 2), dtype=np.int32)
    comps = np.ones(n, dtype=np.float32)
    rw = w2c[:3, :3].astype(np.float64)
    tw = w2c[:3, 3].astype(np.float64)
    fx, fy, cx, cy = intr[0], intr[1], intr[2], intr[3]
    lims = _lims(width, height, fx, fy, cx, cy)
    near, far, eps2d, rclip = opts[O_NEAR], opts[O_FAR], opts[O_EPS2D], opts[O_RCLIP]
    aa = opts[O_AA] > 0.0
    has_op = opacities.shape[0] == n
    n_chunks = (n + CHUNK - 1) // CHUNK
    for chunk in prange(n_chunks):
        rq = np.empty((3, 3))
        sv = np.empty(3)
        wm = np.empty((3, 3))
        sc = np.empty((3, 3))
        j = np.empty((2, 3))
        js = np.empty((2, 3))
        for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, n)):
            x, y, z = _cam_point(means, i, rw, tw)
            if not (z >= near and z <= far):
                continue
            depths[i] = z
            _cam_cov(quats[i], log_scales[i], opts[O_MAX_LOGS], rw, rq, sv, wm, sc)
            _jacobian(x, y, z, fx, fy, lims, j)
            a0, b, c0 = _cov2d(j, sc, js)
            u = fx * x / z + cx
            v = fy * y / z + cy
            means2d[i, 0] = u
            means2d[i, 1] = v
            if not _cov_ok(a0, b, c0, opts):
                continue
            a = a0 + eps2d
            c = c0 + eps2d
            det = a * c - b * b
            if not det > 0.0:
                continue
            conics[i, 0] = c / det
            conics[i, 1] = -b / det
            conics[i, 2] = a / det
            comp = 1.0
            if aa:
                det0 = a0 * c0 - b * b
                comp = math.sqrt(det0 / det) if det0 > 0.0 else 0.0
                comps[i] = comp
            ext = opts[O_EXTEND]
            if has_op:
                op = np.float64(opacities[i]) * comp
                if not op >= opts[O_ALPHA_MIN]:
                    continue
                ext = min(ext, math.sqrt(2.0 * math.log(op / opts[O_ALPHA_MIN])))
            rx = math.ceil(ext * math.sqrt(a))
            ry = math.ceil(ext * math.sqrt(c))
            if rx <= rclip and ry <= rclip:
                continue
            uf = np.float32(u)
            vf = np.float32(v)
            rxf = np.float32(rx)
            ryf = np.float32(ry)
            if uf + rxf > 0 and uf - rxf < width and vf + ryf > 0 and vf - ryf < height:
                extents[i, 0] = rx
                extents[i, 1] = ry
    return means2d, conics, depths, extents, comps


@njit(parallel=True, cache=True)
def project_backward(
    means,
    quats,
    log_scales,
    w2c,
    intr,
    width,
    height,
    opts,
    extents,
    v_means2d,
    v_conics,
    v_depths,
    v_comps,
):  # pragma: no cover
    """Gradients w.r.t. means, quats, log_scales (zero for culled Gaussians), the 3x4 top of
    world_to_cam and the intrinsics (fx, fy, cx, cy), the last two summed per chunk and then
    in chunk order (deterministic whatever the thread count)."""
    n = means.shape[0]
    v_means = np.zeros((n, 3), dtype=np.float32)
    v_quats = np.zeros((n, 4), dtype=np.float32)
    v_logs = np.zeros((n, 3), dtype=np.float32)
    rw = w2c[:3, :3].astype(np.float64)
    tw = w2c[:3, 3].astype(np.float64)
    fx, fy, cx, cy = intr[0], intr[1], intr[2], intr[3]
    lims = _lims(width, height, fx, fy, cx, cy)
    eps2d = opts[O_EPS2D]
    aa = opts[O_AA] > 0.0
    n_chunks = (n + CHUNK - 1) // CHUNK
    cam_acc = np.zeros((n_chunks, 16))  # per chunk: v_W (9), v_t (3), v_fx, v_fy, v_cx, v_cy
    for chunk in prange(n_chunks):
        rq = np.empty((3, 3))
        sv = np.empty(3)
        wm = np.empty((3, 3))
        sc = np.empty((3, 3))
        j = np.empty((2, 3))
        js = np.empty((2, 3))
        g = np.empty((2, 2))
        gj = np.empty((2, 3))
        v_sc = np.empty((3, 3))
        v_j = np.empty((2, 3))
        tmp = np.empty((3, 3))
        v_sig = np.empty((3, 3))
        mm = np.empty((3, 3))
        v_m = np.empty((3, 3))
        t33 = np.empty((3, 3))
        acc = cam_acc[chunk]
        for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, n)):
            if extents[i, 0] == 0:
                continue
            x, y, z = _cam_point(means, i, rw, tw)
            qn, qw, qx, qy, qz = _cam_cov(
                quats[i], log_scales[i], opts[O_MAX_LOGS], rw, rq, sv, wm, sc
            )
            tx, ty, cl_x, cl_y = _jacobian(x, y, z, fx, fy, lims, j)
            a0, b, c0 = _cov2d(j, sc, js)
            a = a0 + eps2d
            c = c0 + eps2d
            det = a * c - b * b
            d2 = det * det
            va_ = np.float64(v_conics[i, 0])
            vb_ = np.float64(v_conics[i, 1])
            vc_ = np.float64(v_conics[i, 2])
            # conic (A, B, C) = (c, -b, a) / det  ->  gradient w.r.t. the 2D covariance
            v_a = (-c * c * va_ + b * c * vb_ - b * b * vc_) / d2
            v_b = (2.0 * b * c * va_ - (a * c + b * b) * vb_ + 2.0 * a * b * vc_) / d2
            v_c = (-b * b * va_ + a * b * vb_ - a * a * vc_) / d2
            if aa:
                det0 = a0 * c0 - b * b
                if det0 > 0.0:
                    # comp = sqrt(det0 / det), det0 = (a - e)(c - e) - b^2, det = ac - b^2
                    comp = math.sqrt(det0 / det)
                    k = np.float64(v_comps[i]) * 0.5 / (comp * d2)
                    v_a += k * (c0 * det - det0 * c)
                    v_c += k * (a0 * det - det0 * a)
                    v_b += k * 2.0 * b * (det0 - det)
            g[0, 0] = v_a  # as a symmetric matrix (b appears twice)
            g[0, 1] = 0.5 * v_b
            g[1, 0] = 0.5 * v_b
            g[1, 1] = v_c
            _mm(g, j, gj)
            _mtm(j, gj, v_sc)  # d/dSigma_cam = J^T G J
            _mm(gj, sc, v_j)  # d/dJ = 2 G J Sigma_cam (factor 2 applied below)
            _mtm(rw, v_sc, tmp)
            _mm(tmp, rw, v_sig)  # d/dSigma = W^T dSigma_cam W
            for r in range(3):
                for cc in range(3):
                    mm[r, cc] = rq[r, cc] * sv[cc]
            # d/dW through Sigma_cam = W Sigma W^T: 2 dSigma_cam (W M) M^T
            _mm(v_sc, wm, tmp)
            for r in range(3):
                for cc in range(3):
                    s_ = 0.0
                    for k3 in range(3):
                        s_ += tmp[r, k3] * mm[cc, k3]
                    acc[3 * r + cc] += 2.0 * s_
            _mm(v_sig, mm, v_m)  # d/dM = 2 dSigma M (factor 2 applied below)
            for cc in range(3):
                s_ = 0.0
                for r in range(3):
                    s_ += v_m[r, cc] * rq[r, cc]
                v_logs[i, cc] = 2.0 * s_ * sv[cc]
            for r in range(3):
                for cc in range(3):
                    t33[r, cc] = 2.0 * v_m[r, cc] * sv[cc]  # d/dR_q
            g_w, g_x, g_y, g_z = _rotmat_vjp(qw, qx, qy, qz, t33)
            dot = qw * g_w + qx * g_x + qy * g_y + qz * g_z
            v_quats[i, 0] = (g_w - qw * dot) / qn
            v_quats[i, 1] = (g_x - qx * dot) / qn
            v_quats[i, 2] = (g_y - qy * dot) / qn
            v_quats[i, 3] = (g_z - qz * dot) / qn
            # Jacobian -> camera-space position (tx = x unless clamped, then tx = lim * z)
            iz = 1.0 / z
            iz2 = iz * iz
            vj00 = 2.0 * v_j[0, 0]
            vj02 = 2.0 * v_j[0, 2]
            vj11 = 2.0 * v_j[1, 1]
            vj12 = 2.0 * v_j[1, 2]
            v_px = 0.0
            v_py = 0.0
            v_pz = np.float64(v_depths[i])
            v_pz += -fx * iz2 * vj00 - fy * iz2 * vj11
            v_pz += 2.0 * fx * tx * iz2 * iz * vj02 + 2.0 * fy * ty * iz2 * iz * vj12
            v_tx = -fx * iz2 * vj02
            v_ty = -fy * iz2 * vj12
            vu = np.float64(v_means2d[i, 0])
            vv = np.float64(v_means2d[i, 1])
            # intrinsics: J00 = fx/z, J02 = -fx tx/z^2, u = fx x/z + cx (and the clamp limits)
            v_fx = vj00 * iz - vj02 * tx * iz2 + vu * x * iz
            v_fy = vj11 * iz - vj12 * ty * iz2 + vv * y * iz
            v_cx = vu
            v_cy = vv
            if cl_x:
                v_pz += v_tx * tx * iz
                # tx = lim0 z, lim0 = (1.15W - cx)/fx, or tx = -lim1 z, lim1 = (cx + 0.15W)/fx:
                # both give d tx / d fx = -tx / fx and d tx / d cx = -z / fx
                v_fx += -v_tx * tx / fx
                v_cx += -v_tx * z / fx
            else:
                v_px += v_tx
            if cl_y:
                v_pz += v_ty * ty * iz
                v_fy += -v_ty * ty / fy
                v_cy += -v_ty * z / fy
            else:
                v_py += v_ty
            v_px += fx * iz * vu
            v_py += fy * iz * vv
            v_pz += -fx * x * iz2 * vu - fy * y * iz2 * vv
            m0 = np.float64(means[i, 0])
            m1 = np.float64(means[i, 1])
            m2 = np.float64(means[i, 2])
            for r in range(3):
                v_means[i, r] = rw[0, r] * v_px + rw[1, r] * v_py + rw[2, r] * v_pz
            vp0, vp1, vp2 = v_px, v_py, v_pz
            acc[0] += vp0 * m0
            acc[1] += vp0 * m1
            acc[2] += vp0 * m2
            acc[3] += vp1 * m0
            acc[4] += vp1 * m1
            acc[5] += vp1 * m2
            acc[6] += vp2 * m0
            acc[7] += vp2 * m1
            acc[8] += vp2 * m2
            acc[9] += vp0
            acc[10] += vp1
            acc[11] += vp2
            acc[12] += v_fx
            acc[13] += v_fy
            acc[14] += v_cx
            acc[15] += v_cy
    cam = np.zeros(16)
    for chunk in range(n_chunks):
        for k in range(16):
            cam[k] += cam_acc[chunk, k]
    return v_means, v_quats, v_logs, cam


@njit(cache=True, inline="always")
def _sh_basis_and_grad(x, y, z, degree, shc, basis, dbasis):  # pragma: no cover
    """Fill basis[k] and d basis[k] / d(x,y,z) (dbasis[k, :]) for k < (degree+1)^2.

    ``shc`` = (C0, C1, C2[0..4], C3[0..6]), the constants of ``assets.gaussians``.
    """
    SH_C0 = shc[0]
    SH_C1 = shc[1]
    C20, C21, C22, C23, C24 = shc[2], shc[3], shc[4], shc[5], shc[6]
    C30, C31, C32, C33, C34 = shc[7], shc[8], shc[9], shc[10], shc[11]
    C35, C36 = shc[12], shc[13]
    basis[0] = SH_C0
    dbasis[0, 0] = 0.0
    dbasis[0, 1] = 0.0
    dbasis[0, 2] = 0.0
    if degree < 1:
        return
    basis[1] = -SH_C1 * y
    basis[2] = SH_C1 * z
    basis[3] = -SH_C1 * x
    dbasis[1:4, :] = 0.0
    dbasis[1, 1] = -SH_C1
    dbasis[2, 2] = SH_C1
    dbasis[3, 0] = -SH_C1
    if degree < 2:
        return
    xx, yy, zz = x * x, y * y, z * z
    basis[4] = C20 * x * y
    basis[5] = C21 * y * z
    basis[6] = C22 * (2.0 * zz - xx - yy)
    basis[7] = C23 * x * z
    basis[8] = C24 * (xx - yy)
    dbasis[4, 0], dbasis[4, 1], dbasis[4, 2] = C20 * y, C20 * x, 0.0
    dbasis[5, 0], dbasis[5, 1], dbasis[5, 2] = 0.0, C21 * z, C21 * y
    dbasis[6, 0], dbasis[6, 1], dbasis[6, 2] = -2.0 * C22 * x, -2.0 * C22 * y, 4.0 * C22 * z
    dbasis[7, 0], dbasis[7, 1], dbasis[7, 2] = C23 * z, 0.0, C23 * x
    dbasis[8, 0], dbasis[8, 1], dbasis[8, 2] = 2.0 * C24 * x, -2.0 * C24 * y, 0.0
    if degree < 3:
        return
    basis[9] = C30 * y * (3.0 * xx - yy)
    basis[10] = C31 * x * y * z
    basis[11] = C32 * y * (4.0 * zz - xx - yy)
    basis[12] = C33 * z * (2.0 * zz - 3.0 * xx - 3.0 * yy)
    basis[13] = C34 * x * (4.0 * zz - xx - yy)
    basis[14] = C35 * z * (xx - yy)
    basis[15] = C36 * x * (xx - 3.0 * yy)
    dbasis[9, 0], dbasis[9, 1], dbasis[9, 2] = C30 * 6.0 * x * y, C30 * 3.0 * (xx - yy), 0.0
    dbasis[10, 0], dbasis[10, 1], dbasis[10, 2] = C31 * y * z, C31 * x * z, C31 * x * y
    dbasis[11, 0] = -2.0 * C32 * x * y
    dbasis[11, 1] = C32 * (4.0 * zz - xx - 3.0 * yy)
    dbasis[11, 2] = 8.0 * C32 * y * z
    dbasis[12, 0] = -6.0 * C33 * x * z
    dbasis[12, 1] = -6.0 * C33 * y * z
    dbasis[12, 2] = C33 * (6.0 * zz - 3.0 * xx - 3.0 * yy)
    dbasis[13, 0] = C34 * (4.0 * zz - 3.0 * xx - yy)
    dbasis[13, 1] = -2.0 * C34 * x * y
    dbasis[13, 2] = 8.0 * C34 * x * z
    dbasis[14, 0], dbasis[14, 1], dbasis[14, 2] = (
        2.0 * C35 * x * z,
        -2.0 * C35 * y * z,
        C35 * (xx - yy),
    )
    dbasis[15, 0], dbasis[15, 1], dbasis[15, 2] = C36 * 3.0 * (xx - yy), -6.0 * C36 * x * y, 0.0


@njit(parallel=True, cache=True)
def sh_forward(means, sh, campos, degree, shc, visible):  # pragma: no cover
    """RGB [N,3] = max(SH(dir) + 0.5, 0), dir = normalised (mean - camera centre).

    Only for ``visible[i]`` (culled Gaussians are never composited: their colour is 0).
    """
    n = means.shape[0]
    kk = (degree + 1) ** 2
    out = np.empty((n, 3), dtype=np.float32)
    n_chunks = (n + CHUNK - 1) // CHUNK
    for chunk in prange(n_chunks):
        basis = np.empty(16)
        dbasis = np.empty((16, 3))
        for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, n)):
            if not visible[i]:
                out[i, 0] = 0.0
                out[i, 1] = 0.0
                out[i, 2] = 0.0
                continue
            dx = means[i, 0] - campos[0]
            dy = means[i, 1] - campos[1]
            dz = means[i, 2] - campos[2]
            nrm = max(math.sqrt(dx * dx + dy * dy + dz * dz), 1e-12)
            _sh_basis_and_grad(dx / nrm, dy / nrm, dz / nrm, degree, shc, basis, dbasis)
            for ch in range(3):
                acc = 0.0
                for k in range(kk):
                    acc += basis[k] * sh[i, k, ch]
                out[i, ch] = max(acc + 0.5, 0.0)
    return out


@njit(parallel=True, cache=True)
def sh_backward(means, sh, campos, degree, shc, visible, v_colors):  # pragma: no cover
    """Gradients w.r.t. sh [N,K,3] (only the used bands) and means (through the direction);
    zero for Gaussians that are not ``visible``. One pass over the bands per Gaussian, all
    three channels at once (a clamped channel contributes nothing)."""
    n = means.shape[0]
    kk = (degree + 1) ** 2
    v_sh = np.zeros(sh.shape, dtype=np.float32)
    v_means = np.zeros((n, 3), dtype=np.float32)
    n_chunks = (n + CHUNK - 1) // CHUNK
    for chunk in prange(n_chunks):
        basis = np.empty(16)
        dbasis = np.empty((16, 3))
        for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, n)):
            if not visible[i]:
                continue
            dx = means[i, 0] - campos[0]
            dy = means[i, 1] - campos[1]
            dz = means[i, 2] - campos[2]
            nrm = max(math.sqrt(dx * dx + dy * dy + dz * dz), 1e-12)
            ux, uy, uz = dx / nrm, dy / nrm, dz / nrm
            _sh_basis_and_grad(ux, uy, uz, degree, shc, basis, dbasis)
            c0 = 0.0
            c1 = 0.0
            c2 = 0.0
            for k in range(kk):
                c0 += basis[k] * sh[i, k, 0]
                c1 += basis[k] * sh[i, k, 1]
                c2 += basis[k] * sh[i, k, 2]
            # a clamped channel (colour + 0.5 < 0) has no gradient
            v0 = np.float64(v_colors[i, 0]) if c0 + 0.5 >= 0.0 else 0.0
            v1 = np.float64(v_colors[i, 1]) if c1 + 0.5 >= 0.0 else 0.0
            v2 = np.float64(v_colors[i, 2]) if c2 + 0.5 >= 0.0 else 0.0
            gx = 0.0
            gy = 0.0
            gz = 0.0
            for k in range(kk):
                b = basis[k]
                v_sh[i, k, 0] = b * v0
                v_sh[i, k, 1] = b * v1
                v_sh[i, k, 2] = b * v2
                w = sh[i, k, 0] * v0 + sh[i, k, 1] * v1 + sh[i, k, 2] * v2
                gx += dbasis[k, 0] * w
                gy += dbasis[k, 1] * w
                gz += dbasis[k, 2] * w
            if degree > 0:
                dot = ux * gx + uy * gy + uz * gz
                v_means[i, 0] = (gx - ux * dot) / nrm
                v_means[i, 1] = (gy - uy * dot) / nrm
                v_means[i, 2] = (gz - uz * dot) / nrm
    return v_sh, v_means
