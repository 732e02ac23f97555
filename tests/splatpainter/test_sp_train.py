"""Edit data with 3D ground truth, the training config, the trainer (resume, loss goes down)."""

import dataclasses
import hashlib
import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from splatpainter.cli import app
from splatpainter.model.stage2 import SignalSettings
from splatpainter.render import render
from splatpainter.train.config import ConfigError, config_from_dict, load_config
from splatpainter.train.data import (
    KINDS,
    EditDataError,
    SequenceSpec,
    base_colors,
    make_edit,
    make_sequence,
)
from splatpainter.train.loop import CHECKPOINT, LOG, WEIGHTS, train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "splatpainter" / "tiny.toml"
SMALL = SequenceSpec(min_gaussians=1000, max_gaussians=1500, view_size=32, num_heldout=3)


@pytest.mark.parametrize("kind", KINDS)
def test_sequence_is_deterministic_and_views_are_ground_truth_renders(kind):
    spec = SequenceSpec(**{**SMALL.__dict__, "first_kind": kind, "min_edits": 2, "max_edits": 2})
    a, b = make_sequence(11, spec), make_sequence(11, spec)
    assert torch.equal(a.source.sh, b.source.sh) and torch.equal(a.source.means, b.source.means)
    assert a.steps[0].kind == kind and len(a.steps) == 2
    for sa, sb in zip(a.steps, b.steps, strict=True):
        assert sa.kind == sb.kind and torch.equal(sa.colors, sb.colors)
        assert all(
            torch.equal(va.image, vb.image) for va, vb in zip(sa.views, sb.views, strict=True)
        )
    assert int(a.steps[0].changed.sum()) >= 10  # an edit always changes something
    for k, step in enumerate(a.steps):
        gt = a.asset_at(k)
        torch.testing.assert_close(base_colors(gt), step.colors, atol=1e-6, rtol=0)
        for v in step.views:
            img = render(gt, v.camera).rgb
            # The edit image is the ground-truth render, 8-bit quantised: within half a step.
            assert float((img - v.image).abs().max()) <= 0.5 / 255 + 1e-6
            assert torch.equal(v.image, torch.round(v.image * 255) / 255)


def test_sequences_differ_by_seed_and_keep_geometry():
    a, b = make_sequence(1, SMALL), make_sequence(2, SMALL)
    assert a.source.num_gaussians != b.source.num_gaussians or not torch.equal(
        a.source.means, b.source.means
    )
    mapped = torch.zeros(a.source.num_gaussians, dtype=torch.bool)
    for k, step in enumerate(a.steps):
        gt = a.asset_at(k)
        assert torch.equal(gt.means, a.source.means) and torch.equal(gt.quats, a.source.quats)
        assert torch.equal(gt.sh, step.sh)
        # Higher SH bands change only where an edit's colour map is not the identity.
        mapped |= (step.rest_map != torch.eye(3)).flatten(1).any(-1)
        assert torch.equal(gt.sh[~mapped, 1:], a.source.sh[~mapped, 1:])


def test_relight_without_normals_is_a_clear_error():
    seq = make_sequence(3, SMALL)
    info = {"points": seq.source.means, "normals": None, "primitive_id": seq.primitive_id}
    vis = torch.ones(seq.source.num_gaussians, dtype=torch.bool)
    with pytest.raises(EditDataError, match="relight needs surface normals"):
        make_edit("relight", seq.source_colors, info, vis, torch.Generator().manual_seed(0))
    with pytest.raises(EditDataError, match="detail needs a low-passed"):
        make_edit("detail", seq.source_colors, info, vis, torch.Generator().manual_seed(0))
    with pytest.raises(EditDataError, match="unknown edit kind"):
        SequenceSpec(kinds=("sharpen",))


def test_config_errors_name_the_key(tmp_path):
    cfg = load_config(TINY)
    assert cfg.data.num_sequences == 3 and cfg.model.stage2.num_blocks == 1
    with pytest.raises(ConfigError, match=r"unknown key\(s\) optim\.stpes \(known in \[optim\]: "):
        config_from_dict({"optim": {"stpes": 3}})
    with pytest.raises(ConfigError, match=r"optim\.lr: expected a number, got 'fast'"):
        config_from_dict({"optim": {"lr": "fast"}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) model\.stage2\.delta_scope"):
        config_from_dict({"model": {"stage2": {"delta_scope": "global"}}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) model\.stage3 \(known in \[model\]: "):
        config_from_dict({"model": {"stage3": {}}})
    with pytest.raises(ConfigError, match="first_seed must be >= 100000"):
        config_from_dict({"data": {"first_seed": 5}})
    with pytest.raises(ConfigError, match=r"loss\.form must be"):
        config_from_dict({"loss": {"form": "l1"}})
    with pytest.raises(ConfigError, match="unknown table"):
        config_from_dict({"trainer": {}})
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim\nsteps = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    r = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "no such config file" in r.output


def _tiny(tmp_path, **optim):
    cfg = load_config(TINY)
    cfg.data.cache_dir = str(tmp_path / "cache")
    for k, v in optim.items():
        setattr(cfg.optim, k, v)
    return cfg


@pytest.mark.slow
def test_resume_is_exact(tmp_path):
    """Killed at step 3 of 6 and resumed for 3 more steps: a resume that lost the optimiser
    state (AdamW moments, the schedule position) would drift within those steps."""
    straight = tmp_path / "straight"
    model_a = train(_tiny(tmp_path, steps=6, checkpoint_every=2), straight)
    part = tmp_path / "part"
    train(_tiny(tmp_path, steps=6, checkpoint_every=2), part, stop_after=3)  # "killed" at 3
    assert torch.load(part / CHECKPOINT, weights_only=True)["step"] == 3
    assert not (part / WEIGHTS).exists()
    model_b = train(_tiny(tmp_path, steps=6, checkpoint_every=2), part, resume=True)
    for (k, va), vb in zip(
        model_a.state_dict().items(), model_b.state_dict().values(), strict=True
    ):
        assert torch.equal(va, vb), k
    la = [json.loads(x)["loss"] for x in (straight / LOG).read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (part / LOG).read_text().splitlines()]
    assert la == lb and len(la) == 6
    assert (part / WEIGHTS).exists() and (part / "loss.png").exists()
    with pytest.raises(ValueError, match="another config"):
        train(_tiny(tmp_path, steps=7, checkpoint_every=2), part, resume=True)


@pytest.mark.slow
def test_tiny_training_lowers_the_loss_and_is_reproducible(tmp_path):
    def run(out):
        cfg = _tiny(tmp_path, steps=24, checkpoint_every=100, lr=3e-3)
        cfg.data.num_sequences = 1  # one sequence, fixed loss views: a clean descent
        cfg.data.auto_hint_prob = 0.0
        cfg.data.loss_views = cfg.data.num_heldout
        train(cfg, out)
        return [json.loads(x)["loss"] for x in (out / LOG).read_text().splitlines()]

    first = run(tmp_path / "a")
    # log-form loss (0.01 * log(mse + eps) per term): 0.005 is half a nat off one error term
    assert sum(first[-4:]) / 4 < first[0] - 0.005, first
    assert all(b < a for a, b in itertools.pairwise(first[:9])), first
    again = run(tmp_path / "b")
    torch.testing.assert_close(torch.tensor(again), torch.tensor(first), rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_training_repeats_bit_for_bit_by_default(tmp_path):
    """Two fresh runs of one config give the same log, bit for bit, with no thread settings
    given: on the renderer's default two threads these runs parted at step 16."""

    def run(out):
        cfg = _tiny(tmp_path, steps=30, checkpoint_every=1000)
        train(cfg, out)
        return [json.loads(x)["loss"] for x in (out / LOG).read_text().splitlines()]

    assert run(tmp_path / "a") == run(tmp_path / "b")


@pytest.mark.slow
def test_training_with_the_propagation_repeats_bit_for_bit(tmp_path):
    """The same with the learned walk over the k-NN graph, on distractor and capture scenes:
    the walk's gather backward and MKL's alignment-dependent paths parted two 50-step runs of
    the editor's propagate phase at step 5-8 before `repeatable` and MKL_CBWR."""

    def run(out):
        cfg = _tiny(tmp_path, steps=12, checkpoint_every=1000)
        cfg.model.stage2.propagate = True
        cfg.data.suites = ("distractor", "capture")
        cfg.data.num_sequences = 2
        train(cfg, out)
        return [json.loads(x)["loss"] for x in (out / LOG).read_text().splitlines()]

    assert run(tmp_path / "a") == run(tmp_path / "b")


@pytest.mark.slow
def test_train_cli_writes_weights_that_load(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--config",
            str(TINY),
            "--out",
            str(out),
            "--steps",
            "2",
            "--json",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["steps"] == 2 and Path(summary["weights"]).exists()
    from splatpainter.model.editor import load_weights

    model = load_weights(out / WEIGHTS)
    assert model.trained and model.config.stage2.num_blocks == 1
    # --weights also takes the run's training checkpoint (here written at the last step)
    from_checkpoint = load_weights(out / CHECKPOINT)
    assert from_checkpoint.trained and from_checkpoint.config == model.config
    for (k, va), vb in zip(
        model.state_dict().items(), from_checkpoint.state_dict().values(), strict=True
    ):
        assert torch.equal(va, vb), k
    shutil.rmtree(tmp_path / "cache")


@pytest.mark.slow
def test_init_from_starts_at_given_weights_and_refuses_another_architecture(tmp_path):
    from splatpainter.model.editor import EditorModel, load_weights, save_weights

    first = train(_tiny(tmp_path, steps=2, checkpoint_every=2), tmp_path / "a")
    cfg = _tiny(tmp_path, steps=1, checkpoint_every=1, init_from=str(tmp_path / "a" / WEIGHTS))
    cfg.optim.lr = 1e-12  # one step that cannot move the weights measurably
    second = train(cfg, tmp_path / "b")
    for k, v in first.state_dict().items():
        torch.testing.assert_close(second.state_dict()[k], v, rtol=0, atol=1e-8)
    assert load_weights(tmp_path / "b" / WEIGHTS).trained
    other = tmp_path / "other.safetensors"
    save_weights(EditorModel.initial(), other)  # the default (larger) architecture
    bad = _tiny(tmp_path, steps=1, init_from=str(other))
    with pytest.raises(ValueError, match="another architecture"):
        train(bad, tmp_path / "c")


def _tiny_phases_dict(cache) -> dict:
    import tomllib

    d = tomllib.loads(TINY.read_text())
    d["data"]["cache_dir"] = str(cache)
    d["optim"].update(steps=2, checkpoint_every=1)
    d["phase"] = [
        {"name": "base"},
        {"name": "solve", "stage2": {"solve_iters": 2}, "optim": {"steps": 3, "lr": 1e-3},
         "data": {"first_seed": 100050, "num_sequences": 2}},
        {"name": "maps", "stage2": {"fit_maps": True}, "optim": {"seed": 5}},
        {"name": "propagate", "stage2": {"propagate": True, "prop_coarse_steps": 30},
         "optim": {"steps": 2},
         "data": {"suites": ["distractor", "capture"], "first_seed": 100080}},
    ]  # fmt: skip
    return d


def test_phases_override_the_phase_before_and_name_their_errors(tmp_path):
    from splatpainter.model.editor import EditorModel

    cfg = config_from_dict(_tiny_phases_dict(tmp_path))
    base, solve, maps, grow = (p.config for p in cfg.phases)
    assert [p.name for p in cfg.phases] == ["base", "solve", "maps", "propagate"]
    assert grow.model.stage2.propagate and not maps.model.stage2.propagate
    # a phase may lengthen the walk (no weights change); the phase's editor walks that long
    assert (grow.model.stage2.prop_coarse_steps, maps.model.stage2.prop_coarse_steps) == (30, 24)
    assert EditorModel.initial(grow.model).stage2.propagation.coarse_steps == 30
    assert grow.data.suites == ("distractor", "capture")
    assert base.optim.steps == 2 and base.model.stage2.solve_iters == 0
    assert (solve.optim.steps, solve.optim.lr, solve.data.num_sequences) == (3, 1e-3, 2)
    # cumulative: maps keeps the solve and the data of the phase before, adds its own keys
    assert maps.model.stage2.signal_settings() == SignalSettings(2, 0.0, True)
    assert (maps.optim.steps, maps.optim.lr, maps.optim.seed) == (3, 1e-3, 5)
    assert maps.data.first_seed == 100050 and maps.data.cache_dir == str(tmp_path)
    assert maps.model.stage1 == base.model.stage1 and not maps.phases

    def bad(edit, match):
        d = _tiny_phases_dict(tmp_path)
        edit(d["phase"])
        with pytest.raises(ConfigError, match=match):
            config_from_dict(d)

    bad(lambda ph: ph[1]["stage2"].update(dim=64), r"'solve'\): stage2 key\(s\) \['dim'\]")
    unknown = r"unknown key\(s\) phase\[3\]\.steps \(known in \[\[phase\]\]: data, "
    bad(lambda ph: ph[2].update(steps=3), unknown)
    bad(lambda ph: ph[2]["optim"].update(init_from="x"), "a phase starts from the last")
    bad(lambda ph: ph[2].update(name="solve"), "phase names must differ")
    bad(lambda ph: ph[0].update(name="Base run"), "name must be a short lowercase word")
    bad(lambda ph: ph[1]["optim"].update(lr="fast"), r"'solve'\): optim\.lr: expected a number")
    bad(lambda ph: ph[1]["data"].update(first_seed=7), r"'solve'\): data\.first_seed must be")


@pytest.mark.slow
def test_phased_training_chains_weights_and_resumes_exactly(tmp_path):
    """One command trains every phase from the one before; killed inside the second phase and
    resumed, it ends with the same weights and log as a straight run."""
    from splatpainter.model.editor import EditorModel, load_weights

    cfg = config_from_dict(_tiny_phases_dict(tmp_path / "cache"))
    phases: list[str] = []
    model_a = train(cfg, tmp_path / "a", on_phase=lambda i, name: phases.append(name))
    assert phases == ["base", "solve", "maps", "propagate"]
    rows = [json.loads(x) for x in (tmp_path / "a" / LOG).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(10))
    assert [r["phase"] for r in rows] == (
        ["base"] * 2 + ["solve"] * 3 + ["maps"] * 3 + ["propagate"] * 2
    )
    shipped = load_weights(tmp_path / "a" / WEIGHTS)
    assert shipped.trained and shipped.config == cfg.phases[-1].config.model
    # the second phase started from the first one's final weights (3 AdamW steps of lr 1e-3
    # move no weight by 0.01), not from its own seeded initialisation
    first = load_weights(tmp_path / "a" / "1-base" / WEIGHTS).state_dict()
    ck = torch.load(tmp_path / "a" / "2-solve" / CHECKPOINT, weights_only=True)
    assert ck["config"] == cfg.phases[1].config.to_dict()
    fresh = EditorModel.initial(cfg.phases[1].config.model, seed=1).state_dict()

    def dist(a: dict) -> float:
        return max(float((a[k] - v).abs().max()) for k, v in first.items())

    assert dist(ck["model"]) < 0.01 < dist(fresh)

    train(cfg, tmp_path / "b", stop_after=3)  # "killed" in the solve phase
    assert not (tmp_path / "b" / WEIGHTS).exists()
    model_b = train(cfg, tmp_path / "b", resume=True)
    for (k, va), vb in zip(
        model_a.state_dict().items(), model_b.state_dict().values(), strict=True
    ):
        assert torch.equal(va, vb), k
    rows_b = [json.loads(x) for x in (tmp_path / "b" / LOG).read_text().splitlines()]
    assert [r["loss"] for r in rows_b] == [r["loss"] for r in rows]
    assert (tmp_path / "b" / "loss.png").exists()
    # the curriculum started at its last phase from the third phase's weights
    model_c = train(
        cfg, tmp_path / "c", from_phase="propagate", init=tmp_path / "a" / "3-maps" / WEIGHTS
    )
    rows_c = [json.loads(x) for x in (tmp_path / "c" / LOG).read_text().splitlines()]
    assert [r["loss"] for r in rows_c] == [r["loss"] for r in rows[-2:]]
    assert [r["step"] for r in rows_c] == [8, 9]
    for (k, va), vc in zip(
        model_a.state_dict().items(), model_c.state_dict().values(), strict=True
    ):
        assert torch.equal(va, vc), k
    with pytest.raises(ConfigError, match="no phase named 'grow'"):
        train(cfg, tmp_path / "d", from_phase="grow", init=tmp_path / "a" / WEIGHTS)


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "splatpainter").glob("*.toml")))
def test_every_kept_config_loads(path):
    load_config(path)


def test_shipped_weights_are_the_last_phase_of_the_kept_config():
    """The weights in the package were trained by editor.toml, whose last phase has the same
    architecture and the same signal settings (solve, pixel-fitted colour maps)."""
    from splatpainter.model.editor import DEFAULT_WEIGHTS, load_weights

    cfg = load_config(ROOT / "configs" / "splatpainter" / "editor.toml")
    assert [p.name for p in cfg.phases] == [
        "base",
        "solve",
        "maps",
        "propagate",
        "gate",
        "gate2",
        "commit",
        "normals",
        "reach",
        "centred",
        "untold",
        "exact",
        "shading",
    ]
    # phase 8's weights, walking further, centred on the recolour's map, relights untold, maps
    # exact, relights committed and a relight its shading explains applied as exactly that
    assert all(p.config.optim.steps == 0 for p in cfg.phases[-5:])
    assert cfg.phases[-1].config.model.stage2.relight_fit == 0.36
    assert cfg.phases[-1].config.model.stage2.untold_hints == ("relight",)
    assert cfg.phases[-1].config.model.stage2.seen_corrections
    assert cfg.phases[-1].config.model.stage2.relight_share == 0.8
    assert cfg.phases[-1].config.model.stage2.prop_reach_steps == 96
    assert cfg.phases[-1].config.model.stage2.map_solves
    assert cfg.phases[-1].config.loss.unseen_gate_bce > 0
    assert cfg.phases[-1].config.model.stage1.normal_views == 16
    assert cfg.phases[-1].config.model.stage2.commit > 0
    shipped = load_weights(DEFAULT_WEIGHTS)
    assert shipped.trained
    assert shipped.config == cfg.phases[-1].config.model
    assert shipped.config.stage2.signal_settings().fit_maps
    # the config's comment records the shipped file's sha256
    digest = hashlib.sha256(Path(DEFAULT_WEIGHTS).read_bytes()).hexdigest()
    assert f"#   {digest}" in (ROOT / "configs" / "splatpainter" / "editor.toml").read_text()


@pytest.mark.slow
def test_a_phase_of_no_steps_takes_the_weights_before_with_its_own_settings(tmp_path):
    """A later phase with optim.steps = 0 (e.g. a longer walk on the weights before) trains
    nothing: its weights are the phase before's bit for bit, its config has its settings.  A
    first phase, or a config without phases, of no steps is refused by name."""
    from splatpainter.model.editor import load_weights

    d = _tiny_phases_dict(tmp_path / "cache")
    d["phase"] = [
        {"name": "base", "optim": {"steps": 1}},
        {"name": "reach", "stage2": {"prop_coarse_steps": 40}, "optim": {"steps": 0}},
    ]
    train(config_from_dict(d), tmp_path / "run")
    before = load_weights(tmp_path / "run" / "1-base" / WEIGHTS)
    after = load_weights(tmp_path / "run" / WEIGHTS)
    assert after.trained and after.config.stage2.prop_coarse_steps == 40
    assert before.config.stage2.prop_coarse_steps == 24
    assert after.config == dataclasses.replace(
        before.config, stage2=dataclasses.replace(before.config.stage2, prop_coarse_steps=40)
    )
    a, b = after.state_dict(), before.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(r) for r in (tmp_path / "run" / LOG).read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["base"]

    d["phase"][0]["optim"]["steps"] = 0
    with pytest.raises(ConfigError, match=r"\[\[phase\]\] 1 \('base'\): optim\.steps = 0"):
        config_from_dict(d)
    del d["phase"]
    d["optim"]["steps"] = 0
    with pytest.raises(ConfigError, match=r"^optim\.steps = 0 trains nothing"):
        config_from_dict(d)
