"""INRIA 3DGS .ply: layout, bit-exact round trips, ASCII/big-endian, malformed input, atomicity."""

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splatpainter.assets import GaussianAsset
from splatpainter.io import (
    AssetFormatError,
    load_asset,
    ply_from_bytes,
    ply_to_bytes,
    read_ply,
    read_ply_with_extras,
    save_asset,
    write_ply,
)


def random_asset(n=40, degree=3, seed=0, features=0):
    g = torch.Generator().manual_seed(seed)
    return GaussianAsset(
        means=torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) - 4,
        opacity_logits=torch.randn(n, generator=g),
        sh=torch.randn(n, (degree + 1) ** 2, 3, generator=g),
        features=torch.randn(n, features, generator=g) if features else None,
    )


def inria_bytes(n, degree, *, endian="<", extra=(), fmt="binary_little_endian", values=None):
    """A .ply built independently of our writer, in the INRIA property order."""
    rest = 3 * ((degree + 1) ** 2 - 1)
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(rest)]
    names += ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    names += list(extra)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(n, len(names))).astype(np.float32) if values is None else values
    head = ["ply", f"format {fmt} 1.0", "comment made by a test", f"element vertex {n}"]
    head += [f"property float {p}" for p in names]
    head += ["end_header"]
    header = ("\n".join(head) + "\n").encode()
    if fmt == "ascii":
        body = "".join(" ".join(repr(float(v)) for v in row) + "\n" for row in data).encode()
    else:
        body = data.astype(endian + "f4").tobytes()
    return header + body, names, data


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_reads_inria_layout_channel_major(degree):
    k = (degree + 1) ** 2
    raw, names, data = inria_bytes(7, degree)
    a, extras = ply_from_bytes(raw)
    col = {nm: data[:, i] for i, nm in enumerate(names)}
    assert a.sh_degree == degree and a.num_gaussians == 7
    assert np.array_equal(a.means.numpy(), np.stack([col["x"], col["y"], col["z"]], 1))
    assert np.array_equal(a.sh[:, 0].numpy(), np.stack([col[f"f_dc_{c}"] for c in range(3)], 1))
    for c in range(3):  # channel-major: all R coefficients, then G, then B
        for j in range(1, k):
            assert np.array_equal(a.sh[:, j, c].numpy(), col[f"f_rest_{c * (k - 1) + j - 1}"])
    assert np.array_equal(a.opacity_logits.numpy(), col["opacity"])
    assert np.array_equal(a.quats.numpy(), np.stack([col[f"rot_{i}"] for i in range(4)], 1))
    assert np.array_equal(a.log_scales[:, 2].numpy(), col["scale_2"])
    assert sorted(extras) == ["nx", "ny", "nz"]
    # writing back with the extras reproduces the file's data bit for bit
    again = ply_to_bytes(a, extras=extras)
    assert again[again.index(b"end_header\n") + 11 :] == raw[raw.index(b"end_header\n") + 11 :]


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_bit_exact(tmp_path, degree):
    a = random_asset(degree=degree, features=5 if degree == 2 else 0)
    p1, p2 = tmp_path / "a.ply", tmp_path / "b.ply"
    write_ply(a, p1)
    b, extras = read_ply_with_extras(p1)
    for name, t in a.tensors().items():
        assert t.dtype == b.tensors()[name].dtype
        assert torch.equal(t, b.tensors()[name]), name
    write_ply(b, p2, extras=extras)
    assert p1.read_bytes() == p2.read_bytes()


def test_extra_properties_preserved(tmp_path):
    raw, names, data = inria_bytes(5, 1, extra=["semantic_id", "confidence"])
    a, extras = ply_from_bytes(raw)
    assert np.array_equal(extras["confidence"], data[:, names.index("confidence")])
    out = tmp_path / "x.ply"
    write_ply(a, out, extras=extras)
    assert out.read_bytes() == raw.replace(b"comment made by a test\n", b"")
    # extras of other dtypes survive too
    ids = np.arange(5, dtype=np.uint16)
    write_ply(a, out, extras={"label": ids})
    assert np.array_equal(read_ply_with_extras(out)[1]["label"], ids)


def test_ascii_and_big_endian_read(tmp_path):
    raw_le, _, data = inria_bytes(6, 3)
    ref = ply_from_bytes(raw_le)[0]
    for kw in ({"fmt": "binary_big_endian", "endian": ">"}, {"fmt": "ascii"}):
        raw, _, _ = inria_bytes(6, 3, values=data, **kw)
        got = ply_from_bytes(raw)[0]
        for name, t in ref.tensors().items():
            assert torch.equal(t, got.tensors()[name]), (kw, name)
    # our own ASCII and big-endian writers round-trip bit-exactly as well
    a = random_asset(degree=2)
    for fmt in ("ascii", "binary_big_endian"):
        p = tmp_path / f"{fmt}.ply"
        write_ply(a, p, fmt=fmt)
        b = read_ply(p)
        for name, t in a.tensors().items():
            assert torch.equal(t, b.tensors()[name]), (fmt, name)


def test_crlf_header_and_other_elements():
    raw, _, data = inria_bytes(3, 0)
    header, body = raw.split(b"end_header\n")
    header = header.replace(b"\n", b"\r\n")
    # an element before the vertex element (fixed size) and one after it
    header = header.replace(
        b"element vertex", b"element camera 2\r\nproperty double f\r\nelement vertex"
    )
    header += b"element face 1\r\nproperty list uchar int vertex_indices\r\n"
    raw2 = header + b"end_header\r\n" + np.zeros(2, "<f8").tobytes() + body + b"\x03" + b"\0" * 12
    a = ply_from_bytes(raw2)[0]
    assert np.array_equal(a.means.numpy(), data[:, :3])


def _corrupt_cases():
    raw, names, data = inria_bytes(4, 1)
    head, body = raw.split(b"end_header\n")
    nan = data.copy()
    nan[2, names.index("scale_1")] = np.nan
    inf = data.copy()
    inf[3, names.index("f_rest_4")] = np.inf
    zq = data.copy()
    zq[1, names.index("rot_0") : names.index("rot_0") + 4] = 0
    return {
        "truncated": (raw[:-5], "truncated PLY"),
        "not_ply": (b"hello world\n" + body, "not a PLY"),
        "no_end_header": (head, "end_header"),
        "missing_property": (raw.replace(b"property float opacity\n", b""), "opacity"),
        "missing_dc": (raw.replace(b"property float f_dc_2\n", b"property float zz\n"), "f_dc_2"),
        "wrong_rest_count": (
            raw.replace(b"property float f_rest_8\n", b"property float other\n"),
            "f_rest",
        ),
        "rest_gap": (raw.replace(b"f_rest_3\n", b"f_rest_30\n"), "numbered"),
        "count_too_big": (raw.replace(b"element vertex 4", b"element vertex 5"), "truncated"),
        "bad_count": (raw.replace(b"element vertex 4", b"element vertex four"), "element"),
        "bad_format": (raw.replace(b"binary_little_endian", b"binary_middle_endian"), "format"),
        "no_format": (raw.replace(b"format binary_little_endian 1.0\n", b""), "format"),
        "no_vertex": (raw.replace(b"element vertex", b"element points"), "vertex"),
        "bad_type": (raw.replace(b"property float x\n", b"property float128 x\n"), "property"),
        "list_in_vertex": (
            raw.replace(b"property float x\n", b"property list uchar float x\n"),
            "list",
        ),
        "duplicate": (raw.replace(b"property float nx\n", b"property float x\n"), "duplicate"),
        "nan": (head + b"end_header\n" + nan.tobytes(), "scale_1.*Gaussian 2"),
        "inf": (head + b"end_header\n" + inf.tobytes(), "f_rest_4.*Gaussian 3"),
        "zero_quat": (head + b"end_header\n" + zq.tobytes(), "zero quaternion.*Gaussian 1"),
        "garbage_header": (b"ply\n\xff\xfe\nend_header\n", "ASCII"),
        "empty": (b"", "not a PLY"),
    }


@pytest.mark.parametrize("case", sorted(_corrupt_cases()))
def test_malformed_binary(case, tmp_path):
    raw, match = _corrupt_cases()[case]
    p = tmp_path / "bad.ply"
    p.write_bytes(raw)
    with pytest.raises(AssetFormatError, match=match):
        load_asset(p)


def test_malformed_ascii():
    raw, _, _ = inria_bytes(3, 0, fmt="ascii")
    lines = raw.split(b"\n")
    with pytest.raises(AssetFormatError, match="expected 3 vertex lines"):
        ply_from_bytes(b"\n".join(lines[:-2]) + b"\n")
    bad_tokens = raw.replace(lines[-2], lines[-2] + b" 1.0")
    with pytest.raises(AssetFormatError, match="vertex 2 has"):
        ply_from_bytes(bad_tokens)
    first_val = lines[-2].split()[0]
    with pytest.raises(AssetFormatError, match="non-numeric"):
        ply_from_bytes(raw.replace(lines[-2], lines[-2].replace(first_val, b"abc", 1)))
    with pytest.raises(AssetFormatError, match="non-finite"):
        ply_from_bytes(raw.replace(lines[-2], lines[-2].replace(first_val, b"nan", 1)))


def test_load_asset_dispatch_errors(tmp_path):
    with pytest.raises(AssetFormatError, match=r"unknown asset format '\.obj'"):
        load_asset(tmp_path / "x.obj")
    with pytest.raises(AssetFormatError, match="no extension"):
        save_asset(random_asset(), tmp_path / "noext")
    with pytest.raises(AssetFormatError, match="cannot read"):
        load_asset(tmp_path / "missing.ply")
    assert issubclass(AssetFormatError, ValueError)


def test_write_refuses_invalid_asset_and_is_atomic(tmp_path):
    good = random_asset(degree=1)
    p = tmp_path / "a.ply"
    write_ply(good, p)
    before = p.read_bytes()
    bad = good.clone()
    bad.means[3, 1] = float("nan")
    with pytest.raises(ValueError, match="Gaussian 3"):
        write_ply(bad, p)
    with pytest.raises(AssetFormatError, match="clashes"):
        write_ply(good, p, extras={"opacity": np.zeros(40, np.float32)})
    with pytest.raises(AssetFormatError, match="expected shape"):
        write_ply(good, p, extras={"foo": np.zeros(3, np.float32)})
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a.ply"]  # no temp files left behind


def test_empty_asset_round_trip(tmp_path):
    p = tmp_path / "empty.ply"
    write_ply(GaussianAsset.empty(sh_degree=2), p)
    a = read_ply(p)
    assert a.num_gaussians == 0 and a.sh_degree == 2


def test_atomic_write_helper(tmp_path):
    from appshell.atomic import atomic_open, atomic_write_bytes

    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")
    assert target.read_bytes() == b"old"
    assert (target.stat().st_mode & 0o777) == (0o666 & ~_umask())
    with pytest.raises(RuntimeError, match="boom"), atomic_open(target) as f:
        f.write(b"partial new content")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f.bin"]
    os.chmod(target, 0o640)  # an existing file keeps its permissions
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o640


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 30),
    degree=st.integers(0, 3),
    fmt=st.sampled_from(["binary_little_endian", "binary_big_endian", "ascii"]),
    seed=st.integers(0, 2**16),
    features=st.integers(0, 3),
)
def test_round_trip_property(n, degree, fmt, seed, features):
    g = torch.Generator().manual_seed(seed)
    a = random_asset(max(n, 1), degree, seed, features).subset(slice(0, n))
    # awkward but valid float32 values: subnormals, the largest accepted position, negative zero
    special = torch.tensor([1e-45, -0.0, 1e15, -1.17e-38])
    if n:
        a.means.view(-1)[: min(4, 3 * n)] = special[: min(4, 3 * n)]
        a.sh.view(-1)[torch.randint(0, a.sh.numel(), (1,), generator=g)] = 1e-40
    b, extras = ply_from_bytes(ply_to_bytes(a, fmt=fmt))
    for name, t in a.tensors().items():
        u, v = t.numpy().view(np.uint32), b.tensors()[name].numpy().view(np.uint32)
        assert np.array_equal(u, v), name  # bit-exact, including the sign of zero
    assert ply_to_bytes(b, extras=extras, fmt=fmt) == ply_to_bytes(a, fmt=fmt)


def test_double_and_mixed_property_types():
    raw, names, data = inria_bytes(5, 0)
    header, _ = raw.split(b"end_header\n")
    header = header.replace(b"property float x\n", b"property double x\n")
    header = header.replace(b"property float nz\n", b"property uchar nz\n")
    dt = [(nm, "<f8" if nm == "x" else "u1" if nm == "nz" else "<f4") for nm in names]
    table = np.empty(5, dtype=dt)
    for i, nm in enumerate(names):
        table[nm] = np.arange(5) if nm == "nz" else data[:, i]
    a, extras = ply_from_bytes(header + b"end_header\n" + table.tobytes())
    assert a.means.dtype == torch.float32
    assert np.array_equal(a.means[:, 0].numpy(), data[:, 0])
    assert extras["nz"].dtype == np.uint8 and extras["nz"].tolist() == [0, 1, 2, 3, 4]
