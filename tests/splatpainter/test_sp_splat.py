"""antimatter15 .splat: byte layout, round trip within quantisation, malformed input."""

import struct

import numpy as np
import pytest
import torch

from splatpainter.assets import SH_C0, GaussianAsset
from splatpainter.io import (
    AssetFormatError,
    load_asset,
    read_splat,
    save_asset,
    splat_from_bytes,
    splat_to_bytes,
    write_splat,
)


def random_asset(n=200, degree=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return GaussianAsset(
        means=torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) - 4,
        opacity_logits=torch.randn(n, generator=g) * 2,
        sh=torch.randn(n, (degree + 1) ** 2, 3, generator=g) * 0.5,
    )


def test_byte_layout_of_one_gaussian():
    q = torch.tensor([[0.5, -0.5, 0.5, 0.5]]) * 3.0  # unnormalised on purpose
    a = GaussianAsset(
        means=torch.tensor([[1.0, -2.0, 3.5]]),
        quats=q,
        log_scales=torch.log(torch.tensor([[0.01, 0.02, 0.5]])),
        opacity_logits=torch.tensor([0.0]),  # alpha 0.5
        sh=((torch.tensor([[0.0, 0.5, 1.0]]) - 0.5) / SH_C0)[:, None, :],
    )
    raw = splat_to_bytes(a)
    assert len(raw) == 32
    pos = struct.unpack("<3f", raw[:12])
    scale = struct.unpack("<3f", raw[12:24])
    rgba = tuple(raw[24:28])
    rot = tuple(raw[28:32])
    assert pos == (1.0, -2.0, 3.5)
    assert np.allclose(scale, (0.01, 0.02, 0.5), rtol=1e-6)
    assert rgba == (0, 128, 255, 128)
    assert rot == (192, 64, 192, 192)  # q * 128 + 128 for q = (0.5, -0.5, 0.5, 0.5)


def test_round_trip_within_quantisation(tmp_path):
    a = random_asset(degree=2)
    p = tmp_path / "a.splat"
    write_splat(a, p)
    assert p.stat().st_size == 32 * a.num_gaussians
    b = read_splat(p)
    b.validate()
    assert b.sh_degree == 0
    assert torch.equal(b.means, a.means)
    assert torch.allclose(b.log_scales, a.log_scales, atol=1e-6)
    assert torch.allclose(b.base_colors(), a.base_colors().clamp(0, 1), atol=0.5 / 255 + 1e-6)
    assert torch.allclose(b.opacities(), a.opacities(), atol=0.5 / 255 + 1e-6)
    extreme = a.replace(opacity_logits=torch.full((a.num_gaussians,), 40.0))
    assert set(splat_to_bytes(splat_from_bytes(splat_to_bytes(extreme)))[27::32]) == {255}
    # rotations agree up to 8-bit quantisation (compare matrices: q and -q are the same)
    ra, rb = a.rotation_matrices(), b.rotation_matrices()
    assert (ra - rb).abs().max() < 0.05
    # a second trip is stable: quantised values are fixed points (rotation bytes up to 1 step,
    # since the stored quaternion is renormalised before quantising again)
    first = np.frombuffer(p.read_bytes(), np.uint8).reshape(-1, 32)
    second = np.frombuffer(splat_to_bytes(b), np.uint8).reshape(-1, 32)
    assert np.array_equal(first[:, :28], second[:, :28])
    assert np.abs(first[:, 28:].astype(int) - second[:, 28:]).max() <= 1


def test_sorted_output_is_a_permutation():
    a = random_asset(50)
    plain = splat_from_bytes(splat_to_bytes(a))
    srt = splat_from_bytes(splat_to_bytes(a, sort=True))
    importance = -(srt.log_scales.sum(1).exp() * srt.opacities())
    assert bool((importance[1:] >= importance[:-1] - 1e-6).all())
    key = lambda x: sorted(map(tuple, x.means.tolist()))  # noqa: E731
    assert key(plain) == key(srt)


def test_dispatch_via_extension(tmp_path):
    a = random_asset(10)
    save_asset(a, tmp_path / "x.SPLAT")
    assert load_asset(tmp_path / "x.SPLAT").num_gaussians == 10


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda raw: raw[:-3], "not a multiple of 32"),
        (lambda raw: b"", "empty"),
        (lambda raw: raw[:32] + struct.pack("<f", float("nan")) + raw[36:], "non-finite position"),
        (lambda raw: raw[:44] + struct.pack("<f", float("inf")) + raw[48:], "non-finite scale"),
        (lambda raw: raw[:44] + struct.pack("<f", -1.0) + raw[48:], "non-positive scale"),
        (lambda raw: raw[:60] + bytes([128, 128, 128, 128]) + raw[64:], "zero quaternion"),
    ],
)
def test_malformed(tmp_path, mutate, match):
    raw = splat_to_bytes(random_asset(4))
    p = tmp_path / "bad.splat"
    p.write_bytes(mutate(raw))
    with pytest.raises(AssetFormatError, match=match):
        load_asset(p)


def test_gaussian_index_in_error():
    raw = bytearray(splat_to_bytes(random_asset(6)))
    raw[3 * 32 + 28 : 3 * 32 + 32] = bytes([128] * 4)
    with pytest.raises(AssetFormatError, match="Gaussian 3"):
        splat_from_bytes(bytes(raw))
