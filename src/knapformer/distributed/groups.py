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

An auto-layout balancer creates the groups of every bag it may ever use at construction; steps
only look them up (:func:`cached_bag_group`), which never creates a group, so no collective group
creation can happen inside a training step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch.distributed as dist

__all__ = [
    "GroupSetupError",
    "bag_process_group",
    "cached_bag_group",
    "clear_group_cache",
    "create_bag_groups",
    "global_ranks",
    "group_cache_size",
    "local_creation_schedule",
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
                _CACHE[key] = dist.new_group(list(ranks))
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
            dist.new_group([me], use_local_synchronization=True)
        _CACHE[_key(group, granks)] = dist.new_group(list(granks), use_local_synchronization=True)
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
