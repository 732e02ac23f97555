"""``torchrun --standalone --nproc-per-node N -m knapformer.train --config FILE [flags]``."""

from __future__ import annotations

import argparse
import sys

from knapformer.train.config import ConfigError, check_world, load_config
from knapformer.train.launch import flag_overrides


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m knapformer.train", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--balancer", help="none | auto | a bag spec such as g1n2+g2n1")
    p.add_argument("--steps", type=int)
    p.add_argument("--log", help="JSONL log written by rank 0")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace checkpoints in the dir")
    p.add_argument("--data-codes")
    p.add_argument("--cost", help="flops | calibrate | PROFILE.json")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    a = p.parse_args(argv)
    try:
        cfg = load_config(
            a.config,
            flag_overrides(
                balancer=a.balancer,
                steps=a.steps,
                log=a.log,
                checkpoint_dir=a.checkpoint_dir,
                checkpoint_every=a.checkpoint_every,
                resume=a.resume,
                overwrite=a.overwrite,
                data_codes=a.data_codes,
                cost=a.cost,
                sets=a.set,
            ),
        )
        import os

        if os.environ.get("WORLD_SIZE", "").isdigit():
            check_world(cfg, int(os.environ["WORLD_SIZE"]))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    from appshell.cli import is_expected, one_line
    from knapformer.train.loop import train

    try:
        train(cfg)
    except Exception as exc:  # bad input or a damaged checkpoint: one line, not a traceback
        if not is_expected(exc):
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1 if isinstance(exc, OSError) else 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from knapformer.train.launch import leave_without_teardown

    leave_without_teardown(main())  # (see there: gloo can abort a finished rank at teardown)
