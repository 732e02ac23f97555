"""Seeded mutation fuzzing of the PLY and .splat readers (CI: a few seconds).

Every mutated file must either load as an asset that passes the load-time value checks and
writes back to bytes that load again (in its own format and converted to the other, as
`convert` does), or fail with AssetFormatError; never another exception, never a hang, never
non-finite values.
"""

import numpy as np
import pytest
import torch

from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.io import (
    AssetFormatError,
    check_asset_values,
    ply_from_bytes,
    ply_to_bytes,
    splat_from_bytes,
    splat_to_bytes,
)

CASES = 300


def _asset(seed, n=5, k=1):
    g = torch.Generator().manual_seed(seed)
    return GaussianAsset(
        means=torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) - 3,
        opacity_logits=torch.randn(n, generator=g),
        sh=torch.randn(n, k, 3, generator=g),
    )


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    # size-preserving mutations (bit flips, special values) reach the value checks more often
    op = rng.choice(7, p=[0.3, 0.1, 0.1, 0.25, 0.1, 0.075, 0.075])
    if op == 0 and b:  # flip random bits
        for i in rng.integers(0, len(b), size=rng.integers(1, 8)):
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif op == 1:  # truncate
        del b[int(rng.integers(0, len(b) + 1)) :]
    elif op == 2:  # append junk
        b += rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    elif op == 3 and b:  # overwrite a run with special float32 values
        special = np.array([np.nan, np.inf, -np.inf, 3e38, 1e-45, 0.0, 1e6, -1e6], "<f4")
        i = int(rng.integers(0, max(1, len(b) - 4)))
        b[i : i + 4] = special[int(rng.integers(0, len(special)))].tobytes()
    elif op == 4:  # change a declared count
        text = bytes(b)
        k = text.find(b"element vertex ")
        if k >= 0:
            end = text.find(b"\n", k)
            new = str(int(rng.integers(0, 12))).encode()
            b = bytearray(text[: k + 15] + new + text[end:])
    elif op == 5 and b:  # duplicate a slice
        i = int(rng.integers(0, len(b)))
        j = min(len(b), i + int(rng.integers(1, 40)))
        b[i:i] = b[i:j]
    elif b:  # delete a slice
        i = int(rng.integers(0, len(b)))
        del b[i : i + int(rng.integers(1, 40))]
    return bytes(b)


def _check(reader, writer, data):
    try:
        result = reader(data, "fuzz")
    except AssetFormatError:
        return "rejected"
    asset = result[0] if isinstance(result, tuple) else result
    check_asset_values(asset, "fuzz")  # what the reader returns passes the load-time checks
    for t in asset.tensors().values():
        assert torch.isfinite(t).all()
    # What we write always loads: in the same format, and converted to the other one.
    for write, read in (
        (writer, reader),
        (ply_to_bytes, ply_from_bytes),
        (splat_to_bytes, splat_from_bytes),
    ):
        try:
            out = write(asset)
        except AssetFormatError:
            assert asset.num_gaussians == 0  # only an empty asset cannot become a .splat
            continue
        back = read(out, "rewritten")
        back = back[0] if isinstance(back, tuple) else back
        assert back.num_gaussians == asset.num_gaussians
    return "accepted"


@pytest.mark.parametrize("fmt", ["binary_little_endian", "binary_big_endian", "ascii"])
def test_fuzz_ply_reader(fmt):
    rng = np.random.default_rng(13)
    seeds = [_asset(s, n=int(rng.integers(1, 6)), k=int(rng.choice([1, 4, 9]))) for s in range(4)]
    originals = [ply_to_bytes(a, fmt=fmt) for a in seeds]
    outcomes = {"rejected": 0, "accepted": 0}
    for i in range(CASES):
        data = originals[i % len(originals)]
        for _ in range(int(rng.integers(1, 4))):
            data = _mutate(data, rng)
        outcomes[_check(ply_from_bytes, lambda a: ply_to_bytes(a, fmt=fmt), data)] += 1
    assert outcomes["rejected"] > CASES // 4 and outcomes["accepted"] > 0, outcomes


def test_fuzz_splat_reader():
    rng = np.random.default_rng(31)
    originals = [splat_to_bytes(_asset(s, n=int(rng.integers(1, 8)))) for s in range(4)]
    outcomes = {"rejected": 0, "accepted": 0}
    for i in range(CASES):
        data = originals[i % len(originals)]
        for _ in range(int(rng.integers(1, 4))):
            data = _mutate(data, rng)
        outcomes[_check(splat_from_bytes, splat_to_bytes, data)] += 1
    assert outcomes["rejected"] > CASES // 10 and outcomes["accepted"] > CASES // 10, outcomes
