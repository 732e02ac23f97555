"""The no-learning editors (edit/rules.py) and the bleed metric they are scored with: exact
no-ops, a colour rule that beats back-projection where colour identifies the part, a diffusion
that stays on its object, and bleed measured on the twin's pixels."""

import math
from types import SimpleNamespace

import pytest
import torch

from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.camera import orbit_cameras
from splatpainter.edit import BackprojectMethod, DiffusionMethod, EditSession, EditView, RuleMethod
from splatpainter.edit.methods import EditMethod
from splatpainter.edit.rules import diffuse_labels
from splatpainter.eval.suite import (
    PSNR_CAP_DB,
    NoEditMethod,
    _score,
    _truth,
    bleed_masks,
    evaluate_edit,
)
from splatpainter.render import render
from splatpainter.train.data import SequenceSpec, base_colors, make_sequence, with_base_colors


def _seq(kind: str, seed: int = 0, n: int = 2000, **kw):
    spec = SequenceSpec(min_gaussians=n, max_gaussians=n, min_edits=1, max_edits=1,
                        first_kind=kind, view_size=48, num_heldout=3, **kw)  # fmt: skip
    return make_sequence(seed, spec)


def _same(a: GaussianAsset, b: GaussianAsset) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.tensors().values(), b.tensors().values(), strict=True)
    )


@pytest.mark.parametrize("method", [RuleMethod, DiffusionMethod])
@pytest.mark.parametrize("kind", ["auto", "recolor", "relight", "paint"])
def test_rules_are_exact_no_ops_when_the_view_equals_the_render(method, kind):
    seq = _seq("recolor", n=1500)
    cam = seq.steps[0].views[0].camera
    view = EditView(cam, render(seq.source, cam).rgb)
    out, state = method(kind=kind).apply(seq.source, [view], None)
    assert state is None and _same(out, seq.source)


def test_rule_told_recolor_beats_backprojection_on_changed_pixels():
    seq = _seq("recolor")
    truth = _truth(seq, 0)
    psnr = {
        name: _score(EditSession(seq.source, m).apply(seq.steps[0].views), truth, seq.heldout)[
            "psnr_changed"
        ]
        for name, m in [("bp", BackprojectMethod()), ("rule", RuleMethod(kind="recolor"))]
    }
    assert psnr["rule"] >= psnr["bp"] + 10.0, psnr


def test_rule_decides_the_kind_from_the_evidence():
    from splatpainter.edit.rules import fit_edit

    for kind, expected in [("relight", "relight"), ("global", "recolor"), ("paint", "paint")]:
        seq = _seq(kind)
        assert fit_edit(seq.source, seq.steps[0].views).kind == expected, kind


def test_diffusion_labels_stay_on_the_connected_part():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(300, 3, generator=g) * 0.2
    points = torch.cat([a, a + torch.tensor([5.0, 0.0, 0.0])])
    ones = torch.zeros(600, dtype=torch.bool)
    ones[:20] = True
    label = diffuse_labels(points, ones, torch.zeros_like(ones))
    assert bool((label[300:] == 0).all())
    assert float(label[20:300].min()) > 0.5


# ------------------------------------------------------------------------------ twins
def _twin_scene():
    """A procedural object (A) recoloured, and its identical twin (B) far off to the side,
    outside the edit view: colour says B is part of the edit, space says it is not."""
    seq = _seq("global", seed=1, n=1500)
    a, step = seq.source, seq.steps[0]
    shift = torch.tensor([6.0, 0.0, 0.0])
    b = a.replace(means=a.means + shift)

    def both(x: GaussianAsset, y: GaussianAsset) -> GaussianAsset:
        pairs = zip(x.tensors().values(), y.tensors().values(), strict=True)
        return GaussianAsset(*(torch.cat([u, v]) for u, v in pairs))

    source = both(a, b)
    gt = both(with_base_colors(a, step.colors), b)
    n = a.num_gaussians
    views = [EditView(v.camera, render(gt, v.camera).rgb.clamp(0, 1)) for v in step.views]
    assert all(
        torch.equal(
            render(gt, v.camera).rgb, render(with_base_colors(a, step.colors), v.camera).rgb
        )
        for v in step.views
    )  # fmt: skip  (B is out of the edit view)
    in_b = torch.arange(2 * n) >= n
    return source, gt, views, in_b


def test_diffusion_does_not_reach_a_separate_object_that_the_colour_rule_recolours():
    source, _, views, in_b = _twin_scene()
    diffused = EditSession(source, DiffusionMethod(kind="recolor")).apply(views)
    ruled = EditSession(source, RuleMethod(kind="recolor")).apply(views)
    assert torch.equal(diffused.sh[in_b], source.sh[in_b])  # the twin keeps its bits
    moved = (base_colors(diffused) - base_colors(source)).abs().amax(-1) > 0.05
    assert int(moved[~in_b].sum()) > 0.5 * int((~in_b).sum())  # A itself is recoloured
    twin_moved = (base_colors(ruled) - base_colors(source))[in_b].abs().amax(-1) > 0.05
    assert float(twin_moved.float().mean()) > 0.5  # colour alone drags the twin along


class _Fixed(EditMethod):
    name = "fixed"

    def __init__(self, asset) -> None:
        super().__init__()
        self.asset = asset

    def apply(self, asset, views, state):
        return self.asset, state


def test_bleed_is_scored_on_the_twin_pixels():
    source, gt, views, in_b = _twin_scene()
    n = source.num_gaussians
    changed = ~in_b
    cams = orbit_cameras(source, 3, width=48, height=48, elevation_deg=20.0)
    # both twins recoloured: right on A, wrong on every pixel of B
    both = with_base_colors(source, torch.cat([base_colors(gt)[~in_b]] * 2))
    step = SimpleNamespace(kind="recolor", views=views, changed=changed, colors=base_colors(gt),
                           bleed=in_b.clone())  # fmt: skip
    seq = SimpleNamespace(seed=0, source=source, steps=[step], heldout=cams,
                          asset_at=lambda k: source if k < 0 else gt)  # fmt: skip
    methods = {"none": NoEditMethod(), "oracle": _Fixed(gt), "both": _Fixed(both)}
    scores, facts, _ = evaluate_edit(seq, methods)
    assert facts["bleed_pixel_fraction"] > 0.005
    # the bleed pixels are B's pixels: where B alone covers the view
    masks = bleed_masks(source, in_b, cams, [torch.zeros(48, 48, dtype=torch.bool)] * 3)
    for cam, m in zip(cams, masks, strict=True):
        b_alone = render(source.subset(in_b.nonzero().squeeze(1)), cam).alpha > 0.3
        assert bool(m.any()) and bool((m <= b_alone).all())
    assert scores["oracle"]["psnr_bleed"] == PSNR_CAP_DB
    assert scores["none"]["psnr_bleed"] == PSNR_CAP_DB  # the twin is unchanged in the GT
    assert scores["both"]["psnr_bleed"] < 25.0
    assert scores["both"]["psnr_changed"] == PSNR_CAP_DB  # A itself is right
    # without a bleed set there is nothing to measure
    del step.bleed
    scores, facts, _ = evaluate_edit(seq, {"both": _Fixed(both)})
    assert math.isnan(scores["both"]["psnr_bleed"]) and math.isnan(facts["bleed_pixel_fraction"])
    assert n == 2 * int(changed.sum())
