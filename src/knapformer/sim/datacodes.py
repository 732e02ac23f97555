"""The paper's data-code grammar and a seeded sampler of per-rank sequence lengths.

A data code `g<G>b<B>i<R>f<F>s<S>` says: G ranks each carry B samples of resolution R with F
frames; S=0 treats frames as independent images (visual tokens = floor(R/16)^2 * F), S=1 is a
smooth video compressed in time (visual tokens = floor(R/16)^2 * max(floor(F/3.4), 1)). Codes are
joined by commas; the sum of G over the codes is the balance group's GPU count. Every sample also
gets 0-392 text tokens (uniform integers) and its visual tokens are jittered by x0.96-1.04, so
steps differ the way real batches do.

Pure: plain data in and out, numpy only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "MIXTURES",
    "TEXT_TOKENS_MAX",
    "DataCode",
    "DataCodeError",
    "LengthsFileError",
    "Mixture",
    "load_lengths_file",
    "parse_data_codes",
    "resolve_mixture",
    "sample_steps",
    "world_of",
]

#: The paper's three mixtures, each for a 32-GPU balance group.
MIXTURES: dict[str, str] = {
    "lowres": "g32b32i256f1s0",
    "mixres": "g16b4i256f1s0,g4b5i512f1s0,g4b5i1024f1s0,g8b1i2048f1s0",
    "joint": (
        "g8b4i256f1s0,g2b5i512f1s0,g2b5i1024f1s0,g4b1i2048f1s0,"
        "g1b10i256f4s0,g3b1i512f4s0,g8b2i256f85s1,g4b1i512f85s1"
    ),
}

TEXT_TOKENS_MAX = 392
JITTER = (0.96, 1.04)
PATCH = 16  # pixels per visual token side (8x VAE downsampling, 2x2 patches)

_CODE_RE = re.compile(r"g(\d+)b(\d+)i(\d+)f(\d+)s(\d+)")


class DataCodeError(ValueError):
    """A data code or mixture that cannot be used, with the reason."""


class LengthsFileError(ValueError):
    """A lengths JSON file that cannot be used, with the reason."""


@dataclass(frozen=True)
class DataCode:
    """One data code: `ranks` ranks, each with `batch` samples of one shape."""

    ranks: int
    batch: int
    resolution: int
    frames: int
    smooth: bool
    code: str

    @property
    def visual_tokens(self) -> int:
        """Visual tokens of one sample before jitter."""
        side = self.resolution // PATCH
        if self.smooth:
            # floor(F / 3.4) in exact integer arithmetic (3.4 is not a binary float)
            latent_frames = max((self.frames * 5) // 17, 1)
        else:
            latent_frames = self.frames
        return side * side * latent_frames


def _parse_one(code: str) -> DataCode:
    m = _CODE_RE.fullmatch(code)
    if m is None:
        raise DataCodeError(
            f"bad data code {code!r}: expected g<G>b<B>i<R>f<F>s<S> with integers, "
            "e.g. 'g8b2i256f85s1'"
        )
    g, b, r, f, s = (int(x) for x in m.groups())
    for name, value in (("G (ranks)", g), ("B (samples)", b), ("F (frames)", f)):
        if value < 1:
            raise DataCodeError(f"bad data code {code!r}: {name} must be >= 1, got {value}")
    if r < PATCH:
        raise DataCodeError(
            f"bad data code {code!r}: resolution {r} is below one {PATCH}-pixel patch"
        )
    if s not in (0, 1):
        raise DataCodeError(f"bad data code {code!r}: S must be 0 or 1, got {s}")
    return DataCode(ranks=g, batch=b, resolution=r, frames=f, smooth=bool(s), code=code)


@dataclass(frozen=True)
class Mixture:
    """Parsed data codes; `gpus` is the group's GPU count (sum of G)."""

    codes: tuple[DataCode, ...]
    text: str

    @property
    def gpus(self) -> int:
        return sum(c.ranks for c in self.codes)

    def rank_codes(self, world_size: int) -> list[DataCode]:
        """The data code of each global rank; replicas of the group tile the world.

        A mixture for G GPUs on k*G GPUs is k identical, independent replicas laid out
        contiguously (ranks 0..G-1, G..2G-1, ...); inside a replica each code's ranks are
        contiguous in the order the codes are written.
        """
        if world_size < 1:
            raise DataCodeError(f"--gpus must be >= 1, got {world_size}")
        if world_size % self.gpus != 0:
            raise DataCodeError(
                f"mixture {self.text!r} describes {self.gpus} GPUs; --gpus {world_size} is not "
                f"a multiple of {self.gpus} (a larger world is tiled with replicas of the mixture)"
            )
        one = [c for c in self.codes for _ in range(c.ranks)]
        return one * (world_size // self.gpus)


def parse_data_codes(text: str) -> Mixture:
    """Parse comma-joined data codes (whitespace around commas is ignored)."""
    if not isinstance(text, str) or not text.strip():
        raise DataCodeError("empty data codes: expected e.g. 'g16b4i256f1s0,g8b1i2048f1s0'")
    parts = [p.strip() for p in text.split(",")]
    for i, p in enumerate(parts):
        if not p:
            raise DataCodeError(f"bad data codes {text!r}: empty code at position {i + 1}")
    codes = tuple(_parse_one(p) for p in parts)
    return Mixture(codes=codes, text=",".join(parts))


def resolve_mixture(name: str) -> Mixture:
    """A named paper mixture (`lowres`, `mixres`, `joint`)."""
    if name not in MIXTURES:
        raise DataCodeError(f"unknown mixture {name!r}: choose one of {', '.join(MIXTURES)}")
    return parse_data_codes(MIXTURES[name])


def sample_steps(
    mixture: Mixture, world_size: int, steps: int, seed: int = 0
) -> list[list[list[int]]]:
    """Sample `steps` steps of per-rank sequence lengths: result[step][rank] = [len, ...].

    Seeded and deterministic: the same arguments give the same lengths.
    """
    if steps < 1:
        raise DataCodeError(f"--steps must be >= 1, got {steps}")
    per_rank = mixture.rank_codes(world_size)
    batch = np.array([c.batch for c in per_rank], dtype=np.int64)
    visual = np.repeat(np.array([c.visual_tokens for c in per_rank], dtype=np.float64), batch)
    splits = np.cumsum(batch)[:-1]
    rng = np.random.default_rng(seed)
    out: list[list[list[int]]] = []
    n = visual.size
    for _ in range(steps):
        jitter = rng.uniform(JITTER[0], JITTER[1], size=n)
        text = rng.integers(0, TEXT_TOKENS_MAX + 1, size=n)
        lengths = np.maximum(np.rint(visual * jitter).astype(np.int64), 1) + text
        out.append([part.tolist() for part in np.split(lengths, splits)])
    return out


def _check_ranks(obj: object, where: str) -> list[list[int]]:
    if not isinstance(obj, list) or not obj:
        raise LengthsFileError(f"{where}: expected a non-empty list of per-rank lists")
    ranks: list[list[int]] = []
    for r, row in enumerate(obj):
        if not isinstance(row, list):
            raise LengthsFileError(f"{where}: rank {r} is not a list of lengths")
        for x in row:
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise LengthsFileError(f"{where}: rank {r} has a bad length {x!r} (need int >= 1)")
        ranks.append(list(row))
    return ranks


def load_lengths_file(path: str | Path) -> list[list[list[int]]]:
    """Read steps of per-rank lengths from JSON.

    Accepted: `{"ranks": [[len, ...], ...]}` (one step, the `knapformer plan` format) or
    `{"steps": [{"ranks": [...]}, ...]}` / `{"steps": [[[len, ...], ...], ...]}` (several steps).
    """
    from appshell.inputs import InputFileError, load_json

    p = Path(path)
    try:
        data = load_json(p, what="lengths file")
    except InputFileError as exc:
        raise LengthsFileError(f"lengths file: {exc}") from None
    if not isinstance(data, dict) or not ({"ranks", "steps"} & data.keys()):
        raise LengthsFileError(
            f"lengths file {str(p)!r}: expected an object with 'ranks' or 'steps'"
        )
    if "ranks" in data:
        return [_check_ranks(data["ranks"], f"{p}: 'ranks'")]
    steps = data["steps"]
    if not isinstance(steps, list) or not steps:
        raise LengthsFileError(f"{p}: 'steps' must be a non-empty list")
    out = []
    for i, step in enumerate(steps):
        rows = step.get("ranks") if isinstance(step, dict) else step
        out.append(_check_ranks(rows, f"{p}: step {i}"))
    world = {len(s) for s in out}
    if len(world) != 1:
        raise LengthsFileError(f"{p}: steps disagree on the number of ranks: {sorted(world)}")
    return out


def world_of(steps: Sequence[Sequence[Sequence[int]]]) -> int:
    """Number of ranks in sampled/loaded steps."""
    return len(steps[0])
