"""The README's edit-quality table from `splatpainter evaluate --json` reports, and issue #21's
targets checked on it.

The baselines do not depend on the weights, so they are evaluated once and the model's columns
(one report per suite, run side by side) are merged in:

    splatpainter evaluate --seeds 0-31 --methods backproject,rule,diffusion --no-forgetting \\
        --json > base.json
    splatpainter evaluate --seeds 0-31 --methods model,model_kind,model_init --no-forgetting \\
        --suites distractor --json > model-distractor.json      # and procedural, capture
    python benchmarks/eval_table.py base.json model-*.json [--before OLD.json] [--json]

A later report's method replaces an earlier one's for the same suite and kind.  `--before`
adds the model of another report as a column (the weights issue #21 calls today's).

Besides the mean over seeds of each seed's changed-pixel PSNR (the issue's figure, capped at
100 dB), it prints the same mean with every seed capped at 50 dB: a seed's changed pixels
within 0.8/255 of the truth are invisible, and a method that is exact there (a fitted map that
is the truth, to float rounding, at 70-100 dB) otherwise gains up to 1.6 dB of mean per such
seed over one that is merely invisible.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from typing import Any

from splatpainter.train.data import ALL_KINDS

SUITES = ("procedural", "distractor", "capture")
KINDS = ALL_KINDS  # the trained kinds, then the brush dab
VISIBLE_CAP_DB = 50.0
CAPPED = ("model", "rule", "diffusion", "diffusion_centred")  # the capped column's methods
COLUMNS = (
    ("back-proj.", "backproject"),
    ("rule", "rule"),
    ("diffusion", "diffusion"),
    ("diffusion, centred", "diffusion_centred"),
    ("**model**", "model"),
    ("model, true kind", "model_kind"),
    ("model, no learning", "model_init"),
)


def merge(reports: list[dict[str, Any]], before: dict[str, Any] | None = None) -> dict:
    """{(suite, kind): {method: {metric: mean, "capped": mean of per-seed capped PSNR}}}."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    tagged = [(r, "") for r in reports] + ([(before, "before")] if before else [])
    for report, rename in tagged:
        per_seed = defaultdict(list)
        for row in report.get("per_seed", []):
            per_seed[(row["suite"], row["kind"], row["method"])].append(row["psnr_changed"])
        for suite, section in report["suites"].items():
            for kind, k in section["kinds"].items():
                for method, metrics in k["methods"].items():
                    if rename and method != "model":
                        continue
                    vals = [v for v in per_seed[(suite, kind, method)] if v is not None]
                    capped = sum(min(v, VISIBLE_CAP_DB) for v in vals) / len(vals) if vals else None
                    out[(suite, kind)][rename or method] = dict(metrics, capped=capped)
    return out


def _get(cell: dict, method: str, key: str = "psnr_changed") -> float | None:
    v = cell.get(method, {}).get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _pair(cell: dict, key: str) -> str:
    return f"{_f(_get(cell, 'model', key))} / {_f(_get(cell, 'rule', key))}"


def markdown(table: dict, with_before: bool) -> str:
    cols = list(COLUMNS) + ([("before", "before")] if with_before else [])
    head = ["suite", "kind", *[c for c, _ in cols], "unchanged: model / rule",
            "bleed: model / rule", "capped at 50 dB: " + " / ".join(CAPPED)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suite in SUITES:
        for kind in KINDS:
            cell = table.get((suite, kind))
            if cell is None:
                continue
            vals = [_f(_get(cell, m)) for _, m in cols]
            bold = [m for _, m in cols].index("model")
            vals[bold] = f"**{vals[bold]}**"
            unchanged, bleed = (_pair(cell, key) for key in ("psnr_unchanged", "psnr_bleed"))
            capped = " / ".join(_f(_get(cell, m, "capped")) for m in CAPPED)
            row = [suite, kind, *vals, unchanged, bleed, capped]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets(table: dict, with_before: bool) -> list[dict[str, Any]]:
    """Issue #21's targets: rows {suite, kind, target, value} (value: the margin or figure)."""
    rows: list[dict[str, Any]] = []

    def add(suite, kind, target, value):
        rows.append({"suite": suite, "kind": kind, "target": target, "value": value})

    def diff(a, b):
        return None if a is None or b is None else round(a - b, 2)

    for (suite, kind), cell in sorted(table.items()):
        model = _get(cell, "model")
        add(suite, kind, "|auto - true kind| <= 1", diff(model, _get(cell, "model_kind")))
        bleed = _get(cell, "model", "psnr_bleed")
        if bleed is not None:
            add(suite, kind, "bleed >= 40", round(bleed, 2))
        if suite == "distractor" and kind == "recolor":
            rules = ("rule", "diffusion", "diffusion_centred")
            rivals = [v for v in (_get(cell, m) for m in rules) if v is not None]
            best = max(rivals, default=None)
            add(suite, kind, "model - best no-learning >= 3", diff(model, best))
            add(suite, kind, "model - no learning >= 3", diff(model, _get(cell, "model_init")))
        if suite == "procedural":
            add(suite, kind, "model - rule >= 0", diff(model, _get(cell, "rule")))
            if with_before:
                add(suite, kind, "model - before >= -0.5", diff(model, _get(cell, "before")))
        if suite == "capture" and kind in ("recolor", "global", "relight"):
            add(suite, kind, "model - backproject >= 3", diff(model, _get(cell, "backproject")))
        if suite == "capture":
            unchanged = _get(cell, "model", "psnr_unchanged")
            add(suite, kind, "unchanged >= 38", None if unchanged is None else round(unchanged, 2))
    return rows


def _read(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="`splatpainter evaluate --json` outputs")
    ap.add_argument("--before", help="a report whose model is shown as the column 'before'")
    ap.add_argument("--json", action="store_true", help="print the merged means and targets")
    args = ap.parse_args(argv)
    try:
        reports = [_read(p) for p in args.reports]
        before = _read(args.before) if args.before else None
    except (OSError, json.JSONDecodeError) as e:
        print(f"eval_table: cannot read a report: {e}", file=sys.stderr)
        return 2
    table = merge(reports, before)
    rows = targets(table, before is not None)
    if args.json:
        cells = {f"{s}/{k}": v for (s, k), v in sorted(table.items())}
        json.dump({"cells": cells, "targets": rows}, sys.stdout, indent=1)
        print()
        return 0
    print(markdown(table, before is not None))
    print()
    for r in rows:
        print(f"{r['suite']:>10} {r['kind']:>7}  {r['target']:<32} {r['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
