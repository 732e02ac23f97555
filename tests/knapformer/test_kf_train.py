"""The trainer: typed config with named errors, balanced == unbalanced losses, exact resume,
and the `knapformer train` / `python -m knapformer.train` front ends end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from knapformer.cli import app
from knapformer.planning.cost import CostModel
from knapformer.train.config import (
    ConfigError,
    apply_overrides,
    build_config,
    check_world,
    load_config,
    parse_override,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import TINY_TRAIN, run_workers

ROOT = Path(__file__).resolve().parents[2]

TINY = TINY_TRAIN

FIELDS = {
    "step",
    "loss",
    "step_wall_s",
    "rank_busy_s",
    "rank_tokens",
    "layout",
    "plan_ms",
    "modelled_max_over_mean",
}


# ---- config ----------------------------------------------------------------------------------


def test_shipped_tiny_config_loads():
    cfg = load_config(ROOT / "configs" / "tiny.toml")
    assert cfg.model_config().d_model == 128 and cfg.balance.balancer == "auto"
    check_world(cfg, 2)
    check_world(cfg, 4)


@pytest.mark.parametrize(
    "patch,match",
    [
        ({"train": {"stepz": 3}}, "unknown key\\(s\\) train.stepz"),
        ({"train": {"steps": "many"}}, "train.steps: expected an integer"),
        ({"train": {"lr": True}}, "train.lr: expected a number"),
        ({"optimizer": {}}, "unknown config section 'optimizer'"),
        ({"data": {"codes": "g1b2i64f1"}}, "'data.codes': bad data code"),
        ({"model": {"preset": "tiny", "num_heads": 5}}, "not divisible"),
        ({"checkpoint": {"every": 2}}, "needs checkpoint.dir"),
        ({"train": {"dtype": "float8"}}, "'train.dtype'"),
    ],
)
def test_bad_config_is_named(patch, match):
    raw = {k: dict(v) for k, v in TINY.items()}
    for k, v in patch.items():
        raw[k] = {**raw.get(k, {}), **v} if k != "model" else v
    with pytest.raises(ConfigError, match=match):
        build_config(raw)


def test_overrides_and_world_checks(tmp_path):
    assert parse_override("train.lr=3e-4") == ("train.lr", 3e-4)
    assert parse_override("balance.balancer=g1n2+g2n1") == ("balance.balancer", "g1n2+g2n1")
    assert parse_override("train.activation_checkpointing=true")[1] is True
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("lr=3")
    cfg = build_config(apply_overrides(TINY, {"train.steps": 7}))
    assert cfg.train.steps == 7
    with pytest.raises(ConfigError, match="does not fit 3 ranks"):
        check_world(cfg, 3)  # the data mixture describes 2 ranks
    cfg = build_config(apply_overrides(TINY, {"balance.balancer": "g4n1"}))
    with pytest.raises(ConfigError, match="'g4n1' does not fit 2 ranks"):
        check_world(cfg, 2)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[train\nsteps = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "bad.toml")


def test_cli_rejects_bad_input_before_spawning(tmp_path):
    runner = CliRunner()
    cfg = str(ROOT / "configs" / "tiny.toml")
    r = runner.invoke(app, ["train", "--config", cfg, "--nproc", "2", "--balancer", "g4n1"])
    assert r.exit_code == 2 and "does not fit 2 ranks" in r.output
    r = runner.invoke(app, ["train", "--config", cfg, "--set", "train.lr=fast"])
    assert r.exit_code == 2 and "train.lr: expected a number" in r.output
    r = runner.invoke(
        app,
        ["train", "--config", cfg, "--nproc", "2", "--resume", "--checkpoint-dir", str(tmp_path)],
    )
    assert r.exit_code == 2 and "no checkpoint" in r.output
    r = runner.invoke(app, ["train", "--config", cfg, "--nproc", "3"])
    assert r.exit_code == 2 and "does not fit 3 ranks" in r.output


# ---- distributed: balanced vs unbalanced, exact resume -----------------------------------------


def train_worker(rank: int, world: int, raw: dict, ckpt: str, what: str):
    import torch.distributed as dist

    from knapformer.train.config import apply_overrides, build_config
    from knapformer.train.loop import train

    def run(**over):
        return [r for r in train(build_config(apply_overrides(raw, over)))]

    if what == "balance":
        return {"none": run(**{"balance.balancer": "none"}), "auto": run()}
    import shutil

    # Every stateful part on: warm-up + cosine schedule, clipping (grad norms are ~1), EMA.
    parts = {"train.steps": 5, "train.lr_schedule": "cosine", "train.warmup_steps": 4}
    parts |= {"train.grad_clip": 0.5, "train.ema_decay": 0.9, "checkpoint.every": 2}
    full_dir, resume_dir = Path(ckpt) / "full", Path(ckpt) / "resumed"
    full = run(**parts, **{"checkpoint.dir": str(full_dir)})  # saves steps 2, 4 and 5
    dist.barrier()
    if rank == 0:  # a second directory that holds only the step-2 checkpoint (mid warm-up)
        shutil.copytree(full_dir / "step_00000002", resume_dir / "step_00000002")
        (resume_dir / "latest").write_text("step_00000002\n")
    dist.barrier()
    resumed = run(**parts, **{"checkpoint.dir": str(resume_dir), "checkpoint.resume": True})
    return {"full": full, "resumed": resumed}


def _train(tmp_path: Path, what: str) -> dict:
    args = (TINY, str(tmp_path / "ckpt"), what)
    return run_workers(__file__, "train_worker", 2, tmp_path, args=args, timeout=55)[0]


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_balanced_losses_match_unbalanced(tmp_path):
    res = _train(tmp_path, "balance")
    auto, none = res["auto"], res["none"]
    assert [r["step"] for r in auto] == [1, 2, 3]
    assert set(auto[0]) >= FIELDS
    for b, u in zip(auto, none, strict=True):
        assert abs(b["loss"] - u["loss"]) <= 1e-5 * abs(u["loss"]), (b["loss"], u["loss"])
        assert len(b["rank_busy_s"]) == 2 and len(b["rank_tokens"]) == 2
        assert sum(b["rank_tokens"]) == sum(u["rank_tokens"])  # every token computed once
    assert auto[0]["layout"] != "none" and none[0]["layout"] == "none"
    assert auto[0]["modelled_max_over_mean"] < none[0]["modelled_max_over_mean"]


def _dcp_tensors(path: Path, out: Path) -> dict[str, object]:
    """A DCP checkpoint as a flat ``{dotted key: tensor or value}`` dict (read in this process)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(out))
    flat: dict[str, object] = {}

    def walk(prefix: str, x: object) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(f"{prefix}.{i}", v)
        else:
            flat[prefix] = x

    walk("", torch.load(out, weights_only=False))
    return flat


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_resume_is_exact(tmp_path):
    """5 straight steps == 2 steps + resume (mid warm-up, clipping and EMA on) + 3 steps: the
    records, the weights, the optimiser state and the EMA, bit for bit."""
    import torch

    res = run_workers(
        __file__, "train_worker", 2, tmp_path, args=(TINY, str(tmp_path / "ckpt"), "resume"),
        timeout=85,
    )[0]  # fmt: skip
    full, resumed = res["full"], res["resumed"]
    assert [r["step"] for r in resumed] == [3, 4, 5]
    assert [r["lr"] for r in full[:4]] == pytest.approx([3e-3 * s / 4 for s in (1, 2, 3, 4)])
    assert any(r["grad_norm"] > 0.5 for r in full)  # clipping acted
    for a, b in zip(resumed, full[2:], strict=True):
        for key in ("loss", "lr", "grad_norm", "rank_tokens", "layout", "rank_modelled_load"):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "resumed" / "latest").read_text().strip() == "step_00000005"
    for step in ("step_00000004", "step_00000005"):
        want = _dcp_tensors(ckpt / "full" / step, tmp_path / f"full_{step}.pt")
        got = _dcp_tensors(ckpt / "resumed" / step, tmp_path / f"resumed_{step}.pt")
        assert sorted(got) == sorted(want)
        groups = {k.split(".")[0] for k in want}
        assert groups == {"model", "optim", "ema"}, groups
        assert any(".exp_avg_sq" in k for k in want)  # the optimiser's state is in there
        for k, v in want.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, got[k]), (step, k)
            else:
                assert v == got[k], (step, k)
    # the EMA is a state of its own (not a copy of the weights), sharded and saved as one
    w = _dcp_tensors(ckpt / "full" / "step_00000005", tmp_path / "w.pt")
    keys = [k[len("model.") :] for k in w if k.startswith("model.")]
    assert sorted(keys) == sorted(k[len("ema.") :] for k in w if k.startswith("ema."))
    assert any(not torch.equal(w[f"model.{k}"], w[f"ema.{k}"]) for k in keys)


def resume_cost_worker(rank: int, world: int, raw: dict, ckpt: str, prof_a: str, prof_b: str):
    import torch.distributed as dist

    from knapformer.train.config import apply_overrides, build_config
    from knapformer.train.loop import train

    def run(**over):
        return [r for r in train(build_config(apply_overrides(raw, over)))]

    full = run(**{"balance.cost": prof_a, "checkpoint.dir": ckpt, "checkpoint.every": 2})
    dist.barrier()
    if rank == 0:
        (Path(ckpt) / "latest").write_text("step_00000002\n")
    dist.barrier()
    # the resumed run is asked for another cost model: it plans with the checkpoint's
    resumed = run(**{"balance.cost": prof_b, "checkpoint.dir": ckpt, "checkpoint.resume": True})
    fresh_b = run(**{"balance.cost": prof_b, "train.steps": 1})
    return {"full": full, "resumed": resumed, "fresh_b": fresh_b}


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_resume_plans_with_the_checkpoints_cost_model(tmp_path):
    import dataclasses

    from knapformer.train.costs import flops_cost

    flops = flops_cost(build_config(TINY).model_config())
    flops.save(tmp_path / "a.json")
    # a model under which the auto layout would not split the video (u outweighs the gain)
    dataclasses.replace(flops, u=1e15, name="b").save(tmp_path / "b.json")
    args = (TINY, str(tmp_path / "ckpt"), str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    res = run_workers(__file__, "resume_cost_worker", 2, tmp_path, args=args, timeout=85)[0]
    full, resumed, fresh_b = res["full"], res["resumed"], res["fresh_b"]
    assert fresh_b[0]["layout"] != full[0]["layout"]  # b alone would plan differently
    assert [r["step"] for r in resumed] == [3]
    assert resumed[0]["layout"] == full[2]["layout"]
    assert resumed[0]["rank_modelled_load"] == full[2]["rank_modelled_load"]
    assert resumed[0]["loss"] == full[2]["loss"]


def refit_worker(rank: int, world: int, raw: dict, ckpt: str):
    import torch.distributed as dist

    from knapformer.train.config import apply_overrides, build_config
    from knapformer.train.loop import train

    def run(**over):
        over = {"train.steps": 6, "balance.refit_steps": 2, **over}
        return [r for r in train(build_config(apply_overrides(raw, over)))]

    full = run(**{"checkpoint.dir": ckpt, "checkpoint.every": 2})  # refits after steps 4, 6
    none = run(**{"balance.balancer": "none"})
    dist.barrier()
    if rank == 0:
        (Path(ckpt) / "latest").write_text("step_00000004\n")
    dist.barrier()
    resumed = run(**{"checkpoint.dir": ckpt, "checkpoint.resume": True})
    return {"full": full, "none": none, "resumed": resumed}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_online_refit_plans_later_steps_with_the_fitted_model(tmp_path):
    import numpy as np

    res = run_workers(
        __file__, "refit_worker", 2, tmp_path, args=(TINY, str(tmp_path / "ckpt")), timeout=115
    )[0]
    full, none, resumed = res["full"], res["none"], res["resumed"]
    # step 1 (the process's first) is left out: step 2 has one sample, the first fit is at 4
    assert [("cost_refit" in r) for r in full] == [False, False, False, True, False, True]
    fit = full[3]["cost_refit"]
    assert fit["samples"] == 2 * 3 and "error" not in fit
    model = CostModel.from_dict(fit["model"])
    assert model.name.startswith("refit:")
    coef = np.array([model.a, model.b, model.c, model.e, model.f, model.u])
    # fitted to measured CPU seconds (the starting model counts FLOPs): its times match theirs
    ratio = np.concatenate(
        [np.asarray(r["rank_cost_features"]) @ coef / r["rank_busy_s"] for r in full[1:4]]
    )
    assert 0.2 < float(np.median(ratio)) < 5.0
    for rec in full[4:6]:  # steps 5 and 6 plan (and model their times) with it, on both ranks
        feats = np.asarray(rec["rank_cost_features"])
        np.testing.assert_allclose(rec["rank_modelled_load"], feats @ coef, rtol=1e-9)
    for b, u in zip(full, none, strict=True):  # balancing still computes the same losses
        assert abs(b["loss"] - u["loss"]) <= 1e-5 * abs(u["loss"])
    # resumed from step 4: the refit state and the model in use come from the checkpoint
    assert [r["step"] for r in resumed] == [5, 6]
    for a, b in zip(resumed, full[4:], strict=True):
        assert a["loss"] == b["loss"]
        assert a["rank_modelled_load"] == b["rank_modelled_load"]
    assert resumed[1]["cost_refit"]["samples"] == 2 * 4  # steps 2-4 restored, plus step 6


# ---- front ends --------------------------------------------------------------------------------


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run in a new session so a timeout kills the launcher *and* every rank it spawned."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _write_tiny(path: Path) -> Path:
    lines = []
    for section, kv in TINY.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in kv.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_cli_spawns_ranks_and_writes_the_log(tmp_path):
    cfg = _write_tiny(tmp_path / "t.toml")
    log = tmp_path / "log.jsonl"
    # progress on (stderr is a pipe: plain lines, here on every step), --json on stdout
    env = dict(os.environ, OMP_NUM_THREADS="1", APPSHELL_PROGRESS_EVERY="0")
    cmd = [sys.executable, "-m", "knapformer.cli", "train", "--config", str(cfg), "--nproc", "2"]
    cmd += ["--balancer", "g2n1", "--steps", "2", "--log", str(log), "--json"]
    r = _run(cmd, env, timeout=85)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in recs] == [1, 2] and set(recs[0]) >= FIELDS
    assert all(x["layout"] == "g2n1" for x in recs)
    assert json.loads(r.stdout)["log"] == str(log)  # stdout is the JSON document alone
    assert re.search(r"^train: 2/2 \(100%\) loss \d+\.\d{4} \d+m\d\ds$", r.stderr, re.M), r.stderr


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_module_entry_point_under_a_torchrun_environment(tmp_path):
    cfg = _write_tiny(tmp_path / "t.toml")
    log = tmp_path / "log.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, "-m", "knapformer.train", "--config", str(cfg), "--steps", "1"]
    cmd += ["--log", str(log), "--data-codes", "g1b2i128f1s0", "--cost", "calibrate"]
    cmd += ["--set", "model.preset=cpu"]
    r = _run(cmd, env, timeout=55)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads(log.read_text().splitlines()[0])
    assert rec["step"] == 1 and rec["layout"] == "g1n1" and len(rec["rank_tokens"]) == 1
    assert "held-out MAPE per block type" in r.stdout  # the per-block-type calibration ran


def test_per_block_type_calibration_feeds_one_cost_model():
    from knapformer.models.mmdit import mmdit_config
    from knapformer.train.costs import calibrate_blocks

    cfg = mmdit_config("cpu", depth_double=2, depth_single=3)
    c = calibrate_blocks(cfg, [64, 128, 192, 256, 384, 512], (1, 2), repeats=2, warmup=0)
    assert c.double.a + c.double.b > 0 and c.single.a + c.single.b > 0
    assert c.total.a == pytest.approx(2 * c.double.a + 3 * c.single.a)
    assert c.total.b == pytest.approx(2 * c.double.b + 3 * c.single.b)
    # Per-sequence constants add up into t (every GPU of a bag pays them per sequence); the
    # per-call ones into f (once per rank and step), apart from t.
    assert c.total.e == pytest.approx(2 * c.double.e + 3 * c.single.e)
    assert c.total.f == pytest.approx(2 * c.double.f + 3 * c.single.f)
    assert c.per_rank_overhead_s == c.total.f
    assert c.total.t(100, 2) == pytest.approx(2 * c.double.t(100, 2) + 3 * c.single.t(100, 2))
    assert set(c.heldout_mape) == {"double", "single"} and c.lengths_heldout
    assert set(c.packed_mape) == {"double", "single"}
    assert CostModel.from_dict(c.total.to_dict()) == c.total
    with pytest.raises(ValueError, match="divide num_heads"):
        calibrate_blocks(cfg, [8, 16, 32], (3,))


def test_round_factors_are_taken_out_of_block_timings():
    import numpy as np

    from knapformer.calibration.blocks import _median_polish

    rng = np.random.default_rng(0)
    level = np.array([3e-3, 7e-3, 2e-2, 9e-2])
    load = rng.uniform(1.0, 2.0, size=12)  # every case of a round slowed alike
    times = level[:, None] * load[None, :]
    times[3, 6:] = np.nan  # expensive cases get fewer rounds
    got = np.array(_median_polish(times, 0.0))
    np.testing.assert_allclose(got / got[0], level / level[0], rtol=1e-12)
    assert got[0] == pytest.approx(level[0] * load.min(), rel=1e-12)  # the quietest round's load


def bag_overhead_worker(rank: int, world: int, raw: dict):
    import dataclasses

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.calibration.clock import CPUClock
    from knapformer.data.synthetic import SyntheticMixture
    from knapformer.train.config import apply_overrides, build_config
    from knapformer.train.costs import flops_cost, measure_bag_overhead
    from knapformer.train.loop import build_run, train_step

    cfg = build_config(apply_overrides(raw, {"balance.balancer": "g2n1"}))
    mcfg = cfg.model_config()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    cpu = torch.device("cpu")
    flops = flops_cost(mcfg)
    measured, info = measure_bag_overhead(cfg, flops, mesh, cpu, steps=3, warmup=1)
    # a step's modelled per-rank times: the plan's loads plus f, and u (g-1)/g in a g-bag
    cost = dataclasses.replace(flops, f=1e6, u=4e6)
    model, bal, optim = build_run(cfg, cost, mesh, cpu)
    data = SyntheticMixture(cfg.data.codes, mcfg, world, text_tokens_max=4)
    rec = train_step(model, bal, optim, data.batch(1, rank), 1, cost, CPUClock(), cpu)
    return {
        "u": measured.u,
        "rest_unchanged": dataclasses.replace(measured, u=0.0) == flops,
        "layouts": sorted(info["unmodelled_s"]),
        "rec": rec,
        "plan_loads": bal.plan.load_after.tolist(),
        "t_own": float(cost.t(data.lengths(1, rank)).sum()),
    }


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_bag_overhead_is_measured_in_place_and_enters_modelled_times(tmp_path):
    res = run_workers(__file__, "bag_overhead_worker", 2, tmp_path, args=(TINY,), timeout=55)
    assert res[0]["u"] == res[1]["u"] >= 0.0  # every rank the same
    assert res[0]["rest_unchanged"] and res[0]["layouts"] == ["g1n2", "g2n1"]
    rec = res[0]["rec"]
    assert rec["rank_bag_size"] == [2, 2]
    for r in range(2):
        want = res[0]["plan_loads"][r] + 1e6 + 4e6 / 2
        assert rec["rank_modelled_load"][r] == pytest.approx(want, rel=1e-12)
    assert rec["modelled_unbalanced_makespan"] == pytest.approx(
        max(x["t_own"] for x in res) + 1e6, rel=1e-12
    )
