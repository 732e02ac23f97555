"""Niantic ``.spz`` read (versions 2 and 3) and write (version 3; version 2 on request).

A ``.spz`` file is one gzip stream holding a 16-byte little-endian header (magic ``NGSP``,
version u32, point count u32, SH degree u8, fractional bits u8, flags u8, reserved u8) and
then, attribute by attribute for all Gaussians: positions (3 x 24-bit signed fixed point with
``fractional bits``), alphas (u8 = round(255 sigmoid(logit))), colours (u8 = round(255 (0.15
f_dc + 0.5)); 0.15, not SH_C0, so a little out-of-range colour survives), log-scales (u8 =
round(16 (log s + 10))), rotations and SH rest (u8 = round(128 x + 128), coefficient-major with
the channel innermost: ``[N, K-1, 3]``, our layout). Rotations (quaternion order x, y, z, w):
version 2 stores x, y, z as u8 = round(127.5 q + 127.5) of the normalised quaternion with
w >= 0 (w derived); version 3 stores "smallest three" in a u32: 2 bits naming the largest
component, then the other three in order, each a sign bit and 9 bits of |q| / (1/sqrt2).

We write version 3: its rotations are about 3x more precise (9 bits over [0, 1/sqrt2] plus a
sign, versus 8 bits over [-1, 1]) and stay accurate when w is near 0, where version 2 loses w
to the square root; every current reader (Niantic's library, splat-transform, web viewers)
reads it. Version 4 (per-attribute ZSTD streams, not gzip) is refused with a clear message.
SH rest is written with all 8 bits (Niantic's default keeps 5 bits for degree 1 and 4 for the
rest, which compresses better but is coarser; readers decode both the same way).

Axes: spz nominally stores RUB (OpenGL) axes, but both reference converters (Niantic's
``ply_to_spz`` with default options, and splat-transform 3.7.0) store the PLY's axes as they
are, with no flip, and read them back the same way; so do we, so a ply -> spz -> ply round
trip through any of these tools keeps positions and rotations.

Quantisation (error of a value rounded to the nearest step, inside each range): position
0.5 / 2^fractional_bits (2^-13 ~ 1.2e-4 at the usual 12 bits; we use fewer bits only when a
coordinate would not fit 24 bits, with a note); opacity 0.5 / 255; colour 0.5 / 255 / 0.15 in
f_dc (0.5/255 * SH_C0 / 0.15 ~ 0.0037 in base colour), f_dc range +-3.33; log-scale 1/32,
range [-10, 5.94]; rotation (version 3) components 0.5 * (1/sqrt2) / 511 ~ 7e-4 (version 2:
0.5/127.5 on x, y, z); SH rest 0.5/128 inside [-1, 127/128]. Values outside a range are
clipped, with one note saying how many.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np
import torch

from appshell.atomic import atomic_write_bytes
from appshell.inputs import InputFileError, read_bytes
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.io.errors import AssetFormatError, add_note
from splatpainter.io.validate import (
    OPACITY_LOGIT_LIMIT,
    asset_from_arrays,
    check_asset_values,
)

SPZ_MAGIC = 0x5053474E  # b"NGSP" little-endian
HEADER_DTYPE = np.dtype(
    [("magic", "<u4"), ("version", "<u4"), ("num_points", "<u4"), ("sh_degree", "u1"),
     ("fractional_bits", "u1"), ("flags", "u1"), ("reserved", "u1")]
)  # fmt: skip
HEADER_BYTES = HEADER_DTYPE.itemsize  # 16
FLAG_ANTIALIASED = 0x1
FLAG_EXTENSIONS = 0x2
COLOR_SCALE = 0.15
MAX_SPZ_BYTES = 4 << 30  # compressed file size
MAX_SPZ_POINTS = 1 << 25  # 33.5M Gaussians: about what the 8 GiB PLY limit holds at degree 3
DEFAULT_FRACTIONAL_BITS = 12  # Niantic's choice (~0.24 mm steps for metres)
_MAX_FIXED = (1 << 23) - 1
# Deflate cannot expand more than ~1032:1, so a header claiming more data than that is forged.
_MAX_DEFLATE_RATIO = 1032
_SQRT1_2 = float(np.sqrt(0.5))
_C_MASK = (1 << 9) - 1


def _bytes_per_point(version: int, sh_degree: int) -> int:
    return 9 + 1 + 3 + 3 + (3 if version == 2 else 4) + 3 * ((sh_degree + 1) ** 2 - 1)


class _Inflater:
    """Bounded gzip reader: never produces more bytes than asked for."""

    def __init__(self, data: bytes, source: str) -> None:
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._tail = data
        self._source = source

    def read(self, size: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        try:
            while got < size:
                chunk = self._d.decompress(self._tail, size - got)
                progressed = bool(chunk) or len(self._d.unconsumed_tail) < len(self._tail)
                self._tail = self._d.unconsumed_tail
                if chunk:
                    parts.append(chunk)
                    got += len(chunk)
                if not progressed or self._d.eof:
                    break
        except zlib.error as e:
            raise AssetFormatError(f"{self._source}: corrupt .spz gzip data ({e})") from None
        return b"".join(parts)

    def finished(self) -> bool:
        """True if the stream ends here (checksum verified); False if more data follows."""
        if self.read(1):
            return False
        if not self._d.eof:
            raise AssetFormatError(
                f"{self._source}: truncated .spz: the gzip stream ends without its end marker"
            )
        return True


def _parse_header(head: bytes, source: str, compressed_size: int) -> np.void:
    if len(head) < HEADER_BYTES:
        raise AssetFormatError(
            f"{source}: truncated .spz: {len(head)} bytes after decompression, "
            f"the header alone needs {HEADER_BYTES}"
        )
    h = np.frombuffer(head, HEADER_DTYPE, count=1)[0]
    if int(h["magic"]) != SPZ_MAGIC:
        raise AssetFormatError(
            f"{source}: not an .spz file (gzip data without the 'NGSP' magic: {head[:4]!r})"
        )
    version, n, degree = int(h["version"]), int(h["num_points"]), int(h["sh_degree"])
    if version not in (2, 3):
        raise AssetFormatError(
            f"{source}: unsupported .spz version {version} (this reader reads versions 2 and 3)"
        )
    if degree > 3:
        raise AssetFormatError(f"{source}: .spz SH degree {degree} is not supported (0-3)")
    if int(h["flags"]) & FLAG_EXTENSIONS:
        raise AssetFormatError(
            f"{source}: .spz uses header extensions (flag 0x2), which this reader does not read"
        )
    if int(h["fractional_bits"]) > 30:
        raise AssetFormatError(
            f"{source}: .spz fractional bits {int(h['fractional_bits'])} is out of range (0-30)"
        )
    payload = n * _bytes_per_point(version, degree)
    if n > MAX_SPZ_POINTS or payload > _MAX_DEFLATE_RATIO * compressed_size + 1024:
        raise AssetFormatError(
            f"{source}: .spz header claims {n:,} Gaussians ({payload:,} bytes), more than "
            + (
                f"the limit of {MAX_SPZ_POINTS:,}"
                if n > MAX_SPZ_POINTS
                else f"a {compressed_size:,}-byte gzip file can hold (truncated or corrupt)"
            )
        )
    return h


def _open(
    data: bytes, source: str, compressed_size: int | None = None
) -> tuple[np.void, _Inflater]:
    """Check the magic, decompress and check the header; the inflater continues after it."""
    if data[:2] != b"\x1f\x8b":
        if data[:4] == b"NGSP" and len(data) >= 8:
            version = int(np.frombuffer(data, "<u4", count=1, offset=4)[0])
            if version >= 4:
                raise AssetFormatError(
                    f"{source}: .spz version {version} (ZSTD-compressed streams) is not "
                    "supported; re-export it as version 3 (splat-transform --spz-version 3)"
                )
            raise AssetFormatError(f"{source}: .spz version {version} data is not gzip-compressed")
        what = "an empty file" if not data else f"starts with {data[:4]!r}"
        raise AssetFormatError(f"{source}: not an .spz file ({what}; expected gzip data)")
    inflater = _Inflater(data, source)
    size = len(data) if compressed_size is None else compressed_size
    return _parse_header(inflater.read(HEADER_BYTES), source, size), inflater


def spz_version(data: bytes, source: str = "<bytes>", *, compressed_size: int | None = None) -> int:
    """The version in an .spz header; `data` may be just the file's start (then give the
    whole file's size as compressed_size). Decompresses only the header."""
    return int(_open(data, source, compressed_size)[0]["version"])


def _decode_rotations(raw: np.ndarray, version: int) -> np.ndarray:
    """(w, x, y, z) float64 quaternions from version 2 [N, 3] or version 3 [N, 4] bytes."""
    n = len(raw)
    xyzw = np.empty((n, 4))
    if version == 2:
        xyz = raw.astype(np.float64) / 127.5 - 1.0
        xyzw[:, :3] = xyz
        xyzw[:, 3] = np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(axis=1)))
    else:
        comp = raw.astype(np.uint32)
        comp = comp[:, 0] | comp[:, 1] << 8 | comp[:, 2] << 16 | comp[:, 3] << 24
        largest = (comp >> 30).astype(np.int64)
        fields = np.stack([(comp >> s) & 0x3FF for s in (20, 10, 0)], axis=1)
        small = _SQRT1_2 * (fields & _C_MASK).astype(np.float64) / _C_MASK
        small = np.where((fields >> 9) & 1, -small, small)
        others = np.array([[j for j in range(4) if j != k] for k in range(4)])  # [4, 3]
        rows = np.arange(n)
        xyzw[rows[:, None], others[largest]] = small
        xyzw[rows, largest] = np.sqrt(np.maximum(0.0, 1.0 - (small * small).sum(axis=1)))
    return xyzw[:, [3, 0, 1, 2]]


def spz_from_bytes(
    data: bytes, source: str = "<bytes>", *, notes: list[str] | None = None
) -> GaussianAsset:
    """Decode an .spz file (version 2 or 3) into a validated float32 asset."""
    h, inflater = _open(data, source)
    version, n, degree = int(h["version"]), int(h["num_points"]), int(h["sh_degree"])
    k = (degree + 1) ** 2
    payload = inflater.read(n * _bytes_per_point(version, degree))
    if len(payload) < n * _bytes_per_point(version, degree):
        raise AssetFormatError(
            f"{source}: truncated .spz: {n:,} Gaussians need "
            f"{n * _bytes_per_point(version, degree):,} bytes of data, the file holds "
            f"{len(payload):,}"
        )
    if not inflater.finished():
        add_note(notes, f"{source}: data after the {n:,} Gaussians of the .spz was ignored")
    if int(h["flags"]) & FLAG_ANTIALIASED:
        add_note(
            notes,
            f"{source}: .spz was trained with antialiasing; it is rendered without the "
            "antialiasing opacity compensation",
        )
    buf = np.frombuffer(payload, np.uint8)
    sizes = [9 * n, n, 3 * n, 3 * n, (3 if version == 2 else 4) * n, 3 * (k - 1) * n]
    pos_b, alpha_b, color_b, scale_b, rot_b, sh_b = np.split(buf, np.cumsum(sizes)[:-1])

    fixed = pos_b.reshape(n, 3, 3).astype(np.int32)
    fixed = fixed[..., 0] | fixed[..., 1] << 8 | fixed[..., 2] << 16
    fixed = (fixed ^ 0x800000) - 0x800000  # sign-extend 24 bits
    means = fixed.astype(np.float64) * 2.0 ** -int(h["fractional_bits"])

    alpha = alpha_b.astype(np.float64) / 255.0
    with np.errstate(divide="ignore"):
        logits = np.log(alpha) - np.log1p(-alpha)
    logits = np.clip(logits, -OPACITY_LOGIT_LIMIT, OPACITY_LOGIT_LIMIT)

    sh = np.empty((n, k, 3), np.float32)
    sh[:, 0] = (color_b.reshape(n, 3).astype(np.float64) / 255.0 - 0.5) / COLOR_SCALE
    sh[:, 1:] = sh_b.reshape(n, k - 1, 3).astype(np.float32) * (1 / 128) - 1.0  # exact
    log_scales = scale_b.reshape(n, 3).astype(np.float64) / 16.0 - 10.0
    quats = _decode_rotations(rot_b.reshape(n, 3 if version == 2 else 4), version)

    return asset_from_arrays(means, quats, log_scales, logits, sh, source)


def read_spz(path: str | os.PathLike[str], *, notes: list[str] | None = None) -> GaussianAsset:
    """Load an .spz file (version 2 or 3) as a float32 GaussianAsset on the CPU."""
    try:
        data = read_bytes(path, max_bytes=MAX_SPZ_BYTES, what=".spz file")
    except InputFileError as e:
        raise AssetFormatError(str(e)) from None
    return spz_from_bytes(data, str(path), notes=notes)


def _to_u8(x: np.ndarray, counts: dict[str, int], what: str) -> np.ndarray:
    """round(x) as uint8; values outside [0, 255] are clipped and counted under `what`."""
    r = np.rint(x)
    out = (r < 0) | (r > 255)
    if out.any():
        counts[what] = counts.get(what, 0) + int(out.sum())
    return np.clip(r, 0, 255).astype(np.uint8)


def _encode_rotations(q_wxyz: np.ndarray, version: int) -> np.ndarray:
    q = q_wxyz[:, [1, 2, 3, 0]]  # spz order x, y, z, w
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    n = len(q)
    if version == 2:
        q = np.where(q[:, 3:] < 0, -q, q)
        return np.clip(np.rint(q[:, :3] * 127.5 + 127.5), 0, 255).astype(np.uint8)
    largest = np.argmax(np.abs(q), axis=1)
    rows = np.arange(n)
    q = np.where(q[rows, largest][:, None] < 0, -q, q)  # the largest becomes positive
    others = np.array([[j for j in range(4) if j != k] for k in range(4)])[largest]  # [N, 3]
    small = q[rows[:, None], others]
    mag = np.minimum(np.floor(_C_MASK * np.abs(small) / _SQRT1_2 + 0.5), _C_MASK).astype(np.uint32)
    fields = mag | ((small < 0) & (mag > 0)).astype(np.uint32) << 9  # no "negative zero"
    comp = largest.astype(np.uint32) << 30 | fields[:, 0] << 20 | fields[:, 1] << 10 | fields[:, 2]
    return comp.astype("<u4").view(np.uint8).reshape(n, 4)


def spz_to_bytes(
    asset: GaussianAsset, *, version: int = 3, notes: list[str] | None = None
) -> bytes:
    """Encode as a gzip-compressed .spz (version 3 by default; 2 for old readers).

    Values outside the format's ranges are clipped with one note; a coordinate too large for
    24-bit fixed point even without fractional bits is an AssetFormatError.
    """
    if version not in (2, 3):
        raise AssetFormatError(f"cannot write .spz version {version}; use 2 or 3")
    check_asset_values(asset, "cannot write .spz")
    a = asset.detach().to(device="cpu")
    n, degree = a.num_gaussians, a.sh_degree

    def f64(t: torch.Tensor) -> np.ndarray:
        return t.to(torch.float64).numpy()

    # SH (most of the data) stays float32, ample for 8-bit steps; the rest is float64.
    sh = a.sh.to(torch.float32).numpy()
    means = f64(a.means)
    biggest = float(np.abs(means).max()) if n else 0.0
    bits = DEFAULT_FRACTIONAL_BITS
    while bits > 0 and np.rint(biggest * 2.0**bits) > _MAX_FIXED:
        bits -= 1
    if np.rint(biggest * 2.0**bits) > _MAX_FIXED:
        raise AssetFormatError(
            f"cannot write .spz: a coordinate of magnitude {biggest:g} does not fit its 24-bit "
            f"fixed-point positions (at most {_MAX_FIXED:,})"
        )
    if bits < DEFAULT_FRACTIONAL_BITS:
        add_note(
            notes,
            f".spz positions use {bits} fractional bits (steps of {2.0**-bits:g}) so that "
            f"coordinates up to {biggest:g} fit in 24 bits",
        )
    fixed = np.rint(means * 2.0**bits).astype(np.int64) & 0xFFFFFF
    pos_b = ((fixed[..., None] >> np.array([0, 8, 16])) & 0xFF).astype(np.uint8)

    clipped: dict[str, int] = {}
    with np.errstate(over="ignore"):  # exp(800) = inf gives opacity 0, as it should
        alpha = 255.0 / (1.0 + np.exp(-f64(a.opacity_logits)))
    alpha_b = _to_u8(alpha, clipped, "opacity")
    dc = f64(a.sh[:, 0])
    color_b = _to_u8(dc * (COLOR_SCALE * 255.0) + 127.5, clipped, "colour (f_dc)")
    scale_b = _to_u8((f64(a.log_scales) + 10.0) * 16.0, clipped, "log-scale")
    rot_b = _encode_rotations(f64(a.quats), version)
    sh_b = _to_u8(sh[:, 1:] * 128.0 + 128.0, clipped, "SH rest")
    if clipped:
        what = ", ".join(f"{c} {name}" for name, c in clipped.items())
        add_note(notes, f".spz cannot hold every value: clipped to its range: {what} value(s)")

    header = np.zeros(1, HEADER_DTYPE)
    header[0] = (SPZ_MAGIC, version, n, degree, bits, 0, 0)
    payload = b"".join(x.tobytes() for x in (header, pos_b, alpha_b, color_b, scale_b, rot_b, sh_b))
    return gzip.compress(payload, compresslevel=6, mtime=0)


def write_spz(
    asset: GaussianAsset,
    path: str | os.PathLike[str],
    *,
    version: int = 3,
    notes: list[str] | None = None,
) -> None:
    """Atomically write an .spz file (parsed back before anything is written)."""
    if asset.num_gaussians > MAX_SPZ_POINTS:
        raise AssetFormatError(
            f"cannot write .spz: {asset.num_gaussians:,} Gaussians is over the "
            f"{MAX_SPZ_POINTS:,} limit"
        )
    data = spz_to_bytes(asset, version=version, notes=notes)
    spz_from_bytes(data, f"{path} (as it would be written)", notes=[])
    atomic_write_bytes(path, data)


__all__ = [
    "MAX_SPZ_POINTS",
    "read_spz",
    "spz_from_bytes",
    "spz_to_bytes",
    "spz_version",
    "write_spz",
]
