"""Time for the same held-out quality: the model's edit against per-edit optimisation.

For each edit kind and evaluation seed (never training seeds), the model edits once; optimisation
(Adam on SH DC, as `splatpainter evaluate`'s "optimize") runs with a ladder of step counts.  Per
kind, the mean held-out changed-pixel PSNR and seconds per edit of each; the first rung whose
PSNR reaches the model's gives the time ratio optimisation / model ("not reached" when even the
last rung stays below; its time ratio is then a lower bound).

    python benchmarks/edit_time_to_quality.py [--json] [--seeds 0-7] [--kinds paint,recolor]
        [--steps 25,50,100,200,500] [--prior-px P] [--weights W]

--prior-px sets optimisation's pull toward each Gaussian's colour (default: OptimizeMethod's).

Runs the same scoring code as `splatpainter evaluate` (eval.suite.evaluate_edit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any


def run(seeds, kinds, ladder, weights, prior_px=None) -> dict[str, Any]:
    from rich.progress import Progress

    from splatpainter.edit import ModelMethod, OptimizeMethod
    from splatpainter.eval.suite import EvalConfig, evaluate_edit, load_model
    from splatpainter.train.data import make_sequence

    model, label = load_model(weights)
    cfg = EvalConfig(seeds=tuple(seeds), kinds=tuple(kinds)).validate()
    methods: dict[str, Any] = {"model": ModelMethod(model)}
    prior = {} if prior_px is None else {"prior_px": prior_px}
    methods.update({f"optimize@{k}": OptimizeMethod(steps=k, **prior) for k in ladder})
    out: dict[str, Any] = {
        "weights": label,
        "seeds": list(seeds),
        "ladder": list(ladder),
        "prior_px": methods[f"optimize@{ladder[0]}"].prior_px,
    }
    first = make_sequence(seeds[0], cfg.edit_spec(kinds[0]))
    evaluate_edit(first, {"model": methods["model"], "warm-up": OptimizeMethod(steps=1)})
    with Progress(transient=True) as bar:
        task = bar.add_task("edits", total=len(seeds) * len(kinds))
        for kind in kinds:
            rows: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
            for seed in seeds:
                scores, _, _ = evaluate_edit(make_sequence(seed, cfg.edit_spec(kind)), methods)
                for m, s in scores.items():
                    rows[m].append((s["psnr_changed"], s["seconds_per_edit"]))
                bar.advance(task)
            mean = {
                m: {
                    "psnr_changed": statistics.fmean(p for p, _ in r),
                    "seconds": statistics.fmean(t for _, t in r),
                }
                for m, r in rows.items()
            }
            target, t_model = mean["model"]["psnr_changed"], mean["model"]["seconds"]
            reached = next(
                (k for k in ladder if mean[f"optimize@{k}"]["psnr_changed"] >= target), None
            )
            rung = f"optimize@{reached if reached is not None else ladder[-1]}"
            out[kind] = {
                "methods": mean,
                "optimize_steps_to_match": reached,
                "time_ratio": mean[rung]["seconds"] / t_model,
                "time_ratio_is_lower_bound": reached is None,
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-7")
    p.add_argument("--kinds", default="paint,recolor,global,relight,detail")
    p.add_argument("--steps", default="25,50,100,200,500")
    p.add_argument("--prior-px", type=float, default=None)
    p.add_argument("--weights", default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    from splatpainter.eval.suite import parse_seeds

    ladder = sorted({int(s) for s in a.steps.split(",")})
    if a.prior_px is not None and not a.prior_px >= 0:
        p.error(f"--prior-px must be >= 0, got {a.prior_px}")
    res = run(parse_seeds(a.seeds), a.kinds.split(","), ladder, a.weights, a.prior_px)
    if a.json:
        json.dump(res, sys.stdout, indent=2)
        print()
        return
    print(
        f"weights {res['weights']}, seeds {a.seeds}, optimisation prior {res['prior_px']} px; "
        "mean changed-pixel PSNR (dB) / s per edit"
    )
    for kind in a.kinds.split(","):
        r = res[kind]
        cells = ", ".join(
            f"{m} {v['psnr_changed']:.2f}/{v['seconds']:.2f}s" for m, v in r["methods"].items()
        )
        steps = r["optimize_steps_to_match"]
        verdict = (
            f"optimisation matches the model at {steps} steps, {r['time_ratio']:.0f}x its time"
            if steps is not None
            else f"optimisation never matches it (>= {r['time_ratio']:.0f}x its time)"
        )
        print(f"{kind}: {cells}\n  -> {verdict}")


if __name__ == "__main__":
    main()
