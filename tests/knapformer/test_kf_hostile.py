"""Issue 13 defects on the knapformer side, one test each: planner inputs that used to be
accepted silently (negative or NaN limits, NaN hysteresis, lengths that overflow), hostile
files given to the CLI, and output file modes."""

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from knapformer.cli import app
from knapformer.planning.auto import choose_layout
from knapformer.planning.cost import CostModel
from knapformer.planning.errors import PlanError
from knapformer.planning.layout import BagLayout, LayoutError
from knapformer.planning.plan import plan_step, validate_lengths

COST = CostModel.flops(256)
LAYOUT = BagLayout.parse("g1n2+g2n1", 4, 8)
STEP = [[100, 300], [50], [800, 20], [400]]
runner = CliRunner()


def one_line_error(r, needle):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan"), float("inf")])
def test_exact_time_limit_must_be_finite_and_positive(value):
    with pytest.raises(PlanError, match="time_limit must be a finite number > 0"):
        plan_step(STEP, LAYOUT, COST, solver="exact", time_limit=value)


@pytest.mark.parametrize("name", ["locality_slack", "stop_gap", "keep_margin"])
def test_other_numeric_options_refuse_nan_and_negative(name):
    for value in (float("nan"), -0.5):
        with pytest.raises(PlanError, match=name):
            plan_step(STEP, LAYOUT, COST, **{name: value})


@pytest.mark.parametrize("value", [float("nan"), -0.1, 1.5])
def test_hysteresis_nan_or_out_of_range_refused(value):
    with pytest.raises(LayoutError, match="hysteresis"):
        choose_layout(STEP, 4, 8, 4, COST, current="g1n4", hysteresis=value)


def test_lengths_near_2_63_are_refused_not_wrapped():
    for huge in (2**62, 2**63 - 1, 2**40 + 1):
        with pytest.raises(PlanError, match="longer than the limit of 2\\^40"):
            plan_step([[huge], [1], [1], [1]], LAYOUT, COST)
    with pytest.raises(PlanError, match="2\\^53"):
        validate_lengths([[2**40] * 2049] * 4, 4)  # each within limit, total above 2^53
    p = plan_step([[2**40], [2**39], [7], [1]], LAYOUT, COST)  # the largest allowed
    assert 0.0 <= p.tokens_moved_fraction <= 1.0 and np.isfinite(p.balanced_max_over_mean)


def test_cli_deep_json_and_fifo_are_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"ranks": ' + "[" * 50_000 + "]" * 50_000 + "}")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, needle in ((deep, "nested 50001 levels deep"), (fifo, "is a FIFO")):
        one_line_error(
            runner.invoke(app, ["plan", "--lengths", str(path), "--spec", "g1n4"]), needle
        )
        r = runner.invoke(app, ["simulate", "--lengths", str(path), "--spec", "g1n4"])
        one_line_error(r, needle)


def test_cli_time_limit_and_hysteresis(tmp_path):
    f = tmp_path / "l.json"
    f.write_text(json.dumps({"ranks": STEP}))
    for value in ("-1", "nan"):
        r = runner.invoke(
            app, ["plan", "--lengths", str(f), "--spec", "g1n4", "--time-limit", value]
        )
        one_line_error(r, "time_limit must be a finite number > 0")
    r = runner.invoke(
        app,
        ["simulate", "--lengths", str(f), "--spec", "auto", "--heads", "8", "--hysteresis", "nan"],
    )
    one_line_error(r, "--hysteresis must be a number in [0, 1]")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"ranks": [[2**63 - 1], [1], [1], [1]]}))
    r = runner.invoke(app, ["plan", "--lengths", str(big), "--spec", "g1n4"])
    one_line_error(r, "2^40")


def test_profiles_and_plots_get_umask_modes(tmp_path):
    from knapformer.sim.plots import atomic_savefig

    old = os.umask(0o022)
    try:
        COST.save(tmp_path / "profile.json")
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        fig = plt.figure()
        atomic_savefig(fig, tmp_path / "plot.png")
        plt.close(fig)
    finally:
        os.umask(old)
    for name in ("profile.json", "plot.png"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_simulate_reports_progress_for_every_planned_step():
    from knapformer.sim.simulator import simulate

    seen = []
    simulate([STEP] * 3, COST, "g1n2+g2n1", 8, 4, on_plan=lambda d, t: seen.append((d, t)))
    total = seen[0][1]
    assert [d for d, _ in seen] == list(range(1, total + 1)) and {t for _, t in seen} == {total}
    assert total >= 3 * 3  # ours, the reference, and at least one homogeneous spec


def test_calibration_timing_reports_every_run():
    from knapformer.calibration.blocks import calibrate_blocks
    from knapformer.models.mmdit import mmdit_config

    seen = []
    calibrate_blocks(
        mmdit_config("tiny"), [64, 128, 256, 512, 1024], (1, 2), repeats=1, warmup=1,
        on_run=lambda d, t: seen.append((d, t)),
    )  # fmt: skip
    assert [d for d, _ in seen] == list(range(1, len(seen) + 1))
    # 2 block types x (5 lengths + 3 packed) x 2 bag sizes x (warmup + repeat)
    assert seen[-1][0] == seen[-1][1] == 2 * 16 * 2


def test_every_result_command_has_json_and_lists_choices():
    for cmd in ("plan", "simulate", "calibrate", "train"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "--json" in r.stdout and "list[" not in r.stdout, cmd
    assert "<local-search|exact|reference|ours>" in runner.invoke(app, ["plan", "--help"]).stdout


def test_train_output_paths_are_checked_before_any_rank_starts():
    """/proc takes no new files even from root: both outputs fail at once, in one line."""
    config = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"
    base = ["train", "--config", str(config), "--nproc", "2", "--steps", "1"]
    r = runner.invoke(app, [*base, "--checkpoint-dir", "/proc/kf_ckpt"])
    one_line_error(r, "/proc/kf_ckpt")
    r = runner.invoke(app, [*base, "--log", "/proc/kf_train.jsonl"])
    one_line_error(r, "cannot write in /proc")
