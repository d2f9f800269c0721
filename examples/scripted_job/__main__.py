"""The command line: ``python -m examples.scripted_job [--base DIR] ...``; exit status 0
when every invariant held, 1 otherwise."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from examples.scripted_job.figures import DemoResult
from examples.scripted_job.job import MIN_CHECKPOINTS
from examples.scripted_job.runner import DEFAULT_CHECKPOINTS, DEFAULT_SEED, UsageError, run_demo


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.scripted_job",
        description="A scripted job on local files in each merging mode, written on the "
        "public API, every invariant checked against the real files.",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="keep the files under BASE/<mode> (default: a temporary directory, removed)",
    )
    parser.add_argument(
        "--checkpoints",
        type=int,
        default=DEFAULT_CHECKPOINTS,
        help=f"checkpoints to complete per mode before quiescing (at least {MIN_CHECKPOINTS}; "
        f"default {DEFAULT_CHECKPOINTS})",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the state sizes")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="name files with CounterIds (the reference model's names) instead of uuids",
    )
    parser.add_argument("--summary", action="store_true", help="no per-checkpoint tables")
    args = parser.parse_args(argv)

    def run(base: Path) -> DemoResult:
        return run_demo(
            base,
            checkpoints=args.checkpoints,
            seed=args.seed,
            deterministic=args.deterministic,
            per_checkpoint=not args.summary,
            out=out,
        )

    try:
        if args.base is not None:
            result = run(args.base)
        else:
            with tempfile.TemporaryDirectory(prefix="ckpt-scripted-job-") as tmp:
                result = run(Path(tmp))
    except UsageError as err:
        parser.error(str(err))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
