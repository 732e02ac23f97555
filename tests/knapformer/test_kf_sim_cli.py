"""`knapformer simulate`: JSON keys, side-by-side consistency, plots and clear errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from knapformer.cli import app
from knapformer.planning import BagLayout, CostModel, plan_step
from knapformer.sim.datacodes import resolve_mixture, sample_steps
from knapformer.sim.metrics import chunk_sizes, flow_matrix
from knapformer.sim.simulator import homogeneous_specs, simulate

PLAN_KEYS = {
    "unbalanced_max_over_mean",
    "balanced_max_over_mean",
    "lower_bound_over_mean",
    "plan_ms",
    "tokens_moved_fraction",
    "sp_tokens_fraction",
}

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, ["simulate", *args])


def test_json_has_documented_keys_and_is_consistent():
    res = _run(
        "--mixture", "mixres", "--gpus", "32", "--steps", "3", "--spec", "g1n16+g2n4+g4n2", "--json"
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["strategy"] for r in rows] == [
        "none",
        "reference",
        "reference-best-homogeneous",
        "ours",
    ]
    for r in rows:
        assert PLAN_KEYS | {"strategy", "spec", "median_gap"} <= r.keys()
        assert r["balanced_max_over_mean"] >= r["lower_bound_over_mean"] * (1 - 1e-9)
        assert 0.0 <= r["sp_tokens_fraction"] <= 1.0
        assert 0.0 <= r["tokens_moved_fraction"] <= 1.0
    # the same sampled steps for every strategy
    assert len({round(r["unbalanced_max_over_mean"], 12) for r in rows}) == 1
    by = {r["strategy"]: r for r in rows}
    assert by["none"]["tokens_moved_fraction"] == 0.0
    assert by["none"]["balanced_max_over_mean"] == by["none"]["unbalanced_max_over_mean"]
    assert by["ours"]["balanced_max_over_mean"] <= by["reference"]["balanced_max_over_mean"]
    assert by["reference-best-homogeneous"]["spec"] in homogeneous_specs(32, 24, 8)


def test_table_lengths_file_and_plots(tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps({"ranks": [[5000, 100], [300], [200, 200], [64]]}))
    res = _run(
        "--lengths",
        str(lengths),
        "--spec",
        "g1n2+g2n1",
        "--heads",
        "4",
        "--d-model",
        "256",
        "--plot-dir",
        str(tmp_path / "plots"),
    )
    assert res.exit_code == 0, res.output
    assert "reference-best-homogeneous" in res.stdout and "g1n2+g2n1" in res.stdout
    for name in ("loads.png", "routing.png"):
        data = (tmp_path / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "plots").glob("*.tmp"))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--mixture", "hires", "--gpus", "32"], "'hires' is not one of 'lowres', 'mixres'"),
        (["--data-codes", "g8b2i256f85", "--gpus", "8"], "bad data code 'g8b2i256f85'"),
        (["--data-codes", "g8b2i256f85s3", "--gpus", "8"], "S must be 0 or 1"),
        (["--mixture", "mixres", "--gpus", "48"], "not a multiple of 32"),
        (["--mixture", "mixres"], "--gpus is required"),
        (["--mixture", "mixres", "--data-codes", "g1b1i256f1s0", "--gpus", "32"], "exactly one"),
        (["--mixture", "mixres", "--gpus", "32", "--spec", "g3n2"], "does not divide"),
        (
            ["--mixture", "mixres", "--gpus", "32", "--spec", "g16n2", "--heads", "32"],
            "larger than a node",
        ),
        (
            ["--data-codes", "g8b1i256f1s0", "--gpus", "8", "--spec", "g1n2+g4n1+g2n1"],
            "spans two nodes",
        ),
        (
            ["--mixture", "mixres", "--gpus", "32", "--profile", "/nonexistent/p.json"],
            "cannot read cost profile",
        ),
    ],
)
def test_bad_input_exit_2_with_a_clear_message(args, needle):
    if "--spec" not in args:
        args = [*args, "--spec", "g4n8"]
    res = _run(*args, "--steps", "1", "--gpus-per-node", "4" if "g8b1i256f1s0" in args else "8")
    assert res.exit_code == 2, res.output
    assert needle in res.stderr
    assert "Traceback" not in res.output + res.stderr


def test_bad_code_in_a_subprocess_has_no_traceback():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "knapformer.cli",
            "simulate",
            "--data-codes",
            "g4b1i2048f1",
            "--gpus",
            "4",
            "--spec",
            "g4n1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "bad data code 'g4b1i2048f1'" in out.stderr
    assert "Traceback" not in out.stderr


def test_flow_matrix_matches_plan_chunks():
    steps = sample_steps(resolve_mixture("joint"), 32, steps=1, seed=3)
    layout = BagLayout.parse("g1n8+g2n4+g4n2+g8n1", 32, 24)
    plan = plan_step(steps[0], layout, CostModel.flops(3072, 0.4), solver="ours")
    flow = flow_matrix(plan)
    assert flow.sum() == plan.lengths.sum()
    np.testing.assert_array_equal(flow.sum(axis=0), plan.tokens_per_gpu())
    np.testing.assert_array_equal(
        flow.sum(axis=1), np.bincount(plan.src_rank, weights=plan.lengths, minlength=32)
    )
    moved = 1.0 - np.trace(flow) / flow.sum()
    assert moved == pytest.approx(plan.tokens_moved_fraction)
    for s in range(plan.num_sequences):
        g = layout.bag_sizes[plan.bag[s]]
        want = np.diff(plan.chunk_bounds(s))
        np.testing.assert_array_equal(chunk_sizes(plan.lengths[s], g, np.arange(g)), want)


def test_best_homogeneous_respects_heads_and_node():
    assert homogeneous_specs(32, 24, 8) == ["g1n32", "g2n16", "g4n8", "g8n4"]
    assert homogeneous_specs(32, 12, 2) == ["g1n32", "g2n16"]
    assert homogeneous_specs(6, None, None) == ["g1n6", "g2n3"]
    steps = sample_steps(resolve_mixture("lowres"), 32, steps=2, seed=0)
    res = simulate(steps, CostModel.flops(3072, 1.0), "g2n16", 24, 8)
    scores = res.homogeneous_scores
    best = next(r for r in res.results if r.strategy == "reference-best-homogeneous")
    assert scores[best.spec] <= min(scores.values()) * (1 + 1e-4)


def test_auto_spec_json_and_layouts_are_valid():
    res = _run(
        "--mixture",
        "joint",
        "--gpus",
        "32",
        "--steps",
        "2",
        "--spec",
        "auto",
        "--heads",
        "12",
        "--gpus-per-node",
        "4",
        "--json",
    )
    assert res.exit_code == 0, res.output
    rows = {r["strategy"]: r for r in json.loads(res.stdout)}
    assert set(rows) == {"none", "reference-best-homogeneous", "ours"}  # no fixed spec to share
    ours = rows["ours"]
    assert ours["spec"] == "auto" and sum(ours["specs_used"].values()) == 2
    assert ours["layout_ms"] > 0
    for spec in ours["specs_used"]:
        layout = BagLayout.parse(spec, 32, 12)
        assert all(r[0] // 4 == r[-1] // 4 for r in layout.bag_ranks)  # inside one node
    assert rows["reference-best-homogeneous"]["spec"] in homogeneous_specs(32, 12, 4)
