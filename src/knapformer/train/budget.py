"""The memory a training run will need, estimated before anything is allocated.

A config that asks for more than the machine holds must be refused with the key to change, not
end in a ``MemoryError`` traceback (or the OOM killer) after minutes of growth. The estimate is
rough on purpose (within ~2x for the presets): the parameters, counted exactly on the meta
device, with their gradients, AdamW state and EMA, sharded over the ranks; one unsharded block
(FSDP gathers a block at a time); and the rank's tokens at their largest (the data codes' widest
jitter and longest text) times the activations a block keeps for the backward pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from knapformer.train.config import ConfigError, rank_tokens_bound

if TYPE_CHECKING:
    from knapformer.models.mmdit import MMDiTConfig
    from knapformer.train.config import TrainConfig

__all__ = ["MemoryEstimate", "available_bytes", "check_memory", "count_parameters", "estimate"]

#: Activations a block keeps per token for the backward pass, in units of d_model (qkv, the
#: normalised q and k, attention output, modulated inputs, MLP hidden before and after the
#: activation, residuals). With activation checkpointing a block keeps its input only.
ACTIVATION_WIDTHS = 20
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}
GIB = float(1 << 30)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank needs: for the model (sharded states) and for its tokens."""

    params: int
    tokens: int
    model_bytes: int
    token_bytes: int

    @property
    def total(self) -> int:
        return self.model_bytes + self.token_bytes


def count_parameters(mcfg: MMDiTConfig) -> tuple[int, int]:
    """(parameters of the model, of its largest block), built on the meta device: exact, and
    no memory is touched whatever the shape."""
    import dataclasses

    import torch

    from knapformer.models.mmdit import DoubleStreamBlock, MMDiT, SingleStreamBlock

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    with torch.device("meta"):
        base = count(MMDiT(dataclasses.replace(mcfg, depth_double=0, depth_single=0)))
        double, single = count(DoubleStreamBlock(mcfg)), count(SingleStreamBlock(mcfg))
    total = base + mcfg.depth_double * double + mcfg.depth_single * single
    return total, max(double if mcfg.depth_double else 0, single if mcfg.depth_single else 0)


def estimate(cfg: TrainConfig, world: int) -> MemoryEstimate:
    """Per-rank memory of ``cfg`` on ``world`` ranks (see the module docstring)."""
    from knapformer.sim.datacodes import parse_data_codes

    mcfg = cfg.model_config()
    params, block = count_parameters(mcfg)
    s = DTYPE_BYTES[cfg.train.dtype]
    act = 2 if cfg.train.mixed_precision == "bf16" else s
    states = 4 * s + (max(s, 4) if cfg.train.ema_decay > 0 else 0)  # w, grad, 2 x AdamW, EMA
    model_bytes = params * states // world + 2 * block * act
    tokens = max(rank_tokens_bound(c, cfg.data) for c in parse_data_codes(cfg.data.codes).codes)
    blocks = mcfg.depth_double + mcfg.depth_single
    widths = (
        (2 * blocks + ACTIVATION_WIDTHS)
        if cfg.train.activation_checkpointing
        else (ACTIVATION_WIDTHS * max(blocks, 1))
    )
    per_token = (3 * mcfg.patch_dim + mcfg.text_dim) * s + 3 * 8 + mcfg.d_model * widths * act
    return MemoryEstimate(params, tokens, model_bytes, tokens * per_token)


def available_bytes(local_ranks: int, cuda: bool) -> int | None:
    """What one rank may use: its GPU's memory, or this machine's physical memory shared by
    the ranks it runs (None where the platform does not say)."""
    if cuda:  # pragma: no cover - CUDA only
        import torch

        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return int(total) // max(local_ranks, 1)


def check_memory(cfg: TrainConfig, world: int, local_ranks: int, cuda: bool = False) -> None:
    """Refuse ``cfg`` when one rank's estimate exceeds what it may use, naming the key whose
    part is larger: ``data.codes`` (the tokens) or ``model`` (the parameters)."""
    est = estimate(cfg, world)
    limit = available_bytes(local_ranks, cuda)
    if limit is None or est.total <= limit:
        return
    where = "GPU" if cuda else f"share of this machine's memory ({local_ranks} ranks)"
    need = f"a rank would need about {est.total / GIB:,.1f} GiB, more than its {where}, "
    need += f"{limit / GIB:,.1f} GiB"
    if est.token_bytes >= est.model_bytes:
        raise ConfigError(
            f"config key 'data.codes': {need} (up to {est.tokens:,} tokens per rank and step "
            f"through a {cfg.model_config().d_model}-wide model); use fewer or smaller samples"
        )
    raise ConfigError(
        f"config section 'model': {need} ({est.params:,} parameters with gradients and "
        f"optimiser state over {world} ranks); use a smaller model or more ranks"
    )
