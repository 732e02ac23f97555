"""numba kernels of the per-Gaussian stages (EWA projection, SH colour), forward and backward.

Fused per Gaussian (``prange`` over Gaussians, each writes only its own row), computed in
float64 internally and stored as float32. The projection's per-Gaussian maths is written on
scalars (tuples of a rotation, of U = J W R S, ...), which LLVM keeps in registers, and takes
the shortest route to the 2D covariance (U U^T with U 2x3, as the reference); the backward
pass runs the chain rule through the same factors. They implement exactly the maths of
``project.project_gaussians`` / ``project.sh_to_color``, whose autograd they replace: on two
cores the dozens of small tensor ops (and their autograd graph) cost more than the rasteriser.

Every constant of the maths (SH basis constants, near/far planes, eps2d, alpha cut-off, box
cap, overflow guard) arrives as an argument, never as a module global: numba freezes globals
into its on-disk cache, so an edited constant would otherwise keep its old value in the
compiled path until the cache was cleared. ``numba_backend.py`` builds these argument arrays.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

# Gaussians per parallel work item: per-chunk scratch buffers (SH), one function call per
# chunk (projection), per-chunk camera-gradient partial sums (summed in chunk order)
CHUNK = 256


@njit(cache=True, inline="always")
def _rotmat_vjp(qw, qx, qy, qz, v):  # pragma: no cover
    """Gradient w.r.t. (w, x, y, z) of sum(v * rotmat(q)), q taken as already normalised;
    ``v`` the 9 entries of a 3x3 matrix, row-major."""
    v00, v01, v02, v10, v11, v12, v20, v21, v22 = v
    g_w = -qz * v01 + qy * v02 + qz * v10 - qx * v12 - qy * v20 + qx * v21
    g_x = qy * v01 + qz * v02 + qy * v10 - 2.0 * qx * v11
    g_x += -qw * v12 + qz * v20 + qw * v21 - 2.0 * qx * v22
    g_y = -2.0 * qy * v00 + qx * v01 + qw * v02 + qx * v10
    g_y += qz * v12 - qw * v20 + qz * v21 - 2.0 * qy * v22
    g_z = -2.0 * qz * v00 - qw * v01 + qx * v02 + qw * v10
    g_z += -2.0 * qz * v11 + qy * v12 + qx * v20 + qy * v21
    return 2.0 * g_w, 2.0 * g_x, 2.0 * g_y, 2.0 * g_z


@njit(cache=True)
def camera_array(w2c, intr, width, height):  # pragma: no cover
    """The camera as one float64 array: W (9, row-major), t (3), fx, fy, cx, cy, and the
    clamp limits (x+, x-, y+, y-) of x/z, y/z: the image extent plus 0.3x the half FOV."""
    cam = np.empty(20)
    for r in range(3):
        for c in range(3):
            cam[3 * r + c] = w2c[r, c]
        cam[9 + r] = w2c[r, 3]
    fx, fy, cx, cy = intr[0], intr[1], intr[2], intr[3]
    cam[12], cam[13], cam[14], cam[15] = fx, fy, cx, cy
    tan_x = 0.5 * width / fx
    tan_y = 0.5 * height / fy
    cam[16] = (width - cx) / fx + 0.3 * tan_x
    cam[17] = cx / fx + 0.3 * tan_x
    cam[18] = (height - cy) / fy + 0.3 * tan_y
    cam[19] = cy / fy + 0.3 * tan_y
    return cam


@njit(cache=True, inline="always")
def _as_tuple(w):  # pragma: no cover
    """The ``camera_array`` as a tuple: kept in registers, not reloaded after every store."""
    return (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9],
            w[10], w[11], w[12], w[13], w[14], w[15], w[16], w[17], w[18], w[19])  # fmt: skip


@njit(cache=True, inline="always")
def _cam_point(means, i, w):  # pragma: no cover
    """Camera-space position (x, y, z) of Gaussian ``i`` (``w``: ``camera_array``)."""
    m0 = np.float64(means[i, 0])
    m1 = np.float64(means[i, 1])
    m2 = np.float64(means[i, 2])
    x = w[0] * m0 + w[1] * m1 + w[2] * m2 + w[9]
    y = w[3] * m0 + w[4] * m1 + w[5] * m2 + w[10]
    z = w[6] * m0 + w[7] * m1 + w[8] * m2 + w[11]
    return x, y, z


@njit(cache=True, inline="always")
def _gaussian_2d(quats, log_scales, i, x, y, z, w, max_log_scale):  # pragma: no cover
    """Everything of Gaussian ``i``'s EWA projection, as scalars (kept in registers); ``w``
    is the ``camera_array``.

    Returns the normalised quaternion (norm, w, x, y, z), R_q (9), the scales (3), the
    Jacobian entries (J00, J02, J11, J12), tx, ty and the clamp flags, U = J W R_q S (2x3,
    6 entries) and the undilated 2D covariance (a, b, c) = U U^T.
    """
    fx, fy = w[12], w[13]
    q0 = np.float64(quats[i, 0])
    q1 = np.float64(quats[i, 1])
    q2 = np.float64(quats[i, 2])
    q3 = np.float64(quats[i, 3])
    qn = max(math.sqrt(q0 * q0 + q1 * q1 + q2 * q2 + q3 * q3), 1e-12)
    iq = 1.0 / qn  # one division (each costs as much as a dozen multiplications)
    qw, qx, qy, qz = q0 * iq, q1 * iq, q2 * iq, q3 * iq
    r = (
        1.0 - 2.0 * (qy * qy + qz * qz), 2.0 * (qx * qy - qw * qz), 2.0 * (qx * qz + qw * qy),
        2.0 * (qx * qy + qw * qz), 1.0 - 2.0 * (qx * qx + qz * qz), 2.0 * (qy * qz - qw * qx),
        2.0 * (qx * qz - qw * qy), 2.0 * (qy * qz + qw * qx), 1.0 - 2.0 * (qx * qx + qy * qy),
    )  # fmt: skip
    s0 = math.exp(min(np.float64(log_scales[i, 0]), max_log_scale))
    s1 = math.exp(min(np.float64(log_scales[i, 1]), max_log_scale))
    s2 = math.exp(min(np.float64(log_scales[i, 2]), max_log_scale))
    # perspective Jacobian with x/z, y/z clamped (tx = x unless clamped, then tx = lim * z)
    iz = 1.0 / z
    rx = x * iz
    ry = y * iz
    cl_x = rx < -w[17] or rx > w[16]
    cl_y = ry < -w[19] or ry > w[18]
    tx = min(max(rx, -w[17]), w[16]) * z if cl_x else x
    ty = min(max(ry, -w[19]), w[18]) * z if cl_y else y
    j00 = fx * iz
    j02 = -fx * tx * iz * iz
    j11 = fy * iz
    j12 = -fy * ty * iz * iz
    # T = J W (2x3), then U = T R_q S
    t00 = j00 * w[0] + j02 * w[6]
    t01 = j00 * w[1] + j02 * w[7]
    t02 = j00 * w[2] + j02 * w[8]
    t10 = j11 * w[3] + j12 * w[6]
    t11 = j11 * w[4] + j12 * w[7]
    t12 = j11 * w[5] + j12 * w[8]
    u00 = (t00 * r[0] + t01 * r[3] + t02 * r[6]) * s0
    u01 = (t00 * r[1] + t01 * r[4] + t02 * r[7]) * s1
    u02 = (t00 * r[2] + t01 * r[5] + t02 * r[8]) * s2
    u10 = (t10 * r[0] + t11 * r[3] + t12 * r[6]) * s0
    u11 = (t10 * r[1] + t11 * r[4] + t12 * r[7]) * s1
    u12 = (t10 * r[2] + t11 * r[5] + t12 * r[8]) * s2
    a0 = u00 * u00 + u01 * u01 + u02 * u02
    b = u00 * u10 + u01 * u11 + u02 * u12
    c0 = u10 * u10 + u11 * u11 + u12 * u12
    return (
        (qn, qw, qx, qy, qz),
        r,
        (s0, s1, s2),
        (j00, j02, j11, j12, tx, ty, cl_x, cl_y),
        (u00, u01, u02, u10, u11, u12),
        (a0, b, c0),
    )


# Layout of the ``opts`` float64 array of the projection kernels (built by ``fast.proj_opts``).
O_NEAR, O_FAR, O_EPS2D, O_RCLIP, O_AA, O_ALPHA_MIN, O_EXTEND, O_MAX_SIGMA, O_MAX_LOGS = range(9)
N_OPTS = 9


@njit(cache=True, inline="always")
def _cov_ok(a0, b, c0, opts):  # pragma: no cover
    """Overflow guard: False for a non-finite or absurdly large 2D covariance."""
    mv = opts[O_MAX_SIGMA] * opts[O_MAX_SIGMA]
    return a0 <= mv and c0 <= mv and abs(b) <= mv


@njit(cache=True, inline="always")
def _project_one(
    i, means, quats, log_scales, opacities, w, width, height, opts, out
):  # pragma: no cover
    """Project Gaussian ``i`` into ``out`` = (means2d, conics, depths, extents, comps)."""
    means2d, conics, depths, extents, comps = out
    x, y, z = _cam_point(means, i, w)
    if not (z >= opts[O_NEAR] and z <= opts[O_FAR]):
        return
    depths[i] = z
    a0, b, c0 = _gaussian_2d(quats, log_scales, i, x, y, z, w, opts[O_MAX_LOGS])[5]
    iz = 1.0 / z  # the same value as in _gaussian_2d (LLVM computes it once)
    u = w[12] * x * iz + w[14]
    v = w[13] * y * iz + w[15]
    means2d[i, 0] = u
    means2d[i, 1] = v
    if not _cov_ok(a0, b, c0, opts):
        return
    a = a0 + opts[O_EPS2D]
    c = c0 + opts[O_EPS2D]
    det = a * c - b * b
    if not det > 0.0:
        return
    idet = 1.0 / det
    conics[i, 0] = c * idet
    conics[i, 1] = -b * idet
    conics[i, 2] = a * idet
    comp = 1.0
    if opts[O_AA] > 0.0:
        det0 = a0 * c0 - b * b
        comp = math.sqrt(det0 / det) if det0 > 0.0 else 0.0
        comps[i] = comp
    ext = opts[O_EXTEND]
    if opacities.shape[0] == means.shape[0]:
        op = np.float64(opacities[i]) * comp
        if not op >= opts[O_ALPHA_MIN]:
            return
        ext = min(ext, math.sqrt(2.0 * math.log(op / opts[O_ALPHA_MIN])))
    rx = math.ceil(ext * math.sqrt(a))
    ry = math.ceil(ext * math.sqrt(c))
    if rx <= opts[O_RCLIP] and ry <= opts[O_RCLIP]:
        return
    uf = np.float32(u)
    vf = np.float32(v)
    rxf = np.float32(rx)
    ryf = np.float32(ry)
    if uf + rxf > 0 and uf - rxf < width and vf + ryf > 0 and vf - ryf < height:
        extents[i, 0] = rx
        extents[i, 1] = ry


@njit(cache=True)
def _project_chunk(
    chunk, means, quats, log_scales, opacities, w, width, height, opts, out
):  # pragma: no cover
    """``_project_one`` over one chunk of Gaussians. The ``prange`` loops call a plain
    function per chunk, not the per-Gaussian code: numba's parfor array analysis mistakes
    the tuples of ``_gaussian_2d`` for array shapes, and a call per Gaussian would cost more
    than the maths."""
    wt = _as_tuple(w)
    for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, means.shape[0])):
        _project_one(i, means, quats, log_scales, opacities, wt, width, height, opts, out)


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
    w = camera_array(w2c, intr, width, height)
    out = (means2d, conics, depths, extents, comps)
    for chunk in prange((n + CHUNK - 1) // CHUNK):
        _project_chunk(chunk, means, quats, log_scales, opacities, w, width, height, opts, out)
    return means2d, conics, depths, extents, comps


@njit(cache=True, inline="always")
def _project_one_bwd(
    i, means, quats, log_scales, w, opts, grads_in, grads_out, acc, want_cam
):  # pragma: no cover
    """Gradients of Gaussian ``i`` (``grads_in`` = d/d(means2d, conics, depths, comps)) into
    ``grads_out`` = (v_means, v_quats, v_logs); if ``want_cam``, adds its camera gradient to
    ``acc`` [16]."""
    v_means2d, v_conics, v_depths, v_comps = grads_in
    v_means, v_quats, v_logs = grads_out
    fx, fy = w[12], w[13]
    eps2d = opts[O_EPS2D]
    aa = opts[O_AA] > 0.0
    x, y, z = _cam_point(means, i, w)
    qv, r, sv, jac, uu, cov = _gaussian_2d(quats, log_scales, i, x, y, z, w, opts[O_MAX_LOGS])
    qn, qw, qx, qy, qz = qv
    s0, s1, s2 = sv
    j00, j02, j11, j12, tx, ty, cl_x, cl_y = jac
    u00, u01, u02, u10, u11, u12 = uu
    a0, b, c0 = cov
    a = a0 + eps2d
    c = c0 + eps2d
    det = a * c - b * b
    d2 = det * det
    va_ = np.float64(v_conics[i, 0])
    vb_ = np.float64(v_conics[i, 1])
    vc_ = np.float64(v_conics[i, 2])
    # conic (A, B, C) = (c, -b, a) / det  ->  gradient w.r.t. the 2D covariance
    id2 = 1.0 / d2
    v_a = (-c * c * va_ + b * c * vb_ - b * b * vc_) * id2
    v_b = (2.0 * b * c * va_ - (a * c + b * b) * vb_ + 2.0 * a * b * vc_) * id2
    v_c = (-b * b * va_ + a * b * vb_ - a * a * vc_) * id2
    if aa:
        det0 = a0 * c0 - b * b
        if det0 > 0.0:
            # comp = sqrt(det0 / det), det0 = (a - e)(c - e) - b^2, det = ac - b^2
            comp = math.sqrt(det0 / det)
            kk = np.float64(v_comps[i]) * 0.5 / (comp * d2)
            v_a += kk * (c0 * det - det0 * c)
            v_c += kk * (a0 * det - det0 * a)
            v_b += kk * 2.0 * b * (det0 - det)
    # cov = U U^T with G = [[v_a, v_b/2], [v_b/2, v_c]]: d/dU = V = 2 G U
    g01 = 0.5 * v_b
    v00 = 2.0 * (v_a * u00 + g01 * u10)
    v01 = 2.0 * (v_a * u01 + g01 * u11)
    v02 = 2.0 * (v_a * u02 + g01 * u12)
    v10 = 2.0 * (g01 * u00 + v_c * u10)
    v11 = 2.0 * (g01 * u01 + v_c * u11)
    v12 = 2.0 * (g01 * u02 + v_c * u12)
    # U = T A, T = J W, A = R_q S: d/dA = T^T V, d/dT = V A^T
    t00 = j00 * w[0] + j02 * w[6]
    t01 = j00 * w[1] + j02 * w[7]
    t02 = j00 * w[2] + j02 * w[8]
    t10 = j11 * w[3] + j12 * w[6]
    t11 = j11 * w[4] + j12 * w[7]
    t12 = j11 * w[5] + j12 * w[8]
    da = (
        t00 * v00 + t10 * v10, t00 * v01 + t10 * v11, t00 * v02 + t10 * v12,
        t01 * v00 + t11 * v10, t01 * v01 + t11 * v11, t01 * v02 + t11 * v12,
        t02 * v00 + t12 * v10, t02 * v01 + t12 * v11, t02 * v02 + t12 * v12,
    )  # fmt: skip
    v_logs[i, 0] = (da[0] * r[0] + da[3] * r[3] + da[6] * r[6]) * s0
    v_logs[i, 1] = (da[1] * r[1] + da[4] * r[4] + da[7] * r[7]) * s1
    v_logs[i, 2] = (da[2] * r[2] + da[5] * r[5] + da[8] * r[8]) * s2
    v_r = (
        da[0] * s0, da[1] * s1, da[2] * s2,
        da[3] * s0, da[4] * s1, da[5] * s2,
        da[6] * s0, da[7] * s1, da[8] * s2,
    )  # fmt: skip
    g_w, g_x, g_y, g_z = _rotmat_vjp(qw, qx, qy, qz, v_r)
    dot = qw * g_w + qx * g_x + qy * g_y + qz * g_z
    iq = 1.0 / qn
    v_quats[i, 0] = (g_w - qw * dot) * iq
    v_quats[i, 1] = (g_x - qx * dot) * iq
    v_quats[i, 2] = (g_y - qy * dot) * iq
    v_quats[i, 3] = (g_z - qz * dot) * iq
    # d/dT (A = R_q S, A[r, c] = r[3r + c] s_c), then d/dJ = d/dT W^T
    a_0, a_1, a_2 = r[0] * s0, r[1] * s1, r[2] * s2
    a_3, a_4, a_5 = r[3] * s0, r[4] * s1, r[5] * s2
    a_6, a_7, a_8 = r[6] * s0, r[7] * s1, r[8] * s2
    dt00 = v00 * a_0 + v01 * a_1 + v02 * a_2
    dt01 = v00 * a_3 + v01 * a_4 + v02 * a_5
    dt02 = v00 * a_6 + v01 * a_7 + v02 * a_8
    dt10 = v10 * a_0 + v11 * a_1 + v12 * a_2
    dt11 = v10 * a_3 + v11 * a_4 + v12 * a_5
    dt12 = v10 * a_6 + v11 * a_7 + v12 * a_8
    vj00 = dt00 * w[0] + dt01 * w[1] + dt02 * w[2]
    vj02 = dt00 * w[6] + dt01 * w[7] + dt02 * w[8]
    vj11 = dt10 * w[3] + dt11 * w[4] + dt12 * w[5]
    vj12 = dt10 * w[6] + dt11 * w[7] + dt12 * w[8]
    # Jacobian -> camera-space position
    iz = 1.0 / z
    iz2 = iz * iz
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
    v_means[i, 0] = w[0] * v_px + w[3] * v_py + w[6] * v_pz
    v_means[i, 1] = w[1] * v_px + w[4] * v_py + w[7] * v_pz
    v_means[i, 2] = w[2] * v_px + w[5] * v_py + w[8] * v_pz
    if not want_cam:
        return
    m0 = np.float64(means[i, 0])
    m1 = np.float64(means[i, 1])
    m2 = np.float64(means[i, 2])
    # W: through the position (v_p m^T) and the covariance (J^T d/dT)
    acc[0] += v_px * m0 + j00 * dt00
    acc[1] += v_px * m1 + j00 * dt01
    acc[2] += v_px * m2 + j00 * dt02
    acc[3] += v_py * m0 + j11 * dt10
    acc[4] += v_py * m1 + j11 * dt11
    acc[5] += v_py * m2 + j11 * dt12
    acc[6] += v_pz * m0 + j02 * dt00 + j12 * dt10
    acc[7] += v_pz * m1 + j02 * dt01 + j12 * dt11
    acc[8] += v_pz * m2 + j02 * dt02 + j12 * dt12
    acc[9] += v_px
    acc[10] += v_py
    acc[11] += v_pz
    acc[12] += v_fx
    acc[13] += v_fy
    acc[14] += v_cx
    acc[15] += v_cy


@njit(cache=True)
def _project_bwd_chunk(
    chunk, means, quats, log_scales, w, opts, extents, grads_in, grads_out, acc, want_cam
):  # pragma: no cover
    """``_project_one_bwd`` over the projected Gaussians of one chunk (see ``_project_chunk``)."""
    wt = _as_tuple(w)
    for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, means.shape[0])):
        if extents[i, 0] != 0:
            _project_one_bwd(
                i, means, quats, log_scales, wt, opts, grads_in, grads_out, acc, want_cam
            )


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
    want_cam,
):  # pragma: no cover
    """Gradients w.r.t. means, quats, log_scales (zero for culled Gaussians), and, if
    ``want_cam``, the 3x4 top of world_to_cam and the intrinsics (fx, fy, cx, cy), summed per
    chunk of CHUNK Gaussians and then in chunk order (deterministic whatever the thread
    count)."""
    n = means.shape[0]
    v_means = np.zeros((n, 3), dtype=np.float32)
    v_quats = np.zeros((n, 4), dtype=np.float32)
    v_logs = np.zeros((n, 3), dtype=np.float32)
    w = camera_array(w2c, intr, width, height)
    grads_in = (v_means2d, v_conics, v_depths, v_comps)
    grads_out = (v_means, v_quats, v_logs)
    n_chunks = (n + CHUNK - 1) // CHUNK
    cam_acc = np.zeros((n_chunks, 16))  # per chunk: v_W (9), v_t (3), v_fx, v_fy, v_cx, v_cy
    for chunk in prange(n_chunks):
        _project_bwd_chunk(
            chunk, means, quats, log_scales, w, opts, extents, grads_in, grads_out,
            cam_acc[chunk], want_cam,
        )  # fmt: skip
    cam = np.zeros(16)
    for chunk in range(n_chunks):
        for q in range(16):
            cam[q] += cam_acc[chunk, q]
    return v_means, v_quats, v_logs, cam


@njit(cache=True, inline="always")
def _sh_basis(x, y, z, degree, shc, basis, dbasis, grad):  # pragma: no cover
    """Fill basis[k] and, if ``grad``, d basis[k] / d(x,y,z) (dbasis[k, :]) for
    k < (degree+1)^2. ``grad`` is a literal at each call site: after inlining, the forward
    pass compiles without the derivative.

    ``shc`` = (C0, C1, C2[0..4], C3[0..6]), the constants of ``assets.gaussians``.
    """
    SH_C0 = shc[0]
    SH_C1 = shc[1]
    C20, C21, C22, C23, C24 = shc[2], shc[3], shc[4], shc[5], shc[6]
    C30, C31, C32, C33, C34 = shc[7], shc[8], shc[9], shc[10], shc[11]
    C35, C36 = shc[12], shc[13]
    basis[0] = SH_C0
    if grad:
        dbasis[0, 0] = 0.0
        dbasis[0, 1] = 0.0
        dbasis[0, 2] = 0.0
    if degree < 1:
        return
    basis[1] = -SH_C1 * y
    basis[2] = SH_C1 * z
    basis[3] = -SH_C1 * x
    if grad:
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
    if grad:
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
    if not grad:
        return
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


@njit(cache=True, inline="always")
def _direction(means, i, campos):  # pragma: no cover
    """Unit vector camera centre -> mean of Gaussian ``i``, and the distance (>= 1e-12)."""
    dx = means[i, 0] - campos[0]
    dy = means[i, 1] - campos[1]
    dz = means[i, 2] - campos[2]
    nrm = max(math.sqrt(dx * dx + dy * dy + dz * dz), 1e-12)
    inv = 1.0 / nrm
    return dx * inv, dy * inv, dz * inv, nrm


@njit(cache=True, inline="always")
def _sh_colour(basis, sh, i, kk):  # pragma: no cover
    """The three channels of Gaussian ``i``'s SH expansion over the first ``kk`` basis values
    (before the +0.5 offset and the clamp)."""
    c0 = 0.0
    c1 = 0.0
    c2 = 0.0
    for k in range(kk):
        c0 += basis[k] * sh[i, k, 0]
        c1 += basis[k] * sh[i, k, 1]
        c2 += basis[k] * sh[i, k, 2]
    return c0, c1, c2


@njit(parallel=True, cache=True)
def sh_forward(means, sh, campos, degree, shc, visible):  # pragma: no cover
    """RGB [N,3] = max(SH(dir) + 0.5, 0), dir = normalised (mean - camera centre).

    Only for ``visible[i]`` (culled Gaussians are never composited: their colour is 0).
    """
    n = means.shape[0]
    kk = (degree + 1) ** 2
    out = np.zeros((n, 3), dtype=np.float32)
    n_chunks = (n + CHUNK - 1) // CHUNK
    for chunk in prange(n_chunks):
        basis = np.empty(16)
        dbasis = np.empty((16, 3))  # untouched (grad=False), typed like the backward's
        for i in range(chunk * CHUNK, min((chunk + 1) * CHUNK, n)):
            if not visible[i]:
                continue
            ux, uy, uz, _ = _direction(means, i, campos)
            _sh_basis(ux, uy, uz, degree, shc, basis, dbasis, False)
            c0, c1, c2 = _sh_colour(basis, sh, i, kk)
            out[i, 0] = max(c0 + 0.5, 0.0)
            out[i, 1] = max(c1 + 0.5, 0.0)
            out[i, 2] = max(c2 + 0.5, 0.0)
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
            ux, uy, uz, nrm = _direction(means, i, campos)
            _sh_basis(ux, uy, uz, degree, shc, basis, dbasis, True)
            c0, c1, c2 = _sh_colour(basis, sh, i, kk)
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
                inv = 1.0 / nrm
                v_means[i, 0] = (gx - ux * dot) * inv
                v_means[i, 1] = (gy - uy * dot) * inv
                v_means[i, 2] = (gz - uz * dot) * inv
    return v_sh, v_means
