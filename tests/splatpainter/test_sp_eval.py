"""`splatpainter evaluate`: metric functions, the suite against oracle edits, the CLI's JSON schema
and its bad-input errors."""

import json
import math

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from splatpainter.cli import app
from splatpainter.edit.methods import EditMethod
from splatpainter.eval import metrics as M
from splatpainter.eval.suite import (
    ABLATIONS,
    DEFAULT_METHODS,
    EVAL_SEED_LIMIT,
    METRICS,
    PSNR_CAP_DB,
    SCHEMA,
    EvalConfig,
    EvalError,
    NoEditMethod,
    build_methods,
    evaluate_edit,
    evaluate_forgetting,
    parse_names,
    parse_seeds,
    run_suite,
)
from splatpainter.model import EditorConfig, EditorModel, Stage1Config, Stage2Config
from splatpainter.model.editor import save_weights
from splatpainter.train.data import KINDS, SUITES, make_sequence

TINY = ["--gaussians", "1000-1000", "--view-size", "32", "--heldout", "2", "--seeds", "0-0"]


# ------------------------------------------------------------------------------ metrics
def test_psnr_of_identical_images_is_inf_or_the_cap():
    img = torch.rand(8, 9, 3)
    assert M.psnr(img, img.clone()) == math.inf
    assert M.psnr(img, img.clone(), max_db=100.0) == 100.0


def test_psnr_known_value_and_empty_mask_is_nan():
    a = torch.zeros(4, 4, 3)
    b = torch.full((4, 4, 3), 0.1)  # mse 0.01 -> 20 dB
    assert M.psnr(a, b) == pytest.approx(20.0)
    assert math.isnan(M.psnr(a, b, torch.zeros(4, 4, dtype=torch.bool)))
    assert math.isnan(M.psnr_from_mse(math.nan, 100.0))


def test_psnr_pools_squared_error_over_views():
    a, b = torch.zeros(2, 2, 3), torch.full((2, 2, 3), 0.1)
    c, d = torch.zeros(4, 4, 3), torch.full((4, 4, 3), 0.3)
    pooled = M.SquaredError().add(a, b).add(c, d)
    mse = (4 * 3 * 0.01 + 16 * 3 * 0.09) / (20 * 3)
    assert pooled.mse == pytest.approx(mse)
    assert pooled.psnr() == pytest.approx(-10 * math.log10(mse))


def test_mask_restricts_psnr_to_masked_pixels():
    a = torch.zeros(4, 4, 3)
    b = a.clone()
    b[0, 0] = 1.0  # one bad pixel
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[2:, 2:] = True
    assert M.psnr(a, b, mask) == math.inf
    mask[0, 0] = True
    assert M.psnr(a, b, mask) == pytest.approx(-10 * math.log10(1 / 5))


def test_changed_and_object_masks():
    before = torch.zeros(1, 4, 3)
    after = before.clone()
    after[0, 1, 2] = 2.0 / 255.0  # exactly at the threshold: not changed
    after[0, 2, 0] = 3.0 / 255.0
    after[0, 3, 1] = -0.5
    assert M.changed_mask(after, before).tolist() == [[False, False, True, True]]
    alpha = torch.tensor([[0.2, 0.5, 0.51, 1.0]])
    assert M.object_mask(alpha).tolist() == [[False, False, True, True]]


def test_ssim_identical_is_one_and_noise_lowers_it():
    img = torch.rand(24, 20, 3, generator=torch.Generator().manual_seed(0))
    s = M.ssim_map(img, img.clone())
    assert s.shape == (24, 20)
    assert torch.allclose(s, torch.ones_like(s), atol=1e-12)
    noisy = (img + 0.2 * torch.randn(img.shape, generator=torch.Generator().manual_seed(1))).clamp(
        0, 1
    )
    s2 = M.ssim_map(img, noisy)
    assert float(s2.mean()) < 0.9
    assert torch.allclose(s2, M.ssim_map(noisy, img), atol=1e-6)  # symmetric


def test_ssim_of_flat_images_matches_the_luminance_term():
    a, b = torch.full((16, 16, 3), 0.3), torch.full((16, 16, 3), 0.6)
    c1 = 0.01**2
    expected = (2 * 0.3 * 0.6 + c1) / (0.3**2 + 0.6**2 + c1)  # variances are zero
    assert torch.allclose(M.ssim_map(a, b), torch.full((16, 16), expected), atol=1e-6)


def test_masked_mean_and_color_error():
    values = torch.arange(4.0).view(2, 2)
    mask = torch.tensor([[True, False], [False, True]])
    assert M.MaskedMean().add(values, mask).mean == pytest.approx(1.5)
    assert math.isnan(M.MaskedMean().mean)
    pred = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    gt = torch.tensor([[0.3, 0.0, 0.0], [0.5, 0.5, 0.5]])
    assert M.color_error(pred, gt, torch.tensor([True, False])) == pytest.approx(0.1)
    assert M.color_error(pred, gt, torch.tensor([True, True])) == pytest.approx(0.3)
    assert math.isnan(M.color_error(pred, gt, torch.tensor([False, False])))


def test_metric_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="images must both be"):
        M.psnr(torch.zeros(4, 4, 3), torch.zeros(4, 5, 3))
    with pytest.raises(ValueError, match="mask must be bool"):
        M.psnr(torch.zeros(4, 4, 3), torch.zeros(4, 4, 3), torch.ones(4, 4))
    with pytest.raises(ValueError, match="selection must be"):
        M.color_error(torch.zeros(3, 3), torch.zeros(3, 3), torch.ones(2, dtype=torch.bool))


# ------------------------------------------------------------------------------ parsing
def test_parse_seeds():
    assert parse_seeds("0-3") == (0, 1, 2, 3)
    assert parse_seeds("7") == (7,)
    assert parse_seeds("5, 1-2,2") == (1, 2, 5)
    with pytest.raises(EvalError, match="empty"):
        parse_seeds("3-1")
    with pytest.raises(EvalError, match="not a seed"):
        parse_seeds("a-b")
    with pytest.raises(EvalError, match="not a seed"):
        parse_seeds("-1")
    with pytest.raises(EvalError, match=">= 0"):
        EvalConfig(seeds=(-1,)).validate()


def test_training_seeds_are_refused():
    with pytest.raises(EvalError, match=f"training seed.*< {EVAL_SEED_LIMIT}"):
        parse_seeds(f"{EVAL_SEED_LIMIT - 2}-{EVAL_SEED_LIMIT}")
    with pytest.raises(EvalError, match="training seed"):
        EvalConfig(seeds=(EVAL_SEED_LIMIT + 5,)).validate()
    parse_seeds(f"{EVAL_SEED_LIMIT - 1}")  # the last evaluation seed is fine


def test_parse_names_errors_name_the_bad_one():
    assert parse_names("optimize,backproject,optimize", ("model", "backproject", "optimize"),
                       "methods") == ("optimize", "backproject")  # fmt: skip
    with pytest.raises(EvalError, match=r"--methods: unknown 'nerf'"):
        parse_names("backproject,nerf", ("model", "backproject"), "methods")
    with pytest.raises(EvalError, match="--kinds: empty"):
        parse_names(" , ", KINDS, "kinds")


# ------------------------------------------------------------------------------ the suite
class OracleMethod(EditMethod):
    """Returns the ground truth after each edit: every metric must come out perfect."""

    name = "oracle"

    def __init__(self, seq) -> None:
        super().__init__()
        self.seq = seq

    def initial_state(self, asset):
        return 0

    def apply(self, asset, views, state):
        return self.seq.asset_at(state), state + 1


def _tiny_config(**kw) -> EvalConfig:
    return EvalConfig(min_gaussians=1000, max_gaussians=1000, view_size=32, num_heldout=3, **kw)


def test_oracle_is_perfect_and_none_is_not():
    cfg = _tiny_config()
    seq = make_sequence(1, cfg.edit_spec("recolor"))
    methods = {"none": NoEditMethod(), "oracle": OracleMethod(seq)}
    scores, facts, row = evaluate_edit(seq, methods, grid=True)
    o, n = scores["oracle"], scores["none"]
    assert facts["changed_pixel_fraction"] > 0 and facts["unseen_changed_fraction"] > 0
    assert o["psnr_changed"] == PSNR_CAP_DB and o["psnr_unchanged"] == PSNR_CAP_DB
    assert o["ssim_changed"] == pytest.approx(1.0)
    assert o["unseen_color_error"] == 0.0
    assert n["psnr_changed"] < 30 and n["ssim_changed"] < 1
    assert n["unseen_color_error"] > 0.01
    assert set(row.methods) == {"none", "oracle"}
    assert torch.equal(row.methods["oracle"], row.ground_truth)


def test_forgetting_of_oracle_and_of_a_method_that_forgets():
    cfg = _tiny_config()
    seq = make_sequence(3, cfg.forgetting_spec())
    assert len(seq.steps) == 5 and seq.steps[0].kind == "paint"

    class Forgets(OracleMethod):  # right after each edit, but undoes edit 1 by the end
        def apply(self, asset, views, state):
            if state == len(self.seq.steps) - 1:
                return self.seq.asset_at(-1), state + 1
            return super().apply(asset, views, state)

    out = evaluate_forgetting(seq, {"oracle": OracleMethod(seq), "forgets": Forgets(seq)})
    o, f = out["oracle"], out["forgets"]
    assert 0 < o["region_kept_fraction"] <= 1
    assert o["psnr_after_first"] == o["psnr_after_last"] == PSNR_CAP_DB and o["drop"] == 0
    assert f["psnr_after_first"] == PSNR_CAP_DB and f["drop"] > 50


def _tiny_model(**stage2) -> EditorModel:
    config = EditorConfig(
        stage1=Stage1Config(
            grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2, view_size=32
        ),
        stage2=Stage2Config(dim=64, num_blocks=1, head_hidden=32, **stage2),
    )
    return EditorModel.initial(config)


@pytest.mark.parametrize(("mode", "hint"), [("kind", "recolor"), ("auto", "auto")])
def test_model_gets_the_kind_hint(mode, hint):
    cfg = _tiny_config(methods=("model", "rule", "model_kind", "model_init"))
    seq = make_sequence(2, cfg.edit_spec("global"))
    model = _tiny_model()
    methods = build_methods(cfg, model)
    scores, _, _ = evaluate_edit(seq, methods, hint_mode=mode)
    assert methods["model"].kind == hint and methods["rule"].kind == hint
    assert methods["model_kind"].kind == "recolor"  # the ablation is always told the kind
    assert methods["model_init"].kind == "auto"
    assert methods["model_kind"].model is model
    init = methods["model_init"].model
    assert init.weights_fingerprint() == EditorModel.initial(model.config).weights_fingerprint()
    assert scores["model"]["seconds_per_edit"] > 0


def test_the_rules_keep_the_plain_solve_and_diffusion_centred_takes_the_centred_one():
    """Whatever the loaded model reads (the shipped one centres a recolour's seen Gaussians),
    rule and diffusion keep the plain solve and diffusion_centred the centred one, the same
    diffusion otherwise."""
    import dataclasses

    cfg = _tiny_config(methods=("rule", "diffusion", "diffusion_centred"))
    for map_solves in (False, True):
        model = _tiny_model(solve_iters=3, fit_maps=True, map_solves=map_solves)
        m = build_methods(cfg, model)
        assert not m["rule"].settings.map_solves and not m["diffusion"].settings.map_solves
        centred = m["diffusion_centred"]
        assert centred.settings.map_solves and centred.settings.fit_maps
        assert dataclasses.replace(centred.settings, map_solves=False) == m["diffusion"].settings
        assert type(centred) is type(m["diffusion"])


def test_run_suite_has_a_section_per_suite_and_lists_the_ablations():
    cfg = _tiny_config(
        seeds=(0,),
        suites=SUITES,
        kinds=("recolor",),
        methods=("backproject", "rule", "diffusion", "model_kind", "model_init"),
        forgetting=False,
        grid_rows=1,
    )
    seen = []
    result = run_suite(cfg, _tiny_model(), lambda desc, n: seen.append((desc, n)))
    rep = result.report
    assert rep["schema"] == SCHEMA and list(rep["suites"]) == list(SUITES)
    assert rep["ablations"] == list(ABLATIONS)
    assert rep["baselines"] == ["backproject", "rule", "diffusion"]
    assert rep["roles"]["none"] == "reference" and rep["roles"]["model_init"] == "ablation"
    # the tiny model is itself a seeded initialisation, so model_init has its very weights
    assert rep["model"]["init_fingerprint"] == rep["model"]["fingerprint"]
    for suite in SUITES:
        section = rep["suites"][suite]
        assert list(section["kinds"]) == ["recolor"] and section["forgetting"] is None
        assert list(section["kinds"]["recolor"]["methods"]) == ["none", *cfg.methods]
        assert (f"{suite} recolor seed 0", 1) in seen
    assert {r["suite"] for r in rep["per_seed"]} == set(SUITES)
    assert len(rep["per_seed"]) == len(SUITES) * (1 + len(cfg.methods))
    assert set(result.grids) == set(SUITES)
    assert sum(n for _, n in seen) == cfg.num_units() == len(SUITES)


# ------------------------------------------------------------------------------ the CLI
def run(*args):
    return CliRunner().invoke(app, ["evaluate", *map(str, args)])


def check_schema(
    report: dict, methods: list[str], kinds: list[str], forgetting: bool, suites=("procedural",)
) -> None:
    assert report["schema"] == SCHEMA
    cfg = report["config"]
    assert cfg["methods"] == ["none", *methods] and cfg["kinds"] == kinds
    assert cfg["suites"] == list(suites) and list(report["suites"]) == list(suites)
    for key in ("seeds", "min_gaussians", "max_gaussians", "view_size", "num_heldout",
                "optimize_steps", "hint", "forgetting", "forgetting_edits", "psnr_cap_db",
                "changed_threshold", "unseen_weight"):  # fmt: skip
        assert key in cfg
    assert set(report["roles"]) == set(cfg["methods"])
    assert report["ablations"] == [m for m in cfg["methods"] if m in ABLATIONS]
    assert report["baselines"] == [m for m in cfg["methods"] if report["roles"][m] == "baseline"]
    for section in report["suites"].values():
        assert set(section["kinds"]) == set(kinds)
        for k in section["kinds"].values():
            assert k["seeds"] == len(cfg["seeds"])
            for key in ("changed_gaussians", "unseen_changed_fraction", "changed_pixel_fraction",
                        "bleed_pixel_fraction"):  # fmt: skip
                assert k[key] is None or isinstance(k[key], float)
            assert list(k["methods"]) == cfg["methods"]
            for m in k["methods"].values():
                assert set(m) == set(METRICS)
                assert all(v is None or isinstance(v, float) for v in m.values())
            assert isinstance(k["methods"]["none"]["psnr_changed"], float)
            assert k["methods"]["none"]["seconds_per_edit"] >= 0
        if forgetting:
            f = section["forgetting"]
            assert f["seeds"] == len(cfg["seeds"]) and f["edits"] == 5
            assert list(f["methods"]) == cfg["methods"]
            for m in f["methods"].values():
                assert set(m) == {"psnr_after_first", "psnr_after_last", "drop",
                                  "seconds_per_edit", "region_kept_fraction"}  # fmt: skip
        else:
            assert section["forgetting"] is None
    rows = report["per_seed"]
    assert len(rows) == len(suites) * len(kinds) * len(cfg["seeds"]) * len(cfg["methods"])
    assert all(set(r) == {"suite", "kind", "seed", "method", *METRICS} for r in rows)
    assert set(report["grids"]) == set(suites)
    assert all(set(g) == set(kinds) for g in report["grids"].values())


def test_evaluate_json_schema_backproject(tmp_path, monkeypatch):
    monkeypatch.setenv("APPSHELL_PROGRESS_EVERY", "0")  # not a terminal: a line per update
    r = run(*TINY, "--methods", "backproject", "--kinds", "paint,global", "--json",
            "--suites", "procedural", "--out", tmp_path)  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert "forgetting seed 0: 3/3 (100%)" in r.stderr, r.stderr  # 2 kinds + forgetting
    check_schema(report, ["backproject"], ["paint", "global"], forgetting=True)
    assert report["model"] is None and report["ablations"] == []
    assert report["config"]["hint"] == "auto"  # as users run it
    # backprojection improves on doing nothing where the edit view sees the change
    paint = report["suites"]["procedural"]["kinds"]["paint"]["methods"]
    assert paint["backproject"]["psnr_changed"] > paint["none"]["psnr_changed"]
    for path in report["grids"]["procedural"].values():
        with Image.open(path) as im:
            assert im.format == "PNG"
            assert im.size[0] == 4 * 32 + 3 * 2  # edit input, GT, none, backproject
    assert json.loads((tmp_path / "report.json").read_text()) == report


def test_evaluate_model_with_untrained_weights(tmp_path):
    w = tmp_path / "untrained.safetensors"
    save_weights(_tiny_model(), w)
    r = run(*TINY, "--methods", "model", "--kinds", "recolor", "--no-forgetting", "--json",
            "--weights", w, "--hint", "kind", "--suite", "procedural",
            "--out", tmp_path / "o")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "untrained" in r.stderr
    report = json.loads(r.stdout)
    check_schema(report, ["model"], ["recolor"], forgetting=False)
    assert report["model"]["trained"] is False and report["model"]["weights"] == str(w)
    assert report["config"]["hint"] == "kind"
    m = report["suites"]["procedural"]["kinds"]["recolor"]["methods"]["model"]
    assert m["psnr_changed"] is not None and m["seconds_per_edit"] > 0


def test_evaluate_json_lists_every_suite_baseline_and_ablation(tmp_path):
    """The defaults: all three suites, and every default method (the editor, the baselines,
    the ablations flagged as such)."""
    w = tmp_path / "untrained.safetensors"
    save_weights(_tiny_model(), w)
    r = run(*TINY, "--kinds", "recolor", "--no-forgetting", "--json", "--weights", w,
            "--out", tmp_path / "o")  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    check_schema(report, list(DEFAULT_METHODS), ["recolor"], forgetting=False, suites=SUITES)
    assert report["ablations"] == ["model_kind", "model_init"]
    assert report["baselines"] == ["backproject", "rule", "diffusion", "diffusion_centred"]
    assert report["roles"]["model"] == "method"
    assert report["model"]["init_fingerprint"] is not None
    _check_eval_table(report)


def _check_eval_table(report):
    """benchmarks/eval_table.py (the README table) reads this report: every suite's row, the
    per-seed PSNR capped at 50 dB as the mean of the capped per-seed rows, and the targets."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "eval_table.py"
    spec = importlib.util.spec_from_file_location("eval_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.merge([report])
    for suite in SUITES:
        cell = table[(suite, "recolor")]
        methods = ("model", "rule", "diffusion", "diffusion_centred", "backproject", "model_kind",
                   "model_init")  # fmt: skip
        for method in methods:
            key = (suite, "recolor", method)
            rows = [r["psnr_changed"] for r in report["per_seed"]
                    if (r["suite"], r["kind"], r["method"]) == key]  # fmt: skip
            assert cell[method]["capped"] == sum(min(v, 50.0) for v in rows) / len(rows)
        assert f"| {suite} | recolor |" in mod.markdown(table, with_before=False)
    targets = {(r["suite"], r["target"]) for r in mod.targets(table, with_before=False)}
    assert ("distractor", "model - best no-learning >= 3") in targets
    assert ("capture", "model - backproject >= 3") in targets


def test_evaluate_prints_a_table(tmp_path):
    r = run(*TINY, "--methods", "backproject", "--kinds", "recolor", "--no-forgetting",
            "--out", tmp_path)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "recolor" in r.stdout and "backproject" in r.stdout and "PSNR chg" in r.stdout
    assert "bleed dB" in r.stdout
    for suite in SUITES:
        assert f"{suite} suite" in r.stdout
        assert (tmp_path / f"grid_{suite}_recolor.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "backproject,nerf"], "--methods: unknown 'nerf'"),
        (["--kinds", "paint,sculpt"], "--kinds: unknown 'sculpt'"),
        (["--seeds", f"0-{EVAL_SEED_LIMIT}"], "training seed"),
        (["--suites", "procedural,mipnerf360"], "--suites: unknown 'mipnerf360'"),
        (["--suite", "mipnerf360"], "--suites: unknown 'mipnerf360'"),
        (["--methods", "rule,model_kinds"], "--methods: unknown 'model_kinds'"),
        (["--hint", "guess"], "'guess' is not one of 'kind', 'auto'"),
        (["--gaussians", "lots"], "--gaussians: expected MIN-MAX"),
        (["--methods", "backproject", "--weights", "w.safetensors"], "--weights only applies"),
        (["--methods", "rule,diffusion", "--weights", "w.safetensors"], "--weights only applies"),
    ],
)
def test_bad_input_is_a_one_line_error(args, message, tmp_path):
    r = run(*args, "--out", tmp_path)
    assert r.exit_code == 2
    assert message in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_edit_reach_counts_what_moved_and_what_was_set_right():
    """benchmarks/edit_reach.py on a distractor part recolour whose fitted map is the truth
    (seed 60: diffusion reaches all 92 changed Gaussians and sets each within 0.02, at 68 dB):
    its shares are those of the Gaussians themselves, and the model's mix rows are mixtures."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "edit_reach.py"
    spec = importlib.util.spec_from_file_location("edit_reach", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rep = mod.run("distractor", "recolor", (60,), ["diffusion", "backproject", "model"], None)
    rows = {r["method"]: r for r in rep["rows"]}
    assert rows["diffusion"]["changed"] == 92
    assert (rows["diffusion"]["reach"], rows["diffusion"]["exact"]) == (1.0, 1.0)
    assert rows["diffusion"]["strays"] == 0.0
    # back-projection moves what the views show (not the faintest few) and sets no map
    assert 0.9 < rows["backproject"]["reach"] < 1.0 and rows["backproject"]["exact"] < 1.0
    mix = rows["model"]["mix_seen"]
    assert len(mix) == 3 and abs(sum(mix) - 1.0) < 2e-3 and rows["model"]["mix_unseen"] is None
    assert rep["mean"]["diffusion"] == {"reach": 1.0, "exact": 1.0, "strays": 0.0}
