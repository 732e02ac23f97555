"""The restricted-capacity lower bound keeps what does not depend on x per set of allowed
(sequence, class) pairs; this checks it against the bisection restated without that cache,
exactly (the bound is every plan's certificate and the search's target: equal floats)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knapformer.planning import BagLayout, CostModel
from knapformer.planning import solvers as S
from knapformer.planning.plan import validate_lengths
from knapformer.planning.solvers.bounds import _class_subsets

SPECS = [
    "g1n16+g2n4+g4n2",
    "g1n8+g2n4+g4n2+g8n1",
    "g8n2+g1n8+g8n1",
    "g1n24+g8n1",
    "g2n8+g4n4",
    "g1n8+g2n2+g4n1+g8n2",
]
COSTS = [
    CostModel.flops(3072, 1.0).scaled(57),
    CostModel.flops(1024, 0.4),
    CostModel(a=1.0, b=1e-4, c=0.3, e=50.0, name="general"),
]


def restated_bound(p: S.Problem, rel_tol: float = 1e-6) -> float:
    """The same bisection over the same tests, everything recomputed at every x."""
    lb0 = S.simple_lower_bound(p)
    K = p.class_sizes.shape[0]
    if p.n == 0 or K == 1:
        return lb0
    tc = p.tg[p.tg.max(axis=1) > lb0]
    if tc.shape[0] == 0:
        return lb0
    wc = tc * p.class_sizes[None, :]
    subsets = list(_class_subsets(K))
    gpus = np.bincount(p.cls, weights=p.sizes, minlength=K)
    caps = np.asarray([gpus[q].sum() for q in subsets])
    bags = np.bincount(p.cls, minlength=K)

    def too_many(x: float, members: np.ndarray, q: np.ndarray) -> bool:
        room = 0
        for k in np.flatnonzero(q).tolist():
            o = tc[:, k].argsort(kind="stable")
            vals = tc[o, k][members[o]]
            room += int(bags[k]) * int(vals.cumsum().searchsorted(x * (1 + 1e-12), side="right"))
            if room >= int(members.sum()):
                return False
        return True

    def refuted(x: float) -> bool:
        allowed = tc <= x
        if not allowed.any(axis=1).all():
            return True
        w = np.where(allowed, wc, np.inf).min(axis=1)
        inside = np.stack([~(allowed & ~q[None, :]).any(axis=1) for q in subsets], axis=1)
        if ((w @ inside) > x * caps * (1 + 1e-12)).any():
            return True
        for qi in np.flatnonzero(inside.any(axis=0)).tolist():
            if too_many(x, inside[:, qi], subsets[qi]):
                return True
        return too_many(x, np.ones(tc.shape[0], dtype=bool), np.ones(K, dtype=bool))

    lo = lb0
    if not refuted(lo):
        return lb0
    hi = 2.0 * lo
    while refuted(hi):
        lo, hi = hi, 2.0 * hi
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if refuted(mid) else (lo, mid)
    return float(lo)


# few long sequences (the bound is then above the simple one) up to many short ones
length = st.one_of(st.integers(1, 2048), st.integers(2048, 65536), st.integers(65536, 400_000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SPECS),
    st.sampled_from(COSTS),
    st.lists(st.lists(length, max_size=5), min_size=32, max_size=32),
)
def test_lower_bound_equals_the_restated_bisection(spec, cost, lengths):
    flat, src = validate_lengths(lengths, 32)
    p = S.build_problem(flat, src, BagLayout.parse(spec, 32, 24), cost, None, {})
    assert S.lower_bound(p) == restated_bound(p)
