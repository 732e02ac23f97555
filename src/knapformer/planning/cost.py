"""Per-GPU cost of a sequence placed in a bag: ``t(L, g) = (a*L + b*L^2)/g + c*L*(g-1)/g + e``.

``a``/``b`` are the linear (projections, MLP) and quadratic (attention) compute terms, split
evenly over the ``g`` GPUs of a bag; ``c`` models the Ulysses all-to-all traffic (the share
``(g-1)/g`` of a chunk that leaves each GPU) and ``e`` a fixed per-sequence overhead, paid by every
GPU of the bag (each runs one attention call per sequence of its bag).

``f`` and ``u`` are apart from ``t``: fixed costs of a step that a rank pays whatever sequences
it holds. ``f`` is paid by every rank (the per-call overheads of the blocks); ``u * (g-1)/g`` by
every rank of a ``g``-bag (the Ulysses exchange's per-call overheads: the agreement all-gathers,
the all-to-all calls, the relayout copies' calls). Neither depends on which sequences a bag gets,
so for a given layout they never change which plan is best and the solvers do not see them (their
lower bounds stay valid: they only add to every plan's loads); they belong to a rank's modelled
time (:meth:`CostModel.rank_time`), so that modelled ratios (max/mean, speedups) are not
overstated.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from appshell.atomic import atomic_open

__all__ = ["COEFFICIENTS", "TERMS", "CostModel", "CostModelError", "cost_terms"]

_PROFILE_KIND = "knapformer-cost-profile"
TERMS = ("a", "b", "c", "e")  # coefficient names, in the order of cost_terms' columns
#: Every coefficient, in one order: checks, arithmetic, serialisation, the fit, the online
#: refit (its feature columns) and the balancer's agreement all go through this tuple.
COEFFICIENTS = (*TERMS, "f", "u")


def _basis(k: int, L: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Column ``k`` of the cost formula's basis ``(L/g, L^2/g, L(g-1)/g, 1)`` (broadcast)."""
    if k == 0:
        return L / g
    if k == 1:
        return L * L / g
    if k == 2:
        return L * (g - 1.0) / g
    return np.ones(np.broadcast_shapes(L.shape, g.shape))


def cost_terms(L: Any, g: Any = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The basis of the cost formula, broadcast over ``L`` and ``g``:
    ``(L/g, L^2/g, L(g-1)/g, 1)``, so that ``t = a, b, c, e`` dotted with these."""
    L, g = np.asarray(L, dtype=np.float64), np.asarray(g, dtype=np.float64)
    shape = np.broadcast_shapes(L.shape, g.shape)
    cols = [_basis(k, L, g) for k in range(len(TERMS))]
    return tuple(np.broadcast_to(c, shape) for c in cols)  # type: ignore[return-value]


class CostModelError(ValueError):
    """Invalid cost-model coefficients or profile file."""


@dataclass(frozen=True)
class CostModel:
    """Cost coefficients; all non-negative so that the planner's lower bounds stay valid."""

    a: float
    b: float
    c: float = 0.0
    e: float = 0.0
    name: str = "custom"
    f: float = 0.0  # per rank and step, outside t (see the module docstring)
    u: float = 0.0  # per rank of a g-bag and step: u * (g-1)/g, outside t
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for k in COEFFICIENTS:
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise CostModelError(f"cost coefficient {k} must be a finite number, got {v!r}")
            if v < 0:
                raise CostModelError(f"cost coefficient {k} must be >= 0, got {v}")
            object.__setattr__(self, k, float(v))
        if self.a == 0 and self.b == 0:
            raise CostModelError("cost model needs a > 0 or b > 0 (otherwise nothing to balance)")

    @classmethod
    def flops(
        cls,
        d_model: int,
        gamma: float = 1.0,
        num_blocks: int = 1,
        a2a_flops_per_byte: float = 0.0,
        bytes_per_element: int = 2,
    ) -> CostModel:
        """The paper's ``W(L) = 24*L*d^2 + gamma*4*L^2*d`` per block (times ``num_blocks``).

        ``a2a_flops_per_byte`` (peak FLOP/s over all-to-all bytes/s, e.g. ~2000 for bf16 on
        NVLink) prices the Ulysses traffic in FLOP-equivalents: per token and block, q, k, v
        and the attention output (4*d elements) cross the bag, of which (g-1)/g leaves the GPU,
        i.e. ``c = 4 * d * bytes_per_element * a2a_flops_per_byte``.
        """
        if d_model < 1 or num_blocks < 1:
            raise CostModelError("d_model and num_blocks must be >= 1")
        if gamma < 0:
            raise CostModelError(f"gamma must be >= 0, got {gamma}")
        if a2a_flops_per_byte < 0 or bytes_per_element < 1:
            raise CostModelError("a2a_flops_per_byte must be >= 0 and bytes_per_element >= 1")
        name = f"flops(d={d_model},gamma={gamma:g},blocks={num_blocks}"
        if a2a_flops_per_byte:
            name += f",a2a={a2a_flops_per_byte:g}flop/B"
        return cls(
            a=24.0 * d_model * d_model * num_blocks,
            b=4.0 * gamma * d_model * num_blocks,
            c=4.0 * d_model * bytes_per_element * a2a_flops_per_byte * num_blocks,
            name=name + ")",
        )

    def values(self) -> tuple[float, ...]:
        """The coefficients in :data:`COEFFICIENTS` order."""
        return tuple(getattr(self, k) for k in COEFFICIENTS)

    def with_values(self, values: Any, name: str | None = None) -> CostModel:
        """This model with coefficients ``values`` (:data:`COEFFICIENTS` order) and ``name``."""
        vals = [float(v) for v in values]
        if len(vals) != len(COEFFICIENTS):
            raise CostModelError(f"need {len(COEFFICIENTS)} coefficients, got {len(vals)}")
        return CostModel(
            **dict(zip(COEFFICIENTS, vals, strict=True)),
            name=self.name if name is None else name,
            meta=dict(self.meta),
        )

    @property
    def coefficients(self) -> np.ndarray:
        """``[a, b, c, e]``: the weights of :func:`cost_terms`' columns."""
        return np.array([self.a, self.b, self.c, self.e])

    def t(self, L: Any, g: Any = 1) -> Any:
        """Per-GPU cost of a length-``L`` sequence in a ``g``-GPU bag (broadcasts over arrays)."""
        L, g = np.asarray(L, dtype=np.float64), np.asarray(g, dtype=np.float64)
        out = self.a * _basis(0, L, g)
        for k, coef in enumerate((self.b, self.c, self.e), start=1):
            if coef != 0.0:  # (zero terms skipped: the planner calls this on every step)
                out = out + coef * _basis(k, L, g)
        return out if out.ndim else float(out)

    def table(self, lengths: Any, sizes: Any) -> np.ndarray:
        """``[n, K]`` per-GPU cost of every sequence in a bag of every size: the one table the
        solvers plan with (override this, or ``t``, to plan with another cost)."""
        L = np.asarray(lengths, dtype=np.float64).reshape(-1, 1)
        g = np.asarray(sizes, dtype=np.float64).reshape(1, -1)
        return np.asarray(self.t(L, g), dtype=np.float64).reshape(L.shape[0], g.shape[1])

    def bag_overhead(self, g: Any) -> Any:
        """Per-step fixed cost of a rank in a ``g``-GPU bag: ``u * (g-1)/g`` (0 for ``g = 1``)."""
        g_arr = np.asarray(g, dtype=np.float64)
        out = self.u * (g_arr - 1.0) / g_arr
        return out if out.ndim else float(out)

    def rank_time(self, load: Any, g: Any = 1) -> Any:
        """Modelled step time of a rank whose sequences cost ``load`` (a sum of ``t``) in a
        ``g``-GPU bag: ``load + f + u * (g-1)/g``."""
        out = np.asarray(load, dtype=np.float64) + self.f + np.asarray(self.bag_overhead(g))
        return out if out.ndim else float(out)

    def work(self, L: Any, g: Any = 1) -> Any:
        """GPU-time of the sequence summed over the bag: ``g * t(L, g)``."""
        g_arr = np.asarray(g, dtype=np.float64)
        out = g_arr * np.asarray(self.t(L, g), dtype=np.float64)
        return out if out.ndim else float(out)

    def __add__(self, other: CostModel) -> CostModel:
        """Costs of consecutive blocks add coefficient-wise (t is linear in a, b, c, e)."""
        if not isinstance(other, CostModel):
            return NotImplemented
        summed = [x + y for x, y in zip(self.values(), other.values(), strict=True)]
        return CostModel(
            **dict(zip(COEFFICIENTS, summed, strict=True)), name=f"{self.name}+{other.name}"
        )

    def scaled(self, k: float) -> CostModel:
        """E.g. ``block.scaled(57)`` for 57 identical blocks."""
        if k < 0:
            raise CostModelError("scale must be >= 0")
        scaled = [v * k for v in self.values()]
        return CostModel(**dict(zip(COEFFICIENTS, scaled, strict=True)), name=f"{k:g}*{self.name}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = _PROFILE_KIND
        d["version"] = 1
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostModel:
        if not isinstance(d, dict):
            raise CostModelError("cost profile must be a JSON object")
        if d.get("kind", _PROFILE_KIND) != _PROFILE_KIND:
            raise CostModelError(f"not a cost profile (kind={d.get('kind')!r})")
        try:
            # a and b are required; the rest default to 0 (profiles written before c, e, f and
            # u existed have none of them)
            values = {k: d[k] if k in ("a", "b") else d.get(k, 0.0) for k in COEFFICIENTS}
            return cls(**values, name=str(d.get("name", "profile")), meta=dict(d.get("meta", {})))
        except KeyError as exc:
            raise CostModelError(f"cost profile is missing coefficient {exc.args[0]!r}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Atomic JSON write (temp file in the same directory + os.replace)."""
        with atomic_open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        from appshell.inputs import InputFileError, load_json

        try:
            d = load_json(path, what="cost profile")
        except InputFileError as exc:
            raise CostModelError(f"cannot read cost profile: {exc}") from None
        return cls.from_dict(d)
