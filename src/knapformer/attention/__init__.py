"""Varlen attention over packed sequences (flash-attn on CUDA when installed, SDPA otherwise)."""

from knapformer.attention.varlen import flash_attn_available, varlen_attention

__all__ = ["flash_attn_available", "varlen_attention"]
