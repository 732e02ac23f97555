"""Multi-process test harness: real gloo processes, file:// rendezvous, guaranteed cleanup.

``run_workers(__file__, "worker_fn", world_size, tmp_path, args=...)`` runs ``world_size`` ranks
(this file run as a script, see :func:`run_workers`). Each initialises gloo with a collective
timeout and calls ``worker_fn(rank, world_size, *args)``, loaded from the given file by path; its
return value (or the exception and traceback) comes back as a pickle. The parent
kills every process it started if the deadline passes, so a hang fails the test instead of the
suite. Worker return values must be plain picklable data (numbers, lists, dicts, str).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

# The tiny trainer config the training tests start from (apply_overrides copies it).
TINY_TRAIN = {
    "model": {"preset": "tiny"},
    "data": {"codes": "g1b2i64f1s0,g1b1i64f17s1", "text_tokens_max": 4},
    "train": {"steps": 3, "lr": 3e-3},
    "balance": {"balancer": "auto"},
    "log": {"progress": False},
}


class WorkerError(AssertionError):
    """A worker raised; carries the rank and the remote traceback."""


def run_workers(
    worker_file: str,
    func_name: str,
    world_size: int,
    tmp_path: Path,
    args: tuple[Any, ...] = (),
    timeout: float = 120.0,
    collective_timeout: float = 30.0,
    may_die: tuple[int, ...] = (),
) -> list[Any]:
    """Run ``func_name`` from ``worker_file`` on ``world_size`` gloo ranks; per-rank results.

    One launcher process imports torch and the worker module once, then forks the ranks (before
    any torch op or thread runs), which keeps an 8-rank start cheap on a 2-core machine. The
    launcher leads its own session, so a timeout kills it and every rank it forked.
    Ranks in ``may_die`` (a fault-injection test kills them) may leave no result: None.
    """
    run_dir = Path(tmp_path) / f"run_{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    (run_dir / "args.pkl").write_bytes(pickle.dumps(args))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        __file__,
        str(Path(worker_file).resolve()),
        func_name,
        str(world_size),
        str(run_dir),
        str(collective_timeout),
    ]
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{func_name} on {world_size} ranks did not finish in {timeout:.0f}s "
                f"(a hang?)\n{_tail(run_dir)}"
            ) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher's own session: our processes
                proc.wait()
    results = []
    for rank in range(world_size):
        out = run_dir / f"result_{rank}.pkl"
        if not out.exists() and rank in may_die:
            results.append(None)
            continue
        if not out.exists():
            raise WorkerError(f"rank {rank} produced no result\n{_tail(run_dir)}")
        status, payload = pickle.loads(out.read_bytes())
        if status != "ok":
            raise WorkerError(f"rank {rank} raised:\n{payload}")
        results.append(payload)
    return results


def _tail(run_dir: Path, n: int = 6000) -> str:
    f = run_dir / "log.txt"
    text = f.read_text(errors="replace") if f.exists() else ""
    return f"--- log (all ranks) ---\n{text[-n:]}"


def _launch(argv: list[str]) -> None:
    """Launcher: import once, fork one process per rank, wait for all of them."""
    import importlib.util

    # Imported before forking so that every rank shares the already-loaded modules.
    import torch.distributed  # noqa: F401

    worker_file, func_name, world_s, run_dir_s, ctimeout = argv
    spec = importlib.util.spec_from_file_location("_kf_worker", worker_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, func_name)
    pids = []
    for rank in range(int(world_s)):
        pid = os.fork()
        if pid == 0:
            _rank_main(fn, rank, int(world_s), Path(run_dir_s), float(ctimeout))
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)


def _rank_main(fn: Any, rank: int, world_size: int, run_dir: Path, ctimeout: float) -> None:
    import datetime
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    result: tuple[str, Any]
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{run_dir / 'rendezvous'}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=ctimeout),
        )
        args = pickle.loads((run_dir / "args.pkl").read_bytes())
        result = ("ok", fn(rank, world_size, *args))
    except BaseException:
        result = ("err", traceback.format_exc())
    tmp = run_dir / f"result_{rank}.pkl.tmp"
    tmp.write_bytes(pickle.dumps(result))
    os.replace(tmp, run_dir / f"result_{rank}.pkl")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a peer that failed mid-collective must not block our exit.
    os._exit(0)


if __name__ == "__main__":
    _launch(sys.argv[1:])
