"""`knapformer plan` command line: JSON keys, human output, clear errors (exit code 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import knapformer
from knapformer.cli import app

MIXRES = Path(knapformer.__file__).parent / "data" / "mixres_32gpu.json"
KEYS = {
    "unbalanced_max_over_mean",
    "balanced_max_over_mean",
    "lower_bound_over_mean",
    "plan_ms",
    "tokens_moved_fraction",
    "sp_tokens_fraction",
    "spec",
    "solver",
    "gap",
}


def _run(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


@pytest.fixture
def small(tmp_path: Path) -> Path:
    f = tmp_path / "lengths.json"
    f.write_text(json.dumps({"ranks": [[100, 3000], [16000], [], [5, 7]]}))
    return f


def test_json_on_paper_mixture_both_solvers():
    out = {}
    for solver in ("ours", "reference"):
        r = _run(
            "--lengths", str(MIXRES), "--spec", "g1n16+g2n4+g4n2", "--solver", solver, "--json"
        )
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        assert set(d) >= KEYS
        assert d["solver"] == solver and d["spec"] == "g1n16+g2n4+g4n2"
        out[solver] = d
    assert out["ours"]["balanced_max_over_mean"] < out["reference"]["balanced_max_over_mean"]
    assert out["reference"]["balanced_max_over_mean"] > 2.0
    assert out["ours"]["gap"] < 1e-4  # certified optimal by the lower bound
    assert out["ours"]["unbalanced_max_over_mean"] == pytest.approx(
        out["reference"]["unbalanced_max_over_mean"]
    )


def test_human_output_and_auto(small: Path):
    r = _run("--lengths", str(small), "--spec", "g1n2+g2n1", "--d-model", "512", "--gamma", "0.4")
    assert r.exit_code == 0, r.output
    assert "max/mean: before" in r.output and "lower bound" in r.output and "planning" in r.output
    rows = [ln for ln in r.output.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s+[\d.]+", ln)]
    assert len(rows) == 4  # one per GPU
    r = _run("--lengths", str(small), "--spec", "auto", "--gpus-per-node", "4", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["requested_spec"] == "auto"
    assert sum(int(t.split("n")[0][1:]) * int(t.split("n")[1]) for t in d["spec"].split("+")) == 4


def test_exact_and_budget(small: Path):
    r = _run("--lengths", str(small), "--spec", "g1n2+g2n1", "--solver", "exact", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["gap"] == pytest.approx(0.0, abs=1e-6)
    for solver in ("local-search", "ours"):  # the default solver, by its name and its alias
        r = _run("--lengths", str(small), "--spec", "g1n2+g2n1", "--solver", solver, "--json")
        assert r.exit_code == 0 and json.loads(r.output)["solver"] == solver, r.output
    r = _run(
        "--lengths", str(small), "--spec", "g1n2+g2n1", "--max-tokens-per-gpu", "9000", "--json"
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["max_tokens_on_a_gpu"] <= 9000


@pytest.mark.parametrize(
    ("content", "args", "match"),
    [
        ("{not json", ["--spec", "g1n4"], "not valid JSON"),
        ('{"x": 1}', ["--spec", "g1n4"], '"ranks"'),
        ('{"ranks": [[1, "a"], [], [], []]}', ["--spec", "g1n4"], "integer lengths"),
        ('{"ranks": [[1, 0], [], [], []]}', ["--spec", "g1n4"], "length 0"),
        ('{"ranks": [[1], [2], [3], [4]]}', ["--spec", "g3n1"], "does not divide"),
        ('{"ranks": [[1], [2], [3], [4]]}', ["--spec", "g1n4+"], "bad bag layout term"),
        ('{"ranks": [[1], [2], [3], [4]]}', ["--spec", "g4n1", "--heads", "6"], "num_heads"),
        ('{"ranks": [[1], [2], [3], [4]]}', ["--spec", "g4n1", "--gpus-per-node", "2"], "node"),
        ('{"ranks": [[1], [2], [3], [4]]}', ["--spec", "g1n4", "--solver", "x"], "is not one of"),
        (
            '{"ranks": [[900], [2], [3], [4]]}',
            ["--spec", "g1n4", "--max-tokens-per-gpu", "10"],
            "max_tokens",
        ),
        (
            '{"ranks": [[1], [2], [3], [4]]}',
            ["--spec", "g1n4", "--solver", "exact", "--time-limit", "-1"],
            "time_limit must be a finite number > 0",
        ),
        (
            '{"ranks": [[1], [2], [3], [4]]}',
            ["--spec", "g1n4", "--solver", "exact", "--time-limit", "nan"],
            "time_limit must be a finite number > 0",
        ),
    ],
)
def test_bad_input_one_line_error_exit_2(tmp_path: Path, content, args, match):
    f = tmp_path / "in.json"
    f.write_text(content)
    r = _run("--lengths", str(f), *args)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert match in lines[0]


def test_real_process_error_has_no_traceback(tmp_path: Path):
    f = tmp_path / "in.json"
    f.write_text('{"ranks": [[1, -3], [2]]}')
    r = subprocess.run(
        [sys.executable, "-m", "knapformer.cli", "plan", "--lengths", str(f), "--spec", "g1n2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: rank 0 has a sequence of length -3: every length must be >= 1"
    ]


def test_missing_file(tmp_path: Path):
    r = _run("--lengths", str(tmp_path / "nope.json"), "--spec", "g1n2")
    assert r.exit_code == 2
    assert "cannot read" in r.output
