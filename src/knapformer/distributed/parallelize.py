"""Apply KnapFormer balancing, activation checkpointing and FSDP2 to a plain MMDiT, from outside.

As in torchtitan, the model is written for one process and ``parallelize`` rewrites it in place:

* every block's :class:`~knapformer.models.mmdit.VarlenAttention` becomes a
  :class:`BalancedAttention` (Ulysses inside multi-GPU bags), so nothing is threaded through
  ``forward``;
* the model's dispatcher becomes a :class:`BalancedDispatcher`: it routes the embedded tokens and
  their per-token features (3-axis positions, modality) to the balanced layout in one
  all-to-all per dtype (the modality also on the host, so the blocks find their streams from
  host tables), derives each token's sequence from the balancer, and delivers every
  sequence's conditioning (timestep, pooled text: the adaLN input) to the ranks that hold its
  tokens (one small all-gather of per-sequence rows, not per-token traffic); ``combine`` routes
  the output back, so the loss is computed in the original layout;
* blocks are wrapped for activation checkpointing (optional) and sharded with ``fully_shard``
  over the data-parallel mesh, then the root.

Per step, call ``balancer.plan_step(batch.seq_lens)`` before the forward (the trainer does; the
plan is also what gets logged). The data-parallel gradient reduction must cover the balance
group: a balanced rank computes gradients from other ranks' tokens, so only the *sum over the
balance group* equals the unbalanced gradient. ``parallelize`` checks this (every rank of the
balancer's group must be in the FSDP mesh).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from knapformer.distributed.balancer import Balancer, BalancerError, upload_table
from knapformer.distributed.collectives import gather_rows
from knapformer.distributed.groups import global_ranks
from knapformer.models.mmdit import (
    AttnMeta,
    DispatchedTokens,
    MMDiT,
    TokenState,
    VarlenAttention,
)

__all__ = ["BalancedAttention", "BalancedDispatcher", "ParallelizeError", "parallelize"]


class ParallelizeError(ValueError):
    """The model, mesh and balancer cannot be combined as asked."""


class BalancedAttention(nn.Module):
    """``pre_attn`` (Ulysses all-to-all) -> varlen attention on whole sequences -> ``post_attn``."""

    def __init__(self, balancer: Balancer):
        super().__init__()
        self.__dict__["balancer"] = balancer  # not a submodule: no parameters, no state_dict

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta | None = None
    ) -> torch.Tensor:
        # No per-layer agreement in the bag: parallelize checked the heads, route agreed the
        # token count, so every rank's shapes are right by construction (a local check stays).
        return self.balancer.attention(q, k, v, agree=False)


def _rows_per_rank(counts: np.ndarray) -> int:
    """Rows each rank contributes to the conditioning gather (its padded sequence count)."""
    return max(int(counts.max()) if counts.size else 0, 1)


class BalancedDispatcher(nn.Module):
    """Route tokens + per-token features in, deliver per-sequence conditioning, route back."""

    def __init__(self, balancer: Balancer):
        super().__init__()
        self.__dict__["balancer"] = balancer
        self._cache: tuple[Any, torch.device, torch.Tensor, torch.Tensor, np.ndarray] | None = None

    def _indices(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Rows of the gathered conditioning for this rank's sequences, each token's row (on
        ``device``), and the latter on the host."""
        bal = self.balancer
        t = bal.tables
        if self._cache is not None and self._cache[0] is t and self._cache[1] == device:
            return self._cache[2], self._cache[3], self._cache[4]
        plan = bal.plan
        assert plan is not None and t is not None
        counts = np.bincount(bal.step_src_rank, minlength=bal.world_size)
        first = np.cumsum(counts) - counts
        per_rank = _rows_per_rank(counts)  # rows per rank in the gather
        ids = np.asarray(t.seq_ids, dtype=np.int64)
        src = bal.step_src_rank[ids]  # (plan covers only this replica)
        rows = src * per_rank + (ids - first[src])
        tok = np.searchsorted(ids, np.asarray(t.token_seq_ids, dtype=np.int64))
        rows_t = upload_table(rows.astype(np.int64), device)
        tok_t = upload_table(tok.astype(np.int64), device)
        tok = tok.astype(np.int64)
        self._cache = (t, device, rows_t, tok_t, tok)
        return rows_t, tok_t, tok

    def _gather_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """Every rank's per-sequence conditioning rows (padded to the largest count). Called
        after :meth:`Balancer.route`, whose agreement has checked every rank's count against
        the plan (``sequences=``), so the gather's sizes match on every rank."""
        bal = self.balancer
        counts = np.bincount(bal.step_src_rank, minlength=bal.world_size)
        width = _rows_per_rank(counts)
        n, c = cond.shape
        buf = cond.new_zeros(width, c)
        buf[:n] = cond.detach()
        out = cond.new_empty(bal.world_size * width, c)
        gather_rows(out, buf, bal.group)
        return out

    def dispatch(self, s: TokenState) -> DispatchedTokens:
        bal = self.balancer
        if bal.tables is None:
            raise BalancerError(
                "the balanced model ran before balancer.plan_step(batch.seq_lens) for this batch"
            )
        if s.cond.requires_grad:
            raise BalancerError(
                "per-sequence conditioning is delivered as data (no gradient through the "
                "gather); detach it or compute trainable conditioning inside the model"
            )
        h, positions, kind = bal.route(s.h, s.positions, s.kind, sequences=s.cond.shape[0])
        # the modality on the host too (a CPU all-to-all of one byte per token), so the blocks'
        # streams come from host tables instead of a nonzero on the device
        kind_host = None if s.kind_host is None else bal.route_host(s.kind_host.astype(np.uint8))
        rows, tok, tok_host = self._indices(h.device)
        cond = self._gather_cond(s.cond).index_select(0, rows)
        return DispatchedTokens(h, positions, kind, tok, cond, None, kind_host, tok_host)

    def combine(self, out: torch.Tensor) -> torch.Tensor:
        return self.balancer.reverse_route(out, agree=False)  # the blocks kept route's rows


def _mesh_ranks(mesh: Any) -> set[int]:
    return {int(r) for r in mesh.mesh.flatten().tolist()}


def parallelize(
    model: MMDiT,
    mesh: Any = None,
    balancer: Balancer | None = None,
    *,
    fsdp: bool = True,
    activation_checkpointing: bool = False,
    reshard_after_forward: bool = True,
    mp_policy: Any = None,
) -> MMDiT:
    """Balance (if ``balancer``), checkpoint activations and shard ``model`` in place.

    Args:
        model: a plain :class:`MMDiT` (not yet sharded).
        mesh: the data-parallel DeviceMesh for FSDP2 (1-D: FSDP; 2-D ``(replicate, shard)``:
            HSDP). Default: a 1-D mesh over the WORLD.
        balancer: a :class:`Balancer` (built over a process group, a 1-D mesh or ``(mesh,
            dim)``); its ``num_heads`` must be the model's.
        fsdp: apply ``fully_shard`` (the gradient reduction over ``mesh``).
        activation_checkpointing: recompute each block in backward (the balanced all-to-alls
            inside a block are recomputed too, in the same order on every rank).
    """
    if not isinstance(model, MMDiT):
        raise ParallelizeError(f"parallelize expects an MMDiT, got {type(model).__name__}")
    if balancer is not None:
        if not isinstance(balancer, Balancer):
            raise ParallelizeError(f"balancer must be a Balancer, got {type(balancer).__name__}")
        if balancer.num_heads != model.cfg.num_heads:
            raise ParallelizeError(
                f"the balancer was built for num_heads={balancer.num_heads}, the model has "
                f"{model.cfg.num_heads} (bag sizes must divide the model's head count)"
            )
    if (fsdp or balancer is not None) and not dist.is_initialized():
        raise ParallelizeError("torch.distributed is not initialised")
    if fsdp and mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        device_type = "cuda" if next(model.parameters()).is_cuda else "cpu"
        mesh = init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    if fsdp and balancer is not None:
        group_ranks = set(
            global_ranks(balancer.group, tuple(range(dist.get_world_size(balancer.group))))
        )
        missing = sorted(group_ranks - _mesh_ranks(mesh))
        if missing:
            raise ParallelizeError(
                f"the FSDP mesh does not cover the balance group (ranks {missing} are missing): "
                "balanced gradients are only correct once summed over the whole balance group"
            )

    if balancer is not None:
        for module in model.modules():
            for name, child in list(module.named_children()):
                if isinstance(child, VarlenAttention):
                    setattr(module, name, BalancedAttention(balancer))
        model.dispatcher = BalancedDispatcher(balancer)

    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for blocks in (model.double_blocks, model.single_blocks):
            for i, block in enumerate(blocks):
                blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)

    if fsdp:
        from torch.distributed.fsdp import fully_shard

        kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
        if mp_policy is not None:
            kw["mp_policy"] = mp_policy
        for blocks in (model.double_blocks, model.single_blocks):
            for block in blocks:
                fully_shard(block, **kw)
        fully_shard(model, **kw)
    return model
