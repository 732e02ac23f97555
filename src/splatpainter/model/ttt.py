"""LaCT test-time-training layer ("Test-Time Training Done Right", arXiv 2505.23884).

The layer keeps a small per-head SwiGLU MLP, the *fast weights*, as explicit state:

    f(x) = W1 (silu(W0 x) * (W2 x))          W0, W2: [m, d]   W1: [d, m]

`update(state, tokens)` takes one large chunk of tokens (e.g. every patch of the edit views),
forms keys/values/learning rates from them and does one step on the loss

    L = -sum_i lr_i <f(k_i), v_i>

(one learning rate per token, head and matrix).  The gradient is written out in closed form
(no autograd inside the update), orthogonalised with a few Newton-Schulz (Muon) iterations,
subtracted from the weights, and each weight row is rescaled back to its previous norm so the
state stays bounded however many edits come.  Everything is ordinary differentiable torch code,
so an outer training loop can back-propagate through updates (meta-learning the initial weights
and projections).

`apply(state, tokens)` reads from the fast weights: queries q, output f(q), per-head RMSNorm,
output projection.  Each token is independent, so applying in chunks equals one shot.

State is functional: `FastWeights` goes in and a new one comes out, so an edit session can keep,
save, restore or reset it.  An optional anchor (EMA of past weights) damps long edit sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

# Muon's quintic Newton-Schulz coefficients: fast push of all singular values into ~[0.7, 1.2].
MUON_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
# Classic cubic iteration: slower, but converges to exactly orthogonal.
CUBIC_COEFFS: tuple[float, float, float] = (1.5, -0.5, 0.0)


@dataclass
class TTTConfig:
    """Sizes and options of one TTT layer."""

    dim: int = 128
    num_heads: int = 4
    hidden_ratio: int = 2  # fast-weight hidden size m = hidden_ratio * head_dim
    ns_steps: int = 5
    ns_coeffs: tuple[float, float, float] = MUON_COEFFS
    base_lr: float = 0.01  # softplus(linear(x) + softplus^-1(base_lr))
    damping: float = 0.0  # 0 = off; fraction pulled toward the anchor after each update
    anchor_ema: float = 0.9  # anchor <- ema * anchor + (1 - ema) * new weights

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def __post_init__(self) -> None:
        if self.dim % self.num_heads != 0:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if not 0.0 <= self.damping < 1.0:
            raise ValueError(f"damping must be in [0, 1), got {self.damping}")
        self.ns_coeffs = tuple(float(c) for c in self.ns_coeffs)  # type: ignore[assignment]


@dataclass
class FastWeights:
    """Per-sample, per-head fast weights (the TTT state).

    w0, w2: [B, H, m, d]; w1: [B, H, d, m].  `anchor` holds EMA copies (w0, w1, w2) when damping
    is enabled; `num_updates` counts update steps (for bookkeeping and the anchor warm-up).
    """

    w0: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    anchor: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    num_updates: int = field(default=0)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.w0, self.w1, self.w2

    def detach(self) -> FastWeights:
        anchor = None if self.anchor is None else tuple(a.detach() for a in self.anchor)
        return replace(
            self, w0=self.w0.detach(), w1=self.w1.detach(), w2=self.w2.detach(), anchor=anchor
        )

    def clone(self) -> FastWeights:
        anchor = None if self.anchor is None else tuple(a.clone() for a in self.anchor)
        return replace(
            self, w0=self.w0.clone(), w1=self.w1.clone(), w2=self.w2.clone(), anchor=anchor
        )

    def to_dict(self) -> dict:
        """Plain tensors and ints, for torch.save."""
        return {
            "w0": self.w0.detach().cpu(),
            "w1": self.w1.detach().cpu(),
            "w2": self.w2.detach().cpu(),
            "anchor": None if self.anchor is None else [a.detach().cpu() for a in self.anchor],
            "num_updates": int(self.num_updates),
        }

    @classmethod
    def from_dict(cls, d: dict, device: torch.device | str = "cpu") -> FastWeights:
        anchor = d.get("anchor")
        return cls(
            w0=d["w0"].to(device),
            w1=d["w1"].to(device),
            w2=d["w2"].to(device),
            anchor=None if anchor is None else tuple(a.to(device) for a in anchor),
            num_updates=int(d.get("num_updates", 0)),
        )


def swiglu_fast(
    x: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """f(x) = W1 (silu(W0 x) * (W2 x)) per head.  x: [B, H, T, d] -> [B, H, T, d]."""
    a = torch.einsum("bhtd,bhmd->bhtm", x, w0)
    b = torch.einsum("bhtd,bhmd->bhtm", x, w2)
    return torch.einsum("bhtm,bhdm->bhtd", F.silu(a) * b, w1)


def fast_weight_grads(
    k: torch.Tensor,
    v: torch.Tensor,
    lr: torch.Tensor,
    w0: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Closed-form gradients of L_j = -sum_t lr[t, j] <f(k_t), v_t> w.r.t. W_j, j = 0, 1, 2.

    k, v: [B, H, T, d]; lr: [B, H, T, 3] (column j weights the loss of matrix W_j).
    With a = W0 k, b = W2 k, h = silu(a) * b, o = W1 h and dL/do = -v:
        dL/dW1 = -v h^T,  dL/dh = -W1^T v,
        dL/da = dL/dh * b * silu'(a),  dL/db = dL/dh * silu(a),
        dL/dW0 = dL/da k^T,  dL/dW2 = dL/db k^T.
    """
    a = torch.einsum("bhtd,bhmd->bhtm", k, w0)
    b = torch.einsum("bhtd,bhmd->bhtm", k, w2)
    sig = torch.sigmoid(a)
    sa = a * sig
    h = sa * b
    gh = -torch.einsum("bhtd,bhdm->bhtm", v, w1)
    dsilu = sig * (1.0 + a * (1.0 - sig))
    da = gh * b * dsilu
    db = gh * sa
    g0 = torch.einsum("bhtm,bhtd->bhmd", da * lr[..., 0:1], k)
    g1 = -torch.einsum("bhtd,bhtm->bhdm", v * lr[..., 1:2], h)
    g2 = torch.einsum("bhtm,bhtd->bhmd", db * lr[..., 2:3], k)
    return g0, g1, g2


def newton_schulz(
    g: torch.Tensor,
    steps: int = 5,
    coeffs: tuple[float, float, float] = MUON_COEFFS,
    eps: float = 1e-7,
) -> torch.Tensor:
    """Approximately orthogonalise the last two dims of `g` (Muon's iteration).

    X <- a X + (b A + c A^2) X with A = X X^T, after scaling X to unit Frobenius norm so every
    singular value starts in (0, 1].  A zero gradient stays exactly zero (no spurious update).
    """
    a, b, c = coeffs
    transposed = g.shape[-2] > g.shape[-1]
    x = g.transpose(-2, -1) if transposed else g
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    for _ in range(steps):
        gram = x @ x.transpose(-2, -1)
        poly = b * gram + c * (gram @ gram) if c != 0.0 else b * gram
        x = a * x + poly @ x
    return x.transpose(-2, -1) if transposed else x


def _renorm_rows(new: torch.Tensor, old_norm: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    return new * (old_norm / new.norm(dim=-1, keepdim=True).clamp_min(eps))


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a learned gain (per-head when used on [.., H, d])."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TTTLayer(nn.Module):
    """One LaCT layer: `update` writes a token chunk into fast weights, `apply` reads them."""

    def __init__(self, config: TTTConfig) -> None:
        super().__init__()
        self.config = config
        h, d = config.num_heads, config.head_dim
        m = config.hidden_ratio * d
        self.qkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.lr_proj = nn.Linear(config.dim, 3 * h)
        nn.init.normal_(self.lr_proj.weight, std=0.02)
        nn.init.zeros_(self.lr_proj.bias)
        self.lr_offset = math.log(math.expm1(config.base_lr))  # softplus^-1(base_lr)
        # Learned initial fast weights (shared by all samples; expanded per batch).
        self.w0 = nn.Parameter(torch.randn(h, m, d) / math.sqrt(d))
        self.w1 = nn.Parameter(torch.randn(h, d, m) / math.sqrt(m))
        self.w2 = nn.Parameter(torch.randn(h, m, d) / math.sqrt(d))
        self.out_norm = RMSNorm(d)
        self.out_proj = nn.Linear(config.dim, config.dim, bias=False)

    # -- state ---------------------------------------------------------------------------
    def init_state(self, batch: int = 1) -> FastWeights:
        """Fresh fast weights (the learned initial ones) for `batch` samples."""
        w0, w1, w2 = (w.unsqueeze(0).expand(batch, *w.shape) for w in (self.w0, self.w1, self.w2))
        anchor = (w0, w1, w2) if self.config.damping > 0 else None
        return FastWeights(w0=w0, w1=w1, w2=w2, anchor=anchor, num_updates=0)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.config.num_heads, self.config.head_dim).transpose(1, 2)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = F.silu(self.qkv(x)).chunk(3, dim=-1)
        q = F.normalize(self._heads(q), dim=-1)
        k = F.normalize(self._heads(k), dim=-1)
        return q, k, self._heads(v)

    def learning_rates(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token, per-head, per-matrix learning rates: [B, H, T, 3]."""
        b, t, _ = x.shape
        lr = F.softplus(self.lr_proj(x) + self.lr_offset)
        return lr.view(b, t, self.config.num_heads, 3).transpose(1, 2)

    # -- write ---------------------------------------------------------------------------
    def update(
        self,
        state: FastWeights,
        tokens: torch.Tensor,
        token_weight: torch.Tensor | None = None,
    ) -> FastWeights:
        """One closed-form Muon step on the whole chunk `tokens` [B, T, D].

        `token_weight` [B, T] (e.g. 0 for padding) multiplies the learning rates.  A sample whose
        weights are all zero keeps its fast weights unchanged.
        """
        cfg = self.config
        _, k, v = self._qkv(tokens)
        lr = self.learning_rates(tokens)
        if token_weight is not None:
            lr = lr * token_weight[:, None, :, None].to(lr.dtype)
        grads = fast_weight_grads(k, v, lr, *state.tensors())
        new = []
        for w, g in zip(state.tensors(), grads, strict=True):
            old_norm = w.norm(dim=-1, keepdim=True)
            w_new = w - newton_schulz(g, cfg.ns_steps, cfg.ns_coeffs)
            new.append((w_new, old_norm))
        anchor = state.anchor
        out = []
        for j, (w_new, old_norm) in enumerate(new):
            if anchor is not None and cfg.damping > 0:
                w_new = (1.0 - cfg.damping) * w_new + cfg.damping * anchor[j]
            out.append(_renorm_rows(w_new, old_norm))
        if anchor is not None:
            e = cfg.anchor_ema
            anchor = tuple(e * a + (1.0 - e) * w for a, w in zip(anchor, out, strict=True))
        # Samples with no signal at all keep their weights bit-exactly.
        if token_weight is not None:
            live = (token_weight != 0).any(dim=1).view(-1, 1, 1, 1)
            out = [
                torch.where(live, w, w_old) for w, w_old in zip(out, state.tensors(), strict=True)
            ]
            if anchor is not None and state.anchor is not None:
                anchor = tuple(
                    torch.where(live, a, a_old)
                    for a, a_old in zip(anchor, state.anchor, strict=True)
                )
        return FastWeights(
            w0=out[0], w1=out[1], w2=out[2], anchor=anchor, num_updates=state.num_updates + 1
        )

    # -- read ----------------------------------------------------------------------------
    def apply(self, state: FastWeights, tokens: torch.Tensor) -> torch.Tensor:
        """Read the fast weights with queries from `tokens` [B, N, D] -> [B, N, D]."""
        q, _, _ = self._qkv(tokens)
        o = self.out_norm(swiglu_fast(q, *state.tensors()))
        b, _, n, _ = o.shape
        return self.out_proj(o.transpose(1, 2).reshape(b, n, self.config.dim))
