"""Varlen attention over packed sequences.

On CUDA in fp16/bf16: flash-attn's varlen kernel when installed, else torch's ``varlen_attn``
(torch >= 2.11); otherwise PyTorch SDPA, one call per sequence.
"""

from knapformer.attention.varlen import flash_attn_available, varlen_attention

__all__ = ["flash_attn_available", "varlen_attention"]
