"""Runs the scripted job in each merging mode, each on a new local directory."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from examples.scripted_job.figures import DemoResult
from examples.scripted_job.job import MIN_CHECKPOINTS, RESCALED_WINDOW, run_mode
from examples.scripted_job.report import print_mode, print_summary, say
from fastimpl import CounterIds, IdSource, RandomIds
from spec.config import MergingMode

DEFAULT_CHECKPOINTS = 30
DEFAULT_SEED = 306
MODES = (MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT)


class UsageError(Exception):
    pass


def run_demo(
    base: Path,
    *,
    checkpoints: int = DEFAULT_CHECKPOINTS,
    seed: int = DEFAULT_SEED,
    deterministic: bool = False,
    modes: Iterable[MergingMode] = MODES,
    per_checkpoint: bool = True,
    out: TextIO = sys.stdout,
) -> DemoResult:
    """Run the script in each mode under ``base/<mode>`` (each must be new or empty)."""
    if checkpoints < MIN_CHECKPOINTS:
        raise UsageError(f"the script needs at least {MIN_CHECKPOINTS} checkpoints")
    start = time.perf_counter()
    say(
        out,
        f"ckpt-ownership scripted job on the public API: source(2) -> window(4, RocksDB-like "
        f"incremental state) -> sink(2) on 2 TMs, local files under {base}; {checkpoints} "
        f"checkpoints per merging mode with a declined checkpoint, a late notice, a TM "
        f"crash with a failover and a zombie write, a CLAIM restore rescaling window "
        f"4->{RESCALED_WINDOW}; then quiesce (deliver, retry deletes, 2 more checkpoints). "
        f"{'CounterIds' if deterministic else 'RandomIds'}, seed {seed}.",
    )
    if per_checkpoint:
        say(
            out,
            "Per checkpoint: state files created (+files) and deleted (-files) on storage "
            "since the previous row, _metadata files created/deleted; then, once the "
            "checkpoint is over, files on storage, KiB of state files, live KiB (referenced "
            "by retained checkpoints) and their ratio (amp).",
        )
    results = []
    for mode in modes:
        root = base / mode.value
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise UsageError(f"{root} is not empty")
        ids: IdSource = CounterIds() if deterministic else RandomIds()
        r = run_mode(mode, str(root), ids, seed, checkpoints)
        print_mode(r, out, per_checkpoint=per_checkpoint)
        out.flush()
        results.append(r)
    result = DemoResult(results, time.perf_counter() - start)
    print_summary(result, out)
    return result
