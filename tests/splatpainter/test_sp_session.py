"""Edit sessions: structural no-op guarantees for every method, undo/redo, state, save/load."""

import pytest
import torch

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import Camera, look_at, orbit_cameras
from splatpainter.edit import (
    BackprojectMethod,
    EditInputError,
    EditSession,
    EditView,
    ModelMethod,
    OptimizeMethod,
    SessionError,
)
from splatpainter.io import load_asset
from splatpainter.model import EditorConfig, EditorModel, Stage1Config, Stage2Config
from splatpainter.render import render

SIZE = 48


def small_model(seed: int = 0) -> EditorModel:
    cfg = EditorConfig(
        stage1=Stage1Config(
            grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2, view_size=32
        ),
        stage2=Stage2Config(dim=64, num_blocks=2, head_hidden=32),
    )
    return EditorModel.initial(cfg, seed=seed)


@pytest.fixture(scope="module")
def scene():
    asset = make_demo_asset(1500, seed=0).asset
    cams = orbit_cameras(asset, 4, width=SIZE, height=SIZE, margin=0.8)
    return asset, cams


@pytest.fixture(scope="module")
def model():
    return small_model()


def make_method(name, model):
    if name == "model":
        return ModelMethod(model)
    if name == "backproject":
        return BackprojectMethod()
    return OptimizeMethod(steps=8)


def assert_assets_equal(a, b):
    for (ka, ta), (kb, tb) in zip(a.tensors().items(), b.tensors().items(), strict=True):
        assert ka == kb
        assert torch.equal(ta, tb), ka


def paint(asset, cam, color=(1.0, 0.0, 1.0), box=(14, 30, 14, 30)):
    img = render(asset, cam).rgb.clamp(0, 1)
    y0, y1, x0, x1 = box
    img[y0:y1, x0:x1] = torch.tensor(color)
    return img


METHODS = ["model", "backproject", "optimize"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("explicit_mask", [False, True])
def test_camera_seeing_nothing_leaves_asset_bit_identical(scene, model, method, explicit_mask):
    asset, cams = scene
    eye = cams[0].camera_center()
    away = Camera.from_fov(SIZE, SIZE, 40.0, look_at(eye, eye + (eye - asset.means.mean(0))))
    assert render(asset, away).alpha.max() == 0  # really sees nothing
    img = torch.rand(SIZE, SIZE, 3, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(SIZE, SIZE) if explicit_mask else None
    session = EditSession(asset, make_method(method, model))
    new = session.apply(EditView(away, img, mask))
    assert_assets_equal(new, asset)


@pytest.mark.parametrize("method", METHODS)
def test_edit_equal_to_render_changes_nothing(scene, model, method):
    asset, cams = scene
    cam = cams[1]
    rendered = render(asset, cam).rgb
    session = EditSession(asset, make_method(method, model))
    # Exactly the render, default mask (empty) and an explicit full mask: bit-identical.
    assert_assets_equal(session.apply(EditView(cam, rendered.clone())), asset)
    assert_assets_equal(
        session.apply(EditView(cam, rendered.clone(), torch.ones(SIZE, SIZE))), asset
    )
    # The render after an 8-bit PNG round trip (what the CLI sees): within a tolerance.
    quantised = (rendered.clamp(0, 1) * 255 + 0.5).floor() / 255
    new = session.apply(EditView(cam, quantised))
    for c in cams:
        diff = (render(new, c).rgb - render(asset, c).rgb).abs().max()
        assert diff <= 1.0 / 255, (c.name, float(diff))


@pytest.mark.parametrize("method", ["model", "backproject"])
def test_undo_redo_restore_bit_exactly(scene, model, method):
    asset, cams = scene
    session = EditSession(asset, make_method(method, model))
    first = session.apply(EditView(cams[0], paint(asset, cams[0])))
    assert not torch.equal(first.sh, asset.sh)
    second = session.apply(EditView(cams[1], paint(first, cams[1], (0.0, 1.0, 0.0))))
    assert_assets_equal(session.undo(), first)
    assert_assets_equal(session.undo(), asset)
    with pytest.raises(SessionError, match="nothing to undo"):
        session.undo()
    assert_assets_equal(session.redo(), first)
    assert_assets_equal(session.redo(), second)
    with pytest.raises(SessionError, match="nothing to redo"):
        session.redo()
    session.undo()
    session.apply(EditView(cams[2], paint(first, cams[2])))  # a new branch drops the redo entry
    assert not session.can_redo and len(session.history) == 3


def test_undo_restores_model_state(scene, model):
    asset, cams = scene
    session = EditSession(asset, ModelMethod(model))
    s0 = session.state["fast"][0].w0
    session.apply(EditView(cams[0], paint(asset, cams[0])))
    assert not torch.equal(session.state["fast"][0].w0, s0)
    session.undo()
    assert torch.equal(session.state["fast"][0].w0, s0)


def test_carried_state_differs_from_reset_state(scene, model):
    asset, cams = scene
    edit1 = EditView(cams[0], paint(asset, cams[0]))
    carried = EditSession(asset, ModelMethod(model))
    reset = EditSession(asset, ModelMethod(model))
    a1 = carried.apply(edit1)
    b1 = reset.apply(edit1)
    assert_assets_equal(a1, b1)
    reset.reset_state()
    edit2 = EditView(cams[1], paint(a1, cams[1], (0.0, 0.8, 0.2), box=(10, 26, 18, 34)))
    a2 = carried.apply(edit2)
    b2 = reset.apply(edit2)
    assert (a2.sh - b2.sh).abs().max() > 1e-4
    # Both sessions keep geometry frozen.
    assert torch.equal(a2.means, asset.means) and torch.equal(
        b2.opacity_logits, asset.opacity_logits
    )


@pytest.mark.parametrize("method", ["model", "backproject"])
def test_save_load_gives_identical_subsequent_results(scene, model, method, tmp_path):
    asset, cams = scene
    session = EditSession(asset, make_method(method, model))
    session.apply(EditView(cams[0], paint(asset, cams[0])))
    path = tmp_path / "s.spsession"
    session.save(path)
    loaded = EditSession.load(path, make_method(method, model))
    assert_assets_equal(loaded.asset, session.asset)
    assert len(loaded.history) == len(session.history)
    edit2 = EditView(cams[1], paint(session.asset, cams[1], (0.1, 0.9, 0.9)))
    assert_assets_equal(loaded.apply(edit2), session.apply(edit2))
    assert_assets_equal(loaded.undo(), session.undo())


def test_session_load_checks_method(scene, model, tmp_path):
    asset, _ = scene
    path = tmp_path / "s.spsession"
    EditSession(asset, ModelMethod(model)).save(path)
    with pytest.raises(SessionError, match="weights"):
        EditSession.load(path, ModelMethod(small_model(seed=1)))
    with pytest.raises(SessionError, match="'model'"):
        EditSession.load(path, BackprojectMethod())
    (tmp_path / "junk").write_bytes(b"nope")
    with pytest.raises(SessionError, match="not a readable"):
        EditSession.load(tmp_path / "junk", BackprojectMethod())


def test_export_writes_current_asset(scene, tmp_path):
    asset, cams = scene
    session = EditSession(asset, BackprojectMethod())
    session.apply(EditView(cams[0], paint(asset, cams[0])))
    session.export(tmp_path / "out.ply")
    assert torch.equal(session.render(cams[0]), render(session.asset, cams[0]).rgb)
    back = load_asset(tmp_path / "out.ply")
    assert torch.equal(back.sh, session.asset.sh)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ply"]


def test_several_views_at_once(scene, model):
    asset, cams = scene
    views = [EditView(c, paint(asset, c)) for c in cams[:2]]
    for method in (ModelMethod(model), BackprojectMethod()):
        new = EditSession(asset, method).apply(views)
        for c in cams[:2]:
            before = (render(asset, c).rgb[14:30, 14:30] - torch.tensor([1.0, 0, 1])).abs().mean()
            after = (render(new, c).rgb[14:30, 14:30] - torch.tensor([1.0, 0, 1])).abs().mean()
            assert after < before


def test_bad_edit_inputs(scene):
    asset, cams = scene
    session = EditSession(asset, BackprojectMethod())
    with pytest.raises(EditInputError, match="camera is 48x48"):
        session.apply(EditView(cams[0], torch.zeros(32, 48, 3)))
    with pytest.raises(EditInputError, match="mask must be"):
        session.apply(EditView(cams[0], torch.zeros(SIZE, SIZE, 3), torch.ones(SIZE, 10)))
    with pytest.raises(EditInputError, match=r"\[0, 1\]"):
        session.apply(EditView(cams[0], torch.full((SIZE, SIZE, 3), 2.0)))
    with pytest.raises(EditInputError, match="at least one view"):
        session.apply([])
    assert len(session.history) == 1


def test_record_and_rollback_keep_the_history_exact(scene, model):
    """A direct edit (the web editor's selection delete) enters the history with the method
    state carried over; a rollback to a mark drops what came after it, undo included."""
    asset, cams = scene
    session = EditSession(asset, make_method("backproject", model))
    first = session.apply(EditView(cams[0], paint(asset, cams[0])))
    mark = session.mark()
    direct = first.replace(opacity_logits=first.opacity_logits - 3.0)
    session.record(direct, "fade", "selection")
    assert session.history[-1].label == "fade" and session.history[-1].method == "selection"
    assert session.state is session.history[-2].state
    assert_assets_equal(session.asset, direct)
    session.apply(EditView(cams[1], paint(direct, cams[1], (0.0, 1.0, 0.0))))
    session.undo()
    session.rollback(mark)
    assert_assets_equal(session.asset, first)
    assert not session.can_redo and len(session.history) == 2
    assert_assets_equal(session.undo(), asset)
