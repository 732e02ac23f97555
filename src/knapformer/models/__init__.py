"""Plain models (nothing distributed inside): a FLUX-shaped MMDiT over packed sequences."""

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
    "mmdit_config",
]
