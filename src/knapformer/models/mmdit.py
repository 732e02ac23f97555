"""A FLUX-shaped MMDiT over packed variable-length sequences (plain: nothing distributed inside).

Each sequence of a packed batch is text tokens plus visual tokens (patchified image or video
latents) in any order; ``is_img`` says which is which. The model

1. embeds text and visual tokens with their own projections into one ``[T, d]`` stream;
2. hands the stream and its per-token features (3-axis positions, modality, sequence ids) plus
   the per-sequence conditioning (timestep, pooled text) to ``self.dispatcher`` — a no-op here;
   :func:`knapformer.distributed.parallelize` swaps it for one that routes tokens to the
   balanced layout and delivers each sequence's conditioning to the rank holding its tokens;
3. runs double-stream blocks (separate text/visual weights, joint attention) and single-stream
   blocks (shared weights, parallel attention + MLP), each modulated (adaLN) by
   ``vec = time_in(t) + vector_in(pooled)`` of the token's sequence, with RoPE over (t, h, w);
4. projects back (adaLN final layer) and returns the visual tokens' prediction, in the order of
   ``batch.img``.

Attention is a submodule (:class:`VarlenAttention`) in every block, so parallelism swaps modules
from outside instead of threading callables through ``forward``.

Initialisation is adaLN-Zero (DiT, FLUX): the modulation projections start at zero, so every
block starts as the identity on its residual stream (:meth:`MMDiT.init_weights`).

Precision: the model computes in the dtype of its weights (bf16 under FSDP2 mixed precision) and
casts its own inputs to it; the conditioning, the timestep embedding, RoPE and the norms are
computed in at least fp32 whatever that dtype is (bf16 cannot tell timestep 0.500 from 0.502,
and rounds RoPE angles and norm statistics), then cast back to the activations' dtype.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from appshell.tables import check_limits, limited
from knapformer.attention.varlen import varlen_attention
from knapformer.models.host import to_device, upload_table
from knapformer.models.rope import apply_rope, rope_nd

__all__ = [
    "PRESETS",
    "AttnMeta",
    "DispatchedTokens",
    "DoubleStreamBlock",
    "LocalDispatcher",
    "MMDiT",
    "MMDiTConfig",
    "MMDiTInputError",
    "PackedBatch",
    "SingleStreamBlock",
    "Streams",
    "TokenState",
    "VarlenAttention",
    "mmdit_config",
    "timestep_embedding",
]


class MMDiTInputError(ValueError):
    """A packed batch or config the model cannot use, with the reason."""


@dataclass(frozen=True)
class MMDiTConfig:
    """Model shape. ``patch_dim`` = latent channels x patch^2 (FLUX: 16 x 2 x 2 = 64)."""

    # Ranges (appshell.tables.limited): real sizes, with stated upper limits so that no
    # shape can overflow or allocate absurdly before the memory estimate sees it.
    d_model: int = limited(3072, ge=1, le=1 << 16)
    num_heads: int = limited(24, ge=1, le=1024)
    depth_double: int = limited(19, ge=0, le=1024)
    depth_single: int = limited(38, ge=0, le=1024)
    mlp_ratio: float = limited(4.0, gt=0, le=64)
    patch_dim: int = limited(64, ge=1, le=1 << 16)
    text_dim: int = limited(4096, ge=1, le=1 << 16)
    pooled_dim: int = limited(768, ge=1, le=1 << 16)
    axes_dim: tuple[int, ...] = (16, 56, 56)
    rope_theta: float = limited(10000.0, gt=0)
    time_dim: int = limited(256, ge=2, le=1 << 16)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "axes_dim":
                object.__setattr__(self, "axes_dim", tuple(int(x) for x in v))
            elif f.name in ("mlp_ratio", "rope_theta"):
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise MMDiTInputError(f"model.{f.name} must be a positive number, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise MMDiTInputError(f"model.{f.name} must be a non-negative integer, got {v!r}")
        check_limits(self, "model", MMDiTInputError)  # before num_heads divides anything
        if self.d_model % self.num_heads:
            raise MMDiTInputError(
                f"model.d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if sum(self.axes_dim) != self.head_dim:
            raise MMDiTInputError(
                f"model.axes_dim {list(self.axes_dim)} must sum to the head dim {self.head_dim}"
            )
        if len(self.axes_dim) != 3 or any(d % 2 or d < 2 for d in self.axes_dim):
            raise MMDiTInputError(
                f"model.axes_dim must be 3 even sizes (t, h, w), got {list(self.axes_dim)}"
            )
        if self.mlp_hidden < 1:
            raise MMDiTInputError(
                f"model.mlp_ratio {self.mlp_ratio} leaves no MLP width at d_model={self.d_model}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.d_model * self.mlp_ratio)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["axes_dim"] = list(self.axes_dim)
        return d


#: From unit tests to the FLUX.1 shape (the latter for cost modelling, not for CPUs).
PRESETS: dict[str, MMDiTConfig] = {
    "tiny": MMDiTConfig(
        d_model=32, num_heads=4, depth_double=1, depth_single=1, patch_dim=8, text_dim=12,
        pooled_dim=8, axes_dim=(2, 2, 4), time_dim=16,
    ),
    "cpu": MMDiTConfig(
        d_model=128, num_heads=4, depth_double=2, depth_single=4, patch_dim=16, text_dim=32,
        pooled_dim=32, axes_dim=(8, 12, 12), time_dim=64,
    ),
    "small": MMDiTConfig(
        d_model=1024, num_heads=16, depth_double=8, depth_single=16, axes_dim=(8, 28, 28),
        text_dim=1024,
    ),
    "flux": MMDiTConfig(),
}  # fmt: skip


def mmdit_config(preset: str = "tiny", **overrides: Any) -> MMDiTConfig:
    """A preset with some fields replaced (unknown names are an error)."""
    if preset not in PRESETS:
        raise MMDiTInputError(
            f"unknown model preset {preset!r}: choose one of {', '.join(PRESETS)}"
        )
    base = PRESETS[preset].to_dict()
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise MMDiTInputError(f"unknown model field(s) {unknown}; known: {sorted(base)}")
    base.update(overrides)
    return MMDiTConfig(**base)


# ---- inputs ----------------------------------------------------------------------------------


@dataclass
class PackedBatch:
    """Packed sequences of one rank (sequence ``i`` owns the next ``seq_lens[i]`` tokens).

    ``img``/``txt`` hold the visual/text token features in packed order of their kind; ``is_img``
    (``[T]`` bool) interleaves them. ``positions`` are per-token (t, h, w) int64 RoPE positions
    (FLUX gives text tokens (0, 0, 0)). ``timesteps``/``pooled`` condition each sequence.

    ``is_img_host``: the same mask on the host (numpy), kept by :meth:`to` when the batch comes
    from the CPU. With it the model finds its streams from host tables; without it it runs
    ``nonzero`` on the device, which on CUDA is a host sync per call.
    """

    img: torch.Tensor  # [T_img, patch_dim]
    txt: torch.Tensor  # [T_txt, text_dim]
    is_img: torch.Tensor  # [T] bool
    positions: torch.Tensor  # [T, 3] int64
    seq_lens: list[int]
    timesteps: torch.Tensor  # [n]
    pooled: torch.Tensor  # [n, pooled_dim]
    is_img_host: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.is_img.shape[0])

    def seq_ids_host(self) -> np.ndarray:
        """``[T]`` int64 local sequence index of every token, on the host."""
        return np.repeat(np.arange(len(self.seq_lens), dtype=np.int64), self.seq_lens)

    def seq_ids(self) -> torch.Tensor:
        """``[T]`` int64 local sequence index of every token, on the batch's device."""
        return upload_table(self.seq_ids_host(), self.is_img.device)

    def to(self, device: torch.device | str) -> PackedBatch:
        """The batch on ``device`` (CPU -> CUDA copies do not block: :func:`to_device`)."""
        host = self.is_img_host
        if host is None and self.is_img.device.type == "cpu":
            host = self.is_img.numpy()
        return PackedBatch(
            img=to_device(self.img, device),
            txt=to_device(self.txt, device),
            is_img=to_device(self.is_img, device),
            positions=to_device(self.positions, device),
            seq_lens=list(self.seq_lens),
            timesteps=to_device(self.timesteps, device),
            pooled=to_device(self.pooled, device),
            is_img_host=host,
        )


def check_batch(batch: PackedBatch, cfg: MMDiTConfig) -> None:
    """Shape/dtype checks with one clear message (cheap: no data-dependent host syncs)."""
    n = len(batch.seq_lens)
    T = batch.num_tokens
    if any(not isinstance(L, int) or isinstance(L, bool) or L < 1 for L in batch.seq_lens):
        raise MMDiTInputError(f"seq_lens must be integers >= 1, got {list(batch.seq_lens)[:8]}")
    if sum(batch.seq_lens) != T:
        raise MMDiTInputError(f"seq_lens sum to {sum(batch.seq_lens)} but is_img has {T} tokens")
    if batch.is_img.dtype != torch.bool or batch.is_img.dim() != 1:
        raise MMDiTInputError("is_img must be a 1-D bool tensor")
    host = batch.is_img_host
    if host is not None and (not isinstance(host, np.ndarray) or host.shape != (T,)):
        raise MMDiTInputError(f"is_img_host must be a numpy array of shape ({T},) like is_img")
    if batch.img.dim() != 2 or batch.img.shape[1] != cfg.patch_dim:
        raise MMDiTInputError(f"img must be [T_img, {cfg.patch_dim}], got {tuple(batch.img.shape)}")
    if batch.txt.dim() != 2 or batch.txt.shape[1] != cfg.text_dim:
        raise MMDiTInputError(f"txt must be [T_txt, {cfg.text_dim}], got {tuple(batch.txt.shape)}")
    if batch.img.shape[0] + batch.txt.shape[0] != T:
        raise MMDiTInputError(
            f"img ({batch.img.shape[0]}) + txt ({batch.txt.shape[0]}) rows != {T} tokens"
        )
    if batch.positions.shape != (T, 3) or batch.positions.dtype != torch.int64:
        raise MMDiTInputError(
            f"positions must be int64 [T={T}, 3], got {batch.positions.dtype} "
            f"{tuple(batch.positions.shape)}"
        )
    if batch.timesteps.shape != (n,):
        raise MMDiTInputError(f"timesteps must be [n={n}], got {tuple(batch.timesteps.shape)}")
    if batch.pooled.shape != (n, cfg.pooled_dim):
        raise MMDiTInputError(
            f"pooled must be [n={n}, {cfg.pooled_dim}], got {tuple(batch.pooled.shape)}"
        )


# ---- dispatch: the seam where parallelism plugs in ---------------------------------------------


@dataclass
class AttnMeta:
    """Sequence boundaries for local varlen attention (absent in a balanced layout)."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    cu_seqlens_host: np.ndarray | None = None  # the same offsets on the host


@dataclass
class TokenState:
    """What the model hands to its dispatcher: the embedded stream and its features."""

    h: torch.Tensor  # [T, d]
    positions: torch.Tensor  # [T, 3] int64
    kind: torch.Tensor  # [T] int64 (1 = visual)
    seq_ids: torch.Tensor  # [T] int64 local sequence index
    seq_lens: list[int]
    cond: torch.Tensor  # [n, 1 + pooled_dim]: timestep, pooled text
    kind_host: np.ndarray | None = None  # ``kind`` on the host, when known there
    seq_ids_host: np.ndarray | None = None


@dataclass
class DispatchedTokens:
    """The layout the blocks run on; ``seq_index`` indexes the rows of ``cond``. The host
    copies (when known) let the blocks' streams be built without reading the device."""

    h: torch.Tensor
    positions: torch.Tensor
    kind: torch.Tensor
    seq_index: torch.Tensor
    cond: torch.Tensor
    attn_meta: AttnMeta | None
    kind_host: np.ndarray | None = None
    seq_index_host: np.ndarray | None = None

    def streams(self) -> Streams:
        """The blocks' stream tables: from the host copies when present (no host sync)."""
        if self.kind_host is not None and self.seq_index_host is not None:
            return Streams.from_host(self.kind_host, self.seq_index_host, self.h.device)
        return Streams.from_kind(self.kind, self.seq_index)


class LocalDispatcher(nn.Module):
    """Single-process layout: tokens stay, attention boundaries come from ``seq_lens``."""

    def dispatch(self, s: TokenState) -> DispatchedTokens:
        lens = np.asarray(s.seq_lens, dtype=np.int64)
        cu = np.zeros(lens.size + 1, dtype=np.int64)
        cu[1:] = np.cumsum(lens)
        meta = AttnMeta(upload_table(cu, s.h.device), int(lens.max()) if lens.size else 0, cu)
        return DispatchedTokens(
            s.h, s.positions, s.kind, s.seq_ids, s.cond, meta, s.kind_host, s.seq_ids_host
        )

    def combine(self, out: torch.Tensor) -> torch.Tensor:
        return out


class VarlenAttention(nn.Module):
    """``[T, H, D]`` q, k, v -> attention inside each sequence (swapped out by parallelize)."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta | None
    ) -> torch.Tensor:
        if meta is None:
            raise MMDiTInputError(
                "VarlenAttention got no sequence boundaries: the model's dispatcher was "
                "replaced but its attention modules were not (use knapformer.distributed."
                "parallelize, which swaps both)"
            )
        return varlen_attention(
            q, k, v, meta.cu_seqlens, meta.max_seqlen, cu_seqlens_host=meta.cu_seqlens_host
        )


# ---- building blocks -------------------------------------------------------------------------


def _wide(dtype: torch.dtype) -> torch.dtype:
    """At least fp32: where bf16 activations' precision is not enough (RoPE, norms, timesteps)."""
    return torch.promote_types(dtype, torch.float32)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of ``t`` in [0, 1] (scaled by 1000 as in FLUX), computed and
    returned in at least fp32 (the caller casts it to the embedder's dtype)."""
    dtype = _wide(t.dtype) if t.is_floating_point() else torch.float32
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=dtype, device=t.device) / half
    )
    args = 1000.0 * t.to(dtype)[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class LayerNorm32(nn.LayerNorm):
    """LayerNorm computed in at least fp32, returned in the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.to(_wide(x.dtype))
        b = None if self.bias is None else self.bias.to(_wide(x.dtype))
        return F.layer_norm(x.to(_wide(x.dtype)), self.normalized_shape, w, b, self.eps).to(x.dtype)


class RMSNorm32(nn.RMSNorm):
    """RMSNorm computed in at least fp32, returned in the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.to(_wide(x.dtype))
        return F.rms_norm(x.to(_wide(x.dtype)), self.normalized_shape, w, self.eps).to(x.dtype)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden)
        self.out_layer = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


class QKNorm(nn.Module):
    """RMSNorm of q and k per head (FLUX)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.q = RMSNorm32(head_dim, eps=1e-6)
        self.k = RMSNorm32(head_dim, eps=1e-6)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q(q), self.k(k)


class Modulation(nn.Module):
    """Per-sequence ``vec`` -> ``k`` chunks of shift/scale/gate, one row per token (the
    projection starts at zero: adaLN-Zero, see :meth:`MMDiT.init_weights`)."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.k = k
        self.lin = nn.Linear(d, k * d)

    def forward(self, vec: torch.Tensor, seq_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Computed once per sequence and gathered per token: k*d^2 FLOPs per sequence, not token.
        return self.lin(F.silu(vec)).index_select(0, seq_index).chunk(self.k, dim=-1)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


@dataclass
class Streams:
    """Where the visual and text tokens of the running layout are (computed once per forward)."""

    img_idx: torch.Tensor  # [T_img]
    txt_idx: torch.Tensor  # [T_txt]
    inv: torch.Tensor  # [T]: cat(img rows, txt rows)[inv] = packed order
    img_seq: torch.Tensor  # [T_img] row of cond / vec for each visual token
    txt_seq: torch.Tensor  # [T_txt]

    @classmethod
    def from_kind(cls, kind: torch.Tensor, seq_index: torch.Tensor) -> Streams:
        """From device tensors: two ``nonzero`` (on CUDA, two host syncs per forward)."""
        is_img = kind.to(torch.bool)
        img_idx = torch.nonzero(is_img).flatten()
        txt_idx = torch.nonzero(~is_img).flatten()
        order = torch.cat([img_idx, txt_idx])
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        return cls(img_idx, txt_idx, inv, seq_index[img_idx], seq_index[txt_idx])

    @classmethod
    def from_host(cls, kind: np.ndarray, seq_index: np.ndarray, device: torch.device) -> Streams:
        """From host tables (no read of device data), uploaded to ``device``."""
        img, txt, inv = _split_order(np.asarray(kind).astype(bool))
        seq = np.asarray(seq_index, dtype=np.int64)
        tabs = (img, txt, inv, seq[img], seq[txt])
        return cls(*(upload_table(t, device) for t in tabs))


def _split_order(is_img: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host: positions of the visual and of the text tokens, and ``inv`` with
    ``cat(rows[img], rows[txt])[inv] = rows``."""
    img = np.flatnonzero(is_img).astype(np.int64)
    txt = np.flatnonzero(~is_img).astype(np.int64)
    inv = np.empty(is_img.size, dtype=np.int64)
    inv[np.concatenate([img, txt])] = np.arange(is_img.size, dtype=np.int64)
    return img, txt, inv


class _StreamWeights(nn.Module):
    """One stream's weights of a double-stream block."""

    def __init__(self, cfg: MMDiTConfig):
        super().__init__()
        d = cfg.d_model
        self.mod = Modulation(d, 6)
        self.norm1 = LayerNorm32(d, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.qk_norm = QKNorm(cfg.head_dim)
        self.proj = nn.Linear(d, d)
        self.norm2 = LayerNorm32(d, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(d, cfg.mlp_hidden), nn.GELU(approximate="tanh"), nn.Linear(cfg.mlp_hidden, d)
        )


class DoubleStreamBlock(nn.Module):
    """Text and visual tokens keep separate weights and attend jointly within their sequence."""

    def __init__(self, cfg: MMDiTConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.img = _StreamWeights(cfg)
        self.txt = _StreamWeights(cfg)
        self.attn = VarlenAttention()

    def forward(
        self,
        h: torch.Tensor,
        vec: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        streams: Streams,
        meta: AttnMeta | None,
    ) -> torch.Tensor:
        T, d = h.shape
        parts = []
        for w, idx, seq in ((self.img, streams.img_idx, streams.img_seq),
                            (self.txt, streams.txt_idx, streams.txt_seq)):  # fmt: skip
            x = h.index_select(0, idx)
            mod = w.mod(vec, seq)
            q, k, v = (
                w.qkv(_modulate(w.norm1(x), mod[0], mod[1]))
                .view(-1, 3, self.num_heads, self.head_dim)
                .unbind(1)
            )
            q, k = w.qk_norm(q, k)
            parts.append((x, mod, torch.stack((q, k, v), dim=1)))
        qkv = torch.cat([parts[0][2], parts[1][2]]).index_select(0, streams.inv)
        q, k, v = qkv.unbind(1)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = self.attn(q, k, v, meta).reshape(T, d)
        outs = []
        for (w, idx), (x, mod, _) in zip(
            ((self.img, streams.img_idx), (self.txt, streams.txt_idx)), parts, strict=True
        ):
            x = x + mod[2] * w.proj(a.index_select(0, idx))
            x = x + mod[5] * w.mlp(_modulate(w.norm2(x), mod[3], mod[4]))
            outs.append(x)
        return torch.cat(outs).index_select(0, streams.inv)


class SingleStreamBlock(nn.Module):
    """Shared weights; attention and MLP in parallel from one fused input projection (FLUX)."""

    def __init__(self, cfg: MMDiTConfig):
        super().__init__()
        d = cfg.d_model
        self.num_heads, self.head_dim, self.mlp_hidden = cfg.num_heads, cfg.head_dim, cfg.mlp_hidden
        self.mod = Modulation(d, 3)
        self.pre_norm = LayerNorm32(d, elementwise_affine=False, eps=1e-6)
        self.linear1 = nn.Linear(d, 3 * d + cfg.mlp_hidden)
        self.linear2 = nn.Linear(d + cfg.mlp_hidden, d)
        self.qk_norm = QKNorm(cfg.head_dim)
        self.attn = VarlenAttention()

    def forward(
        self,
        h: torch.Tensor,
        vec: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seq_index: torch.Tensor,
        meta: AttnMeta | None,
    ) -> torch.Tensor:
        T, d = h.shape
        shift, scale, gate = self.mod(vec, seq_index)
        qkv, mlp = self.linear1(_modulate(self.pre_norm(h), shift, scale)).split(
            [3 * d, self.mlp_hidden], dim=-1
        )
        q, k, v = qkv.reshape(T, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.qk_norm(q, k)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = self.attn(q, k, v, meta).reshape(T, d)
        return h + gate * self.linear2(torch.cat([a, F.gelu(mlp, approximate="tanh")], dim=-1))


class LastLayer(nn.Module):
    def __init__(self, cfg: MMDiTConfig):
        super().__init__()
        self.norm = LayerNorm32(cfg.d_model, elementwise_affine=False, eps=1e-6)
        self.mod = Modulation(cfg.d_model, 2)
        self.linear = nn.Linear(cfg.d_model, cfg.patch_dim)

    def forward(self, h: torch.Tensor, vec: torch.Tensor, seq_index: torch.Tensor) -> torch.Tensor:
        shift, scale = self.mod(vec, seq_index)
        return self.linear(_modulate(self.norm(h), shift, scale))


class MMDiT(nn.Module):
    """FLUX-shaped MMDiT on packed sequences; ``forward(batch) -> [T_img, patch_dim]``."""

    def __init__(self, cfg: MMDiTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.img_in = nn.Linear(cfg.patch_dim, d)
        self.txt_in = nn.Linear(cfg.text_dim, d)
        self.time_in = MLPEmbedder(cfg.time_dim, d)
        self.vector_in = MLPEmbedder(cfg.pooled_dim, d)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(cfg) for _ in range(cfg.depth_double))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(cfg) for _ in range(cfg.depth_single))
        self.final_layer = LastLayer(cfg)
        self.dispatcher: nn.Module = LocalDispatcher()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """PyTorch's default init for every layer, then adaLN-Zero: every modulation projection
        (shift/scale/gate of the blocks, shift/scale of the final layer) is zero, so each block
        starts as the identity on its residual stream (gates 0) and training grows the blocks
        from there, as DiT and FLUX train. The output projection keeps its random init, so the
        first step already sends gradients to the modulations. Called by ``__init__``; call it
        again after materialising a model built on the meta device (torchtitan style)."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()
        for m in self.modules():
            if isinstance(m, Modulation):
                nn.init.zeros_(m.lin.weight)
                nn.init.zeros_(m.lin.bias)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        cfg = self.cfg
        check_batch(batch, cfg)
        # The weights' dtype is the compute dtype (bf16 under FSDP2 mixed precision, whose
        # unsharded parameters are in place during the forward): inputs are cast to it here.
        dtype = self.img_in.weight.dtype
        wide = _wide(dtype)
        is_img = batch.is_img
        host = batch.is_img_host
        if host is not None:  # host tables: no read of device data
            img_np, _, inv_np = _split_order(np.asarray(host, dtype=bool))
            img_idx, inv = upload_table(img_np, is_img.device), upload_table(inv_np, is_img.device)
        else:  # two nonzero (on CUDA, host syncs)
            img_idx = torch.nonzero(is_img).flatten()
            order = torch.cat([img_idx, torch.nonzero(~is_img).flatten()])
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel(), device=order.device)
        h = torch.cat([self.img_in(batch.img.to(dtype)), self.txt_in(batch.txt.to(dtype))])
        h = h.index_select(0, inv)
        cond = torch.cat([batch.timesteps[:, None].to(wide), batch.pooled.to(wide)], dim=1)
        state = TokenState(
            h=h,
            positions=batch.positions,
            kind=is_img.to(torch.int64),
            seq_ids=batch.seq_ids(),
            seq_lens=list(batch.seq_lens),
            cond=cond,
            kind_host=None if host is None else np.asarray(host, dtype=np.int64),
            seq_ids_host=batch.seq_ids_host(),
        )
        dt = self.dispatcher.dispatch(state)
        temb = timestep_embedding(dt.cond[:, 0], cfg.time_dim)
        vec = self.time_in(temb.to(dtype)) + self.vector_in(dt.cond[:, 1:].to(dtype))
        rope = rope_nd(dt.positions, cfg.axes_dim, cfg.rope_theta, dtype=wide)
        streams = dt.streams()
        x = dt.h
        for block in self.double_blocks:
            x = block(x, vec, rope, streams, dt.attn_meta)
        for block in self.single_blocks:
            x = block(x, vec, rope, dt.seq_index, dt.attn_meta)
        out = self.dispatcher.combine(self.final_layer(x, vec, dt.seq_index))
        return out.index_select(0, img_idx)

    @property
    def blocks(self) -> list[nn.Module]:
        return [*self.double_blocks, *self.single_blocks]
