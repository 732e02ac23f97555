"""Does the same training config and seed give the same losses?  The first --steps logged losses
of one phase of a config, run afresh, compared bit for bit with a logged run (--against: the
phase's log.jsonl of that run, e.g. the run that made the shipped weights) or, without it, with a
second fresh run.

    python benchmarks/train_repeat.py --config configs/splatpainter/editor.toml \
        --phase propagate --init runs/editor-phase3.safetensors \
        --against runs/editor/4-propagate/log.jsonl [--steps 50] [--json]

A phase after the first needs the weights it starts from (--init, as `splatpainter train
--from-phase` does).  Training data come from the config's data cache (built when missing).
Prints how many of the first --steps losses are bit-identical, the first step that differs and
the largest difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def first_losses(log: Path, steps: int) -> list[float]:
    """The losses of the first `steps` rows of a phase's log.jsonl (steps counted in the phase)."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] < steps]
    rows.sort(key=lambda r: r["step"])
    if len(rows) < steps:
        raise SystemExit(f"{log}: only {len(rows)} logged steps, need {steps}")
    return [float(r["loss"]) for r in rows]


def fresh_losses(config: Path, phase: str | None, init: Path | None, steps: int) -> list[float]:
    """Train the phase's first `steps` steps in a temporary folder; its logged losses."""
    from rich.progress import Progress

    from splatpainter.train.config import load_config
    from splatpainter.train.loop import train

    cfg = load_config(config)
    names = [p.name for p in cfg.phases]
    first = names.index(phase) if phase is not None else 0
    offset = sum(p.config.optim.steps for p in cfg.phases[:first])
    with (
        tempfile.TemporaryDirectory(prefix="train-repeat-") as tmp,
        Progress(transient=True) as bar,
    ):
        task = bar.add_task(f"training the first {steps} steps", total=steps)
        train(
            cfg, tmp, stop_after=offset + steps, from_phase=phase, init=init,
            on_step=lambda step, row: bar.advance(task),
        )  # fmt: skip
        logs = sorted(Path(tmp).glob("*/log.jsonl")) if cfg.phases else [Path(tmp, "log.jsonl")]
        return first_losses(logs[-1], steps)


def compare(a: list[float], b: list[float]) -> dict[str, object]:
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return {
        "steps": len(a),
        "identical": len(a) - len(differ),
        "first_differing_step": differ[0] if differ else None,
        "max_abs_diff": max(diffs) if diffs else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/splatpainter/editor.toml"))
    ap.add_argument("--phase", default=None, help="the phase to run (default: the first)")
    ap.add_argument("--init", type=Path, default=None, help="weights the phase starts from")
    ap.add_argument("--against", type=Path, default=None, help="log.jsonl of the run to match")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    if args.against is not None and not args.against.is_file():
        ap.error(f"--against {args.against}: no such file")
    reference = (
        first_losses(args.against, args.steps)
        if args.against is not None
        else fresh_losses(args.config, args.phase, args.init, args.steps)
    )
    again = fresh_losses(args.config, args.phase, args.init, args.steps)
    result = {
        "config": str(args.config),
        "phase": args.phase,
        "against": str(args.against) if args.against else "a second fresh run",
        **compare(reference, again),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['identical']} of {result['steps']} logged losses identical to "
            f"{result['against']} (max |difference| {result['max_abs_diff']:.3g})"
        )
    return 0 if result["identical"] == result["steps"] else 1


if __name__ == "__main__":
    sys.exit(main())
