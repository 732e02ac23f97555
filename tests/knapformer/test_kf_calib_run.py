"""A small real calibration run: valid profile, plot, errors; the all-to-all measurement."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from knapformer.calibration.comm import measure_all_to_all
from knapformer.calibration.run import bag_attention
from knapformer.cli import app
from knapformer.planning import BagLayout, CostModel, plan_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference_model import local_attention

runner = CliRunner()


def test_small_calibration_gives_a_usable_profile(tmp_path):
    out, png = tmp_path / "profile.json", tmp_path / "fit.png"
    res = runner.invoke(
        app,
        [
            "calibrate",
            "--d-model",
            "64",
            "--heads",
            "4",
            "--lengths",
            "32,64,96,128,192,256",
            "--bag-sizes",
            "1,2",
            "--repeats",
            "1",
            "--min-time",
            "0",
            "--warmup",
            "1",
            "--no-comm",
            "--out",
            str(out),
            "--plot",
            str(png),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "held-out MAPE" in res.stdout
    prof = CostModel.load(out)
    assert min(prof.a, prof.b, prof.c, prof.e) >= 0 and (prof.a > 0 or prof.b > 0)
    meta = prof.meta
    assert meta["lengths_heldout"] and set(meta["lengths_heldout"]).isdisjoint(meta["lengths_fit"])
    assert np.isfinite(meta["heldout_mape_percent"])
    assert set(meta["measured_seconds"]) == {"1", "2"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the planner takes the profile as its cost model
    layout = BagLayout.parse("g1n2+g2n1", 4, 4)
    plan = plan_step([[900, 30], [40], [50, 60], [70]], layout, prof)
    assert plan.balanced_max_over_mean <= plan.unbalanced_max_over_mean + 1e-12
    # and so does the simulator
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps({"ranks": [[900, 30], [40], [50, 60], [70]]}))
    sim = runner.invoke(
        app,
        [
            "simulate",
            "--lengths",
            str(lengths),
            "--spec",
            "g1n2+g2n1",
            "--heads",
            "4",
            "--profile",
            str(out),
            "--json",
        ],
    )
    assert sim.exit_code == 0, sim.output
    assert {r["strategy"] for r in json.loads(sim.stdout)} >= {"none", "ours"}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--bag-sizes", "1,3"], "do not divide heads=4"),
        (["--lengths", "16,32,64"], "at least 4 distinct lengths"),
        (["--lengths", "a,b"], "comma-separated integers"),
    ],
)
def test_calibrate_bad_input(args, needle):
    res = runner.invoke(app, ["calibrate", "--d-model", "64", "--heads", "4", "--no-comm", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.stderr
    assert "Traceback" not in res.output


def test_bag_attention_emulation():
    torch.manual_seed(0)
    L, H, D = 10, 4, 8
    q, k, v = (torch.randn(L, H, D, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, L])
    torch.testing.assert_close(bag_attention(1, L)(q, k, v), local_attention(cu, L)(q, k, v))
    # g=2: one GPU holds a 5-token chunk with all heads; its attention covers the whole
    # sequence for H/2 heads, and the output comes back in the chunk's [C, H, D] shape.
    C = 5
    qc = q[:C].clone().requires_grad_(True)
    out = bag_attention(2, L)(qc, k[:C], v[:C])
    assert out.shape == (C, H, D)
    out.sum().backward()
    assert qc.grad is not None and torch.isfinite(qc.grad).all()


def test_bag_attention_emulation_of_packed_sequences():
    torch.manual_seed(0)
    n, L, H, D = 3, 10, 4, 8
    q, k, v = (torch.randn(n * L, H, D, dtype=torch.float64) for _ in range(3))
    cu = torch.arange(n + 1) * L
    torch.testing.assert_close(bag_attention(1, L, n)(q, k, v), local_attention(cu, L)(q, k, v))
    # g=2: the GPU holds one 5-token chunk of each sequence; the emulation fills each whole
    # sequence with copies of the local chunk, so head group 0 of local row r is attention at
    # row r of that filled sequence, computed here directly.
    g, C, hg = 2, 5, 2
    rows = torch.cat([torch.arange(i * L, i * L + C) for i in range(n)])
    qc, kc, vc = (x[rows].clone().requires_grad_(True) for x in (q, k, v))
    out = bag_attention(g, L, n)(qc, kc, vc)
    assert out.shape == (n * C, H, D)
    for i in range(n):
        whole = [x[i * C : (i + 1) * C, :hg].repeat(g, 1, 1) for x in (qc, kc, vc)]
        ref = local_attention(torch.tensor([0, L]), L)(*whole)
        torch.testing.assert_close(out[i * C : (i + 1) * C, :hg], ref[:C])
    out.sum().backward()
    assert qc.grad is not None and torch.isfinite(qc.grad).all()


@pytest.mark.timeout(120)
def test_all_to_all_measurement_two_processes():
    r = measure_all_to_all(32, sizes=(64, 256, 1024), repeats=2, timeout_s=90)
    assert len(r.seconds) == 3 and all(s > 0 for s in r.seconds)
    assert r.k >= 0 and r.alpha >= 0 and r.c == 8 * r.k
