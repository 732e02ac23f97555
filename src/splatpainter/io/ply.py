"""INRIA 3DGS ``.ply`` read/write (SH degree 0-3, ASCII and binary of either endianness).

PlayCanvas compressed PLY files (an ``element chunk`` and packed vertex words) are recognised
from the header and decoded by `splatpainter.io.compressed_ply`. Opacity logits of +-inf
(opacity exactly 1 or 0, as tools write them after decoding 8-bit alphas) load clamped to
+-OPACITY_LOGIT_LIMIT with one note; NaN anywhere is refused.

Vertex properties understood: ``x y z``, ``nx ny nz`` (unused by 3DGS; kept as extras),
``f_dc_0..2``, ``f_rest_*`` (channel-major: all R coefficients, then G, then B), ``opacity``,
``scale_0..2``, ``rot_0..3`` (w, x, y, z) and ``feat_*`` (our per-Gaussian feature vectors).
Any other vertex property is returned as an extra column and can be written back, so a
read -> write of a float32 file reproduces it bit for bit when the extras are passed along.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from appshell.atomic import atomic_write_bytes
from appshell.inputs import InputFileError, read_bytes
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.io.compressed_ply import decode_compressed_ply, is_compressed_ply
from splatpainter.io.errors import AssetFormatError
from splatpainter.io.validate import check_asset_values, clamp_infinite_opacity

_PLY_TYPES = {
    "char": "i1",
    "int8": "i1",
    "uchar": "u1",
    "uint8": "u1",
    "short": "i2",
    "int16": "i2",
    "ushort": "u2",
    "uint16": "u2",
    "int": "i4",
    "int32": "i4",
    "uint": "u4",
    "uint32": "u4",
    "float": "f4",
    "float32": "f4",
    "double": "f8",
    "float64": "f8",
}
_NP_TO_PLY = {"i1": "char", "u1": "uchar", "i2": "short", "u2": "ushort", "i4": "int",
              "u4": "uint", "f4": "float", "f8": "double"}  # fmt: skip
_FORMATS = {"ascii": "", "binary_little_endian": "<", "binary_big_endian": ">"}
MAX_HEADER_BYTES = 1 << 20
MAX_ASSET_BYTES = 8 << 30  # 8 GiB: ~30M Gaussians at SH degree 3

_DC = ["f_dc_0", "f_dc_1", "f_dc_2"]
_SCALE = ["scale_0", "scale_1", "scale_2"]
_ROT = ["rot_0", "rot_1", "rot_2", "rot_3"]
_REQUIRED = ["x", "y", "z", *_DC, "opacity", *_SCALE, *_ROT]
_NORMALS = ["nx", "ny", "nz"]
_REST_RE = re.compile(r"f_rest_(\d+)$")
_FEAT_RE = re.compile(r"feat_(\d+)$")


@dataclass
class _Element:
    name: str
    count: int
    props: list[tuple[str, str]]  # (name, numpy type code, or "list")
    has_list: bool = False
    list_types: dict[str, tuple[str, str]] | None = None  # list property -> (count, item) codes


@dataclass
class _Header:
    fmt: str
    elements: list[_Element]
    data_offset: int


def _parse_header(data: bytes, source: str) -> _Header:
    if not data.startswith(b"ply"):
        raise AssetFormatError(f"{source}: not a PLY file (missing 'ply' magic)")
    end = data.find(b"end_header", 0, MAX_HEADER_BYTES)
    if end < 0:
        raise AssetFormatError(f"{source}: PLY header has no 'end_header' line (truncated?)")
    nl = data.find(b"\n", end)
    if nl < 0:
        raise AssetFormatError(f"{source}: PLY header is truncated after 'end_header'")
    try:
        text = data[:end].decode("ascii")
    except UnicodeDecodeError:
        raise AssetFormatError(f"{source}: PLY header is not ASCII text") from None
    lines = [ln.strip() for ln in text.replace("\r", "").split("\n")]
    if lines[0] != "ply":
        raise AssetFormatError(f"{source}: not a PLY file (first line is {lines[0]!r})")
    fmt = None
    elements: list[_Element] = []
    for ln in lines[1:]:
        if not ln or ln.startswith(("comment", "obj_info")):
            continue
        parts = ln.split()
        if parts[0] == "format":
            if len(parts) != 3 or parts[1] not in _FORMATS:
                raise AssetFormatError(f"{source}: unsupported PLY format line {ln!r}")
            fmt = parts[1]
        elif parts[0] == "element":
            if len(parts) != 3 or not parts[2].isdigit():
                raise AssetFormatError(f"{source}: malformed PLY element line {ln!r}")
            elements.append(_Element(parts[1], int(parts[2]), []))
        elif parts[0] == "property":
            if not elements:
                raise AssetFormatError(f"{source}: PLY property before any element: {ln!r}")
            if len(parts) == 5 and parts[1] == "list":
                if parts[2] not in _PLY_TYPES or parts[3] not in _PLY_TYPES:
                    raise AssetFormatError(f"{source}: malformed PLY list property line {ln!r}")
                el = elements[-1]
                el.has_list = True
                el.props.append((parts[4], "list"))
                el.list_types = {
                    **(el.list_types or {}),
                    parts[4]: (_PLY_TYPES[parts[2]], _PLY_TYPES[parts[3]]),
                }
                continue
            if len(parts) != 3 or parts[1] not in _PLY_TYPES:
                raise AssetFormatError(f"{source}: malformed PLY property line {ln!r}")
            elements[-1].props.append((parts[2], _PLY_TYPES[parts[1]]))
        else:
            raise AssetFormatError(f"{source}: unexpected PLY header line {ln!r}")
    if fmt is None:
        raise AssetFormatError(f"{source}: PLY header has no 'format' line")
    return _Header(fmt, elements, nl + 1)


def _read_vertex_table(data: bytes, header: _Header, source: str) -> np.ndarray:
    """Structured array (native byte order) of the vertex element."""
    names = [e.name for e in header.elements]
    if "vertex" not in names:
        raise AssetFormatError(f"{source}: PLY file has no 'vertex' element")
    vi = names.index("vertex")
    vertex = header.elements[vi]
    if vertex.has_list:
        raise AssetFormatError(f"{source}: list properties in the vertex element are not supported")
    seen = set()
    for n, _ in vertex.props:
        if n in seen:
            raise AssetFormatError(f"{source}: duplicate vertex property {n!r}")
        seen.add(n)
    endian = _FORMATS[header.fmt]
    n = vertex.count
    if header.fmt == "ascii":
        return _read_ascii(data, header, vi, source)
    offset = header.data_offset
    for el in header.elements[:vi]:
        offset = _skip_element(data, offset, el, endian, source)
    dtype = np.dtype([(p, endian + t) for p, t in vertex.props])
    need = n * dtype.itemsize
    have = len(data) - offset
    if have < need:
        raise AssetFormatError(
            f"{source}: truncated PLY: vertex data needs {need} bytes for {n} vertices, "
            f"file has {max(have, 0)}"
        )
    table = np.frombuffer(data, dtype=dtype, count=n, offset=offset)
    end = offset + need
    for el in header.elements[vi + 1 :]:
        end = _skip_element(data, end, el, endian, source)
    if end != len(data):
        raise AssetFormatError(
            f"{source}: {len(data) - end} bytes after the declared elements (the header's "
            f"counts do not match the data: {n} vertices declared)"
        )
    return table.astype(dtype.newbyteorder("="), copy=False)


def _skip_element(data: bytes, offset: int, el: _Element, endian: str, source: str) -> int:
    """Offset just past a binary element's data (list properties walked one row at a time)."""
    if not el.has_list:
        end = offset + el.count * np.dtype([(p, endian + t) for p, t in el.props]).itemsize
        if end > len(data):
            raise AssetFormatError(f"{source}: truncated PLY in element {el.name!r}")
        return end
    lists = el.list_types or {}
    for _ in range(el.count):
        for name, code in el.props:
            if code != "list":
                offset += np.dtype(code).itemsize
                continue
            count_code, item_code = lists[name]
            size = np.dtype(count_code).itemsize
            if offset + size > len(data):
                raise AssetFormatError(f"{source}: truncated PLY in element {el.name!r}")
            k = int(np.frombuffer(data, endian + count_code, 1, offset)[0])
            if k < 0:
                raise AssetFormatError(f"{source}: negative list length in element {el.name!r}")
            offset += size + k * np.dtype(item_code).itemsize
        if offset > len(data):
            raise AssetFormatError(f"{source}: truncated PLY in element {el.name!r}")
    return offset


def _read_ascii(data: bytes, header: _Header, vi: int, source: str) -> np.ndarray:
    vertex = header.elements[vi]
    lines = data[header.data_offset :].split(b"\n")
    # ASCII elements are one per line, so earlier elements (even with lists) are skipped by lines.
    lines = [ln for ln in lines if ln.strip()]
    start = sum(el.count for el in header.elements[:vi])
    rows = lines[start : start + vertex.count]
    if len(rows) < vertex.count:
        raise AssetFormatError(
            f"{source}: truncated ASCII PLY: expected {vertex.count} vertex lines, "
            f"found {len(rows)}"
        )
    declared = sum(el.count for el in header.elements)
    if len(lines) > declared:
        raise AssetFormatError(
            f"{source}: {len(lines) - declared} lines after the declared elements (the header's "
            f"counts do not match the data: {vertex.count} vertices declared)"
        )
    nprops = len(vertex.props)
    tokens: list[bytes] = []
    for i, row in enumerate(rows):
        parts = row.split()
        if len(parts) != nprops:
            raise AssetFormatError(
                f"{source}: vertex {i} has {len(parts)} values, expected {nprops}"
            )
        tokens.extend(parts)
    try:
        values = np.array(tokens, dtype=np.bytes_).astype(np.float64)
    except ValueError as e:
        raise AssetFormatError(f"{source}: non-numeric value in ASCII PLY ({e})") from None
    values = values.reshape(vertex.count, nprops)
    table = np.empty(vertex.count, dtype=[(p, t) for p, t in vertex.props])
    for j, (p, _) in enumerate(vertex.props):
        table[p] = values[:, j]
    return table


def _indexed(names: list[str], pattern: re.Pattern[str], what: str, source: str) -> list[str]:
    found = {int(m.group(1)): m.group(0) for n in names if (m := pattern.match(n))}
    if not found:
        return []
    if sorted(found) != list(range(len(found))):
        raise AssetFormatError(
            f"{source}: {what} properties are not numbered 0..{len(found) - 1}: "
            f"{sorted(found)[:8]}..."
        )
    return [found[i] for i in range(len(found))]


def _columns(table: np.ndarray, names: list[str]) -> np.ndarray:
    if not names:
        return np.zeros((len(table), 0), dtype=np.float32)
    fields = list(table.dtype.names or ())
    if table.flags.c_contiguous and all(table.dtype[f] == np.float32 for f in fields):
        # The usual all-float32 file: one row-wise gather instead of strided per-column copies.
        mat = table.view(np.float32).reshape(len(table), len(fields))
        return mat[:, [fields.index(nm) for nm in names]]
    return np.stack([table[n].astype(np.float32, copy=False) for n in names], axis=1)


def _check_finite(arr: np.ndarray, names: list[str], source: str) -> None:
    ok = np.isfinite(arr)
    if ok.all():
        return
    row = int(np.argmin(ok.all(axis=1)))
    col = int(np.argmin(ok[row]))
    raise AssetFormatError(
        f"{source}: non-finite value {arr[row, col]} in property {names[col]!r} at Gaussian {row}"
    )


def read_ply_with_extras(
    path: str | os.PathLike[str], *, notes: list[str] | None = None
) -> tuple[GaussianAsset, dict[str, np.ndarray]]:
    """Load an INRIA 3DGS .ply; also return the vertex properties it does not interpret.

    Raises AssetFormatError for anything malformed (never returns garbage); what it changed
    (clamped infinite opacities) goes to ``notes`` (a warning when notes is None).
    """
    source = str(path)
    try:
        data = read_bytes(path, max_bytes=MAX_ASSET_BYTES, what="PLY file")
    except InputFileError as e:
        raise AssetFormatError(str(e)) from None
    return ply_from_bytes(data, source, notes=notes)


def ply_kind(data: bytes, source: str = "<bytes>") -> str:
    """'ply (INRIA)' or 'ply (PlayCanvas compressed)', from the header alone."""
    compressed = is_compressed_ply(_parse_header(data, source))
    return "ply (PlayCanvas compressed)" if compressed else "ply (INRIA)"


def ply_from_bytes(
    data: bytes, source: str = "<bytes>", *, notes: list[str] | None = None
) -> tuple[GaussianAsset, dict[str, np.ndarray]]:
    """Decode PLY bytes (INRIA or PlayCanvas compressed; the latter has no extras)."""
    header = _parse_header(data, source)
    if is_compressed_ply(header):
        return decode_compressed_ply(data, header, source), {}
    declared = [p for e in header.elements if e.name == "vertex" for p, _ in e.props]
    missing = [n for n in _REQUIRED if n not in declared]
    if declared and missing:  # named before any size check: the clearer message
        raise AssetFormatError(f"{source}: missing required vertex property(ies): {missing}")
    table = _read_vertex_table(data, header, source)
    names = list(table.dtype.names or ())
    missing = [n for n in _REQUIRED if n not in names]
    if missing:
        raise AssetFormatError(f"{source}: missing required vertex property(ies): {missing}")
    rest = _indexed(names, _REST_RE, "f_rest_*", source)
    if len(rest) % 3 or (len(rest) // 3 + 1) not in (1, 4, 9, 16):
        raise AssetFormatError(
            f"{source}: {len(rest)} f_rest_* properties do not match any SH degree 0-3 "
            "(expected 0, 9, 24 or 45)"
        )
    feats = _indexed(names, _FEAT_RE, "feat_*", source)
    n = len(table)
    core_names = ["x", "y", "z", *_DC, *rest, "opacity", *_SCALE, *_ROT]
    core = _columns(table, core_names)
    o = 6 + len(rest)
    if np.isinf(core[:, o]).any():  # core is a copy (a gather), never the file's bytes
        core[:, o] = clamp_infinite_opacity(core[:, o], source, notes)
    _check_finite(core, core_names, source)
    k = len(rest) // 3 + 1
    means = core[:, 0:3]
    dc = core[:, 3:6]
    rest_arr = core[:, 6 : 6 + len(rest)].reshape(n, 3, k - 1).transpose(0, 2, 1)
    opacity = core[:, o]
    scales = core[:, o + 1 : o + 4]
    rots = core[:, o + 4 : o + 8]
    zero_q = ~(np.abs(rots).sum(axis=1) > 0)
    if zero_q.any():
        raise AssetFormatError(
            f"{source}: zero quaternion (rot_0..3 all 0) at Gaussian {int(np.argmax(zero_q))}"
        )
    sh = np.concatenate([dc[:, None, :], rest_arr], axis=1)
    features = None
    if feats:
        fa = _columns(table, feats)
        _check_finite(fa, feats, source)
        features = torch.from_numpy(np.ascontiguousarray(fa))
    asset = GaussianAsset(
        means=torch.from_numpy(np.ascontiguousarray(means)),
        quats=torch.from_numpy(np.ascontiguousarray(rots)),
        log_scales=torch.from_numpy(np.ascontiguousarray(scales)),
        opacity_logits=torch.from_numpy(np.ascontiguousarray(opacity)),
        sh=torch.from_numpy(np.ascontiguousarray(sh)),
        features=features,
    )
    check_asset_values(asset, source)
    understood = set(core_names) | set(feats)
    extras = {p: np.array(table[p]) for p in names if p not in understood}
    return asset, extras


def read_ply(path: str | os.PathLike[str], *, notes: list[str] | None = None) -> GaussianAsset:
    """Load an INRIA 3DGS (or PlayCanvas compressed) .ply as a float32 CPU GaussianAsset."""
    return read_ply_with_extras(path, notes=notes)[0]


def _vertex_columns(
    asset: GaussianAsset, extras: Mapping[str, np.ndarray] | None
) -> tuple[list[tuple[str, np.ndarray]], int]:
    check_asset_values(asset, "cannot write PLY")
    n = asset.num_gaussians
    k = asset.sh.shape[1]

    def np32(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().to(torch.float32).numpy()

    extras = dict(extras or {})
    for name, arr in extras.items():
        if np.asarray(arr).shape != (n,):
            raise AssetFormatError(
                f"extra property {name!r}: expected shape [{n}], got {list(np.shape(arr))}"
            )
        if name in _REQUIRED or _REST_RE.match(name) or _FEAT_RE.match(name):
            raise AssetFormatError(f"extra property {name!r} clashes with a standard property")
    means, sh = np32(asset.means), np32(asset.sh)
    cols: list[tuple[str, np.ndarray]] = [
        ("x", means[:, 0]),
        ("y", means[:, 1]),
        ("z", means[:, 2]),
    ]
    for nm in _NORMALS:
        cols.append((nm, np.asarray(extras.pop(nm)) if nm in extras else np.zeros(n, np.float32)))
    cols += [(f"f_dc_{c}", sh[:, 0, c]) for c in range(3)]
    rest = sh[:, 1:, :].transpose(0, 2, 1).reshape(n, 3 * (k - 1))
    cols += [(f"f_rest_{j}", rest[:, j]) for j in range(rest.shape[1])]
    cols.append(("opacity", np32(asset.opacity_logits)))
    scales, quats = np32(asset.log_scales), np32(asset.quats)
    cols += [(f"scale_{j}", scales[:, j]) for j in range(3)]
    cols += [(f"rot_{j}", quats[:, j]) for j in range(4)]
    if asset.features is not None:
        f = np32(asset.features)
        cols += [(f"feat_{j}", f[:, j]) for j in range(f.shape[1])]
    cols += [(name, np.asarray(arr)) for name, arr in extras.items()]
    return cols, n


def ply_to_bytes(
    asset: GaussianAsset,
    *,
    extras: Mapping[str, np.ndarray] | None = None,
    fmt: str = "binary_little_endian",
) -> bytes:
    """Serialise to PLY bytes (fmt: binary_little_endian, binary_big_endian or ascii)."""
    if fmt not in _FORMATS:
        raise AssetFormatError(f"unknown PLY format {fmt!r}; use one of {sorted(_FORMATS)}")
    cols, n = _vertex_columns(asset, extras)
    codes = []
    for name, arr in cols:
        code = arr.dtype.str[1:]
        if code not in _NP_TO_PLY:
            raise AssetFormatError(f"property {name!r}: dtype {arr.dtype} has no PLY type")
        codes.append(code)
    header = ["ply", f"format {fmt} 1.0", f"element vertex {n}"]
    header += [f"property {_NP_TO_PLY[c]} {name}" for (name, _), c in zip(cols, codes, strict=True)]
    header.append("end_header")
    head = ("\n".join(header) + "\n").encode("ascii")
    if fmt == "ascii":
        parts = []
        for (_, arr), c in zip(cols, codes, strict=True):
            if c[0] == "f":
                # 9 (float32) / 17 (float64) significant digits parse back to the same bits.
                digits = 9 if c == "f4" else 17
                parts.append(np.char.mod(f"%.{digits}g", arr.astype(np.float64)))
            else:
                parts.append(arr.astype(np.int64).astype(str))
        if n == 0:
            return head
        body = np.stack(parts, axis=1)
        return head + ("\n".join(" ".join(r) for r in body.tolist()) + "\n").encode("ascii")
    endian = _FORMATS[fmt]
    if all(c == "f4" for c in codes):
        # Common case: a row-major float32 matrix written in one go.
        mat = np.empty((n, len(cols)), dtype=endian + "f4")
        for j, (_, arr) in enumerate(cols):
            mat[:, j] = arr
        return head + mat.tobytes()
    dtype = np.dtype([(name, endian + c) for (name, _), c in zip(cols, codes, strict=True)])
    table = np.empty(n, dtype=dtype)
    for name, arr in cols:
        table[name] = arr
    return head + table.tobytes()


def write_ply(
    asset: GaussianAsset,
    path: str | os.PathLike[str],
    *,
    extras: Mapping[str, np.ndarray] | None = None,
    fmt: str = "binary_little_endian",
) -> None:
    """Atomically write an INRIA 3DGS .ply (float32; nx/ny/nz zero unless given as extras).

    The bytes are parsed back before anything is written, so a file we write always loads.
    """
    data = ply_to_bytes(asset, extras=extras, fmt=fmt)
    ply_from_bytes(data, f"{path} (as it would be written)")
    atomic_write_bytes(path, data)
