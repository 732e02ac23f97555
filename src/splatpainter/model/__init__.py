"""The editing model: LaCT TTT layer, Stage I voxel latent, Stage II editor, checkpoints."""

from splatpainter.model.editor import (
    CheckpointError,
    EditorConfig,
    EditorModel,
    load_checkpoint,
    load_weights_into,
    save_checkpoint,
)
from splatpainter.model.stage1 import Stage1Config, Stage1Encoder, Stage1Latent
from splatpainter.model.stage2 import GaussianSignals, Stage2Config, Stage2Editor
from splatpainter.model.ttt import FastWeights, TTTConfig, TTTLayer

__all__ = [
    "CheckpointError",
    "EditorConfig",
    "EditorModel",
    "FastWeights",
    "GaussianSignals",
    "Stage1Config",
    "Stage1Encoder",
    "Stage1Latent",
    "Stage2Config",
    "Stage2Editor",
    "TTTConfig",
    "TTTLayer",
    "load_checkpoint",
    "load_weights_into",
    "save_checkpoint",
]
