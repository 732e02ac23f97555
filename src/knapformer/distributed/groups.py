"""Process groups for the multi-GPU bags of a layout, created once and cached.

``dist.new_group`` is collective over the default group, so for a balancer over the WORLD every
rank creates the groups of *all* bags, in one sorted order, even those it is not part of. That
cache is keyed by the global rank tuple (and the default group), so layouts that share a bag
share a group and every rank skips the same creations. Balancers over a sub-group (only its
members construct them) create their bags' groups with local synchronisation; those live in a
separate cache so that they can never make the WORLD cache differ between ranks (which would
desynchronise the collective ``new_group`` calls).

Locally synchronised groups have a catch: torch names such a group by its ranks *and by how many
groups the calling process already belongs to*, so two members that have joined different
numbers of groups compute different names and wait for each other forever. Sub-group creation
therefore agrees on a schedule first (one ``all_gather_object`` over the balance group) and pads
the members that are behind with single-rank groups before each bag group.

An auto-layout balancer creates the groups of a layout's bags when that layout is first chosen:
every rank takes the same decision at the same step, so the creation is collective there (and
the number of groups stays the number of distinct bags actually used, not every bag that might
be). Otherwise steps only look groups up (:func:`cached_bag_group`), which never creates one.

Every bag group gets the timeout of the group it balances over (:func:`group_timeout`), so a
peer that fails inside a bag makes the others fail within that timeout, not torch's 30-minute
default.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

__all__ = [
    "GroupSetupError",
    "bag_process_group",
    "cached_bag_group",
    "clear_group_cache",
    "control_device",
    "create_bag_groups",
    "global_ranks",
    "group_cache_size",
    "group_timeout",
    "has_cpu_backend",
    "local_creation_schedule",
    "ranks_per_node",
    "resolve_group",
]

_CACHE: dict[tuple[str, int, tuple[int, ...]], dist.ProcessGroup] = {}


class GroupSetupError(ValueError):
    """The members of a bag do not agree on which groups to create (raised on every rank)."""


def clear_group_cache() -> None:
    """Forget cached groups (call after ``destroy_process_group`` if the process re-initialises)."""
    _CACHE.clear()


def group_cache_size() -> int:
    """Number of bag groups created so far by this process (for logging and tests)."""
    return len(_CACHE)


def group_timeout(group: dist.ProcessGroup | None = None) -> datetime.timedelta | None:
    """The collective timeout ``group`` was created with (None if torch does not say)."""
    pg = dist.distributed_c10d._get_default_group() if _is_world(group) else group
    for dev in getattr(pg, "_device_types", ()):
        try:
            timeout = pg._get_backend(dev).options._timeout
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, datetime.timedelta):
            return timeout
    return None


def has_cpu_backend(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` can run collectives on CPU tensors (gloo, ``"cpu:gloo,cuda:nccl"``)."""
    pg = dist.distributed_c10d._get_default_group() if _is_world(group) else group
    return torch.device("cpu") in getattr(pg, "_device_types", ())


def control_device(group: dist.ProcessGroup | None, fallback: torch.device) -> torch.device:
    """Where small agreement tensors go: the CPU when ``group`` has a CPU backend, so agreeing
    on a check never waits for the device; otherwise ``fallback``."""
    return torch.device("cpu") if has_cpu_backend(group) else fallback


def _is_world(group: dist.ProcessGroup | None) -> bool:
    return group is None or group is dist.group.WORLD


def _key(
    group: dist.ProcessGroup | None, granks: tuple[int, ...]
) -> tuple[str, int, tuple[int, ...]]:
    key_root = id(dist.distributed_c10d._get_default_group())
    return ("world" if _is_world(group) else "local", key_root, granks)


def _joined_groups() -> int:
    """How many groups this process belongs to: what torch puts in a local group's name."""
    return len(getattr(dist.distributed_c10d._world, "pg_names", ()))


def global_ranks(group: dist.ProcessGroup | None, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Map ranks of ``group`` (layout ranks) to global ranks."""
    if _is_world(group):
        return tuple(int(r) for r in ranks)
    return tuple(int(dist.get_global_rank(group, r)) for r in ranks)


def bag_process_group(
    bag_ranks: tuple[tuple[int, ...], ...], my_bag: int, group: dist.ProcessGroup | None = None
) -> dist.ProcessGroup | None:
    """The group of bag ``my_bag`` (None for a 1-GPU bag); creates the bag groups collectively.

    Over the WORLD every rank creates the groups of every multi-GPU bag; over a sub-group each
    rank creates only its own bag's group (see :func:`create_bag_groups`).
    """
    mine = bag_ranks[my_bag]
    create_bag_groups(bag_ranks if _is_world(group) else [mine], group)
    return cached_bag_group(mine, group)


def create_bag_groups(bags: Iterable[Sequence[int]], group: dist.ProcessGroup | None = None) -> int:
    """Create (once) the groups of the multi-GPU ``bags`` (ranks of ``group``); returns how many.

    Collective over ``group``. Over the WORLD every rank must pass the same bags; they are
    created in sorted order. Over a sub-group each rank may pass only the bags it belongs to
    (the others are ignored), and the creation schedule is agreed first.
    """
    wanted = sorted({tuple(int(r) for r in b) for b in bags if len(b) > 1})
    if _is_world(group):
        created = 0
        for ranks in wanted:
            key = _key(group, ranks)
            if key not in _CACHE:
                _CACHE[key] = dist.new_group(list(ranks), timeout=group_timeout(group))
                created += 1
        return created
    me = dist.get_rank()
    pending = []
    for ranks in wanted:
        granks = global_ranks(group, ranks)
        if me in granks and _key(group, granks) not in _CACHE:
            pending.append(granks)
    gathered: list[tuple[int, list[tuple[int, ...]]]] = [None] * dist.get_world_size(group)  # type: ignore[list-item]
    dist.all_gather_object(gathered, (_joined_groups(), pending), group=group)
    members = [dist.get_global_rank(group, r) for r in range(len(gathered))]
    schedule = local_creation_schedule(
        {m: c for m, (c, _) in zip(members, gathered, strict=True)},
        {m: p for m, (_, p) in zip(members, gathered, strict=True)},
    )
    for pad, granks in schedule.get(me, []):
        for _ in range(pad):  # single-rank groups: only to keep torch's group names in step
            dist.new_group([me], timeout=group_timeout(group), use_local_synchronization=True)
        _CACHE[_key(group, granks)] = dist.new_group(
            list(granks), timeout=group_timeout(group), use_local_synchronization=True
        )
    return len(pending)


def local_creation_schedule(
    joined: dict[int, int], pending: dict[int, Sequence[tuple[int, ...]]]
) -> dict[int, list[tuple[int, tuple[int, ...]]]]:
    """Per rank: ``(padding groups, bag)`` to create, in one global order (pure).

    Every rank walks the bags in sorted order, so no cycle of ranks can wait for each other;
    before each bag the members that have joined fewer groups are padded up to the most.
    """
    todo = sorted({tuple(b) for p in pending.values() for b in p})
    count = dict(joined)
    out: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for bag in todo:
        absent = [m for m in bag if m not in count]
        if absent:
            raise GroupSetupError(f"bag {bag} has ranks {absent} outside the balance group")
        lagging = [m for m in bag if bag not in set(map(tuple, pending[m]))]
        if lagging:
            raise GroupSetupError(
                f"ranks {lagging} of bag {bag} already hold its process group and the others "
                "do not; construct balancers over the same groups in the same order on every rank"
            )
        target = max(count[m] for m in bag)
        for m in bag:
            out.setdefault(m, []).append((target - count[m], bag))
            count[m] = target + 1
    return out


def cached_bag_group(
    ranks: Sequence[int], group: dist.ProcessGroup | None = None
) -> dist.ProcessGroup | None:
    """The already created group of a bag (None for a 1-GPU bag); never creates one."""
    if len(ranks) < 2:
        return None
    key = _key(group, global_ranks(group, tuple(ranks)))
    if key not in _CACHE:
        raise LookupError(
            f"no process group was created for bag ranks {tuple(ranks)}; groups are created "
            "only at balancer construction"
        )
    return _CACHE[key]


def resolve_group(group: object) -> dist.ProcessGroup | None:
    """A process group from what users hold: None (WORLD), a ProcessGroup, a 1-D DeviceMesh,
    or ``(mesh, dim)`` / a named 1-D slice ``mesh["dp"]`` of a larger mesh."""
    from torch.distributed.device_mesh import DeviceMesh

    if group is None or isinstance(group, dist.ProcessGroup):
        return group
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
        mesh, dim = group
        try:
            return mesh.get_group(dim)
        except (KeyError, ValueError, RuntimeError, IndexError) as exc:
            raise GroupSetupError(f"device mesh has no dimension {dim!r}: {exc}") from None
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise GroupSetupError(
                f"a {group.ndim}-D DeviceMesh names no single process group; pass a 1-D slice "
                "(mesh['dp']) or (mesh, 'dim_name')"
            )
        return group.get_group()
    raise GroupSetupError(
        f"group must be a ProcessGroup, a 1-D DeviceMesh or (mesh, dim), got {type(group).__name__}"
    )


def ranks_per_node(group: dist.ProcessGroup | None = None) -> int:
    """Ranks per host in ``group``, from the gathered host names (collective over ``group``).

    Used when neither ``gpus_per_node`` nor ``$LOCAL_WORLD_SIZE`` is given (``mp.spawn``):
    hosts must hold equal, contiguous blocks of ranks, as every launcher lays them out.
    """
    import socket

    names: list[str] = [""] * dist.get_world_size(group)
    dist.all_gather_object(names, socket.gethostname(), group=group)
    blocks: list[tuple[str, int]] = []
    for n in names:
        if blocks and blocks[-1][0] == n:
            blocks[-1] = (n, blocks[-1][1] + 1)
        else:
            blocks.append((n, 1))
    sizes = {s for _, s in blocks}
    if len(sizes) != 1 or len({n for n, _ in blocks}) != len(blocks):
        raise GroupSetupError(
            f"ranks are not laid out in equal contiguous blocks per host ({blocks}); pass "
            "gpus_per_node explicitly"
        )
    return sizes.pop()
