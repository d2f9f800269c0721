"""Not a benchmark: why the streaming job opens each state file, and how far the space
amplification bound lets it merge (issue 17's closing figures, without Spark).

    python -m bench.stream_files [--mode ACROSS_CHECKPOINT] [--batches 30] [--rows 1000]
        [--vocabulary 1000]

The demo's workload (``pipeline.stream.demo``: parallelism 3, a TM per subtask, a rescale
to 4 after batch 3, a worker killed mid-upload in batch 5, num_retained 1, 5 s windows) run in this
process by the stream harness (``tests/stream_harness.py``: the job's own driver, subtask
and snapshot code, the partitions of each batch one after another). After each batch the
storage is listed as the demo lists it: state files created per checkpoint and space
amplification (state bytes over the bytes the latest checkpoint refers to): the figures
the demo prints for the same input, up to the timing of RocksDB's background compactions
(the amplification moves by a few tenths from run to run, the file count did not). Every
pooled file a TM closes is counted by why, read from the file's record at that moment: it
reached ``max_file_size`` (R12), its checkpoint is over (WITHIN, R14), the amplification
bound gave it up (R80, R81), or the job ended (the rescale, R90).

Last, the least number of files any rule could create on this run at amplification
<= ``max_space_amplification``: a file appended to loses its dead bytes only when it is
deleted whole (R15), and each checkpoint's EXCLUSIVE state (MANIFEST, OPTIONS, CURRENT,
the operator state) dies at the next subsume, so a file that takes the EXCLUSIVE state of
k checkpoints holds (k - 1) checkpoints of it dead when the last completes; at bound b
that must fit in (b - 1) times the bytes the checkpoint refers to. Each job's subtasks
need a SHARED file each (R13). The bound ignores RocksDB's compactions, which retire
SHARED bytes too: the true least is higher.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastimpl.tm_files import TmFiles
from fastimpl.tm_writing import TmWriter
from pipeline.stream.job import _Files
from pipeline.stream.kills import Failures
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode, StateKind
from spec.handles import stream_of
from tests.stream_harness import LocalJob


@dataclass
class Figures:
    mode: MergingMode
    checkpoints: int
    created: int
    amplification: list[float]
    closes: collections.Counter[tuple[str, str]]
    least: int | None = None
    """ACROSS: the least files any rule could create at the bound (compactions ignored)."""
    notes: list[str] = field(default_factory=list)
    premise: list[tuple[int, int, float, float]] = field(default_factory=list)
    """Per file that took EXCLUSIVE state of k >= 2 checkpoints: the last of them, k, the
    least amplification that forces at the last one's sample (1 + its k - 1 older
    checkpoints' EXCLUSIVE bytes over the bytes referenced then) and the one measured."""


def _why(tm: Any, path: str) -> str:
    pf = tm.m.pfiles[path]
    if pf.size >= tm.cfg.max_file_size:
        return "reached max_file_size (R12)"
    if pf.checkpoint is not None:
        return "its checkpoint is over (WITHIN, R14)"
    if not pf.reusable:
        return "given up by the amplification bound (R80, R81)"
    return "the job ended (rescale, R90)"


def measure(args: argparse.Namespace) -> Figures:
    mode = MergingMode[args.mode]
    closes: collections.Counter[tuple[str, str]] = collections.Counter()
    exclusive: dict[int, int] = collections.defaultdict(int)
    spans: dict[tuple[str, str], collections.Counter[int]] = collections.defaultdict(
        collections.Counter
    )
    orig_close = TmFiles._close_pfile
    orig_write = TmWriter._write_stream

    def close(self: Any, path: str) -> None:
        pf = self.a.m.pfiles[path]
        if pf.open:
            closes[(pf.scope.value, _why(self.a, path))] += 1
        orig_close(self, path)

    def write(self: Any, subtask: Any, checkpoint: int, kind: StateKind, *a: Any, **k: Any) -> Any:
        entry = orig_write(self, subtask, checkpoint, kind, *a, **k)
        if kind.scope.value == "exclusive":
            exclusive[checkpoint] += a[1]  # name, size, ...
            h = stream_of(entry.handle)
            if h is not None:
                spans[(self.a.tm, h.path)][checkpoint] += a[1]
        return entry

    TmFiles._close_pfile = close  # type: ignore[method-assign]
    TmWriter._write_stream = write  # type: ignore[method-assign]
    config = Config.for_mode(mode, num_retained=1)
    try:
        files, jobs = _run(args, config)
    finally:
        TmFiles._close_pfile = orig_close  # type: ignore[method-assign]
        TmWriter._write_stream = orig_write  # type: ignore[method-assign]
    samples = files.samples
    fig = Figures(
        mode,
        len(samples),
        sum(x.created for x in samples),
        [a for x in samples if (a := x.amplification) is not None],
        closes,
    )
    bound = config.amplification_bound
    if mode is MergingMode.ACROSS_CHECKPOINT and bound is not None:
        refers = {x.checkpoint: x.referenced_bytes for x in samples}
        fig.least = 0
        for cps, par in zip(jobs, [args.start_parallelism, args.parallelism], strict=False):
            if not cps:
                continue
            # the most checkpoints one file may take EXCLUSIVE state of, at best
            k = 1 + math.floor(max((bound - 1) * refers[c] / exclusive[c] for c in cps))
            fig.least += math.ceil(len(cps) / k) + par
            fig.notes.append(
                f"job at parallelism {par}: {len(cps)} checkpoints, EXCLUSIVE state"
                f" {min(exclusive[c] for c in cps)}-{max(exclusive[c] for c in cps)} bytes each,"
                f" referenced {min(refers[c] for c in cps)}-{max(refers[c] for c in cps)}:"
                f" one file takes at most {k} checkpoints' EXCLUSIVE state at <= {bound:.1f}x"
            )
    amp = {x.checkpoint: x.amplification for x in samples}
    refers = {x.checkpoint: x.referenced_bytes for x in samples}
    for written in spans.values():
        last = max(written)
        measured = amp.get(last)
        if len(written) >= 2 and measured is not None:
            # at the sample after ``last`` completed, the older checkpoints are subsumed:
            # their bytes in this file are dead, and the file stays for ``last``'s
            older = sum(n for c, n in written.items() if c != last)
            fig.premise.append((last, len(written), 1 + older / refers[last], measured))
    return fig


def _run(args: argparse.Namespace, config: Config) -> tuple[_Files, list[list[int]]]:
    with tempfile.TemporaryDirectory() as tmp:
        job = LocalJob(
            Path(tmp),
            config,
            parallelism=args.start_parallelism,
            source=RateSource(args.rows, vocabulary=args.vocabulary),
            windowing=Windowing(5000),
            write_buffer_size=64 * 1024,
            failures=Failures(kill_at=(args.kill, 1, "mid-upload")),
        )
        files = _Files(job.url, {})
        jobs: list[list[int]] = [[]]
        for b in range(args.batches):
            if b == args.rescale + 1:
                job.rescale(args.parallelism)
                jobs.append([])
            r = job.batch()
            job.coordinator.settle()
            files.sample(
                r.checkpoint,
                [
                    job.coordinator.restore_assignment(s, r.checkpoint + 1)
                    for s in job.driver.subtasks()
                ],
                job.coordinator.job_id,
            )
            jobs[-1].append(r.checkpoint)
    return files, jobs


def report(fig: Figures) -> str:
    n = fig.checkpoints
    amps = fig.amplification
    lines = [
        f"{fig.mode.name}: {n} checkpoints, {fig.created} state files created,"
        f" {fig.created / n:.2f} per checkpoint;"
        f" space amplification end / peak {amps[-1]:.2f}x / {max(amps):.2f}x",
        *(
            f"  {scope} pooled files closed because {why}: {count}"
            for (scope, why), count in sorted(fig.closes.items())
        ),
        *(f"  {note}" for note in fig.notes),
        *(
            f"  a file took EXCLUSIVE state of {k} checkpoints up to {last}: at least"
            f" {least:.2f}x then, measured {measured:.2f}x"
            for last, k, least, measured in fig.premise
        ),
    ]
    if fig.least is not None:
        lines.append(
            f"least files any rule could create within the bound (compactions ignored):"
            f" {fig.least}, {fig.least / n:.2f} per checkpoint"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.stream_files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--mode", default="ACROSS_CHECKPOINT", choices=[m.name for m in MergingMode])
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--vocabulary", type=int, default=1000)
    ap.add_argument("--start-parallelism", type=int, default=3)
    ap.add_argument("--parallelism", type=int, default=4)
    ap.add_argument("--kill", type=int, default=5)
    ap.add_argument("--rescale", type=int, default=3)
    print(report(measure(ap.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
