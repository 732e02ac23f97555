"""Plain models (nothing distributed inside): the reference block and a FLUX-shaped MMDiT."""

from knapformer.models.block import (
    PackedTransformer,
    TransformerBlock,
    balanced_attention,
    balanced_forward,
    local_attention,
)
from knapformer.models.mmdit import (
    PRESETS,
    MMDiT,
    MMDiTConfig,
    MMDiTInputError,
    PackedBatch,
    mmdit_config,
)

__all__ = [
    "PRESETS",
    "MMDiT",
    "MMDiTConfig",
    "MMDiTInputError",
    "PackedBatch",
    "PackedTransformer",
    "TransformerBlock",
    "balanced_attention",
    "balanced_forward",
    "local_attention",
    "mmdit_config",
]
