"""Issue 25 on the knapformer side, one test per defect: never lose a checkpoint, refuse a resume
whose config differs, run no code from a checkpoint, one-line errors for damaged files and a
full disk, ranks that die with their launcher, a log without duplicate steps after a resume,
named errors for NaN / inf / zero / negative config values and a diverged loss, and bounds on
memory before anything is allocated.

The distributed scenarios run once, in one 2-rank worker (``scenarios``), and the tests read
their parts; the CLI checks run in this process (they refuse before any rank starts)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from knapformer.cli import app
from knapformer.train.config import ConfigError, apply_overrides, build_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import TINY_TRAIN, run_workers

TINY = TINY_TRAIN
runner = CliRunner()


def one_line_error(r, *needles: str, code: int = 2) -> str:
    assert r.exit_code == code, (r.exit_code, r.output)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_toml(path: Path, raw: dict) -> Path:
    lines = []
    for section, kv in raw.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in kv.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- the distributed scenarios (2 gloo ranks, tiny model) --------------------------------------


def _steps(log: Path) -> list[int]:
    return [json.loads(x)["step"] for x in log.read_text().splitlines() if x.strip()]


def scenarios_worker(rank: int, world: int, raw: dict, root_s: str) -> dict:
    """Every scenario runs whatever the previous ones did (on the old code too, where they
    reproduce the defects), so each result is a list of (step, loss) or the error's line."""
    import dataclasses
    import errno

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as dcp_fs

    from knapformer.train.config import CheckpointConfig, apply_overrides, build_config
    from knapformer.train.loop import train

    root = Path(root_s)
    ckpt, log = root / "ckpt", root / "train.jsonl"
    base = {"checkpoint.dir": str(ckpt), "log.path": str(log)}

    def attempt(**over) -> list | str:
        try:
            return [(r["step"], r["loss"]) for r in train(build_config(apply_overrides(raw, over)))]
        except BaseException as exc:  # what the rank ends with (DCP's is a BaseException)
            return f"{type(exc).__name__}: {exc}"

    def on_rank0(fn) -> None:
        dist.barrier()
        if rank == 0:
            try:
                fn()
            except OSError as exc:
                out.setdefault("setup_errors", []).append(repr(exc))
        dist.barrier()

    out: dict = {"ref": attempt(**{"train.steps": 5})}  # uninterrupted

    # killed after logging step 3, before its checkpoint: the log has 1-3, latest is step 2
    out["first"] = attempt(**base, **{"train.steps": 3, "checkpoint.every": 2})

    def as_if_killed():
        shutil.rmtree(ckpt / "step_00000003")
        (ckpt / "latest").write_text("step_00000002\n")
        out["log_before"] = _steps(log)

    on_rank0(as_if_killed)
    resume = {"checkpoint.resume": True}
    out["resumed"] = attempt(**base, **resume, **{"train.steps": 4, "checkpoint.every": 2})
    if rank == 0:
        out["log_after"] = _steps(log)
    out["fresh"] = attempt(**base, **{"train.steps": 3, "checkpoint.every": 2})

    # a fresh run (another seed; --overwrite where it exists) killed while the shards of its
    # step 4 are half written: step 4 is the checkpoint in charge
    real_save = dcp.save

    def killed(state, **kw):
        real_save(state, **kw)
        path = Path(str(kw.get("checkpoint_id") or kw["storage_writer"].path))
        shard = path / f"__{dist.get_rank()}_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        raise RuntimeError("simulated kill during the save")

    over = {"train.steps": 4, "checkpoint.every": 4, "train.seed": 1}
    over |= {"checkpoint.dir": str(ckpt), "log.path": str(root / "other.jsonl")}
    if "overwrite" in {f.name for f in dataclasses.fields(CheckpointConfig)}:
        over["checkpoint.overwrite"] = True
    dcp.save = killed
    try:
        out["killed"] = attempt(**over)
    finally:
        dcp.save = real_save
    dist.barrier()
    out["after_kill"] = attempt(**base, **resume, **{"train.steps": 5, "checkpoint.every": 5})

    # the disk fills up while step 6 is written
    real_item = dcp_fs._write_item

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    dcp_fs._write_item = full
    try:
        out["enospc"] = attempt(**base, **resume, **{"train.steps": 6, "checkpoint.every": 6})
    finally:
        dcp_fs._write_item = real_item
    if rank == 0:
        out["enospc_latest"] = (ckpt / "latest").read_text().strip()
        out["enospc_partials"] = [p.name for p in ckpt.glob(".partial-*")]

    # resume with another model and learning rate
    over = {"train.steps": 6, "model.depth_single": 2, "train.lr": 1e-3}
    out["changed"] = attempt(**base, **resume, **over)
    # a learning rate that is finite but blows the weights up
    out["diverged"] = attempt(**{"train.steps": 4, "train.lr": 1e30})

    # a checkpoint from before the hashes were recorded, with a truncated shard
    legacy = root / "legacy"

    def make_legacy():
        shutil.copytree(ckpt / "step_00000005", legacy / "step_00000005")
        (legacy / "latest").write_text("step_00000005\n")
        tj = legacy / "step_00000005" / "trainer.json"
        state = json.loads(tj.read_text())
        state.pop("files", None)
        tj.write_text(json.dumps(state))
        shard = legacy / "step_00000005" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])

    on_rank0(make_legacy)
    over = {"checkpoint.dir": str(legacy), "checkpoint.resume": True, "train.steps": 6}
    out["legacy_truncated"] = attempt(**over)
    return out


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("scenarios")
    res = run_workers(
        __file__, "scenarios_worker", 2, root, args=(TINY, str(root)), timeout=230
    )  # fmt: skip
    res[0]["fresh_rank1"] = res[1]["fresh"]
    return res[0], root


def ckpt_cli(root: Path, *args: str) -> list[str]:
    cfg = write_toml(root / "t.toml", TINY)
    return ["train", "--config", str(cfg), "--nproc", "2", "--checkpoint-dir", *args]


# ---- 1: a fresh run never destroys a checkpoint ------------------------------------------------


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_fresh_run_into_a_checkpoint_dir_is_refused(scenarios):
    res, root = scenarios
    fresh = str(res["fresh"])
    assert fresh.startswith("CheckpointError: ") and "--overwrite" in fresh
    assert res["fresh_rank1"] == res["fresh"]  # every rank stops alike
    r = runner.invoke(app, ckpt_cli(root, str(root / "ckpt"), "--steps", "3"))
    one_line_error(r, "already holds checkpoints", "--resume", "--overwrite")
    r = runner.invoke(app, ckpt_cli(root, str(root / "ckpt"), "--resume", "--overwrite"))
    one_line_error(r, "pass one of the two")


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_kill_during_save_keeps_the_previous_checkpoint(scenarios):
    """An --overwrite run killed half way through writing the step `latest` names: the
    checkpoint in charge is untouched, loads, and continues the run exactly."""
    res, root = scenarios
    assert res["killed"] == "RuntimeError: simulated kill during the save"
    ref = [loss for _, loss in res["ref"]]
    assert res["resumed"] == [(3, ref[2]), (4, ref[3])]
    assert res["after_kill"] == [(5, ref[4])]  # step 4 of the first run, not the killed one
    assert not list((root / "ckpt").glob(".partial-*"))  # the next save cleared it


def test_publish_never_writes_into_the_checkpoint_in_charge(tmp_path):
    """The rename step of a save: a folder `latest` names is kept (the new one gets another
    name), a stale one (not in charge) is replaced; `latest` moves last."""
    from knapformer.train.checkpoint import _publish

    root = tmp_path / "ckpt"
    for name in ("step_00000004", "step_00000006"):
        (root / name).mkdir(parents=True)
        (root / name / "old").write_text("old")
    (root / "latest").write_text("step_00000004\n")
    for step in (4, 6):
        tmp = root / f".partial-step_{step:08d}"
        tmp.mkdir()
        (tmp / "shard").write_text("new")
        final = _publish(root, tmp, root / f"step_{step:08d}", {"step": step})
        assert (root / "latest").read_text() == final.name + "\n" and not tmp.exists()
        assert (final / "shard").read_text() == "new" and (final / "trainer.json").is_file()
        if step == 4:
            assert final.name == "step_00000004-1"
            assert (root / "step_00000004" / "old").read_text() == "old"  # untouched
        else:
            assert final.name == "step_00000006" and not (final / "old").exists()


# ---- 2: resume checks the whole config ---------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_resume_with_another_config_names_every_changed_key(scenarios):
    res, root = scenarios
    msg = str(res["changed"])
    assert msg.startswith("CheckpointError: --resume: the config differs")
    assert "model.depth_single (checkpoint 1, now 2)" in msg and "train.lr" in msg
    r = runner.invoke(
        app,
        ckpt_cli(root, str(root / "ckpt"), "--resume", "--steps", "9", "--set",
                 "model.depth_single=2", "--set", "train.lr=1e-3"),
    )  # fmt: skip
    line = one_line_error(r, "model.depth_single (checkpoint 1, now 2)", "train.lr (checkpoint")
    assert "train.steps" not in line.split("; only")[0]  # steps may change


def test_resumable_keys_are_listed_once():
    from knapformer.train.config import RESUMABLE_KEYS, config_changes

    a = build_config(TINY)
    b = build_config(
        apply_overrides(TINY, {"train.steps": 9, "log.path": "x", "balance.cost": "y"})
    )
    assert config_changes(a, b) == [] and "train.steps" in RESUMABLE_KEYS
    c = build_config(apply_overrides(TINY, {"model.depth_single": 1}))  # = the tiny preset
    assert config_changes(a, c) == []
    d = build_config(apply_overrides(TINY, {"data.seed": 3}))
    assert config_changes(a, d) == ["data.seed (checkpoint 0, now 3)"]


# ---- 3: no code runs from a checkpoint ---------------------------------------------------------


class _Evil:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_crafted_metadata_is_refused_and_runs_nothing(tmp_path):
    """A `.metadata` whose unpickling would create a file (its hash even recorded, as an
    attacker who can write the folder would): refused in one line, and no file appears."""
    import hashlib

    marker = tmp_path / "pwned"
    ckpt = tmp_path / "ckpt"
    step = ckpt / "step_00000002"
    step.mkdir(parents=True)
    payload = pickle.dumps(_Evil(str(marker)))
    (step / ".metadata").write_bytes(payload)
    cfg = build_config(apply_overrides(TINY, {"checkpoint.dir": str(ckpt), "checkpoint.every": 2}))
    files = {".metadata": {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}
    state = {"step": 2, "config": cfg.to_dict(), "files": files}
    (step / "trainer.json").write_text(json.dumps(state))
    (ckpt / "latest").write_text("step_00000002\n")
    r = runner.invoke(app, ckpt_cli(tmp_path, str(ckpt), "--resume", "--steps", "3"))
    one_line_error(r, str(step / ".metadata"), "refused to load io.open")
    assert not marker.exists()
    from knapformer.train.checkpoint import CheckpointError, read_metadata

    with pytest.raises(CheckpointError, match="not a DCP metadata type"):
        read_metadata(step)
    assert not marker.exists()


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_real_metadata_passes_the_restricted_unpickler(scenarios):
    from torch.distributed.checkpoint.metadata import Metadata

    from knapformer.train.checkpoint import read_metadata

    _, root = scenarios
    md = read_metadata(root / "ckpt" / "step_00000005")
    assert isinstance(md, Metadata) and any(k.startswith("optim.") for k in md.state_dict_metadata)


# ---- 4: damaged files and a full disk are one line naming the file and the reason -------------


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "damage,needles",
    [
        ("truncate_shard", ("__0_0.distcp: ", "(truncated or damaged)")),
        ("flip_shard", ("__1_0.distcp: contents differ", "SHA-256 mismatch")),
        ("flip_metadata", (".metadata: contents differ", "SHA-256 mismatch")),
        ("garbage_metadata_unrecorded", (".metadata: not DCP metadata",)),
    ],
)
def test_damaged_checkpoint_files_are_one_line(scenarios, tmp_path, damage, needles):
    _, root = scenarios
    ckpt = tmp_path / "ckpt"
    shutil.copytree(root / "ckpt", ckpt)
    step = ckpt / "step_00000005"
    if damage == "truncate_shard":
        f = step / "__0_0.distcp"
        f.write_bytes(f.read_bytes()[:-7])
    elif damage.startswith("flip"):
        f = step / ("__1_0.distcp" if damage == "flip_shard" else ".metadata")
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
    else:  # a checkpoint without recorded hashes, whose metadata is not a pickle
        tj = step / "trainer.json"
        state = json.loads(tj.read_text())
        del state["files"]
        tj.write_text(json.dumps(state))
        (step / ".metadata").write_bytes(b"\x80\x04garbage")
    r = runner.invoke(app, ckpt_cli(tmp_path, str(ckpt), "--resume", "--steps", "6"))
    one_line_error(r, str(step) + "/", *needles)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_truncated_shard_without_hashes_is_one_line_in_the_ranks(scenarios):
    res, root = scenarios
    msg = str(res["legacy_truncated"])
    assert msg.startswith("CheckpointError: --resume: ") and "\n" not in msg
    assert str(root / "legacy" / "step_00000005" / "__1_0.distcp") in msg


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_full_disk_during_save_is_one_line_and_keeps_the_previous_checkpoint(scenarios):
    res, root = scenarios
    msg = str(res["enospc"])
    want = f"CheckpointError: cannot write checkpoint {root / 'ckpt' / 'step_00000006'}: "
    assert msg == want + "No space left on device", msg
    assert res["enospc_latest"] == "step_00000005" and res["enospc_partials"] == []


# ---- 5: the ranks die with their launcher ------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"multiprocessing.spawn" in cmd and b"resource_tracker" not in cmd:
            out.append(int(d.name))
    return out


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited (its new parent may not reap it)


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_ranks_die_with_the_launcher(tmp_path, sig):
    raw = {**TINY, "train": {"steps": 100000, "lr": 1e-3}}
    cfg = write_toml(tmp_path / "t.toml", raw)
    log, tmpdir = tmp_path / "log.jsonl", tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmpdir))
    cmd = [sys.executable, "-m", "knapformer.cli", "train", "--config", str(cfg), "--nproc", "2"]
    cmd += ["--log", str(log), "--no-progress"]
    # as `knapformer train ... &` from a script starts it: SIGINT ignored, which torch's own
    # parent-death signal for spawned ranks (SIGINT) then cannot overcome
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = ranks if len(ranks) == 2 else _children(proc.pid)
            if len(ranks) == 2 and log.is_file() and log.read_text().count("\n") >= 1:
                break
            time.sleep(0.5)
        assert proc.poll() is None and len(ranks) == 2, proc.stderr.read().decode()[-2000:]
        assert list(tmpdir.glob("knapformer-rdzv-*"))
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(p) for p in ranks):
            time.sleep(0.2)
        assert not [p for p in ranks if _running(p)], "ranks outlived their launcher"
        if sig == signal.SIGTERM:
            assert not list(tmpdir.glob("knapformer-rdzv-*"))
    finally:
        for p in ranks:  # on the old code: orphans still training
            if _running(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


# ---- 6: a resumed run logs every step once -----------------------------------------------------


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_resume_truncates_the_log_to_the_checkpoint(scenarios):
    res, _ = scenarios
    assert res["log_before"] == [1, 2, 3]  # step 3 logged, its checkpoint never written
    assert res["log_after"] == [1, 2, 3, 4]


def test_truncate_log_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    from knapformer.train.loop import truncate_log

    log = tmp_path / "l.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3)) + '{"st')
    assert truncate_log(log, 2) == 2
    assert _steps(log) == [1, 2]
    assert truncate_log(tmp_path / "missing.jsonl", 2) == 0


# ---- 7: NaN, inf, zero and negative values name their key; a diverged loss stops the run ------


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("train.timeout_s", float("nan"), "config key 'train.timeout_s': must be"),
        ("train.timeout_s", 0.0, "config key 'train.timeout_s': must be"),
        ("train.lr", float("inf"), "config key 'train.lr': must be a finite number > 0"),
        ("train.lr", -1e-3, "config key 'train.lr': must be a finite number > 0"),
        ("train.threads", 0, "config key 'train.threads': must be"),
        ("train.steps", 0, "config key 'train.steps': must be"),
        ("balance.gamma", float("nan"), "config key 'balance.gamma': must be a finite number >= 0"),
        ("balance.gamma", float("-inf"), "config key 'balance.gamma'"),
        ("data.patch_px", 0, "config key 'data.patch_px': must be"),
        ("data.seed", -1, "config key 'data.seed': must be"),
        ("data.text_tokens_max", -1, "config key 'data.text_tokens_max': must be"),
        ("checkpoint.every", -2, "config key 'checkpoint.every': must be >= 0"),
        ("model.mlp_ratio", float("nan"), "model.mlp_ratio: must be"),
        ("model.mlp_ratio", 0.0, "model.mlp_ratio: must be"),
        ("model.rope_theta", float("inf"), "model.rope_theta: must be"),
        ("model.num_heads", 0, "model.num_heads: must be"),
        ("model.time_dim", 1, "model.time_dim: must be"),
        ("model.d_model", 0, "model.d_model: must be"),
    ],
)
def test_non_finite_zero_and_negative_values_name_the_key(key, value, needle):
    with pytest.raises(ConfigError) as exc:
        build_config(apply_overrides(TINY, {key: value}))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_cli_names_the_key_of_a_nan(tmp_path):
    cfg = write_toml(tmp_path / "t.toml", TINY)
    for over, needle in (
        ("train.timeout_s=nan", "'train.timeout_s'"),
        ("model.num_heads=0", "model.num_heads"),
        ("balance.gamma=nan", "'balance.gamma'"),
    ):
        r = runner.invoke(app, ["train", "--config", str(cfg), "--nproc", "2", "--set", over])
        one_line_error(r, needle)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_non_finite_loss_stops_the_run_naming_the_step(scenarios):
    res, _ = scenarios
    assert re.fullmatch(
        r"DivergedError: step \d+: the loss is (nan|inf|-inf) \(training diverged\); .*",
        str(res["diverged"]),
    ), res["diverged"]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_cli_exits_non_zero_with_one_line_on_a_diverged_run(tmp_path):
    raw = {**TINY, "train": {"steps": 4, "lr": 1e30}}
    cfg = write_toml(tmp_path / "t.toml", raw)
    cmd = [sys.executable, "-m", "knapformer.cli", "train", "--config", str(cfg), "--nproc", "2"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, err
    assert re.fullmatch(r"error: training failed: step \d+: the loss is \S+ \(training.*", lines[0])


# ---- 8: no memory bombs ------------------------------------------------------------------------


def test_huge_data_codes_are_refused_before_anything_is_built(tmp_path):
    cfg = write_toml(tmp_path / "t.toml", TINY)
    base = ["train", "--config", str(cfg), "--nproc", "1"]
    t0 = time.monotonic()
    r = runner.invoke(app, [*base, "--data-codes", "g1b100000000i64f1s0"])
    one_line_error(r, "config key 'data.codes'", "100,000,000 sequences", "65,536")
    r = runner.invoke(app, [*base, "--data-codes", "g1b1i100000000f1s0"])
    one_line_error(r, "config key 'data.codes'", "tokens per step; the limit is 4,194,304")
    r = runner.invoke(app, [*base, "--set", "data.num_sequences=1e9"])
    one_line_error(r, "unknown key(s) data.num_sequences")
    assert time.monotonic() - t0 < 20


def test_estimated_memory_beyond_the_machine_is_refused_naming_the_key(tmp_path):
    cfg = write_toml(tmp_path / "t.toml", TINY)
    base = ["train", "--config", str(cfg), "--nproc", "1"]
    r = runner.invoke(
        app, [*base, "--data-codes", "g1b512i1024f1s0", "--set", "model.preset=small"]
    )  # 2.2M tokens per rank through 24 blocks of width 1024: terabytes of activations
    one_line_error(r, "config key 'data.codes': a rank would need about", "GiB")
    r = runner.invoke(
        app,
        [*base[:-1], "2", "--set", "model.d_model=65536", "--set", "model.num_heads=1024",
         "--set", "model.axes_dim=[16, 24, 24]"],
    )  # fmt: skip
    one_line_error(r, "config section 'model': a rank would need about", "parameters")
    with pytest.raises(ConfigError, match=r"model\.d_model: must be in"):
        build_config(apply_overrides(TINY, {"model.d_model": 1 << 20}))
