"""The thin torch.distributed shell: gather lengths, plan, route tokens, Ulysses attention hooks.

Per step::

    plan = balancer.plan_step(local_lengths)   # 1 small all_gather (2 when it widens) + planner
    x, pos = balancer.route(x, pos)            # 1 all_to_all_single (integer features ride)
    ... blocks; attention via balancer.attention(q, k, v) (pre_attn -> varlen -> post_attn)
    y = balancer.reverse_route(y)              # inverse all_to_all_single

With ``Balancer("auto", cost, num_heads=H, gpus_per_node=P)`` the bag layout itself is chosen
at run time (every step, or every ``window`` steps, with hysteresis) from the gathered lengths by
the pure chooser of :mod:`knapformer.planning.auto`. Every rank decides alone from the same data;
the process groups of a layout's bags are created when it is first chosen (collectively: every
rank switches at the same step). With several replicas, each rank plans only its own.

Every collective is autograd-aware (backward of ``route`` is ``reverse_route``, backward of
``pre_attn`` is ``post_attn``), so the loss is computed in the original layout. Input checks that
could make ranks diverge are agreed collectively (one tiny all_gather before the data moves), so a
bad input raises the same :class:`BalancerError` on every rank instead of hanging one of them.
A peer that fails elsewhere and stays alive, or is killed, makes every collective waiting for it
raise a :class:`BalancerError` naming it, within the group's timeout
(:mod:`knapformer.distributed.failures`).
That same all_gather carries a fingerprint of this rank's plan (layout and bag of every
sequence), so ranks whose deterministic planners nevertheless disagree (diverged state, a
time-limited solver) get a clear error before any token moves.
"""

from __future__ import annotations

import functools
import inspect
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from knapformer.attention.varlen import varlen_attention
from knapformer.distributed.autolayout import AutoLayout
from knapformer.distributed.collectives import all_to_all, gather_rows
from knapformer.distributed.failures import BalancerError, collective
from knapformer.distributed.groups import (
    GroupSetupError,
    bag_process_group,
    cached_bag_group,
    control_device,
    create_bag_groups,
    group_cache_size,
    has_cpu_backend,
    ranks_per_node,
    resolve_group,
)
from knapformer.models.host import upload_table
from knapformer.planning.auto import spans_nodes
from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout, LayoutError
from knapformer.planning.plan import Plan, plan_step
from knapformer.planning.routing import RoutingTables, offset_tables, routing_from_plan
from knapformer.planning.solvers.registry import DEFAULT_SOLVER, canonical_solver

__all__ = ["AttnInputs", "Balancer", "BalancerError", "upload_table"]


@dataclass(frozen=True)
class AttnInputs:
    """Whole sequences with ``heads / g`` heads, ready for :func:`varlen_attention`."""

    q: torch.Tensor  # [N, H/g, D]
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens: torch.Tensor  # [n + 1] int32
    max_seqlen: int


# ---- head-group reshapes (module level so tests can break them on purpose) ------------------


def _split_head_groups(x: torch.Tensor, g: int) -> torch.Tensor:
    """``[T, *mid, H, D] -> [g * T, *mid, H/g, D]``: block j = head group j, for peer j."""
    T, H, D = x.shape[0], x.shape[-2], x.shape[-1]
    mid = tuple(x.shape[1:-2])
    y = x.reshape(T, *mid, g, H // g, D).movedim(-3, 0)
    return y.reshape(g * T, *mid, H // g, D)


def _qkv_head_groups(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: int) -> torch.Tensor:
    """``3 x [T, H, D] -> [g * T, 3, H/g, D]`` in one strided copy per input: what
    ``_split_head_groups(torch.stack((q, k, v), 1), g)`` gives, without the stacked copy."""
    T, H, D = q.shape
    buf = q.new_empty(g, T, 3, H // g, D)
    for i, x in enumerate((q, k, v)):
        buf[:, :, i] = x.reshape(T, g, H // g, D).movedim(1, 0)
    return buf.view(g * T, 3, H // g, D)


def _rides_in(f: torch.Tensor, carrier: torch.dtype) -> bool:
    """Whether the integer rows ``f`` ``[R, w]`` travel as ``carrier`` elements: a float
    carrier, whole elements per row, and nothing to differentiate."""
    size = torch.empty((), dtype=carrier).element_size()
    return (
        carrier.is_floating_point
        and f.dtype != carrier
        and not (f.is_floating_point() or f.is_complex() or f.dtype == torch.bool)
        and not f.requires_grad
        and (f.shape[1] * f.element_size()) % size == 0
    )


def _merge_head_groups(y: torch.Tensor, g: int) -> torch.Tensor:
    """``[g * T, H/g, D]`` (block j = head group j from peer j) ``-> [T, H, D]``."""
    Hg, D = y.shape[-2], y.shape[-1]
    T = y.shape[0] // g
    return y.reshape(g, T, Hg, D).movedim(0, 1).reshape(T, g * Hg, D)


# ---- error agreement -------------------------------------------------------------------------

_ERR_MESSAGES = {
    1: "lengths must be integers (token counts)",
    2: "lengths must be a flat (1-D) list",
    3: "sequence #{a} has length {b}; every length must be >= 1",
    10: "{op}: tokens have {a} rows but this rank's layout has {b} tokens",
    11: "{op}: features[{a}] has first dimension {b}, tokens have {c}",
    12: "{op}: argument #{a} is on a different device than the tokens",
    13: "{op}: argument #{a} is not a torch.Tensor",
    14: "{op}: tokens must have at least one dimension",
    15: "{op}: {a} sequences given, this rank's plan has {b}; call balancer.plan_step("
    "batch.seq_lens) with this batch before the forward",
    20: "{op}: tensor #{a} must be 3-D [tokens, heads, head_dim], got {b} dimensions",
    21: "{op}: tensor #{a} has {b} rows but this rank holds {c} balanced tokens",
    22: "{op}: {a} heads are not divisible by the bag size {b}",
    23: "{op}: expected {c} whole-sequence rows [N, H/g, D], got {b}",
}


def _describe(code: int, a: int, b: int, c: int, op: str) -> str:
    return _ERR_MESSAGES[code].format(a=a, b=b, c=c, op=op)


def _gather_rows(t: torch.Tensor, n: int, group: dist.ProcessGroup | None, op: str) -> torch.Tensor:
    """``[n, *t.shape]``: every rank's ``t`` (one gather into one tensor)."""
    shape = t.shape
    t = t.contiguous().view(-1)
    out = t.new_empty(n * t.numel())  # (rows concatenated along dim 0, as gloo wants)
    with collective(op, group):
        gather_rows(out, t, group)
    return out.view(n, *shape)


@functools.lru_cache(maxsize=64)
def _takes_host_offsets(fn: Callable[..., Any]) -> bool:
    """Whether an attention callable accepts ``cu_seqlens_host=`` (the plan's host offsets,
    so that it need not copy ``cu_seqlens`` back from the device)."""
    try:
        return "cu_seqlens_host" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Balancer:
    """KnapFormer balancer over a process group (default: the WORLD).

    Args:
        layout: bag spec such as ``"g1n2+g2n1+g4n1"`` (or a :class:`BagLayout`); the group size
            must divide the world size (the extra factor = independent replicas). ``"auto"``:
            chosen at run time from the lengths (needs ``num_heads`` and ``gpus_per_node``).
        cost: the workload model used by the planner (and by the auto-layout chooser).
        num_heads: attention heads of the model; every bag size must divide it (Ulysses).
        solver: planner name (``"local-search"``, alias ``"ours"``, or ``"reference"``);
            ``solver_options`` go to it.
        group: process group to balance over; its ranks are the layout's ranks. A 1-D
            DeviceMesh (e.g. ``mesh["dp"]``) or ``(mesh, "dim")`` names the same group.
        device: device of the small control tensors (default: current CUDA device under NCCL,
            else CPU). Data tensors stay on whatever device they come in on.
        gpus_per_node: ranks per node (of ``group``, whose ranks must be node-aligned); no bag may
            cross a node. Auto default: ``$LOCAL_WORLD_SIZE`` (set by torchrun), else the
            ranks per host found from the gathered host names (``mp.spawn``). With a fixed
            layout it is optional and only checked.
        hysteresis: auto only: keep the current layout unless the chooser's winner has a lower
            modelled makespan by more than this fraction (default 0.02).
        window: auto only: decide on the first step and then every ``window`` steps (default 1).
        candidates: auto only: restrict the choice to these specs; default: any layout with
            allowed bag sizes. Groups are created for the bags of the layouts chosen
            (:attr:`process_groups_created` counts them).

    Construction is collective: every rank of ``group`` must build the balancer with the same
    arguments (checked: a mismatch raises on every rank).

    After each :meth:`plan_step`, :attr:`layout_spec` is the layout in use and
    :attr:`layout_changed` says whether it differs from the previous step's (True on the first
    auto step).
    """

    def __init__(
        self,
        layout: str | BagLayout,
        cost: CostModel,
        *,
        num_heads: int | None = None,
        solver: str = DEFAULT_SOLVER,
        group: Any = None,
        device: torch.device | str | None = None,
        gpus_per_node: int | None = None,
        hysteresis: float | None = None,
        window: int | None = None,
        candidates: Sequence[str] | None = None,
        **solver_options: Any,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise BalancerError("torch.distributed is not initialised (call init_process_group)")
        try:  # a ProcessGroup, a 1-D DeviceMesh or (mesh, dim) all name a group
            group = resolve_group(group)
        except GroupSetupError as exc:
            raise BalancerError(str(exc)) from None
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = torch.device(device) if device is not None else self._default_device()
        spec = layout.spec if isinstance(layout, BagLayout) else layout
        self.num_heads = num_heads
        self.cost = cost
        self.solver = solver
        self.solver_options = dict(solver_options)
        auto = isinstance(spec, str) and spec.strip().lower() == "auto"
        host_error = None
        if auto and gpus_per_node is None:
            # Collective on every rank alike: mp.spawn sets no $LOCAL_WORLD_SIZE, so the hosts'
            # rank blocks (gathered host names) tell how many ranks share a node.
            try:
                per_host = ranks_per_node(group)
            except GroupSetupError as exc:
                per_host, host_error = None, str(exc)
            env = os.environ.get("LOCAL_WORLD_SIZE", "")
            gpus_per_node = int(env) if env.isdigit() else per_host
        self.gpus_per_node = gpus_per_node

        error = None
        parsed: BagLayout | None = None
        self._auto: AutoLayout | None = None
        try:
            if auto and gpus_per_node is None and host_error is not None:
                raise LayoutError(f"layout 'auto' needs gpus_per_node: {host_error}")
            if auto:
                self._auto = self._make_auto(cost, gpus_per_node, hysteresis, window, candidates)
            else:
                parsed = self._parse_fixed(spec, gpus_per_node, hysteresis, window, candidates)
        except LayoutError as exc:
            error = str(exc)
        config = {
            "spec": str(spec),
            "num_heads": num_heads,
            "cost": cost.values() if isinstance(cost, CostModel) else repr(cost),
            "solver": canonical_solver(solver) if isinstance(solver, str) else repr(solver),
            "solver_options": repr(sorted(self.solver_options.items())),
            "world_size": self.world_size,
            "gpus_per_node": gpus_per_node,
            "hysteresis": hysteresis,
            "window": window,
            "candidates": None if candidates is None else repr(list(candidates)),
        }
        if not isinstance(cost, CostModel):
            error = error or f"cost must be a CostModel, got {type(cost).__name__}"
        gathered: list[Any] = [None] * self.world_size
        with collective("Balancer()", group):
            dist.all_gather_object(gathered, (config, error), group=group)
        errors = [(r, e) for r, (_, e) in enumerate(gathered) if e is not None]
        if errors:
            r, e = errors[0]
            raise BalancerError(f"invalid balancer configuration on rank {r}: {e}")
        for key in config:
            values = [c[key] for c, _ in gathered]
            if any(v != values[0] for v in values):
                per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
                raise BalancerError(f"ranks disagree on the balancer's {key}: {per_rank}")
        self.plan: Plan | None = None
        self.tables: RoutingTables | None = None
        self._plan_sig = 0
        self._lengths_width = 0  # the most sequences any rank had in a step (plan_step)
        self._index_cache: dict[tuple[str, torch.device], torch.Tensor] = {}
        self._cache_owner: RoutingTables | None = None
        self.step = 0
        self.layout_changed = False
        # Layout-dependent state; in auto mode set by the first plan_step.
        self.layout: BagLayout | None = None
        self.bag: int | None = None
        self.bag_ranks: tuple[int, ...] = ()
        self.bag_size = 0
        self.bag_group: dist.ProcessGroup | None = None
        # Checks agreed across ranks travel as CPU tensors when the group has a CPU backend
        # (gloo; "cpu:gloo,cuda:nccl"), so they never wait for the device.
        self._ctrl_device = control_device(group, self.device)
        self._seq_offset = 0
        self._step_src = np.zeros(0, dtype=np.int64)
        self._replica_layout: BagLayout | None = None
        self.process_groups_created = 0  # bag groups this balancer created (logging, tests)
        try:
            if self._auto is None:
                assert parsed is not None
                bag = parsed.bag_of_rank[self.rank]
                before = group_cache_size()
                self._set_layout(parsed, bag_process_group(parsed.bag_ranks, bag, group))
                self.process_groups_created += group_cache_size() - before
                if parsed.num_replicas > 1:  # each rank plans only its own replica
                    self._replica_layout = BagLayout.parse(parsed.spec, parsed.group_size)
            # auto: bag groups are created when a layout that needs them is first chosen
            # (every rank decides the same at the same step, so creation is collective then)
        except GroupSetupError as exc:
            raise BalancerError(f"cannot create the bag process groups: {exc}") from exc

    def _make_auto(
        self,
        cost: CostModel,
        gpus_per_node: int | None,
        hysteresis: float | None,
        window: int | None,
        candidates: Sequence[str] | None,
    ) -> AutoLayout:
        if self.num_heads is None:
            raise LayoutError("layout 'auto' needs num_heads (bag sizes must divide it)")
        if gpus_per_node is None:
            raise LayoutError(
                "layout 'auto' needs gpus_per_node (or $LOCAL_WORLD_SIZE): bags must not "
                "cross a node"
            )
        return AutoLayout(
            world_size=self.world_size,
            num_heads=self.num_heads,
            gpus_per_node=gpus_per_node,
            cost=cost,
            hysteresis=0.02 if hysteresis is None else hysteresis,
            window=1 if window is None else window,
            candidates=None if candidates is None else tuple(candidates),
        )

    def _parse_fixed(
        self,
        spec: Any,
        gpus_per_node: int | None,
        hysteresis: float | None,
        window: int | None,
        candidates: Sequence[str] | None,
    ) -> BagLayout:
        extra = [
            n
            for n, v in (("hysteresis", hysteresis), ("window", window), ("candidates", candidates))
            if v is not None
        ]
        if extra:
            raise LayoutError(f"{', '.join(extra)} only apply to layout 'auto' (got {spec!r})")
        parsed = BagLayout.parse(spec, self.world_size, self.num_heads)
        if gpus_per_node is not None:
            if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
                raise LayoutError(
                    f"gpus_per_node must be a positive integer, got {gpus_per_node!r}"
                )
            if spans_nodes(parsed, gpus_per_node):
                raise LayoutError(
                    f"bag layout {parsed.spec!r} has a bag spanning two nodes "
                    f"(gpus_per_node={gpus_per_node})"
                )
        return parsed

    def _set_layout(self, layout: BagLayout, bag_group: dist.ProcessGroup | None) -> None:
        self.layout = layout
        self.bag = layout.bag_of_rank[self.rank]
        self.bag_ranks = layout.bag_ranks[self.bag]
        self.bag_size = len(self.bag_ranks)
        self.bag_group = bag_group

    # ---- layout state (logging, checkpoints) -------------------------------------------------

    @property
    def is_auto(self) -> bool:
        return self._auto is not None

    @property
    def layout_spec(self) -> str | None:
        """Spec of the layout in use (None before the first auto step)."""
        return None if self.layout is None else self.layout.spec

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must restore so a resumed run makes the same layout decisions."""
        if self._auto is not None:
            return self._auto.state_dict()
        return {"layout": self.layout_spec, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (every rank must load the same state; checked at route)."""
        if not isinstance(state, dict):
            raise BalancerError(f"balancer state must be a dict, got {type(state).__name__}")
        if self._auto is None:
            if state.get("layout") != self.layout_spec:
                raise BalancerError(
                    f"state has layout {state.get('layout')!r}, this balancer uses the fixed "
                    f"layout {self.layout_spec!r}"
                )
            step = state.get("step", self.step)
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise BalancerError(f"invalid balancer state: step {step!r}")
            self.step = step
            return
        try:
            self._auto.load_state_dict(state)
        except LayoutError as exc:
            raise BalancerError(f"invalid balancer state: {exc}") from exc
        self.step = self._auto.step
        if self._auto.current is not None:
            self._use_auto_layout(self._auto.layout(self._auto.current))
        self.plan = self.tables = None

    def set_cost(self, cost: CostModel) -> None:
        """Plan the next steps (and choose their auto layouts) with ``cost``. Every rank must
        pass the same model before the same step (e.g. one broadcast from rank 0); ranks that
        do not would plan differently, which the next routing's agreement check reports."""
        if not isinstance(cost, CostModel):
            raise BalancerError(f"cost must be a CostModel, got {type(cost).__name__}")
        self.cost = cost
        if self._auto is not None:
            self._auto.cost = cost

    def _use_auto_layout(self, lay: BagLayout) -> None:
        """Switch to an auto-chosen layout, creating its missing bag groups (collective: every
        rank switches at the same step)."""
        try:
            self.process_groups_created += create_bag_groups(lay.bag_ranks, self.group)
        except GroupSetupError as exc:
            raise BalancerError(f"cannot create the bag process groups: {exc}") from exc
        mine = lay.bag_ranks[lay.bag_of_rank[self.rank]]
        self._set_layout(lay, cached_bag_group(mine, self.group))

    def _default_device(self) -> torch.device:
        backend = str(dist.get_backend(self.group)).lower()
        if "nccl" in backend and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # ---- planning ----------------------------------------------------------------------------

    def plan_step(self, local_lengths: Sequence[int] | np.ndarray | torch.Tensor) -> Plan:
        """Gather every rank's lengths (integers only), plan, and build this rank's tables."""
        if isinstance(local_lengths, torch.Tensor):
            local_lengths = local_lengths.detach().cpu().numpy()
        arr = np.asarray(local_lengths)
        code, a, b = 0, 0, 0
        if arr.size == 0:
            arr = np.zeros(0, dtype=np.int64)
        elif arr.ndim != 1:
            code = 2
        elif arr.dtype.kind not in "iu":
            code = 1
        elif (arr <= 0).any():
            code = 3
            a = int(np.flatnonzero(arr <= 0)[0])
            b = int(arr[a])
        count = int(arr.size) if code == 0 else 0
        # (on the CPU when the group has a CPU backend: the step's lengths are host data)
        # The lengths ride with the check when they fit the widest step so far (a width every
        # rank knows alike): one gather a step, a second only when a rank has more sequences.
        width = self._lengths_width
        info = torch.zeros(4 + width, dtype=torch.int64, device=self._ctrl_device)
        info[:4] = torch.tensor([count, code, a, b], dtype=torch.int64)
        if 0 < count <= width:
            info[4 : 4 + count] = torch.from_numpy(arr.astype(np.int64))
        infos = self._all_gather(info, "plan_step").cpu().numpy()
        bad = [r for r in range(self.world_size) if infos[r, 1] != 0]
        if bad:
            parts = [f"rank {r}: " + _describe(*infos[r, 1:4], 0, op="plan_step") for r in bad]
            raise BalancerError("bad sequence lengths passed to plan_step: " + "; ".join(parts))
        counts = infos[:, 0]
        m = int(counts.max()) if counts.size else 0
        lengths: list[list[int]] = [[] for _ in range(self.world_size)]
        if m > width:
            padded = torch.zeros(m, dtype=torch.int64, device=self._ctrl_device)
            padded[: arr.size] = torch.from_numpy(arr.astype(np.int64))
            allp = self._all_gather(padded, "plan_step").cpu().numpy()
            self._lengths_width = m
        else:
            allp = infos[:, 4:]
        if m > 0:
            lengths = [allp[r, : counts[r]].tolist() for r in range(self.world_size)]
        if self._auto is not None:
            try:
                layout, changed = self._auto.decide(lengths)  # pure: the same on every rank
            except LayoutError as exc:
                raise BalancerError(f"auto layout failed: {exc}") from exc
            if changed:
                self._use_auto_layout(layout)
            self.layout_changed = changed
            self.step = self._auto.step
        else:
            self.step += 1
        assert self.layout is not None
        self._step_src = np.repeat(np.arange(self.world_size, dtype=np.int64), counts)
        if self._replica_layout is not None:
            # Only this rank's replica: its ranks' lengths, planned on a one-replica layout;
            # the tables are then shifted to world ranks, bags and sequence ids.
            group = self.layout.group_size
            r = self.rank // group
            ranks = slice(r * group, (r + 1) * group)
            self._seq_offset = int(counts[: r * group].sum())
            plan = plan_step(
                lengths[ranks], self._replica_layout, self.cost, self.solver, **self.solver_options
            )
            self.tables = offset_tables(
                routing_from_plan(plan, self.rank - r * group),
                r * group,
                r * self.layout.bags_per_replica,
                self._seq_offset,
                self.world_size,
            )
        else:
            plan = plan_step(lengths, self.layout, self.cost, self.solver, **self.solver_options)
            self.tables = routing_from_plan(plan, self.rank)
        self.plan = plan
        self._plan_sig = zlib.crc32(plan.bag.tobytes(), zlib.crc32(plan.layout.spec.encode()))
        return plan

    @property
    def step_src_rank(self) -> np.ndarray:
        """Source rank (of the balance group) of every sequence of the step, all replicas,
        indexed by the global sequence ids the routing tables use."""
        return self._step_src

    @property
    def seq_offset(self) -> int:
        """Global id of the first sequence of this rank's replica: with several replicas,
        :attr:`plan` covers only this replica, and its row ``i`` is global sequence
        ``seq_offset + i`` (the id the routing tables use)."""
        return self._seq_offset

    def _all_gather(self, t: torch.Tensor, op: str = "all_gather") -> torch.Tensor:
        return _gather_rows(t, self.world_size, self.group, op)

    def _require_tables(self, op: str) -> RoutingTables:
        if self.tables is None:
            raise BalancerError(f"{op} called before plan_step")
        return self.tables

    def index(self, name: str, device: torch.device) -> torch.Tensor:
        """A routing table (``RoutingTables`` field) as a cached index tensor on ``device``."""
        tables = self._require_tables(name)
        if self._cache_owner is not tables:  # tables replaced (new step, or by hand): reset
            self._index_cache.clear()
            self._cache_owner = tables
        key = (name, torch.device(device))
        t = self._index_cache.get(key)
        if t is None:
            dtype = torch.int64
            if name == "inverse_send_perm":
                arr = np.empty_like(tables.send_perm)
                arr[tables.send_perm] = np.arange(arr.size, dtype=np.int64)
            elif name == "cu_seqlens_int32":  # the dtype flash-attn wants
                arr, dtype = tables.cu_seqlens, torch.int32
            else:
                arr = getattr(tables, name)
            t = upload_table(np.array(arr, dtype=np.int64), device, dtype)
            self._index_cache[key] = t
        return t

    # ---- routing -----------------------------------------------------------------------------

    def _agree(
        self,
        tensors: Sequence[Any],
        expected_rows: int,
        op: str,
        agree: bool = True,
        sequences: int | None = None,
    ) -> None:
        """Check inputs locally, then agree on errors and tensor signatures across ranks
        (``agree=False``: the local check alone, see :meth:`reverse_route`)."""
        code, a, b, c = 0, 0, 0, 0
        sig = 0
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            code, a = 13, next(i for i, t in enumerate(tensors) if not isinstance(t, torch.Tensor))
        elif tensors[0].dim() == 0:
            code = 14
        else:
            rows = tensors[0].shape[0]
            desc = [(str(t.dtype), tuple(t.shape[1:])) for t in tensors]
            sig = zlib.crc32(repr(desc).encode()) & 0x7FFFFFFF
            if rows != expected_rows:
                code, a, b = 10, rows, expected_rows
            for i, t in enumerate(tensors[1:]):
                if code:
                    break
                if t.dim() == 0 or t.shape[0] != rows:
                    code, a, b, c = 11, i, (t.shape[0] if t.dim() else -1), rows
                elif t.device != tensors[0].device:
                    code, a = 12, i + 1
        if not code and sequences is not None:
            planned = int(np.count_nonzero(self._step_src == self.rank))
            if sequences != planned:
                code, a, b = 15, sequences, planned
        if not agree:
            if code:
                detail = _describe(code, a, b, c, op=op)
                raise BalancerError(f"bad input: rank {self.rank}: {detail}")
            return
        info = torch.tensor(
            [code, a, b, c, sig, self._plan_sig], dtype=torch.int64, device=self._ctrl_device
        )
        infos = self._all_gather(info, op).cpu().numpy()  # (CPU already on a gloo-capable group)
        bad = [r for r in range(self.world_size) if infos[r, 0] != 0]
        if bad:
            parts = [f"rank {r}: " + _describe(*infos[r, :4], op=op) for r in bad]
            raise BalancerError("bad input: " + "; ".join(parts))
        group = self.layout.group_size if self.layout is not None else self.world_size
        if any(len(set(row)) > 1 for row in infos[:, 5].reshape(-1, group).tolist()):
            # Rare path, taken by every rank alike: fetch the specs for a readable message.
            specs: list[Any] = [None] * self.world_size
            with collective(op, self.group):
                dist.all_gather_object(specs, self.layout_spec, group=self.group)
            per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(specs))
            raise BalancerError(
                f"{op}: ranks computed different plans for this step (layouts {per_rank}); "
                "every rank must hold the same balancer state (load_state_dict the same state "
                "everywhere) and a deterministic solver"
            )
        if len(set(infos[:, 4].tolist())) > 1:
            raise BalancerError(
                f"{op}: ranks passed tensors with different dtypes or trailing shapes "
                f"(this rank: {[(str(t.dtype), tuple(t.shape[1:])) for t in tensors]})"
            )

    def _exchange(
        self,
        op: str,
        tensors: Sequence[torch.Tensor],
        out_splits: np.ndarray,
        in_splits: np.ndarray,
        pre_index: str | None,
        post_index: str | None,
        out_rows: int,
    ) -> list[torch.Tensor]:
        """One all_to_all per dtype: same-dtype tensors are concatenated column-wise, and
        integer features ride in the tokens' floating-point buffer, bit for bit (a view of
        their bytes, never a conversion), where their row's bytes divide into its elements:
        the usual route (tokens, positions, kind) is one exchange, not two."""
        rows = tensors[0].shape[0]
        device = tensors[0].device
        carrier = tensors[0].dtype
        flat: list[torch.Tensor] = []
        for t in tensors:
            f = t.reshape(rows, int(np.prod(t.shape[1:], dtype=np.int64)))
            if _rides_in(f, carrier):
                f = f.contiguous().view(carrier)
            flat.append(f)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, f in enumerate(flat):
            by_dtype.setdefault(f.dtype, []).append(i)
        result: list[torch.Tensor | None] = [None] * len(tensors)
        for idxs in by_dtype.values():
            widths = [flat[i].shape[1] for i in idxs]
            buf = flat[idxs[0]] if len(idxs) == 1 else torch.cat([flat[i] for i in idxs], dim=1)
            if pre_index is not None:
                buf = buf.index_select(0, self.index(pre_index, device))
            out = all_to_all(buf, out_splits.tolist(), in_splits.tolist(), self.group, op=op)
            if post_index is not None:
                out = out.index_select(0, self.index(post_index, device))
            for i, part in zip(idxs, torch.split(out, widths, dim=1), strict=True):
                t = tensors[i]
                if part.dtype != t.dtype:
                    part = part.contiguous().view(t.dtype)
                result[i] = part.reshape(out_rows, *t.shape[1:])
        return result  # type: ignore[return-value]

    def route(
        self, tokens: torch.Tensor, *features: torch.Tensor, sequences: int | None = None
    ) -> Any:
        """Move ``[T_local, ...]`` tensors into the balanced layout (same row order on all).

        Returns the routed tokens, or a tuple ``(tokens, *features)`` when features are given.
        Integer/bool features travel in their own dtype (bit-exact). ``sequences``: how many
        sequences the caller holds for this step (e.g. its per-sequence conditioning rows),
        checked against the plan in the same agreement as the tokens.
        """
        t = self._require_tables("route")
        tensors = (tokens, *features)
        self._agree(tensors, t.num_local_tokens, "route", sequences=sequences)
        out = self._exchange(
            "route", tensors, t.recv_splits, t.send_splits, "send_perm", None,
            t.num_balanced_tokens,
        )  # fmt: skip
        return out[0] if not features else tuple(out)

    def reverse_route(
        self, tokens: torch.Tensor, *features: torch.Tensor, agree: bool = True
    ) -> Any:
        """Inverse of :meth:`route`: balanced layout -> this rank's original packed order.

        ``agree=False`` keeps the input check local (no gather): for callers whose tensors
        come out of :meth:`route` by construction (the parallelized model), where :meth:`route`
        has agreed on the rows, dtypes and plan already."""
        t = self._require_tables("reverse_route")
        tensors = (tokens, *features)
        self._agree(tensors, t.num_balanced_tokens, "reverse_route", agree)
        out = self._exchange(
            "reverse_route", tensors, t.send_splits, t.recv_splits, None, "inverse_send_perm",
            t.num_local_tokens,
        )  # fmt: skip
        return out[0] if not features else tuple(out)

    def route_host(self, values: np.ndarray) -> np.ndarray | None:
        """A per-token host array (``[T_local]``, this rank's packed order) in the balanced
        layout, as :meth:`route` moves the tokens, through a CPU collective: host tables (the
        tokens' modality) follow their tokens without a read of device data. None when the
        group has no CPU backend (plain ``"nccl"``). Call it after :meth:`route`, whose
        agreement has checked every rank's row count."""
        t = self._require_tables("route_host")
        if not has_cpu_backend(self.group):  # pragma: no cover - CUDA with a plain "nccl" group
            return None
        arr = np.asarray(values)
        if arr.shape[:1] != (t.num_local_tokens,):
            raise BalancerError(
                f"route_host: {arr.shape[:1]} rows, this rank's layout has {t.num_local_tokens}"
            )
        x = torch.from_numpy(np.ascontiguousarray(arr[t.send_perm]))
        out = all_to_all(x, t.recv_splits.tolist(), t.send_splits.tolist(), self.group, "route")
        return out.numpy()

    # ---- balanced-layout metadata (known locally, no communication) --------------------------

    def balanced_positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """In-sequence position of every balanced token (``[T_out]`` int64)."""
        return self.index("token_positions", torch.device(device))

    def balanced_seq_ids(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global sequence id of every balanced token (``[T_out]`` int64)."""
        return self.index("token_seq_ids", torch.device(device))

    # ---- Ulysses attention hooks -------------------------------------------------------------

    def pre_attn(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, agree: bool = True
    ) -> AttnInputs:
        """``[T_out, H, D]`` chunks with all heads -> whole sequences with ``H/g`` heads.

        ``agree=False`` keeps the input check local (no gather in the bag): for callers whose
        shapes are fixed by construction, as :func:`~knapformer.distributed.parallelize`'s
        model is (heads checked once, token counts agreed by :meth:`route`)."""
        t = self._require_tables("pre_attn")
        g = self.bag_size
        code, a, b, c = 0, 0, 0, 0
        for i, x in enumerate((q, k, v)):
            if not isinstance(x, torch.Tensor):
                code, a = 13, i
            elif x.dim() != 3:
                code, a, b = 20, i, x.dim()
            elif x.shape[0] != t.num_balanced_tokens:
                code, a, b, c = 21, i, x.shape[0], t.num_balanced_tokens
            elif x.shape[1] % g != 0:
                code, a, b = 22, x.shape[1], g
            if code:
                break
        self._agree_in_bag("pre_attn", code, a, b, c, agree)
        device = q.device
        cu = self.index("cu_seqlens_int32", device)
        if g == 1:
            return AttnInputs(q, k, v, cu, t.max_seqlen)
        outs = [int(s) for s in t.peer_splits]
        ins = [t.num_balanced_tokens] * g
        gather = self.index("attn_gather", device)
        if q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype:
            x = _qkv_head_groups(q, k, v, g)  # [g*T, 3, H/g, D]
            y = all_to_all(x, outs, ins, self.bag_group, op="pre_attn").index_select(0, gather)
            qs, ks, vs = y.unbind(dim=1)
        else:
            qs, ks, vs = (
                all_to_all(
                    _split_head_groups(x, g), outs, ins, self.bag_group, op="pre_attn"
                ).index_select(0, gather)
                for x in (q, k, v)
            )
        return AttnInputs(qs, ks, vs, cu, t.max_seqlen)

    def post_attn(self, out: torch.Tensor, *, agree: bool = True) -> torch.Tensor:
        """Inverse of :meth:`pre_attn` for the output: ``[N, H/g, D] -> [T_out, H, D]``."""
        t = self._require_tables("post_attn")
        g = self.bag_size
        if g == 1:
            return out
        code, b = 0, 0
        if not isinstance(out, torch.Tensor):
            code = 13
        elif out.dim() != 3:
            code, b = 20, out.dim()
        elif out.shape[0] != t.num_attn_tokens:
            code, b = 23, out.shape[0]
        self._agree_in_bag("post_attn", code, 0, b, t.num_attn_tokens, agree)
        y = out.index_select(0, self.index("attn_scatter", out.device))
        ins = [int(s) for s in t.peer_splits]
        outs = [t.num_balanced_tokens] * g
        back = all_to_all(y, outs, ins, self.bag_group, op="post_attn")
        return _merge_head_groups(back, g)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool = False,
        attn_fn: Callable[..., torch.Tensor] = varlen_attention,
        *,
        agree: bool = True,
    ) -> torch.Tensor:
        """``pre_attn`` -> varlen attention over whole sequences -> ``post_attn``.

        ``attn_fn(q, k, v, cu_seqlens, max_seqlen, causal=...)`` also gets the plan's host
        offsets as ``cu_seqlens_host=`` when it has that parameter (the shipped one does), so
        that it never copies ``cu_seqlens`` back from the device. ``agree``: as in
        :meth:`pre_attn`."""
        a = self.pre_attn(q, k, v, agree=agree)
        kw: dict[str, Any] = {"causal": causal}
        if _takes_host_offsets(attn_fn):
            kw["cu_seqlens_host"] = self._require_tables("attention").cu_seqlens
        out = attn_fn(a.q, a.k, a.v, a.cu_seqlens, a.max_seqlen, **kw)
        return self.post_attn(out, agree=agree)

    def _agree_in_bag(self, op: str, code: int, a: int, b: int, c: int, agree: bool = True) -> None:
        """Agree on a local check across the bag before its collective: every rank of the bag
        raises the same error (naming the ranks) instead of leaving its peers in a mismatched
        all-to-all. A one-GPU bag has no collective, so its check stays local; so does a bag
        group without a CPU backend (plain "nccl"), where agreeing would make every attention
        call wait for the device: initialise with "cpu:gloo,cuda:nccl" to have both."""
        row = [code, a, b, c]
        if agree and self.bag_size > 1 and has_cpu_backend(self.bag_group):
            info = torch.tensor(row, dtype=torch.int64)
            rows = _gather_rows(info, self.bag_size, self.bag_group, op).tolist()
            named = list(zip(self.bag_ranks, rows, strict=True))
        else:
            named = [(self.rank, row)]
        bad = [(rk, r) for rk, r in named if r[0] != 0]
        if bad:
            parts = [f"rank {rk}: " + _describe(*r, op=op) for rk, r in bad]
            raise BalancerError(
                f"bad input in the bag of ranks {self.bag_ranks}: " + "; ".join(parts)
            )
