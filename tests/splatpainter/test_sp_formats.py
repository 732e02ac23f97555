"""Formats artists have: Niantic .spz, PlayCanvas compressed .ply, +-inf opacities.

Fixtures in data/formats were made by the reference tool, splat-transform 3.7.0 (see the
README there and data/make_format_fixtures.py); these tests need no node. Tolerances are the
formats' quantisation steps (half a step: values are rounded to the nearest one):

.spz: position 0.5 / 4096 (12 fractional bits); opacity 0.5 / 255; f_dc 0.5 / 255 / 0.15;
log-scale 1 / 32; rotation (v3) the three smaller components 0.5 * (1/sqrt2) / 511 ~ 7e-4,
the largest (derived from them) 3e-3, (v2) x, y, z 0.5 / 127.5; SH rest 0.5 / 128 as we write
it, and as the reference writes it (5 bits for band 1, 4 bits above: buckets of 8 and 16
steps) 4.5 / 128 and 8.5 / 128.
compressed .ply: position and log-scale extent / 2047 / 2 (x, z), extent / 1023 / 2 (y),
extent over a 256-Gaussian chunk (bounded here by the whole asset's); colour (colour extent)
/ 255 / 2 (f_dc: / SH_C0); opacity 0.5 / 255; rotation smaller components 0.5 * sqrt2 / 1023
~ 7e-4, the largest 3e-3; SH rest 8 / 256 / 2 = 1/64.
"""

import gzip
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from splatpainter.assets.gaussians import SH_C0, GaussianAsset
from splatpainter.cli import app
from splatpainter.io import (
    AssetFormatError,
    AssetNoteWarning,
    check_asset_values,
    describe_format,
    load_asset,
    ply_from_bytes,
    ply_to_bytes,
    spz_from_bytes,
    spz_to_bytes,
    write_ply,
    write_splat,
    write_spz,
)
from splatpainter.io.spz import HEADER_DTYPE, SPZ_MAGIC
from splatpainter.io.validate import OPACITY_LOGIT_LIMIT

DATA = Path(__file__).parent / "data" / "formats"
EPS = 1e-6  # float32 arithmetic on top of a quantisation step
SPZ_POS = 0.5 / 4096
SPZ_ALPHA = 0.5 / 255
SPZ_DC = 0.5 / 255 / 0.15
SPZ_LOG_SCALE = 1 / 32
QUAT_SMALL = 0.5 * np.sqrt(0.5) / 511
QUAT_LARGEST = 3e-3
SPZ_V2_XYZ = 0.5 / 127.5
SPZ_SH = 0.5 / 128
REF_SPZ_SH1, REF_SPZ_SH_REST = 4.5 / 128, 8.5 / 128
CPLY_SH = 1 / 64

runner = CliRunner()


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output
    return res


def gunzip_ply(name: str) -> GaussianAsset:
    return ply_from_bytes(gzip.decompress((DATA / name).read_bytes()), name, notes=[])[0]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The source assets the fixtures were made from, and their paths as plain .ply files."""
    tmp = tmp_path_factory.mktemp("formats")
    out = {}
    for name in ("sh3", "sh0"):
        path = tmp / f"{name}.ply"
        path.write_bytes(gzip.decompress((DATA / f"{name}.ply.gz").read_bytes()))
        out[name] = (load_asset(path, notes=[]), path)
    return out


def unit_quats(q: torch.Tensor) -> torch.Tensor:
    return q / q.norm(dim=1, keepdim=True)


def quat_error(q: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-component |q - ref| of unit quaternions, signs aligned (q and -q are one rotation)."""
    q, ref = unit_quats(q.double()), unit_quats(ref.double())
    sign = torch.where((q * ref).sum(dim=1, keepdim=True) < 0, -1.0, 1.0)
    return (q * sign - ref).abs()


def check_quats(q: torch.Tensor, ref: torch.Tensor) -> None:
    """The three smaller components within QUAT_SMALL, the largest within QUAT_LARGEST."""
    err = quat_error(q, ref)
    largest = unit_quats(ref.double()).abs().argmax(dim=1)
    is_largest = torch.nn.functional.one_hot(largest, 4).bool()
    assert err[~is_largest].max() <= QUAT_SMALL + EPS
    assert err[is_largest].max() <= QUAT_LARGEST


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def random_asset(n: int, degree: int, seed: int = 0) -> GaussianAsset:
    """Values inside every format's ranges."""
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    sh = torch.rand(n, k, 3, generator=g) * 1.8 - 0.9
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) * 6
    return GaussianAsset(
        means=torch.rand(n, 3, generator=g) * 20 - 10,
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.rand(n, 3, generator=g) * 14 - 9.5,
        opacity_logits=torch.randn(n, generator=g) * 3,
        sh=sh,
    )


# ------------------------------------------------------------------ .spz against the reference
def test_reference_spz_reads_within_quantisation(sources):
    """The reference tool's .spz (v3, its SH buckets) read by us matches the source asset."""
    for name in ("sh3", "sh0"):
        src = sources[name][0]
        notes = []
        ours = load_asset(DATA / f"ref_{name}.spz", notes=notes)
        assert notes == []
        assert ours.num_gaussians == src.num_gaussians and ours.sh_degree == src.sh_degree
        assert max_err(ours.means, src.means) <= SPZ_POS + EPS
        assert max_err(ours.opacities(), src.opacities()) <= SPZ_ALPHA + EPS
        assert max_err(ours.log_scales, src.log_scales) <= SPZ_LOG_SCALE + EPS
        assert max_err(ours.sh[:, 0], src.sh[:, 0]) <= SPZ_DC + EPS
        check_quats(ours.quats, src.quats)
        if src.sh_degree:
            assert max_err(ours.sh[:, 1:4], src.sh[:, 1:4]) <= REF_SPZ_SH1 + EPS
            assert max_err(ours.sh[:, 4:], src.sh[:, 4:]) <= REF_SPZ_SH_REST + EPS


@pytest.mark.parametrize("name", ["ref_sh0.spz", "ours_sh3_v3.spz", "ours_sh0_v2.spz"])
def test_spz_decodes_as_the_reference_does(name):
    """Our decode equals the reference tool's decode of the same file (its .spz -> .ply), and
    the reference reads the .spz files we write (v3 and v2) as we do."""
    ours = load_asset(DATA / name, notes=[])
    ref = gunzip_ply(f"{name}.ply.gz")
    for attr in ("means", "quats", "log_scales", "sh"):
        assert torch.equal(getattr(ours, attr), getattr(ref, attr)), attr
    # it keeps alpha bytes 0 / 255 at 1e-6 from 0 / 1; we clamp the logit at +-20
    assert max_err(ours.opacities(), ref.opacities()) <= 1e-6


def test_info_names_each_format(sources, tmp_path):
    splat = tmp_path / "a.splat"
    write_splat(sources["sh0"][0], splat)
    expected = {
        sources["sh3"][1]: "ply (INRIA)",
        DATA / "ref_sh3.compressed.ply": "ply (PlayCanvas compressed)",
        DATA / "ref_sh3.spz": "spz v3",
        DATA / "ours_sh0_v2.spz": "spz v2",
        splat: "splat",
    }
    for path, kind in expected.items():
        assert describe_format(path) == kind
    res = invoke("info", DATA / "ours_sh0_v2.spz")
    assert res.exit_code == 0 and "format        spz v2" in res.output
    res = invoke("info", DATA / "ref_sh3.compressed.ply", "--json")
    assert res.exit_code == 0 and '"format": "ply (PlayCanvas compressed)"' in res.output


# ------------------------------------------------------------------ our .spz writer
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_spz_round_trip_within_quantisation(version, degree):
    src = random_asset(500, degree, seed=degree)
    notes = []
    data = spz_to_bytes(src, version=version, notes=notes)
    assert notes == []  # everything inside the ranges: nothing clipped
    back = spz_from_bytes(data, "rt")
    assert back.sh_degree == degree and back.num_gaussians == 500
    assert max_err(back.means, src.means) <= SPZ_POS + EPS
    assert max_err(back.opacities(), src.opacities()) <= SPZ_ALPHA + EPS
    assert max_err(back.log_scales, src.log_scales) <= SPZ_LOG_SCALE + EPS
    assert max_err(back.sh[:, 0], src.sh[:, 0]) <= SPZ_DC + EPS
    if degree:
        assert max_err(back.sh[:, 1:], src.sh[:, 1:]) <= SPZ_SH + EPS
    if version == 3:
        check_quats(back.quats, src.quats)
    else:  # x, y, z stored (w >= 0), w derived
        q = unit_quats(src.quats.double())
        q = torch.where(q[:, :1] < 0, -q, q)
        assert max_err(back.quats[:, 1:], q[:, 1:]) <= SPZ_V2_XYZ + EPS
    # a read .spz written again keeps positions, colours, scales, opacities and SH exactly
    again = spz_from_bytes(spz_to_bytes(back, version=version, notes=[]), "again")
    for attr in ("means", "log_scales", "opacity_logits", "sh"):
        assert torch.equal(getattr(again, attr), getattr(back, attr)), attr


@pytest.mark.parametrize("version", [2, 3])
def test_spz_empty_asset_round_trips(version):
    empty = random_asset(0, 1)
    back = spz_from_bytes(spz_to_bytes(empty, version=version), "empty.spz")
    assert back.num_gaussians == 0 and back.sh_degree == 1


def test_spz_write_notes_clipping_and_large_coordinates(tmp_path):
    a = random_asset(20, 1)
    a.log_scales[0, 0] = -15.0  # below the smallest .spz scale (log -10)
    a.sh[1, 2, 0] = 3.0  # SH rest above +1
    notes = []
    back = spz_from_bytes(spz_to_bytes(a, notes=notes), "x")
    assert len(notes) == 1 and "1 log-scale" in notes[0] and "1 SH rest" in notes[0]
    assert back.log_scales[0, 0] == -10.0 and back.sh[1, 2, 0] == 127 / 128

    a.means[3] = torch.tensor([5000.0, 0.0, 0.0])  # needs 13 integer bits: 10 fractional left
    notes = []
    back = spz_from_bytes(spz_to_bytes(a, notes=notes), "x")
    assert any("10 fractional bits" in n for n in notes)
    assert max_err(back.means, a.means) <= 0.5 / 1024 + EPS

    a.means[3, 0] = 1e8
    with pytest.raises(AssetFormatError, match="24-bit"):
        spz_to_bytes(a)

    # convert writes .spz by extension; the CLI shows notes on stderr
    ply = tmp_path / "a.ply"
    write_ply(random_asset(30, 2), ply)
    res = invoke("convert", ply, tmp_path / "a.spz")
    assert res.exit_code == 0, res.output
    assert describe_format(tmp_path / "a.spz") == "spz v3"
    assert load_asset(tmp_path / "a.spz").sh_degree == 2


# ------------------------------------------------------------------ compressed .ply
@pytest.mark.parametrize("name", ["sh3", "sh0"])
def test_compressed_ply_decodes_exactly_as_the_reference(name):
    """Same values, bit for bit, as the reference's own compressed .ply -> .ply (whose +-inf
    opacity logits our PLY reader clamps, with a note)."""
    ours = load_asset(DATA / f"ref_{name}.compressed.ply", notes=[])
    notes = []
    ref = ply_from_bytes(
        gzip.decompress((DATA / f"ref_{name}.compressed.ply.ply.gz").read_bytes()),
        "ref",
        notes=notes,
    )[0]
    for attr in ("means", "quats", "log_scales", "opacity_logits", "sh"):
        assert torch.equal(getattr(ours, attr), getattr(ref, attr)), attr
    assert len(notes) == 1 and "of +inf loaded as opacity 1" in notes[0]


def test_compressed_ply_within_quantisation_of_the_source(sources):
    src = sources["sh3"][0]
    ours = load_asset(DATA / "ref_sh3.compressed.ply", notes=[])
    # the writer reorders Gaussians (Morton order): match each to its nearest source position
    match = torch.cdist(ours.means.double(), src.means.double()).argmin(dim=1)
    assert sorted(match.tolist()) == list(range(src.num_gaussians))
    s = GaussianAsset(*(t[match] for t in src.tensors().values()))
    extent = (src.means.max(0).values - src.means.min(0).values).double()
    steps = torch.tensor([2047.0, 1023.0, 2047.0], dtype=torch.float64)
    assert ((ours.means - s.means).abs() <= extent / steps / 2 + EPS).all()
    ls_extent = (src.log_scales.max(0).values - src.log_scales.min(0).values).double()
    assert ((ours.log_scales - s.log_scales).abs() <= ls_extent / steps / 2 + EPS).all()
    rgb = 0.5 + SH_C0 * src.sh[:, 0].double()
    rgb_step = (rgb.max(0).values - rgb.min(0).values) / 255 / 2
    assert ((ours.sh[:, 0] - s.sh[:, 0]).abs() * SH_C0 <= rgb_step + EPS).all()
    assert max_err(ours.opacities(), s.opacities()) <= SPZ_ALPHA + EPS
    err = quat_error(ours.quats, s.quats)
    largest = torch.nn.functional.one_hot(unit_quats(s.quats).abs().argmax(1), 4).bool()
    assert err[~largest].max() <= 0.5 * np.sqrt(2) / 1023 + EPS
    assert err[largest].max() <= QUAT_LARGEST
    assert max_err(ours.sh[:, 1:], s.sh[:, 1:]) <= CPLY_SH + EPS


# ------------------------------------------------------------------ +-inf and NaN opacity
def _ply_with_opacity(values: list[float]) -> bytes:
    """A PLY whose opacity column holds `values` (inf / nan written in place of sentinels)."""
    n = len(values)
    a = random_asset(n, 1)
    sentinels = [1000.0 + i for i in range(n)]
    a.opacity_logits = torch.tensor(sentinels)
    data = ply_to_bytes(a)
    for s, v in zip(sentinels, values, strict=True):
        old = np.float32(s).tobytes()
        assert data.count(old) == 1
        data = data.replace(old, np.float32(v).tobytes())
    return data


def test_infinite_opacity_loads_clamped_with_one_note():
    data = _ply_with_opacity([np.inf, 0.5, -np.inf, np.inf])
    notes = []
    asset = ply_from_bytes(data, "inf.ply", notes=notes)[0]
    assert notes == [
        "inf.ply: 2 opacity logit(s) of +inf loaded as opacity 1 and 1 of -inf as opacity 0 "
        f"(logit clamped to +-{OPACITY_LOGIT_LIMIT:g})"
    ]
    op = asset.opacities()
    assert op[0] == 1.0 and op[3] == 1.0  # exactly 1 in float32
    assert op[2] < 1 / 255  # below the renderer's alpha cut: not drawn, as opacity 0
    assert asset.opacity_logits[1] == 0.5
    check_asset_values(asset)
    with pytest.warns(AssetNoteWarning, match=r"\+inf"):  # no notes list: a warning
        ply_from_bytes(data, "inf.ply")


def test_nan_opacity_is_still_refused():
    with pytest.raises(AssetFormatError, match=r"nan\.ply: non-finite value nan in property "):
        ply_from_bytes(_ply_with_opacity([0.0, np.nan]), "nan.ply", notes=[])


# ------------------------------------------------------------------ bad files: one clear line
def _spz_header(n: int, degree: int = 0, version: int = 3, flags: int = 0) -> bytes:
    h = np.zeros(1, HEADER_DTYPE)
    h[0] = (SPZ_MAGIC, version, n, degree, 12, flags, 0)
    return h.tobytes()


def _gz(data: bytes) -> bytes:
    """gzip with a fixed timestamp: the bytes (and the test ids made from them) are the same in
    every process, as pytest-xdist's workers require."""
    return gzip.compress(data, mtime=0)


def _spz_payload(n: int, degree: int = 0, version: int = 3, flags: int = 0) -> bytes:
    per = 9 + 1 + 3 + 3 + (3 if version == 2 else 4) + 3 * ((degree + 1) ** 2 - 1)
    return _spz_header(n, degree, version, flags) + bytes(n * per)


GOOD_SPZ = (DATA / "ref_sh0.spz").read_bytes()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not an .spz file (an empty file"),
        (b"hello, not a splat", "not an .spz file"),
        (GOOD_SPZ[: len(GOOD_SPZ) // 2], "truncated .spz"),
        (GOOD_SPZ[:-4], "end marker"),  # the gzip trailer cut off
        (GOOD_SPZ[:-8] + bytes(4) + GOOD_SPZ[-4:], "corrupt .spz gzip data"),  # bad CRC
        (_gz(b"just some text, gzipped"), "NGSP"),
        (_gz(_spz_payload(4, version=1)), "unsupported .spz version 1"),
        (_gz(_spz_payload(4, degree=4)), "SH degree 4"),
        (_gz(_spz_payload(4, flags=2)), "extensions"),
        (b"NGSP" + (4).to_bytes(4, "little") + bytes(24), "version 4 (ZSTD"),
        # a header claiming 5M Gaussians in a tiny file: refused before allocating anything
        (_gz(_spz_header(5_000_000, 3)), "more than a"),
        (_gz(_spz_header(1 << 30)), "the limit of"),
    ],
)
def test_bad_spz_gives_one_clear_line(data, message):
    with pytest.raises(AssetFormatError) as e:
        spz_from_bytes(data, "bad.spz", notes=[])
    text = str(e.value)
    assert text.startswith("bad.spz: ") and "\n" not in text
    assert message in text


def test_spz_gzip_bomb_is_bounded():
    """Declares 10 Gaussians, then 64 MB of zeros (a 64 KB file): only the 10 are inflated."""
    bomb = gzip.compress(_spz_payload(10) + bytes(64 << 20), compresslevel=9)
    assert len(bomb) < 100_000
    notes = []
    asset = spz_from_bytes(bomb, "bomb.spz", notes=notes)
    assert asset.num_gaussians == 10
    assert notes == ["bomb.spz: data after the 10 Gaussians of the .spz was ignored"]


def _replace_header(data: bytes, old: bytes, new: bytes) -> bytes:
    end = data.index(b"end_header")
    assert data[:end].count(old) == 1
    return data[:end].replace(old, new) + data[end:]


COMPRESSED = (DATA / "ref_sh3.compressed.ply").read_bytes()
_BODY = COMPRESSED.index(b"end_header\n") + len(b"end_header\n")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (COMPRESSED[:-100], "truncated compressed PLY: element 'sh'"),
        (COMPRESSED + b"\0" * 8, "8 bytes after the declared elements"),
        (_replace_header(COMPRESSED, b"uint packed_color", b"uint packed_colour"), "lacks"),
        (_replace_header(COMPRESSED, b"uint packed_scale", b"float packed_scale"), "wrong type"),
        (
            _replace_header(COMPRESSED, b"element vertex 300", b"element vertex 600")[:-1],
            "truncated",
        ),
        (
            _replace_header(COMPRESSED, b"binary_little_endian", b"ascii"),
            "must be binary",
        ),
        (
            COMPRESSED[:_BODY] + np.float32(np.nan).tobytes() + COMPRESSED[_BODY + 4 :],
            "non-finite chunk bound min_x = nan in chunk 0",
        ),
    ],
)
def test_bad_compressed_ply_gives_one_clear_line(data, message):
    with pytest.raises(AssetFormatError) as e:
        ply_from_bytes(data, "bad.ply", notes=[])
    text = str(e.value)
    assert text.startswith("bad.ply: ") and "\n" not in text
    assert message in text


def test_bad_spz_through_the_cli(tmp_path):
    bad = tmp_path / "cut.spz"
    bad.write_bytes(GOOD_SPZ[: len(GOOD_SPZ) // 2])
    res = invoke("info", bad)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: truncated .spz")


def test_spz_and_compressed_ply_fuzz():
    """Mutated files load as valid assets or fail with AssetFormatError, nothing else."""
    rng = np.random.default_rng(7)
    payload = zlib.decompress(GOOD_SPZ, 16 + zlib.MAX_WBITS)
    cases = [(spz_from_bytes, GOOD_SPZ, False), (spz_from_bytes, payload, True)]
    cases.append((lambda d, s, notes: ply_from_bytes(d, s, notes=notes)[0], COMPRESSED, False))
    for reader, data, regzip in cases:
        for _ in range(80):
            b = bytearray(data)
            for i in rng.integers(0, len(b), size=int(rng.integers(1, 6))):
                b[i] = int(rng.integers(0, 256))
            if rng.random() < 0.2:
                del b[int(rng.integers(0, len(b))) :]
            mutated = gzip.compress(bytes(b)) if regzip else bytes(b)
            try:
                asset = reader(mutated, "fuzz", notes=[])
            except AssetFormatError:
                continue
            check_asset_values(asset, "fuzz")


# ------------------------------------------------------------------ the reference CLI (optional)
# installed from tests/tools/package-lock.json by scripts/setup.sh (the dev extra) where npm is
REFERENCE_CLI = Path(__file__).resolve().parents[1] / "tools/node_modules/.bin/splat-transform"


def _reference_cli() -> str | None:
    tool = os.environ.get("SPLAT_TRANSFORM", str(REFERENCE_CLI))
    return tool if shutil.which("node") and Path(tool).exists() else None


@pytest.mark.skipif(
    _reference_cli() is None,
    reason="needs node and splat-transform (bash scripts/setup.sh dev installs it into "
    "tests/tools where npm exists, or set SPLAT_TRANSFORM to its CLI)",
)
def test_reference_cli_reads_what_we_write(tmp_path):
    src = random_asset(300, 3, seed=5)
    write_spz(src, tmp_path / "ours.spz", notes=[])
    subprocess.run(
        [_reference_cli(), "-q", "-w", tmp_path / "ours.spz", tmp_path / "back.ply"],
        check=True,
        timeout=120,
    )
    ours = load_asset(tmp_path / "ours.spz")
    ref = load_asset(tmp_path / "back.ply", notes=[])
    for attr in ("means", "quats", "log_scales", "sh"):
        assert torch.equal(getattr(ours, attr), getattr(ref, attr)), attr
