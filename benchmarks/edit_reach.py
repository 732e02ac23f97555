"""Where an edit went and what it set there, per Gaussian: reach against value.

The evaluation scores pixels.  This splits a method's result on the Gaussians an edit changed
into two questions: did it move them (reach: the share of the changed Gaussians whose colour
moved), and did it set them right (exact: the share within 0.02 of the true colour); and it
counts what it moved that the edit left alone (strays, as a share of the unchanged Gaussians).
For the model it also gives the mean hypothesis mix (seen change, affine recolour, shading) on
the changed Gaussians the edit views see, and on those they do not: where the choice between a
Gaussian's own least-squares change and a fitted map decides the value.

    python benchmarks/edit_reach.py [--suite distractor] [--kind recolor] [--seeds 32-63]
        [--methods model,diffusion,rule] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

MOVED = 1e-3  # a Gaussian whose base colour moved by more than this (any channel) was edited
EXACT = 0.02  # ... and one within this of the true colour (every channel) was set right


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]  # NaN: nothing to measure on that seed
    return sum(xs) / len(xs) if xs else None


def _share(mask: torch.Tensor, of: torch.Tensor) -> float:
    n = int(of.sum())
    return int((mask & of).sum()) / n if n else float("nan")


def _model_mix(model, method, seq, state) -> dict[str, list[float] | None]:
    """Mean hypothesis mix of the model's edit on the changed Gaussians, seen and unseen
    (`state`: the session's before the edit, Stage I's latent included)."""
    from splatpainter.edit.methods import build_edit_sample
    from splatpainter.eval.suite import UNSEEN_WEIGHT

    step = seq.steps[0]
    with torch.no_grad():
        sample = build_edit_sample(
            seq.source, step.views, state["latent"], hint=method.kind,
            settings=model.stage2.config.signal_settings(),
        )  # fmt: skip
        mix = model.stage2([sample], state["fast"])[0][0]["mix"]
    seen = sample.signals.in_mask_weight >= UNSEEN_WEIGHT
    out: dict[str, list[float] | None] = {}
    for name, sel in (("mix_seen", seen & step.changed), ("mix_unseen", ~seen & step.changed)):
        out[name] = [round(float(v), 3) for v in mix[sel].mean(0)] if bool(sel.any()) else None
    return out


def run(suite: str, kind: str, seeds, methods: list[str], weights) -> dict[str, Any]:
    from rich.progress import Progress

    from splatpainter.assets.gaussians import sh_dc_to_rgb
    from splatpainter.edit import EditSession, ModelMethod
    from splatpainter.eval.suite import EvalConfig, build_methods, load_model, make_sequence

    model, label = load_model(weights)
    cfg = EvalConfig(seeds=tuple(seeds), methods=tuple(methods), kinds=(kind,), suites=(suite,))
    by_name = build_methods(cfg, model)
    rows = []
    with Progress(transient=True) as bar:
        task = bar.add_task(f"{suite} {kind}", total=len(seeds) * len(methods))
        for seed in seeds:
            seq = make_sequence(seed, cfg.edit_spec(kind, suite))
            step = seq.steps[0]
            before = sh_dc_to_rgb(seq.source.sh[:, 0, :], clamp=False)
            changed = step.changed
            for name in methods:
                method = by_name[name]  # built with kind "auto", as users run it
                session = EditSession(seq.source, method)
                before_edit = session.state
                out = session.apply(step.views)
                after = sh_dc_to_rgb(out.sh[:, 0, :], clamp=False)
                moved = (after - before).abs().amax(-1) > MOVED
                exact = (after - step.colors).abs().amax(-1) <= EXACT
                row = {
                    "seed": seed,
                    "method": name,
                    "changed": int(changed.sum()),
                    "reach": _share(moved, changed),
                    "exact": _share(exact, changed),
                    "strays": _share(moved, ~changed),
                }
                if isinstance(method, ModelMethod):
                    row |= _model_mix(model, method, seq, before_edit)
                rows.append(row)
                bar.advance(task)
    summary = {
        name: {
            key: _mean([r[key] for r in rows if r["method"] == name])
            for key in ("reach", "exact", "strays")
        }
        for name in methods
    }
    return {"weights": label, "suite": suite, "kind": kind, "seeds": list(seeds), "rows": rows,
            "mean": summary}  # fmt: skip


def _pct(v: float | None) -> str:
    return "    -" if v is None or v != v else f"{100 * v:5.1f}"


def main(argv=None) -> int:
    from splatpainter.eval.suite import parse_seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="distractor", help="procedural, distractor or capture")
    ap.add_argument("--kind", default="recolor", help="the edit kind (the methods run in auto)")
    ap.add_argument("--seeds", default="32-63", help="A-B, A or a comma list")
    ap.add_argument("--methods", default="model,diffusion,rule", help="comma list")
    ap.add_argument("--weights", default=None, help="editor weights (default: the shipped ones)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    rep = run(a.suite, a.kind, parse_seeds(a.seeds), a.methods.split(","), a.weights)
    if a.json:
        json.dump(rep, sys.stdout)
        print()
        return 0
    print(f"{rep['suite']} {rep['kind']}, kind auto, {len(rep['seeds'])} seeds; {rep['weights']}")
    print("shares in %: reach = changed Gaussians moved, exact = changed ones within "
          f"{EXACT} of the truth, strays = unchanged ones moved")  # fmt: skip
    print(f"{'seed':>5} {'method':>10} {'changed':>8} {'reach':>6} {'exact':>6} {'strays':>6}  "
          "model mix (seen change, affine, shading) on changed: seen / unseen")  # fmt: skip
    for r in rep["rows"]:
        mix = ""
        if "mix_seen" in r:
            mix = f"  {r['mix_seen']} / {r['mix_unseen']}"
        print(f"{r['seed']:>5} {r['method']:>10} {r['changed']:>8} {_pct(r['reach']):>6} "
              f"{_pct(r['exact']):>6} {_pct(r['strays']):>6}{mix}")  # fmt: skip
    for name, m in rep["mean"].items():
        print(f"mean {name:>10}          {_pct(m['reach']):>6} {_pct(m['exact']):>6} "
              f"{_pct(m['strays']):>6}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
