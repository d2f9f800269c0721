"""Figure 6: the product's memory over a long steady job (issue 16).

A job that checkpoints forever must not keep a record per checkpoint: the deletion
history, the aborts a TM heard, who deleted what... A ``CheckpointStore`` (the public
API, WITHIN_CHECKPOINT merging, 2 vertices of parallelism 2 on 2 TMs, ``num_retained``
2) runs 10,000 checkpoint cycles: every subtask writes fresh shared state and an
operator list, acknowledges, the checkpoint completes and the TMs receive their
notifications (one checkpoint in 50 is aborted instead). ``tracemalloc`` counts the
bytes allocated by the product's own lines (``fastimpl/``, ``spec/``) that are still
live, at ten points over the 100 checkpoints up to the 1,000th and up to the 10,000th;
the figure is the ratio of the two peaks (goal: flat, at most 1.1). A peak rather than
one sample: what is in flight (queued deletes, notices not yet received) goes up and
down from one checkpoint to the next. The same job with the opt-in deletion log
(``deletion_log=True``, for tests and traces), over 2,000 checkpoints, is the contrast:
it grows by design.

Where: a local directory, on tmpfs (``/dev/shm``) where there is one, else in the
system's temp dir. Not ``memory://``: fsspec's memory file system keeps a pseudo
directory per ``chk-N`` it ever saw and scans that list on every ``makedirs``, so each
checkpoint cost more than the one before (20-40 minutes for 10,000) and the product's
path strings it keeps counted as the product's. On a local file system the store prunes
each emptied ``chk-N`` (the storage holds nothing per past checkpoint), and on tmpfs an
``fsync`` costs nothing, so the run measures the product's own work: about a minute or
two for 10,000 checkpoints. ``details.seconds`` says how long it took.
"""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from bench.common import Case, Figure
from fastimpl import testing
from fastimpl.api import CheckpointStore
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec

JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)
GOAL_RATIO = 1.1
_ROOT = Path(__file__).resolve().parent.parent
_PRODUCT = (str(_ROOT / "fastimpl") + "/*", str(_ROOT / "spec") + "/*")
_runs = itertools.count()


def _product_bytes() -> int:
    gc.collect()
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, pattern) for pattern in _PRODUCT]
    )
    return sum(s.size for s in snap.statistics("filename"))


def steady_job(
    checkpoints: int, marks: tuple[int, ...], *, deletion_log: bool
) -> dict[int, tuple[int, int]]:
    """Run ``checkpoints`` cycles; for each of ``marks`` (checkpoints done) the peak of
    the product's live bytes at ten samples over the 100 checkpoints up to it, and all
    live traced bytes at that peak."""
    cfg = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=2)
    root = tempfile.mkdtemp(prefix=f"bench-memory-{next(_runs)}-", dir=where())
    out: dict[int, tuple[int, int]] = {}
    tracemalloc.start()
    try:
        with CheckpointStore(f"file://{root}", cfg, JOB) as store:
            if deletion_log:
                testing.keep_deletion_log(store)
            coord = store.coordinator
            subtasks = sorted(store.placement())
            for n in range(1, checkpoints + 1):
                cp = coord.trigger()
                for s in subtasks:
                    m = store.manager_for(s)
                    m.write(cp, s, StateKind.KEYED_SHARED, f"{cp}.sst", b"k" * 200)
                    m.write(cp, s, StateKind.OPERATOR_LIST, "offsets", b"o" * 40)
                    m.acknowledge(cp, s)
                if n % 50 == 0:
                    coord.abort(cp)
                else:
                    coord.complete(cp)
                for tm in store.task_managers():
                    store.task_manager(tm).receive_notifications()
                mark = next((k for k in marks if k - 100 < n <= k and (k - n) % 10 == 0), None)
                if mark is not None:
                    store.flush()
                    got = (_product_bytes(), tracemalloc.get_traced_memory()[0])
                    out[mark] = max(out.get(mark, got), got)
            bad = testing.check_invariants(store)
            if bad:
                raise AssertionError(f"the steady job broke invariants: {bad[:3]}")
    finally:
        tracemalloc.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def where() -> str:
    """tmpfs if there is one (``fsync`` costs nothing there), else the system temp dir."""
    return (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else (tempfile.gettempdir())
    )


def memory_over_checkpoints(quick: bool = False, log: Callable[[str], None] = print) -> Figure:
    total = 2_000 if quick else 10_000
    cases: list[Case] = []
    results: dict[str, dict[int, tuple[int, int]]] = {}
    seconds: dict[str, float] = {}
    for label, with_log, n in (("default", False, total), ("with deletion_log", True, 2_000)):
        first = n // 10
        t0 = time.perf_counter()
        got = steady_job(n, (first, n), deletion_log=with_log)
        seconds[label] = round(time.perf_counter() - t0, 1)
        results[label] = got
        (p1, a1), (p2, a2) = got[first], got[n]
        case = Case(
            f"{label}: product bytes at {n:,} / at {first:,} checkpoints",
            float(p2),
            float(p1),
            p2 / p1,
            f"all traced bytes {a1:,} -> {a2:,}",
            {"product_bytes": [float(p1), float(p2)], "all_bytes": [float(a1), float(a2)]},
        )
        cases.append(case)
        log(
            f"  {label}: product {p1:,} B at {first:,}, {p2:,} B at {n:,} checkpoints"
            f" (x{p2 / p1:.2f}); all traced {a1:,} -> {a2:,} B; {seconds[label]} s"
        )
    head = cases[0]
    return Figure(
        key="memory_over_checkpoints",
        title=f"6. product memory over {total:,} checkpoints of a steady job",
        unit="B",
        value=head.value,
        baseline=head.baseline,
        baseline_what=f"the same store after {total // 10:,} checkpoints",
        ratio=head.ratio,
        ratio_what=(
            f"peak live bytes near {total:,} / near {total // 10:,} checkpoints"
            " (tracemalloc, fastimpl/ and spec/ lines)"
        ),
        goal=f"flat: ratio <= {GOAL_RATIO}",
        met=head.ratio <= GOAL_RATIO,
        cases=cases,
        details={
            "job": "2 vertices x parallelism 2 on 2 TMs, WITHIN_CHECKPOINT, num_retained 2,"
            " a local directory, 1 checkpoint in 50 aborted",
            "directory": where(),
            "seconds": seconds,
            "marks": [total // 10, total],
        },
    )
