"""``rope_nd`` against FLUX's closed form, axis by axis.

FLUX (``flux/math.py: rope`` / ``EmbedND``): position column ``i`` of ``[T, A]`` drives its own
block of ``axes_dim[i] / 2`` angle columns, in column order, with angle ``pos * theta^(-2j /
axes_dim[i])`` for ``j = 0 .. axes_dim[i] / 2 - 1``. Positions are (t, h, w): a token moved along
one axis rotates only that axis's block.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from knapformer.models.rope import rope_nd

AXES = (8, 12, 12)  # the (t, h, w) split of configs/tiny.toml
THETA = 10000.0


def _blocks(axes=AXES):
    """The angle columns of each axis: [0, 4), [4, 10), [10, 16) for (8, 12, 12)."""
    edges = [0]
    for d in axes:
        edges.append(edges[-1] + d // 2)
    return [range(a, b) for a, b in itertools.pairwise(edges)]


def _angles(pos: tuple[int, ...], axes=AXES, theta=THETA) -> list[float]:
    """The closed form, one Python float per angle column."""
    out = []
    for p, d in zip(pos, axes, strict=True):
        out += [p * theta ** (-2 * j / d) for j in range(d // 2)]
    return out


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_unit_position_on_one_axis_rotates_only_that_axis_block(axis):
    """(1, 0, 0) rotates only the first axes_dim[0]/2 columns, (0, 0, 1) only the last block;
    the rotated columns hold theta^(-2j/axes_dim[axis]) and every other column angle 0."""
    pos = [0, 0, 0]
    pos[axis] = 1
    cos, sin = rope_nd(torch.tensor([pos]), AXES, THETA, dtype=torch.float64)
    assert cos.shape == sin.shape == (1, sum(AXES) // 2)
    blocks = _blocks()
    d = AXES[axis]
    for b, cols in enumerate(blocks):
        for jj, c in enumerate(cols):
            want = THETA ** (-2 * jj / d) if b == axis else 0.0
            assert sin[0, c].item() == pytest.approx(math.sin(want), abs=1e-15), (b, jj)
            assert cos[0, c].item() == pytest.approx(math.cos(want), abs=1e-15), (b, jj)
    rotated = [c for c in range(cos.shape[1]) if sin[0, c] != 0]
    assert rotated == list(blocks[axis])


def test_angles_are_the_closed_form_for_general_positions():
    """Arbitrary (t, h, w), a non-default theta and uneven axes: every angle column matches
    pos[i] * theta^(-2j / axes_dim[i]) to float64 rounding."""
    axes, theta = (4, 6, 10), 500.0
    positions = [(0, 0, 0), (3, 0, 7), (1, 5, 2), (17, 9, 33)]
    cos, sin = rope_nd(torch.tensor(positions), axes, theta, dtype=torch.float64)
    want = torch.tensor([_angles(p, axes, theta) for p in positions], dtype=torch.float64)
    torch.testing.assert_close(cos, want.cos(), rtol=0, atol=1e-14)
    torch.testing.assert_close(sin, want.sin(), rtol=0, atol=1e-14)
