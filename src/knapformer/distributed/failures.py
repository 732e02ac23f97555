"""Collective failures become one agreed kind of error that names the rank at fault.

When a rank fails outside the balancer (an exception in the model, a data error) and stays
alive, or is killed, its peers meet the failure inside a collective: gloo raises a
``RuntimeError`` such as "Timed out waiting 20000ms for recv operation to complete" (after the
group's timeout) or "Connection closed by peer" (at once), which names no rank. `collective`
turns that into a :class:`BalancerError` naming the ranks that did not report the same failure:
every survivor writes a key into the process group's store and waits for the others' keys;
whoever is missing failed, stopped or was killed. Survivors still blocked in the collective
report when their own timeout fires, so the wait lasts until the collective's start + the
timeout + :data:`SKEW_S` (for ranks that entered it later), at least 0.5 s and at most
:data:`REPORT_WAIT_S`: every survivor ends within the timeout + 3 s, and a killed peer is
reported within :data:`REPORT_WAIT_S` however long the timeout (naming, then, also the
survivors that have not timed out yet).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch.distributed as dist

from appshell.errors import first_line
from knapformer.distributed.groups import group_timeout

__all__ = ["REPORT_WAIT_S", "SKEW_S", "BalancerError", "collective", "collective_failure"]

REPORT_WAIT_S = 5.0  # longest wait for the other survivors' reports
SKEW_S = 2.5  # how much later than this rank another survivor may have entered the collective
_events: dict[tuple[int, ...], int] = {}  # failures seen per set of ranks (store key suffix)


class BalancerError(ValueError):
    """Bad input to the balancer, or a peer that failed; the same kind of error on every rank."""


def _ranks_of(group: dist.ProcessGroup | None) -> list[int]:
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return [int(r) for r in dist.get_process_group_ranks(group)]


def _fmt_ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _unreported(ranks: list[int], me: int, deadline: float) -> tuple[list[int] | None, str | None]:
    """The ranks of ``ranks`` whose report has not arrived by ``deadline`` (None: unknown)."""
    key = "knapformer/collective-failure/" + "-".join(map(str, ranks))
    n = _events.get(tuple(ranks), 0)
    _events[tuple(ranks)] = n + 1
    keys = {r: f"{key}/{n}/{r}" for r in ranks}
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(keys[me], "1")
        others = [keys[r] for r in ranks if r != me]
        while not (not others or store.check(others)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [r for r in ranks if r != me and not store.check([keys[r]])], None
    except Exception as exc:  # the store itself is gone (e.g. its host rank was killed)
        return None, first_line(exc)


def collective_failure(
    op: str, group: dist.ProcessGroup | None, exc: BaseException, started: float
) -> BalancerError:
    """The BalancerError for a collective of ``op`` over ``group`` that raised ``exc``."""
    ranks = _ranks_of(group)
    me = dist.get_rank()
    timeout = group_timeout(group)
    now = time.monotonic()
    wait = REPORT_WAIT_S
    if timeout is not None:  # survivors blocked here report by their start + the timeout
        wait = min(wait, max(0.5, started + timeout.total_seconds() + SKEW_S - now))
    missing, why = _unreported(ranks, me, now + wait)
    where = (
        f"{op}: the collective over ranks {_fmt_ranks(ranks)} failed on rank {me} after "
        f"{now - started:.1f} s"
        + (f" (timeout {timeout.total_seconds():g} s)" if timeout is not None else "")
    )
    if missing is None:
        who = f"which peer failed is unknown (the store cannot be reached: {why})"
    elif missing:
        who = (
            f"no report of this failure from rank{'s' if len(missing) > 1 else ''} "
            f"{_fmt_ranks(missing)} within {wait:.1f} s: failed, stopped or killed (or still "
            "waiting in this collective)"
        )
    else:
        who = "every peer reported the same failure"
    return BalancerError(f"{where}: {who} [{first_line(exc)}]")


@contextlib.contextmanager
def collective(op: str, group: dist.ProcessGroup | None) -> Iterator[None]:
    """Run one collective call of ``op``; its failure becomes :func:`collective_failure`.

    Wrap only the ``torch.distributed`` call itself: every ``RuntimeError`` inside is taken
    for a failed collective.
    """
    started = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        raise collective_failure(op, group, exc, started) from exc
