"""Exponential moving average of the parameters, sharded like them.

Under FSDP2 every parameter is a DTensor shard; the EMA holds a DTensor of the same placement
per parameter, so it costs each rank one more copy of its shard (at least fp32: a bf16 EMA
with decay 0.999 would round every update away) and is saved by DCP next to the model.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EMA"]

_WRAPPER = "_checkpoint_wrapped_module."  # activation checkpointing's prefix, not a real name


def _local(t: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds (a view: in-place updates reach the DTensor)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class EMA:
    """``ema = decay * ema + (1 - decay) * param`` after every optimiser step."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.names: list[str] = []
        self.shadow: list[torch.Tensor] = []
        self.reset(model)

    @torch.no_grad()
    def reset(self, model: nn.Module) -> None:
        """Start over from ``model``'s current parameters."""
        self.names, self.shadow = [], []
        for name, p in model.named_parameters():
            dtype = torch.promote_types(p.dtype, torch.float32)
            self.names.append(name.replace(_WRAPPER, ""))
            self.shadow.append(p.detach().to(dtype=dtype, copy=True))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        params = [p for _, p in model.named_parameters()]
        if len(params) != len(self.shadow):
            raise ValueError("EMA: the model's parameters changed since the EMA was made")
        for e, p in zip(self.shadow, params, strict=True):
            le = _local(e)
            le.lerp_(_local(p.detach()).to(le.dtype), 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameter name -> EMA tensor (DTensors under FSDP2: DCP saves and loads them in
        place, shard by shard)."""
        return dict(zip(self.names, self.shadow, strict=True))

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Overwrite ``model``'s parameters with the EMA (for evaluation or export)."""
        for e, (_, p) in zip(self.shadow, model.named_parameters(), strict=True):
            _local(p).copy_(_local(e).to(p.dtype))
