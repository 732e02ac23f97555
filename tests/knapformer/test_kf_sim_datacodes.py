"""Data-code grammar, token arithmetic, mixtures and the seeded sampler."""

import json

import numpy as np
import pytest

from knapformer.sim.datacodes import (
    MIXTURES,
    TEXT_TOKENS_MAX,
    DataCodeError,
    LengthsFileError,
    load_lengths_file,
    parse_data_codes,
    resolve_mixture,
    sample_steps,
)


def test_token_arithmetic():
    (video,) = parse_data_codes("g8b2i256f85s1").codes
    assert video.visual_tokens == 256 * 25 == 6400  # floor(85 / 3.4) = 25 (exactly 25.0)
    (img,) = parse_data_codes("g1b10i256f4s0").codes
    assert img.visual_tokens == 256 * 4
    (big,) = parse_data_codes("g8b1i2048f1s0").codes
    assert big.visual_tokens == 128 * 128
    (short,) = parse_data_codes("g1b1i512f3s1").codes
    assert short.visual_tokens == 32 * 32 * 1  # max(floor(3 / 3.4), 1)
    (odd,) = parse_data_codes("g1b1i500f1s0").codes
    assert odd.visual_tokens == 31 * 31  # floor(500 / 16)


@pytest.mark.parametrize("name,gpus", [("lowres", 32), ("mixres", 32), ("joint", 32)])
def test_paper_mixtures_describe_32_gpus(name, gpus):
    assert resolve_mixture(name).gpus == gpus
    assert resolve_mixture(name).text == MIXTURES[name]


def test_sampler_bounds_and_determinism():
    mix = parse_data_codes("g2b3i256f1s0,g1b1i512f85s1")
    steps = sample_steps(mix, 3, steps=50, seed=7)
    assert steps == sample_steps(mix, 3, steps=50, seed=7)
    assert steps != sample_steps(mix, 3, steps=50, seed=8)
    for step in steps:
        assert [len(r) for r in step] == [3, 3, 1]
        for r, base in ((0, 256), (1, 256), (2, 1024 * 25)):
            for L in step[r]:
                lo = int(np.floor(base * 0.96))
                hi = int(np.ceil(base * 1.04)) + TEXT_TOKENS_MAX
                assert lo <= L <= hi
    # text tokens and jitter really vary: not all lengths of a rank are equal
    assert len({L for step in steps for L in step[0]}) > 20


def test_tiling_replicas_and_non_multiple():
    mix = resolve_mixture("mixres")
    codes64 = mix.rank_codes(64)
    assert len(codes64) == 64 and codes64[:32] == codes64[32:]
    steps = sample_steps(mix, 64, steps=1, seed=0)
    assert len(steps[0]) == 64
    with pytest.raises(DataCodeError, match=r"describes 32 GPUs; --gpus 48 is not a multiple"):
        sample_steps(mix, 48, steps=1)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("g8b2i256f85", "bad data code 'g8b2i256f85'"),
        ("g8b2i256f85s2", "S must be 0 or 1"),
        ("g0b2i256f1s0", "G (ranks) must be >= 1"),
        ("g1b1i8f1s0", "below one 16-pixel patch"),
        ("g1b1i256f1s0,,g1b1i256f1s0", "empty code at position 2"),
        ("", "empty data codes"),
        ("gXb1i256f1s0", "bad data code 'gXb1i256f1s0'"),
    ],
)
def test_bad_codes_name_the_problem(text, needle):
    with pytest.raises(DataCodeError) as info:
        parse_data_codes(text)
    assert needle in str(info.value)


def test_unknown_mixture():
    with pytest.raises(DataCodeError, match=r"unknown mixture 'hires'.*lowres, mixres, joint"):
        resolve_mixture("hires")


def test_lengths_file_formats(tmp_path):
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"ranks": [[5, 6], [7]]}))
    assert load_lengths_file(one) == [[[5, 6], [7]]]
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"steps": [{"ranks": [[1], [2]]}, [[3], [4, 5]]]}))
    assert load_lengths_file(many) == [[[1], [2]], [[3], [4, 5]]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ranks": [[5, 0]]}))
    with pytest.raises(LengthsFileError, match="rank 0 has a bad length 0"):
        load_lengths_file(bad)
    with pytest.raises(LengthsFileError, match="No such file or directory"):
        load_lengths_file(tmp_path / "missing.json")
    ragged = tmp_path / "ragged.json"
    ragged.write_text(json.dumps({"steps": [[[1], [2]], [[3]]]}))
    with pytest.raises(LengthsFileError, match="disagree on the number of ranks"):
        load_lengths_file(ragged)
