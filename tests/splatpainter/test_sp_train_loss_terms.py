"""``sequence_loss`` is what its config says: the weighted sum of its four logged parts (in the
configured ``loss.form``), every term matters on its own, and the held-out views are rendered as
many times as ``data.loss_views`` asks (plus the edit view) for every edit of the sequence."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

import splatpainter.render
from splatpainter.model.editor import EditorModel
from splatpainter.train.config import load_config
from splatpainter.train.examples import ensure_cache, load_example
from splatpainter.train.loop import sequence_loss

TINY = Path(__file__).resolve().parents[2] / "configs" / "splatpainter" / "tiny.toml"
PARTS = ("gauss_changed", "gauss_unchanged", "render_changed", "render_unchanged")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny config (cache in a tmp dir), the first cached training example with two edits,
    and the seeded model with its (untrained) weights perturbed so every loss term is non-zero."""
    cfg = load_config(TINY)
    cfg.data.cache_dir = str(tmp_path_factory.mktemp("cache"))
    s2 = cfg.model.stage2
    for seed in range(cfg.data.first_seed, cfg.data.first_seed + 10):
        paths = ensure_cache(
            [seed],
            cfg.data.sequence_spec(cfg.data.suites[0]),
            cfg.model.stage1,
            cfg.data.loss_view_size,
            cfg.data.cache_dir,
            settings=s2.signal_settings(),
            graph=(s2.prop_k, s2.prop_anchors) if s2.propagate else None,
            workers=1,
        )
        ex = load_example(paths[seed])
        if len(ex["steps"]) >= 2:  # so the parts really are sums over edits
            break
    assert len(ex["steps"]) >= 2
    model = EditorModel.initial(cfg.model, seed=cfg.optim.seed)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return cfg, ex, model


def _loss(cfg, ex, model, seed: int = 0):
    with torch.no_grad():
        return sequence_loss(model, ex, cfg, torch.Generator().manual_seed(seed))


def _with(cfg, **loss):
    c = copy.deepcopy(cfg)
    for k, v in loss.items():
        setattr(c.loss, k, v)
    return c


def test_mse_total_is_the_weighted_sum_of_the_logged_parts(setup):
    """form 'mse': total == sum_k weight_k * part_k (parts summed over the edits), with distinct
    weights so no term can stand in for another."""
    cfg, ex, model = setup
    weights = dict(zip(PARTS, (1.0, 2.0, 3.0, 5.0), strict=True))
    c = _with(cfg, form="mse", **weights)
    total, parts = _loss(c, ex, model)
    assert set(parts) == set(PARTS)
    assert all(parts[k] > 0 for k in PARTS), parts
    want = sum(weights[k] * parts[k] for k in PARTS)
    assert float(total) == pytest.approx(want, rel=1e-6)


def test_log_total_is_the_weighted_sum_of_transformed_parts(setup):
    """form 'log' on a one-edit sequence: total == sum_k weight_k * 0.01 * log(part_k + eps)."""
    cfg, ex, model = setup
    one = {**ex, "steps": ex["steps"][:1]}
    weights = dict(zip(PARTS, (1.0, 2.0, 3.0, 5.0), strict=True))
    c = _with(cfg, form="log", eps=1e-4, **weights)
    total, parts = _loss(c, one, model)
    want = sum(w * 0.01 * math.log(parts[k] + 1e-4) for k, w in weights.items())
    assert float(total) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("term", PARTS)
def test_each_weight_alone_gives_a_nonzero_loss_of_its_part(setup, term):
    """With one weight 1 and the rest 0 (form 'mse'), the loss is exactly that part, and > 0."""
    cfg, ex, model = setup
    c = _with(cfg, form="mse", **{k: float(k == term) for k in PARTS})
    total, parts = _loss(c, ex, model)
    assert float(total) > 0
    assert float(total) == pytest.approx(parts[term], rel=1e-6)


@pytest.mark.parametrize("loss_views", [1, 2])
def test_held_out_views_are_rendered_as_configured(setup, monkeypatch, loss_views):
    """Per edit: `loss_views` distinct held-out cameras plus the edit view, in that order; with
    the render terms weighted the rendered error reaches the loss."""
    cfg, ex, model = setup
    c = copy.deepcopy(cfg)
    c.data.loss_views = loss_views
    calls = []
    real = splatpainter.render.render

    def counting(asset, camera, *a, **kw):
        calls.append(camera.to_dict())
        return real(asset, camera, *a, **kw)

    monkeypatch.setattr(splatpainter.render, "render", counting)
    _loss(c, ex, model)
    steps = ex["steps"]
    per = loss_views + 1
    assert len(calls) == len(steps) * per
    for i, step in enumerate(steps):
        cams = step["loss_cameras"]
        held, edit = cams[:-1], cams[-1]
        assert len(held) >= loss_views
        mine = calls[i * per : (i + 1) * per]
        assert mine[-1] == edit
        picked = mine[:-1]
        assert all(cam in held for cam in picked)
        assert len({repr(cam) for cam in picked}) == loss_views


@pytest.mark.parametrize("name", ["tiny.toml", "editor.toml"])
def test_shipped_configs_train_every_term(name):
    """The kept configs give all four terms a positive weight and render held-out views."""
    cfg = load_config(TINY.parent / name)
    assert all(getattr(cfg.loss, k) > 0 for k in PARTS), cfg.loss
    assert cfg.data.loss_views >= 1 and cfg.data.num_heldout >= cfg.data.loss_views


def test_unseen_gate_term_is_the_two_means_cross_entropy():
    """unseen_gate_loss: zero where the gate is the target on the unseen Gaussians, 2 log 2 at
    an undecided gate, and blind to the seen ones."""
    from splatpainter.train.loop import unseen_gate_loss

    want = torch.tensor([True, False, True, False, True, False])
    unseen = torch.tensor([True, True, True, True, False, False])
    right = torch.where(want, 1.0, 0.0)
    right[4:] = torch.tensor([0.0, 1.0])  # the seen ones wrong: no matter
    assert float(unseen_gate_loss(right, want, unseen)) == pytest.approx(0.0, abs=1e-5)
    half = torch.full((6,), 0.5)
    assert float(unseen_gate_loss(half, want, unseen)) == pytest.approx(2 * math.log(2), rel=1e-6)
    # the unchanged unseen Gaussians are a mean of their own: one of two at 0.5 gives log(2) / 2
    lopsided = right.clone()
    lopsided[1] = 0.5
    got = float(unseen_gate_loss(lopsided, want, unseen))
    assert got == pytest.approx(math.log(2) / 2, rel=1e-5)


def test_unseen_gate_weight_adds_its_term_to_the_loss(setup):
    """With loss.unseen_gate_bce > 0 the total grows by a positive amount proportional to it
    (the same sequence, the same hint draws), and the logged parts do not change."""
    cfg, ex, model = setup
    base, parts = _loss(cfg, ex, model)
    one, parts1 = _loss(_with(cfg, unseen_gate_bce=1.0), ex, model)
    two, _ = _loss(_with(cfg, unseen_gate_bce=2.0), ex, model)
    assert parts1 == parts
    assert float(one - base) > 0
    assert float(two - base) == pytest.approx(2 * float(one - base), rel=1e-4)
