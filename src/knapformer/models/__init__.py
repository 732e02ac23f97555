"""Reference packed-varlen transformer wired to the balancer (integration example)."""

from knapformer.models.block import (
    PackedTransformer,
    TransformerBlock,
    balanced_attention,
    balanced_forward,
    local_attention,
)

__all__ = [
    "PackedTransformer",
    "TransformerBlock",
    "balanced_attention",
    "balanced_forward",
    "local_attention",
]
