"""MMDiT training with KnapFormer balancing: config, loop, checkpoints, launchers.

``knapformer train --config configs/tiny.toml --nproc 2`` spawns local ranks;
``torchrun --standalone --nproc-per-node N -m knapformer.train --config ...`` runs under torchrun.
"""

from knapformer.train.config import ConfigError, TrainConfig, load_config

__all__ = ["ConfigError", "TrainConfig", "load_config"]
