"""Edit-data suites that break the colour shortcut (issue #21): distractor scenes with twins,
shared colours, textured parts and partial recolours; capture-like scenes; per-Gaussian bleed
facts; SH bands edited consistently with the colour edit."""

from __future__ import annotations

import hashlib

import pytest
import torch

from splatpainter.assets.procedural import Texture
from splatpainter.train.data import (
    SUITES,
    EditDataError,
    SequenceSpec,
    apply_color_transform,
    bleed_mask,
    color_transform_map,
    edit_sh,
    make_sequence,
)

TINY = dict(min_gaussians=1000, max_gaussians=2000, view_size=32, num_heldout=1, max_views=1)


def _spec(**kw) -> SequenceSpec:
    return SequenceSpec(**{**TINY, **kw})


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("kind", ["sunburst", "plaid"])
@pytest.mark.parametrize("space", ["uv", "object"])
def test_new_textures_are_deterministic_multicolour_and_in_range(kind, space):
    gen = torch.Generator().manual_seed(0)
    uv = torch.rand(2000, 2, generator=gen, dtype=torch.float64)
    local = 0.3 * (torch.rand(2000, 3, generator=gen, dtype=torch.float64) - 0.5)
    tex = Texture(kind, (0.9, 0.6, 0.1), (0.3, 0.1, 0.05), frequency=8.0, space=space, axis=2)
    a, b = tex.sample(uv, local), tex.sample(uv.clone(), local.clone())
    assert torch.equal(a, b)
    assert a.shape == (2000, 3) and float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert len(torch.unique((a * 255).round(), dim=0)) >= 3  # one part, several colours


def test_suite_is_validated():
    assert SUITES == ("procedural", "distractor", "capture")
    with pytest.raises(EditDataError, match="unknown suite"):
        SequenceSpec(suite="real")


# Recorded from the generator before the suites existed (same spec): sha256 of round(colours
# x 1000) as int32 and of the changed masks, per step.
PROCEDURAL_BEFORE = {
    (0, None): (["f61983e9d3bee0e7", "3830df71d819fa37"], ["5f13088d24f5e82a", "b68dca0cee502e7a"]),
    (1, None): (["4bf86350aaa2fe8a"], ["67a5009bd31a3fde"]),
    (0, "recolor"): (
        ["f7bce7ae337c591d", "3299595892e4ae83"],
        ["83dad77d5a7f0b18", "87fca2aab45678a1"],
    ),
    (1, "recolor"): (["d68b145952bb2671"], ["62ae00586d98cb3e"]),
}


@pytest.mark.parametrize(("seed", "first_kind"), list(PROCEDURAL_BEFORE))
def test_procedural_suite_is_unchanged(seed, first_kind):
    spec = SequenceSpec(min_gaussians=1000, max_gaussians=2000, view_size=32, first_kind=first_kind)
    seq = make_sequence(seed, spec)
    colors = [_digest((s.colors * 1000).round().to(torch.int32)) for s in seq.steps]
    changed = [_digest(s.changed) for s in seq.steps]
    assert (colors, changed) == PROCEDURAL_BEFORE[(seed, first_kind)]
    assert bool((seq.instance_id == 0).all()) and bool((seq.twin_index == -1).all())


def test_distractor_is_deterministic():
    spec = _spec(suite="distractor", min_edits=2, max_edits=2)
    a, b = make_sequence(5, spec), make_sequence(5, spec)
    for name, t in a.source.tensors().items():
        assert torch.equal(t, b.source.tensors()[name]), name
    assert torch.equal(a.instance_id, b.instance_id) and torch.equal(a.twin_index, b.twin_index)
    for sa, sb in zip(a.steps, b.steps, strict=True):
        for name in ("colors", "changed", "bleed", "sh", "rest_map"):
            assert torch.equal(getattr(sa, name), getattr(sb, name)), name
    assert not torch.equal(a.source.means, make_sequence(6, spec).source.means)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_distractor_twins_are_identical_apart_from_position(seed):
    kind = "detail" if seed % 2 else "paint"  # detail: the source is low-passed per object
    seq = make_sequence(seed, _spec(suite="distractor", first_kind=kind, fuzzy_prob=0.5))
    src, twin = seq.source, seq.twin_index
    assert bool((twin >= 0).any()), "every distractor scene has a twin"
    i = (twin >= 0).nonzero().flatten()
    j = twin[i]
    assert torch.equal(twin[j], i)  # a symmetric pairing
    assert bool((seq.instance_id[i] != seq.instance_id[j]).all())
    for name, t in src.tensors().items():
        if name != "means":
            assert torch.equal(t[i], t[j]), name
    shift = src.means[i] - src.means[j]
    first = shift[seq.instance_id[i] == seq.instance_id[i[0]]]
    torch.testing.assert_close(first, first[:1].expand_as(first), atol=1e-6, rtol=0)
    assert float(first[0].norm()) > 0.3
    # Separate objects with a clear gap, the scene inside the unit cube.
    inst = seq.instance_id
    for o in inst.unique().tolist():
        d = torch.cdist(src.means[inst == o], src.means[inst != o])
        assert float(d.min()) >= 0.1
    assert float(src.means.abs().max()) <= 0.5


def test_distractor_shares_colours_across_objects():
    checked = 0
    for seed in range(6):
        seq = make_sequence(seed, _spec(suite="distractor", kinds=("paint",)))
        index = torch.arange(seq.source.num_gaussians)
        original = (seq.twin_index < 0) | (seq.twin_index > index)  # not a twin's second copy
        keys = (seq.source_colors * 255).round().int()
        palettes = [
            {tuple(c) for c in keys[original & (seq.instance_id == o)].tolist()}
            for o in seq.instance_id.unique().tolist()
        ]
        palettes = [p for p in palettes if p]
        if len(palettes) < 2:
            continue  # only a twin pair
        checked += 1
        assert any(palettes[x] & palettes[y] for x in range(len(palettes)) for y in range(x))
    assert checked >= 2


def test_bleed_covers_the_twin_and_is_disjoint_from_changed():
    found = False
    for seed in range(12):
        seq = make_sequence(seed, _spec(suite="distractor", first_kind="recolor"))
        step = seq.steps[0]
        assert not bool((step.bleed & step.changed).any())
        ch = step.changed & (seq.twin_index >= 0)
        if int(ch.sum()) < 10:
            continue
        found = True
        at_twin = torch.zeros_like(step.changed)
        at_twin[seq.twin_index[ch]] = True
        at_twin &= ~step.changed
        assert bool(step.bleed.any()) and bool((step.bleed | ~at_twin).all())
        break
    assert found, "no twin-part recolour in 12 seeds"


def test_bleed_rule():
    n = 8
    before = torch.tensor([[0.9, 0.1, 0.1]] * 4 + [[0.92, 0.12, 0.1], [0.1, 0.1, 0.9]] * 2)
    changed = torch.tensor([True, True, False, False, False, False, False, False])
    twin = torch.tensor([6, -1, -1, -1, -1, -1, 0, -1])
    bleed = bleed_mask("recolor", before, changed, twin)
    # same colour: 2, 3, 4, 6 (4: near); twin of 0: 6; the blue ones 5 and 7 are not at risk
    assert bleed.tolist() == [False, False, True, True, True, False, True, False]
    for kind in ("global", "relight"):
        assert not bool(bleed_mask(kind, before, changed, twin).any())
    assert not bool(bleed_mask("paint", before, torch.zeros(n, dtype=torch.bool), twin).any())


def test_partial_recolour_stops_inside_the_part():
    cut = 0
    for seed in range(4):
        seq = make_sequence(seed, _spec(suite="distractor", first_kind="recolor", partial_prob=1.0))
        ch = seq.steps[0].changed
        parts = seq.primitive_id[ch].unique()
        assert parts.numel() == 1  # one part ...
        cut += int(((seq.primitive_id == parts[0]) & ~ch).sum()) > 0  # ... not all of it
    assert cut >= 3  # (a transform may leave a few Gaussians of the region unchanged)


def test_sh_rest_follows_matrix_hsv_and_relight():
    gen = torch.Generator().manual_seed(0)
    n = 64
    colors = 0.1 + 0.8 * torch.rand(n, 3, generator=gen)
    sh = 0.2 * torch.randn(n, 16, 3, generator=gen)
    m = torch.tensor([[0.9, 0.2, 0.0], [0.1, 0.7, 0.3], [-0.2, 0.1, 1.1]])
    params = torch.cat([m, torch.tensor([[0.05], [0.0], [-0.02]])], 1)
    maps = color_transform_map(colors, "matrix", params)
    out = edit_sh(sh, apply_color_transform(colors, "matrix", params), maps)
    torch.testing.assert_close(out[:, 1:], sh[:, 1:] @ m.T)  # M applied to every band
    # HSV: the map is the colour transform's Jacobian (a small step is transformed by it).
    hsv = torch.tensor([0.2, 1.1, 0.9])
    jac = color_transform_map(colors, "hsv", hsv)
    step = 1e-3 * torch.randn(n, 3, generator=gen, dtype=torch.float64)
    c64 = colors.double()
    moved = apply_color_transform(c64 + step, "hsv", hsv.double())
    moved = moved - apply_color_transform(c64, "hsv", hsv.double())
    torch.testing.assert_close(
        torch.einsum("nij,nj->ni", jac.double(), step), moved, atol=2e-5, rtol=0
    )
    # Identity maps keep the bands' bits.
    eye = torch.eye(3).expand(n, 3, 3)
    assert torch.equal(edit_sh(sh, colors, eye)[:, 1:], sh[:, 1:])


@pytest.mark.parametrize("suite", ["procedural", "capture"])
def test_sequence_sh_matches_relight_and_recolour(suite):
    for kind in ("relight", "recolor"):
        seq = make_sequence(2, _spec(suite=suite, first_kind=kind, fuzzy_prob=1.0))
        step, prev = seq.steps[0], seq.source.sh
        assert seq.source.sh_degree == 3
        assert torch.equal(seq.asset_at(0).sh, step.sh)
        torch.testing.assert_close(
            step.sh[:, 1:], torch.einsum("nij,nkj->nki", step.rest_map, prev[:, 1:])
        )
        if kind == "relight":  # shade x I, the same shade that scaled the colour
            shade = step.rest_map[:, 0, 0]
            torch.testing.assert_close(step.rest_map, shade[:, None, None] * torch.eye(3))
            torch.testing.assert_close(step.sh[:, 1:], shade[:, None, None] * prev[:, 1:])
            ok = (seq.source_colors * shade[:, None] < 1).all(-1)
            torch.testing.assert_close(
                step.colors[ok], seq.source_colors[ok] * shade[ok, None], atol=1e-5, rtol=0
            )
            assert not bool(step.bleed.any())
        else:  # unchanged Gaussians keep identity maps and their bands
            same = ~step.changed & (step.rest_map == torch.eye(3)).flatten(1).all(-1)
            assert int(same.sum()) > 0
            assert torch.equal(step.sh[same, 1:], prev[same, 1:])


def test_matrix_recolour_in_a_sequence_maps_every_band():
    for seed in range(10):
        seq = make_sequence(seed, _spec(suite="capture", first_kind="recolor"))
        step = seq.steps[0]
        maps = step.rest_map[step.changed]
        if not torch.equal(maps, maps[:1].expand_as(maps)):
            continue  # an HSV recolour: per-Gaussian Jacobians
        m = maps[0]
        assert not torch.equal(m, torch.eye(3))
        ch = step.changed
        torch.testing.assert_close(step.sh[ch, 1:], seq.source.sh[ch, 1:] @ m.T)
        return
    pytest.fail("no matrix recolour in 10 seeds")


def test_capture_scenes_are_fuzzy_with_floaters():
    for seed in range(3):
        seq = make_sequence(seed, _spec(suite="capture", first_kind="paint"))
        a = seq.source
        assert a.sh_degree == 3
        body = seq.instance_id >= 0
        s = a.scales()[body]
        flat = s.min(1).values / s.max(1).values
        assert float(flat.median()) > 0.15  # procedural splats: 0.05
        assert float(a.opacities()[body].median()) < 0.6
        assert float(a.sh[:, 1:].abs().mean()) > 0.05  # fuzz_asset: about 0.03
        floaters = seq.instance_id == -1
        assert 0.01 <= float(floaters.float().mean()) <= 0.06
        assert bool((seq.primitive_id[floaters] == -1).all())
        torch.testing.assert_close(seq.normals.norm(dim=1), torch.ones(a.num_gaussians))
        assert float(a.means.abs().max()) <= 0.5 + 1e-6


@pytest.mark.parametrize("suite", SUITES)
def test_every_kind_runs_in_every_suite(suite):
    for i, kind in enumerate(("paint", "recolor", "global", "relight", "detail")):
        seq = make_sequence(i, _spec(suite=suite, first_kind=kind, max_edits=1))
        step = seq.steps[0]
        n = seq.source.num_gaussians
        assert step.colors.shape == (n, 3) and step.rest_map.shape == (n, 3, 3)
        assert step.sh.shape == seq.source.sh.shape and step.bleed.shape == (n,)
        assert seq.instance_id.dtype == torch.int64 and int(step.changed.sum()) >= 10


@pytest.mark.parametrize("suite", ["procedural", "distractor", "capture"])
def test_a_brush_dab_paints_a_screen_square_of_what_its_view_shows(suite):
    """Deterministic; every Gaussian it changes is seen by the edit view and projects inside a
    square at most BRUSH_SIDES[1] of the view across; some dabs cut across parts."""
    from splatpainter.train.data import BRUSH_SIDES, _visible

    spec = _spec(suite=suite, first_kind="brush", min_edits=1, max_edits=1)
    crossing = 0
    for seed in range(4):
        seq = make_sequence(seed, spec)
        again = make_sequence(seed, spec)
        step = seq.steps[0]
        assert step.kind == "brush" and torch.equal(step.colors, again.steps[0].colors)
        cam = step.views[0].camera
        changed = step.changed
        assert int(changed.sum()) >= 10
        assert bool(_visible(seq.source, cam)[changed].all())
        uv, _ = cam.project(seq.source.means[changed])
        side = (uv.amax(0) - uv.amin(0)).max()
        assert float(side) <= BRUSH_SIDES[1] * cam.width
        crossing += len(torch.unique(seq.primitive_id[changed])) >= 2
    assert crossing >= 2
