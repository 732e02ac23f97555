"""PlayCanvas / SuperSplat compressed ``.ply`` (read only), decoded as splat-transform does.

Layout: ``element chunk`` (float bounds per block of 256 Gaussians: ``min_x..max_z``,
``min_scale_x..max_scale_z`` in log-scale, optionally ``min_r..max_b`` colour bounds),
``element vertex`` of four packed uint32 (``packed_position``, ``packed_rotation``,
``packed_scale``, ``packed_color``) and an optional ``element sh`` of uint8 ``f_rest_*``
(channel-major, as in the INRIA layout). Gaussian ``i`` uses chunk ``i // 256``.

- position, log-scale: 11-10-11 bit unorms (x in the top bits) lerped between the chunk bounds;
- rotation: 2 bits naming the largest of (rot_0..rot_3), then the other three in order, each
  10 bits mapping [-1/sqrt2, 1/sqrt2]; the largest is sqrt(1 - sum of squares);
- colour: 8-8-8-8 bits (r in the top byte) giving base colour (lerped between the colour
  bounds when the file has them), then opacity = byte / 255;
- SH: byte 0 -> -4, 255 -> +4, else ((byte + 0.5) / 256 - 0.5) * 8.

Quantisation (the error of a value the writer rounded to the nearest step): position and
log-scale (chunk extent) / 2047 / 2 on x and z, / 1023 / 2 on y; rotation components 0.5 *
sqrt(2) / 1023 ~ 7e-4; colour (chunk colour extent) / 255 / 2; opacity 0.5 / 255; SH 1/64
(1/32 at the ends of [-4, 4]; values outside are clipped by the writer).

Opacity bytes 0 and 255 (which the reference decodes as logits -inf / +inf) load as
opacity 0 / 1 with the logit clamped to +-OPACITY_LOGIT_LIMIT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from splatpainter.assets.gaussians import SH_C0, GaussianAsset
from splatpainter.io.errors import AssetFormatError
from splatpainter.io.validate import (
    OPACITY_LOGIT_LIMIT,
    asset_from_arrays,
)

if TYPE_CHECKING:
    from splatpainter.io.ply import _Header

CHUNK_SIZE = 256
PACKED = ("packed_position", "packed_rotation", "packed_scale", "packed_color")
_BOUNDS = [f"{m}_{a}" for m in ("min", "max") for a in "xyz"] + [
    f"{m}_scale_{a}" for m in ("min", "max") for a in "xyz"
]
_COLOR_BOUNDS = [f"{m}_{c}" for m in ("min", "max") for c in "rgb"]
_ENDIAN = {"binary_little_endian": "<", "binary_big_endian": ">"}
_ROT_NORM = 1.0 / (np.sqrt(2.0) * 0.5)  # the packed range is [-1/sqrt2, 1/sqrt2]
# SH byte -> value: the ends are exactly -4 and 4, other bytes the centre of their bin.
_SH_UNIT = np.concatenate([[0.0], (np.arange(1, 255) + 0.5) / 256.0, [1.0]])
_SH_LUT = ((_SH_UNIT - 0.5) * 8.0).astype(np.float32)


def is_compressed_ply(header: _Header) -> bool:
    """A PLY header in the compressed layout: a 'chunk' element and packed vertex words."""
    names = {e.name for e in header.elements}
    vertex_props = {p for e in header.elements if e.name == "vertex" for p, _ in e.props}
    return "chunk" in names and "packed_position" in vertex_props


def _unorm(words: np.ndarray, shift: int, bits: int) -> np.ndarray:
    return ((words >> np.uint32(shift)) & np.uint32((1 << bits) - 1)).astype(np.float64) / (
        (1 << bits) - 1
    )


def _lerp(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    return lo * (1.0 - t) + hi * t  # the reference's formula, so values agree to the last bit


def _tables(data: bytes, header: _Header, source: str) -> dict[str, np.ndarray]:
    """Structured arrays of every element, after checking the layout and the file size."""
    if header.fmt not in _ENDIAN:
        raise AssetFormatError(f"{source}: compressed PLY must be binary, not {header.fmt}")
    endian = _ENDIAN[header.fmt]
    offset = header.data_offset
    tables: dict[str, np.ndarray] = {}
    for el in header.elements:
        if el.has_list:
            raise AssetFormatError(
                f"{source}: compressed PLY element {el.name!r} has a list property"
            )
        dtype = np.dtype([(p, endian + t) for p, t in el.props])
        need = el.count * dtype.itemsize
        if offset + need > len(data):
            raise AssetFormatError(
                f"{source}: truncated compressed PLY: element {el.name!r} needs {need} bytes "
                f"for {el.count} rows, file has {max(len(data) - offset, 0)}"
            )
        if el.name in tables:
            raise AssetFormatError(f"{source}: compressed PLY has two {el.name!r} elements")
        table = np.frombuffer(data, dtype=dtype, count=el.count, offset=offset)
        tables[el.name] = table.astype(dtype.newbyteorder("="), copy=False)
        offset += need
    if offset != len(data):
        raise AssetFormatError(
            f"{source}: {len(data) - offset} bytes after the declared elements of the "
            "compressed PLY (the header's counts do not match the data)"
        )
    return tables


def _check_props(
    table: np.ndarray, names: list[str] | tuple[str, ...], kinds: str, what: str, source: str
) -> None:
    fields = table.dtype.fields or {}
    missing = [n for n in names if n not in fields]
    if missing:
        raise AssetFormatError(f"{source}: compressed PLY {what} lacks {missing}")
    wrong = [n for n in names if fields[n][0].kind + str(fields[n][0].itemsize) != kinds]
    if wrong:
        raise AssetFormatError(
            f"{source}: compressed PLY {what} properties {wrong} have the wrong type "
            f"(expected {kinds})"
        )


def decode_compressed_ply(data: bytes, header: _Header, source: str) -> GaussianAsset:
    """Decode a compressed PLY (header already parsed) into a float32 asset."""
    tables = _tables(data, header, source)
    if "vertex" not in tables:
        raise AssetFormatError(f"{source}: compressed PLY has no 'vertex' element")
    vertex, chunk, sh_table = tables["vertex"], tables["chunk"], tables.get("sh")
    n = len(vertex)
    _check_props(vertex, PACKED, "u4", "vertex element", source)
    _check_props(chunk, _BOUNDS, "f4", "chunk element", source)
    chunk_fields = chunk.dtype.fields or {}
    has_colors = all(c in chunk_fields for c in _COLOR_BOUNDS)
    if has_colors:
        _check_props(chunk, _COLOR_BOUNDS, "f4", "chunk element", source)
    need_chunks = -(-n // CHUNK_SIZE)
    if len(chunk) < need_chunks:
        raise AssetFormatError(
            f"{source}: compressed PLY has {len(chunk)} chunks; {n} Gaussians need "
            f"{need_chunks} (one per {CHUNK_SIZE})"
        )
    bound_names = _BOUNDS + (_COLOR_BOUNDS if has_colors else [])
    bounds = np.stack([chunk[b].astype(np.float64) for b in bound_names], axis=1)
    bad = ~np.isfinite(bounds[:need_chunks])
    if bad.any():
        row, col = (int(v[0]) for v in np.nonzero(bad))
        raise AssetFormatError(
            f"{source}: non-finite chunk bound {bound_names[col]} = {bounds[row, col]} "
            f"in chunk {row}"
        )
    rest = 0
    if sh_table is not None:
        rest = len(sh_table.dtype.names or ())
        if rest not in (9, 24, 45):
            raise AssetFormatError(
                f"{source}: compressed PLY 'sh' element has {rest} properties; expected 9, 24 "
                "or 45 (SH degree 1-3)"
            )
        names = [f"f_rest_{i}" for i in range(rest)]
        _check_props(sh_table, names, "u1", "sh element", source)
        if len(sh_table) != n:
            raise AssetFormatError(
                f"{source}: compressed PLY has {len(sh_table)} 'sh' rows for {n} Gaussians"
            )

    b = bounds[np.arange(n) // CHUNK_SIZE]  # per-Gaussian bounds
    pp, ps = vertex["packed_position"], vertex["packed_scale"]
    pr, pc = vertex["packed_rotation"], vertex["packed_color"]
    t_pos = np.stack([_unorm(pp, 21, 11), _unorm(pp, 11, 10), _unorm(pp, 0, 11)], axis=1)
    t_scale = np.stack([_unorm(ps, 21, 11), _unorm(ps, 11, 10), _unorm(ps, 0, 11)], axis=1)
    means = _lerp(b[:, 0:3], b[:, 3:6], t_pos)
    log_scales = _lerp(b[:, 6:9], b[:, 9:12], t_scale)

    small = np.stack([(_unorm(pr, s, 10) - 0.5) * _ROT_NORM for s in (20, 10, 0)], axis=1)
    largest_value = np.sqrt(np.maximum(0.0, 1.0 - (small * small).sum(axis=1)))
    largest = (pr >> np.uint32(30)).astype(np.int64)
    others = np.array([[j for j in range(4) if j != k] for k in range(4)])  # [4, 3]
    quats = np.empty((n, 4))
    rows = np.arange(n)
    quats[rows[:, None], others[largest]] = small
    quats[rows, largest] = largest_value

    t_col = np.stack([_unorm(pc, 24, 8), _unorm(pc, 16, 8), _unorm(pc, 8, 8)], axis=1)
    rgb = _lerp(b[:, 12:15], b[:, 15:18], t_col) if has_colors else t_col
    dc = (rgb - 0.5) / SH_C0
    alpha_byte = pc & np.uint32(255)
    alpha = alpha_byte.astype(np.float64) / 255.0
    with np.errstate(divide="ignore"):
        logits = -np.log(1.0 / alpha - 1.0)
    logits = np.clip(logits, -OPACITY_LOGIT_LIMIT, OPACITY_LOGIT_LIMIT)

    sh = np.empty((n, 1 + rest // 3, 3), np.float32)
    sh[:, 0] = dc
    if sh_table is not None:
        names = list(sh_table.dtype.names or ())
        order = [names.index(f"f_rest_{i}") for i in range(rest)]
        raw = np.ascontiguousarray(sh_table).view(np.uint8).reshape(n, rest)[:, order]
        sh[:, 1:] = _SH_LUT[raw].reshape(n, 3, rest // 3).transpose(0, 2, 1)

    return asset_from_arrays(means, quats, log_scales, logits, sh, source)


__all__ = ["CHUNK_SIZE", "decode_compressed_ply", "is_compressed_ply"]
