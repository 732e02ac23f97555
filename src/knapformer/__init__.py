"""KnapFormer: online load balancing + sequence parallelism for DiT training."""

__version__ = "0.1.0"
