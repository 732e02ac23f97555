"""The auto-layout decision is the same as before the speed-ups of issue 11 (same layout on
every step, first step and steady state), and the cached pieces the chooser now uses are the
formulas they replace, computed directly.

``data/auto_decisions.json`` holds the decisions of the chooser at commit 2c269a0 (before the
speed-ups) on seeded steps of the paper mixtures and a video-heavy one, for two cost models;
``python tests/knapformer/test_kf_planning_auto_decisions.py --record`` rewrites it from the
current chooser (only after a deliberate change of the decisions)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from knapformer.distributed.autolayout import AutoLayout
from knapformer.planning import CostModel
from knapformer.planning import auto as auto_mod
from knapformer.planning.auto import _Step, allowed_bag_sizes, candidate_specs
from knapformer.sim.datacodes import MIXTURES, parse_data_codes, sample_steps

RECORD = Path(__file__).parent / "data" / "auto_decisions.json"
VIDEOHEAVY = "g4b2i256f1s0,g8b1i512f85s1,g8b2i256f85s1,g8b1i1024f43s1,g4b1i512f129s1"
MIXES = {"mixres": MIXTURES["mixres"], "joint": MIXTURES["joint"], "videoheavy": VIDEOHEAVY}
STEPS = 25


def _costs(cost_cls) -> dict[str, object]:
    """FLUX-size blocks, and the same with per-rank fixed costs (``f``, ``u``)."""
    base = cost_cls.flops(3072, 1.0).scaled(57)
    return {"flux": base, "flux_f_u": dataclasses.replace(base, f=2e12, u=5e12)}


def _steps(mix: str, k: int) -> list[list[list[int]]]:
    """Seeded steps of a mixture at ``k`` times its batch, on 32 GPUs."""
    text = re.sub(r"b(\d+)", lambda m: f"b{int(m.group(1)) * k}", MIXES[mix])
    return sample_steps(parse_data_codes(text), 32, STEPS, seed=11 + k)


def decisions(choose_layout, autolayout_cls, cost_cls) -> dict[str, dict[str, list[str]]]:
    """Per cost model, mixture and batch scale: the layout of every step as a first step (no
    current layout) and as the stateful chooser (hysteresis) picks them in sequence. Takes the
    chooser's parts as arguments so the record can come from another version of them."""
    out: dict[str, dict[str, list[str]]] = {}
    for cname, cost in _costs(cost_cls).items():
        for mix in MIXES:
            for k in (1, 3):
                data = _steps(mix, k)
                first = [choose_layout(s, 32, 24, 8, cost) for s in data]
                sched = autolayout_cls(32, 24, 8, cost)
                seq = [sched.decide(s)[0].spec for s in data]
                out[f"{cname}/{mix}/x{k}"] = {"first": first, "sequence": seq}
    return out


def test_decisions_are_the_recorded_ones():
    want = json.loads(RECORD.read_text())["decisions"]
    got = decisions(auto_mod.choose_layout, AutoLayout, CostModel)
    assert sorted(got) == sorted(want)
    assert sum(len(v["first"]) + len(v["sequence"]) for v in want.values()) >= 600
    for key, modes in want.items():
        for mode, specs in modes.items():
            diff = [(i, a, b) for i, (a, b) in enumerate(zip(specs, got[key][mode], strict=True))]
            diff = [d for d in diff if d[1] != d[2]]
            assert not diff, f"{key} {mode}: step, recorded, now: {diff[:5]}"


def _direct_simple_bound(step: _Step, spec: str) -> float:
    """The simple bound of a one-replica layout as it was computed before (per bag)."""
    layout = step.layout(spec)
    key = tuple(sorted(layout.bag_sizes))
    g = np.asarray(sorted(set(key)), dtype=np.float64)
    o = np.asarray(step.cost.rank_time(0.0, g), dtype=np.float64)
    fixed = float(sum(step.cost.rank_time(0.0, x) * x for x in key)) / step.world_size
    t = step.table.values[:, np.searchsorted(step.table.sizes, g)]
    if t.shape[0] == 0:
        return float(o.max())
    work = (t * g).min(axis=1)
    return float(max(work.sum() / step.world_size + fixed, (t + o).min(axis=1).max(), o.max()))


def _direct_sp_floor(step: _Step, spec: str, level: float) -> float:
    """The fractional-knapsack floor on split tokens as it was computed before the caches (a
    restatement of the same greedy, kept to pin the cached path to it bit for bit; its truth
    is checked independently, as a linear program, by `test_sp_floor_is_the_knapsack_lp`)."""
    sizes = step.layout(spec).bag_sizes
    n1, nbags = sizes.count(1), len(sizes)
    tot = step.total_tokens
    if tot == 0 or n1 == nbags:
        return 0.0
    if n1 == 0:
        return 1.0
    level -= float(step.cost.rank_time(0.0, 1))
    t1 = step.table.values[:, 0]
    o = np.lexsort((t1, -(step.flat / np.maximum(t1, 1e-300))))
    t1, tok = t1[o], step.flat[o].astype(np.float64)
    ok = t1 <= level
    cost = np.where(ok, t1, 0.0).cumsum()
    cap = n1 * level
    k = int(np.searchsorted(cost, cap, side="right"))
    g1 = float(np.where(ok[:k], tok[:k], 0.0).sum())
    if k < t1.size:
        rest = np.flatnonzero(ok[k:])
        if rest.size:
            j = k + int(rest[0])
            room = cap - (float(cost[k - 1]) if k else 0.0)
            g1 += tok[j] * min(1.0, room / t1[j]) if t1[j] > 0 else tok[j]
    return max(0.0, 1.0 - g1 / tot)


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("cname", ["flux", "flux_f_u"])
def test_cached_bounds_equal_the_direct_formulas(mix, cname):
    """``simple_bound`` (cached per set of bag sizes) and ``sp_floor`` (cached per level)
    give exactly what the direct per-bag computations give, on every candidate layout."""
    cost = _costs(CostModel)[cname]
    sizes = allowed_bag_sizes(32, 24, 8)
    for s in [*_steps(mix, 1)[:4], *_steps(mix, 3)[:4], [[] for _ in range(32)]]:
        step = _Step(s, 32, 24, cost, sizes)
        specs = candidate_specs(s, 32, 24, 8, cost, table=step.table, flat=step.flat)
        specs += ["g1n8+g2n4+g4n2+g8n1", "g8n1+g1n8+g2n4+g4n2", "g1n32", "g4n8"]
        for spec in specs:
            assert step.simple_bound(spec) == _direct_simple_bound(step, spec), spec
            for level in (step.simple_bound(spec), 1.3 * step.simple_bound(spec)):
                assert step.sp_floor(spec, level) == _direct_sp_floor(step, spec, level), spec


def _lp_sp_floor(step: _Step, spec: str, level: float) -> float:
    """The same floor from its definition, solved by HiGHS: the most tokens the one-GPU bags can
    hold, max sum tok_i x_i  s.t.  sum t_i x_i <= n1 (level - f), 0 <= x_i <= 1, and x_i = 0 for
    a sequence whose cost t_i = t(L_i, 1) alone exceeds level - f."""
    from scipy.optimize import linprog

    sizes = step.layout(spec).bag_sizes
    n1, tot = sizes.count(1), float(step.total_tokens)
    if tot == 0 or n1 == len(sizes):
        return 0.0
    if n1 == 0:
        return 1.0
    room = level - float(step.cost.rank_time(0.0, 1))
    t = np.asarray(step.table.values[:, 0], dtype=np.float64)
    tok = np.asarray(step.flat, dtype=np.float64)
    if room < 0:  # not even an empty bag fits under this level: no token can stay on one GPU
        return 1.0
    if t.size == 0:
        return 0.0
    upper = np.where(t <= room, 1.0, 0.0)
    unit = max(float(t.max()), room, 1e-300)  # costs reach 1e15: scale the row for the solver
    res = linprog(-tok / tok.max(), A_ub=t[None, :] / unit, b_ub=[n1 * room / unit],
                  bounds=list(zip(0 * upper, upper, strict=True)), method="highs")  # fmt: skip
    assert res.status == 0, res.message
    return max(0.0, 1.0 - float(-res.fun) * tok.max() / tot)


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_sp_floor_is_the_knapsack_lp(mix):
    """`sp_floor` equals the optimum of the fractional knapsack it bounds, solved as a linear
    program (no code shared with the planner's greedy)."""
    cost = _costs(CostModel)["flux_f_u"]
    sizes = allowed_bag_sizes(32, 24, 8)
    for s in [*_steps(mix, 1)[:3], *_steps(mix, 3)[:3]]:
        step = _Step(s, 32, 24, cost, sizes)
        for spec in ["g1n8+g2n4+g4n2+g8n1", "g1n16+g2n4+g4n2", "g1n32", "g4n8", "g1n24+g8n1"]:
            for level in (step.simple_bound(spec), 1.3 * step.simple_bound(spec)):
                want = _lp_sp_floor(step, spec, level)
                assert step.sp_floor(spec, level) == pytest.approx(want, rel=1e-7, abs=1e-9), spec


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORD.parent.mkdir(exist_ok=True)
    body = {"note": "auto-layout decisions; see this module's docstring"}
    body["decisions"] = decisions(auto_mod.choose_layout, AutoLayout, CostModel)
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(RECORD)
