"""Bag layouts: how the GPUs of a balance group are partitioned into compute bags.

Spec grammar: ``g{G}n{N}`` terms joined by ``+`` (``g1n2+g2n1+g4n1`` = two 1-GPU bags, one
2-GPU bag, one 4-GPU bag). Bags take contiguous ranks in spec order; when the world size is a
multiple of the group size the layout is repeated as independent replicas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

__all__ = ["BagLayout", "LayoutError", "format_spec", "parse_terms"]

_TERM = re.compile(r"g(\d+)n(\d+)")


class LayoutError(ValueError):
    """A bag-layout spec is malformed or incompatible with the world size / head count."""


def parse_terms(spec: str) -> tuple[tuple[int, int], ...]:
    """Parse ``g{G}n{N}+...`` into ``((G, N), ...)``; no world-size checks."""
    if not isinstance(spec, str):
        raise LayoutError(f"bag layout spec must be a string, got {type(spec).__name__}")
    text = spec.strip().lower()
    if not text:
        raise LayoutError("bag layout spec is empty (expected e.g. 'g1n2+g2n1+g4n1')")
    terms: list[tuple[int, int]] = []
    for part in text.split("+"):
        m = _TERM.fullmatch(part.strip())
        if m is None:
            raise LayoutError(
                f"bad bag layout term {part.strip()!r} in spec {spec!r}: expected 'g<G>n<N>' "
                "terms joined by '+', e.g. 'g1n2+g2n1+g4n1'"
            )
        g, n = int(m.group(1)), int(m.group(2))
        if g < 1 or n < 1:
            raise LayoutError(f"bag layout term {part.strip()!r}: G and N must be >= 1")
        terms.append((g, n))
    return tuple(terms)


def format_spec(terms: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> str:
    """Inverse of :func:`parse_terms`."""
    return "+".join(f"g{g}n{n}" for g, n in terms)


@dataclass(frozen=True)
class BagLayout:
    """GPU-to-bag assignment over the whole world (all replicas)."""

    spec: str
    world_size: int
    group_size: int
    num_replicas: int
    bag_ranks: tuple[tuple[int, ...], ...]
    bag_of_rank: tuple[int, ...]
    replica_of_bag: tuple[int, ...]

    @classmethod
    def parse(cls, spec: str, world_size: int, num_heads: int | None = None) -> BagLayout:
        """Build the layout for ``world_size`` ranks; checks ``num_heads % g == 0`` if given."""
        terms = parse_terms(spec)
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise LayoutError(f"world_size must be a positive integer, got {world_size!r}")
        group = sum(g * n for g, n in terms)
        if world_size % group != 0:
            raise LayoutError(
                f"bag layout {spec!r} covers {group} GPUs, which does not divide "
                f"world_size={world_size}"
            )
        if num_heads is not None:
            if num_heads < 1:
                raise LayoutError(f"num_heads must be >= 1, got {num_heads}")
            bad = sorted({g for g, _ in terms if num_heads % g != 0})
            if bad:
                raise LayoutError(
                    f"bag size(s) {bad} in layout {spec!r} do not divide num_heads={num_heads} "
                    "(Ulysses needs heads % g == 0)"
                )
        replicas = world_size // group
        bag_ranks: list[tuple[int, ...]] = []
        replica_of_bag: list[int] = []
        rank = 0
        for rep in range(replicas):
            for g, n in terms:
                for _ in range(n):
                    bag_ranks.append(tuple(range(rank, rank + g)))
                    replica_of_bag.append(rep)
                    rank += g
        bag_of_rank = [0] * world_size
        for b, ranks in enumerate(bag_ranks):
            for r in ranks:
                bag_of_rank[r] = b
        return cls(
            spec=format_spec(terms),
            world_size=world_size,
            group_size=group,
            num_replicas=replicas,
            bag_ranks=tuple(bag_ranks),
            bag_of_rank=tuple(bag_of_rank),
            replica_of_bag=tuple(replica_of_bag),
        )

    @cached_property
    def bag_sizes(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.bag_ranks)

    @property
    def num_bags(self) -> int:
        return len(self.bag_ranks)

    @property
    def bags_per_replica(self) -> int:
        return self.num_bags // self.num_replicas

    def replica_of_rank(self, rank: int) -> int:
        return rank // self.group_size

    def replica_bags(self, replica: int) -> range:
        """Global bag indices of one replica (contiguous)."""
        k = self.bags_per_replica
        return range(replica * k, (replica + 1) * k)

    def replica_ranks(self, replica: int) -> range:
        return range(replica * self.group_size, (replica + 1) * self.group_size)
