"""Synthetic heterogeneous image/video batches from the paper's data-code grammar.

Rank ``r`` of a ``world``-rank run draws its samples from the data code
``Mixture.rank_codes(world)[r]`` (``g<G>b<B>i<R>f<F>s<S>``, see :mod:`knapformer.sim.datacodes`):
B samples of resolution R with F frames (S=1: a smooth video, ``max(floor(F/3.4), 1)`` latent
frames). A sample is a latent grid of ``t x h x w`` tokens (``h = R // patch_px``, ``w`` jittered
by x0.96-1.04 so steps differ) plus 0..``text_tokens_max`` text tokens.

Everything is random but deterministic per sample: the generator of sample ``i`` of rank ``r``
at step ``k`` is seeded from ``(seed, k, r, i)``, so the data position of a run is just its step
(exact resume needs no data state beyond it). The objective is rectified flow: with clean latent
``x0``, noise ``e`` and ``t ~ sigmoid(N(0, 1))``, the model sees ``(1 - t) x0 + t e`` and
predicts the velocity ``e - x0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from knapformer.models.mmdit import MMDiTConfig, PackedBatch
from knapformer.sim.datacodes import DataCode, DataCodeError, Mixture, parse_data_codes

__all__ = ["DataCodeError", "SyntheticMixture", "TrainBatch", "sample_grid"]


@dataclass
class TrainBatch:
    """The model input and the rectified-flow target of its visual tokens."""

    batch: PackedBatch
    target: torch.Tensor  # [T_img, patch_dim]

    @property
    def seq_lens(self) -> list[int]:
        return self.batch.seq_lens


def sample_grid(code: DataCode, patch_px: int, u: float) -> tuple[int, int, int]:
    """(t, h, w) latent grid of one sample of ``code`` with width jitter ``u``."""
    side = max(code.resolution // patch_px, 1)
    frames = max((code.frames * 5) // 17, 1) if code.smooth else code.frames
    return frames, side, max(round(side * u), 1)


class SyntheticMixture:
    """Deterministic per-rank batches for a mixture of data codes on ``world_size`` ranks."""

    def __init__(
        self,
        codes: str | Mixture,
        model: MMDiTConfig,
        world_size: int,
        *,
        text_tokens_max: int = 32,
        patch_px: int = 16,
        seed: int = 0,
        jitter: tuple[float, float] = (0.96, 1.04),
    ) -> None:
        self.mixture = parse_data_codes(codes) if isinstance(codes, str) else codes
        if text_tokens_max < 0:
            raise DataCodeError(f"text_tokens_max must be >= 0, got {text_tokens_max}")
        if patch_px < 1:
            raise DataCodeError(f"patch_px must be >= 1, got {patch_px}")
        if not (0 < jitter[0] <= jitter[1]):
            raise DataCodeError(f"jitter must be 0 < low <= high, got {jitter}")
        self.rank_codes = self.mixture.rank_codes(world_size)  # raises if the world does not fit
        self.model = model
        self.world_size = world_size
        self.text_tokens_max = text_tokens_max
        self.patch_px = patch_px
        self.seed = seed
        self.jitter = jitter

    def _rng(self, step: int, rank: int, i: int) -> tuple[np.random.Generator, torch.Generator]:
        ss = np.random.SeedSequence([self.seed, step, rank, i])
        g = torch.Generator().manual_seed(int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1)))
        return np.random.default_rng(ss), g

    def lengths(self, step: int, rank: int) -> list[int]:
        """Token counts of the rank's sequences at ``step`` (cheap: no tensors)."""
        code = self.rank_codes[rank]
        out = []
        for i in range(code.batch):
            rng, _ = self._rng(step, rank, i)
            t, h, w = sample_grid(code, self.patch_px, rng.uniform(*self.jitter))
            out.append(t * h * w + int(rng.integers(0, self.text_tokens_max + 1)))
        return out

    def batch(self, step: int, rank: int, dtype: torch.dtype = torch.float32) -> TrainBatch:
        """The rank's packed batch at ``step`` (text tokens first in each sequence)."""
        cfg = self.model
        code = self.rank_codes[rank]
        imgs, txts, kinds, poss, targets, lens, ts, pooled = [], [], [], [], [], [], [], []
        for i in range(code.batch):
            rng, g = self._rng(step, rank, i)
            t, h, w = sample_grid(code, self.patch_px, rng.uniform(*self.jitter))
            n_txt = int(rng.integers(0, self.text_tokens_max + 1))
            n_img = t * h * w
            x0 = torch.randn(n_img, cfg.patch_dim, generator=g, dtype=dtype)
            noise = torch.randn(n_img, cfg.patch_dim, generator=g, dtype=dtype)
            tt = torch.sigmoid(torch.randn((), generator=g, dtype=dtype))
            imgs.append((1 - tt) * x0 + tt * noise)
            targets.append(noise - x0)
            txts.append(torch.randn(n_txt, cfg.text_dim, generator=g, dtype=dtype))
            pooled.append(torch.randn(cfg.pooled_dim, generator=g, dtype=dtype))
            ts.append(tt)
            grid = torch.stack(
                torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"),
                dim=-1,
            ).reshape(-1, 3)
            poss.append(torch.cat([torch.zeros(n_txt, 3, dtype=torch.int64), grid]))
            kinds.append(torch.arange(n_txt + n_img) >= n_txt)
            lens.append(n_txt + n_img)
        batch = PackedBatch(
            img=torch.cat(imgs),
            txt=torch.cat(txts),
            is_img=torch.cat(kinds),
            positions=torch.cat(poss),
            seq_lens=lens,
            timesteps=torch.stack(ts),
            pooled=torch.stack(pooled),
        )
        return TrainBatch(batch, torch.cat(targets))
