"""Run-time bag-layout schedule for ``Balancer("auto", ...)``: pure, no communication.

Every rank holds one :class:`AutoLayout` and feeds it the same gathered lengths, so every rank
makes the same decision without a broadcast (the balancer checks agreement cheaply). The
schedule decides on the first step and then every ``window`` steps, keeping the current layout
unless the chooser's winner is better by more than ``hysteresis``. Process groups are created
lazily, for the bags of the layouts actually chosen (every rank decides the same at the same
step, so the balancer creates them collectively then); :attr:`AutoLayout.used_bags` counts them
without any process, and :attr:`AutoLayout.bags` is every bag a decision may use (the eager
alternative's count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from knapformer.planning.auto import allowed_bag_sizes, choose_layout, spans_nodes
from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout, LayoutError

__all__ = ["AutoLayout", "node_local_bags"]


def node_local_bags(
    world_size: int, sizes: Sequence[int], gpus_per_node: int
) -> list[tuple[int, ...]]:
    """Every contiguous rank window of a size in ``sizes`` (> 1) that stays inside one node.

    Any layout whose bags have allowed sizes and do not cross a node uses only these bags,
    whatever offsets the chooser gives them.
    """
    bags = []
    for g in sorted(set(sizes)):
        if g < 2:
            continue
        for start in range(world_size - g + 1):
            if start // gpus_per_node == (start + g - 1) // gpus_per_node:
                bags.append(tuple(range(start, start + g)))
    return bags


@dataclass
class AutoLayout:
    """Which layout each step uses; ``current``/``step`` are the state to checkpoint."""

    world_size: int
    num_heads: int
    gpus_per_node: int
    cost: CostModel
    hysteresis: float = 0.02
    window: int = 1
    candidates: tuple[str, ...] | None = None
    current: str | None = None
    step: int = 0
    # derived in __post_init__: allowed bag sizes and every multi-GPU bag a decision may use
    sizes: tuple[int, ...] = field(init=False, default=())
    bags: tuple[tuple[int, ...], ...] = field(init=False, default=())
    # multi-GPU bags of every layout chosen so far: the process groups the balancer creates
    used_bags: set[tuple[int, ...]] = field(init=False, default_factory=set, repr=False)
    _layouts: dict[str, BagLayout] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("world_size", "num_heads", "gpus_per_node", "window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LayoutError(f"auto layout: {name} must be a positive integer, got {v!r}")
        if self.world_size > self.gpus_per_node and self.world_size % self.gpus_per_node:
            raise LayoutError(
                f"auto layout: world_size={self.world_size} is not a whole number of nodes of "
                f"gpus_per_node={self.gpus_per_node}"
            )
        h = self.hysteresis
        if not isinstance(h, (int, float)) or isinstance(h, bool) or not 0 <= h <= 1:
            raise LayoutError(f"auto layout: hysteresis must be in [0, 1], got {h!r}")
        self.hysteresis = float(h)
        if not isinstance(self.cost, CostModel):
            raise LayoutError(f"cost must be a CostModel, got {type(self.cost).__name__}")
        if self.candidates is not None:
            if isinstance(self.candidates, str) or not self.candidates:
                raise LayoutError("auto layout: candidates must be a non-empty list of specs")
            self.candidates = tuple(self.layout(s).spec for s in self.candidates)
        self.sizes = tuple(allowed_bag_sizes(self.world_size, self.num_heads, self.gpus_per_node))
        if self.candidates is None:
            bags = node_local_bags(self.world_size, self.sizes, self.gpus_per_node)
        else:
            bags = sorted({b for s in self.candidates for b in self.layout(s).bag_ranks})
        self.bags = tuple(b for b in bags if len(b) > 1)
        if self.current is not None:
            self.current = self._use(self.current)

    def layout(self, spec: str) -> BagLayout:
        """Parse (cached) and check that ``spec`` is one this schedule may use."""
        lay = self._layouts.get(spec)
        if lay is not None:
            return lay
        lay = BagLayout.parse(spec, self.world_size, self.num_heads)
        if lay.num_replicas != 1:
            raise LayoutError(f"auto layout: {spec!r} must cover all {self.world_size} ranks")
        if spans_nodes(lay, self.gpus_per_node):
            raise LayoutError(
                f"auto layout: {spec!r} has a bag spanning two nodes "
                f"(gpus_per_node={self.gpus_per_node})"
            )
        self._layouts[lay.spec] = lay
        self._layouts[spec] = lay
        return lay

    def decide(self, lengths: Sequence[Sequence[int]]) -> tuple[BagLayout, bool]:
        """Layout for this step (from the gathered lengths) and whether it changed."""
        previous = self.current
        if previous is None or self.step % self.window == 0:
            spec = choose_layout(
                lengths,
                self.world_size,
                self.num_heads,
                self.gpus_per_node,
                self.cost,
                candidates=self.candidates,
                current=previous,
                hysteresis=self.hysteresis,
            )
            self.current = self._use(spec)
        self.step += 1
        assert self.current is not None
        return self.layout(self.current), self.current != previous

    def _use(self, spec: str) -> str:
        """Checked spec of a layout about to be used; records its bags (groups to create)."""
        lay = self.layout(spec)
        multi = [b for b in lay.bag_ranks if len(b) > 1]
        if self.candidates is not None:
            allowed = set(self.bags)
            outside = [b for b in multi if b not in allowed]
            if outside:
                raise LayoutError(
                    f"auto layout: {spec!r} uses bag ranks {outside[0]}, which none of the "
                    "candidate layouts has"
                )
        self.used_bags.update(multi)
        return lay.spec

    @property
    def num_groups(self) -> int:
        """Process groups the chosen layouts need so far (created lazily by the balancer)."""
        return len(self.used_bags)

    def state_dict(self) -> dict[str, Any]:
        return {"layout": self.current, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        spec, step = state.get("layout"), state.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise LayoutError(f"auto layout state: step must be an integer >= 0, got {step!r}")
        self.current = None if spec is None else self._use(spec)
        self.step = step
