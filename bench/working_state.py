"""Issue 18's figures: the streaming job's state backends on the same input and the same
checkpoint storage, ``rocksdb`` (a local RocksDB whose new SSTs each checkpoint uploads)
against ``working`` (a SlateDB on the checkpoint storage whose SSTs a checkpoint refers
to in place, SPEC §11).

    python -m bench.working_state [--batches 24] [--rows 1000] [--vocabulary 1000]
        [--parallelism 4] [--s3] [--json PATH]

The pipeline's workload (``ckpt stream``'s defaults: 1000 rows a batch, 1000 words, 5 s
windows, parallelism 4, WITHIN merging, num_retained 1, RocksDB's 64 KiB memtable) run by
the stream harness (``tests/stream_harness.py``: the job's own driver, subtask, snapshot
and coordinator code; the partitions of each batch one after another in this process, so
no Spark start and no scheduling noise). For each backend, after each checkpoint:

* **bytes the checkpoint wrote**: what the snapshot writes for the checkpoint (RocksDB:
  its new SSTs, MANIFEST, OPTIONS, CURRENT and the operator state; working: the copy of
  each database's manifest and the operator state; the SSTs are referred to in place);
* **bytes written to the checkpoint storage**: every byte of every object that appeared
  on the storage since the previous checkpoint, whoever wrote it (working: the
  databases' flushes, compactions, manifests too: what the database costs the storage);
* **checkpoint duration**: the slowest subtask's snapshot and acknowledgement (its part
  of the checkpoint), median and p95 over the checkpoints;
* **objects created per checkpoint** on the storage, and the **space amplification**
  (bytes on the storage for the job over the bytes the latest checkpoint refers to),
  at the end and at its peak;
* **restore time after a worker kill**: a subtask whose worker is gone (no local state)
  opens its state again: RocksDB downloads its files; working clones the checkpoint's
  SlateDB checkpoint (its SSTs stay where they are); the time from the task's start
  until its state is open, median over four kills (one subtask each, batches 6, 10, 14,
  18 of 24);
* **restore time after a rescale 4 -> 3** (CLAIM): the same time for each new subtask
  of the first batch after the rescale, median over the three.

Each ratio is rocksdb over working, from the same run. The goal (issue 18): at least 10x
fewer bytes written per checkpoint and at least 5x faster restore, with the space
amplification within ``max_space_amplification`` (2.0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]

from bench.common import Case, Figure
from fastimpl.writer_state import WRITER_STATE
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode, RestoreMode
from tests.stream_harness import LocalJob

KILLS = (6, 10, 14, 18)
"""Batches before which one subtask loses its worker (subtask ``k % parallelism``)."""


@dataclass
class Backend:
    name: str
    checkpoint_bytes: list[int] = field(default_factory=list)
    storage_bytes: list[int] = field(default_factory=list)
    created: list[int] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    amplification: list[float] = field(default_factory=list)
    kill_restores: list[float] = field(default_factory=list)
    rescale_restores: list[float] = field(default_factory=list)
    correct: bool = False
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, float]:
        def p95(xs: list[float]) -> float:
            return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]

        return {
            "checkpoint_bytes_per_checkpoint": statistics.mean(self.checkpoint_bytes),
            "storage_bytes_per_checkpoint": statistics.mean(self.storage_bytes),
            "objects_created_per_checkpoint": statistics.mean(self.created),
            "checkpoint_duration_median_s": statistics.median(self.durations),
            "checkpoint_duration_p95_s": p95(self.durations),
            "restore_after_kill_median_s": statistics.median(self.kill_restores),
            "restore_after_rescale_median_s": statistics.median(self.rescale_restores),
            "space_amplification_end": self.amplification[-1],
            "space_amplification_peak": max(self.amplification),
        }


class Storage:
    """What the checkpoint storage holds, listed after each checkpoint."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.fs, root = fsspec.core.url_to_fs(url, **options)
        self.root = str(root).rstrip("/")
        self.seen: dict[str, int] = {}

    def sample(self) -> tuple[int, int, dict[str, int]]:
        """Objects and bytes that appeared since the last sample; every object now."""
        self.fs.invalidate_cache()
        found = self.fs.find(self.root, detail=True) if self.fs.exists(self.root) else {}
        now = {
            p[len(self.root) + 1 :]: int(i.get("size") or 0)
            for p, i in found.items()
            if not p.endswith(("/_metadata", "/_writer", f"/{WRITER_STATE}"))
        }
        new = {p: n for p, n in now.items() if self.seen.get(p) != n}
        self.seen = now
        return len(new), sum(new.values()), now


def _referenced(job: LocalJob) -> int:
    """Bytes the latest checkpoint refers to: its entries' ranges and its in-place files."""
    from spec.handles import stream_of

    done = job.coordinator.co.retained[-1]
    ranges = {(h.path, getattr(h, "offset", 0), h.length)
              for e in done.entries if (h := stream_of(e.handle)) is not None}  # fmt: skip
    return sum(r[2] for r in ranges) + sum(w.length for _, w in done.working)


def run_backend(
    name: str,
    tmp: Path,
    *,
    batches: int,
    rows: int,
    vocabulary: int,
    parallelism: int,
    url: str | None,
    options: dict[str, Any],
    log: Any,
) -> Backend:
    config = Config.for_mode(
        MergingMode.WITHIN_CHECKPOINT,
        num_retained=1,
        restore_mode=RestoreMode.CLAIM,
        open_files_readable=url is None,
    )
    job = LocalJob(
        tmp,
        config,
        parallelism=parallelism,
        source=RateSource(rows, vocabulary=vocabulary),
        windowing=Windowing(5000),
        write_buffer_size=64 * 1024,
        url=url,
        storage_options=options,
        backend=name,
        gc_min_age_s=0.0,
    )
    storage = Storage(job.url, options)
    out = Backend(name)
    t0 = time.perf_counter()
    rescale_at = batches - 3
    for b in range(batches):
        if b in KILLS and b < rescale_at:
            job.lose_local_state(b % job.parallelism)
        if b == rescale_at:
            job.coordinator.finish_attempts()
            job.rescale(3)
        order = job.driver.order(job.next_batch)
        results = job.run_tasks(order)
        job.emitted[order.batch_id] = [w for r in results for w in r.closed]
        report = job.driver.finish(order, results)
        job.next_batch += 1
        job.coordinator.settle()
        created, written, now = storage.sample()
        out.checkpoint_bytes.append(report.uploaded_bytes + report.exclusive_bytes)
        out.storage_bytes.append(written)
        out.created.append(created)
        out.durations.append(max(r.snapshot_seconds for r in results))
        mine = sum(n for p, n in now.items() if p.split("/", 1)[0] in job.coordinator.co.lineage)
        out.amplification.append(mine / _referenced(job))
        restored = [r.ready_seconds for r in results if r.restored]
        if b in KILLS and b < rescale_at:
            out.kill_restores += restored
        if b == rescale_at:
            out.rescale_restores += restored
    out.seconds = time.perf_counter() - t0
    out.correct = job.comparison().equal
    job.quiesce()
    job.coordinator.finish_attempts()
    out.violations = job.coordinator.violations(quiet=True)
    job.coordinator.close()
    log(f"  {name}: {batches} checkpoints in {out.seconds:.1f} s, counts "
        f"{'equal' if out.correct else 'DIFFERENT'}, violations {len(out.violations)}")  # fmt: skip
    return out


@contextmanager
def _s3() -> Iterator[tuple[str, dict[str, Any]]]:
    import logging

    import boto3  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
        region_name="us-east-1",
    ).create_bucket(Bucket="bench")  # fmt: skip
    try:
        yield "s3://bench", {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}
    finally:
        server.stop()


RATIOS = (
    ("checkpoint_bytes_per_checkpoint", "bytes the checkpoint wrote, per checkpoint", 10.0),
    ("storage_bytes_per_checkpoint", "bytes written to the storage, per checkpoint", None),
    ("objects_created_per_checkpoint", "objects created on the storage, per checkpoint", None),
    ("checkpoint_duration_median_s", "checkpoint duration, median (s)", None),
    ("checkpoint_duration_p95_s", "checkpoint duration, p95 (s)", None),
    ("restore_after_kill_median_s", "restore after a worker kill, median (s)", 5.0),
    ("restore_after_rescale_median_s", "restore after a rescale 4 -> 3, median (s)", 5.0),
    ("space_amplification_end", "space amplification at the end", None),
    ("space_amplification_peak", "space amplification, peak", None),
)


def compare(where: str, rocks: Backend, working: Backend) -> dict[str, Any]:
    a, b = rocks.summary(), working.summary()
    rows = []
    for key, label, goal in RATIOS:
        ratio = a[key] / b[key] if b[key] else float("inf")
        rows.append({"figure": label, "rocksdb": a[key], "working": b[key], "ratio": ratio,
                     "goal": goal, "met": None if goal is None else ratio >= goal})  # fmt: skip
    return {
        "storage": where,
        "rows": rows,
        "correct": {"rocksdb": rocks.correct, "working": working.correct},
        "violations": {"rocksdb": rocks.violations, "working": working.violations},
        "seconds": {"rocksdb": rocks.seconds, "working": working.seconds},
        "raw": {"rocksdb": asdict(rocks), "working": asdict(working)},
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['storage']}: rocksdb against working (ratio: rocksdb / working)")
    print(f"{'figure':<50}{'rocksdb':>14}{'working':>14}{'ratio':>9}  goal")
    for r in result["rows"]:
        met = "met" if r["met"] else "NOT met"
        goal = "" if r["goal"] is None else f">= {r['goal']:.0f}x {met}"
        fmt = "{:>14,.0f}" if r["rocksdb"] >= 100 else "{:>14.3f}"
        print(f"{r['figure']:<50}" + fmt.format(r["rocksdb"]) + fmt.format(r["working"])
              + f"{r['ratio']:>8.1f}x  {goal}")  # fmt: skip
    print(f"counts equal to the batch computation: {result['correct']}; invariant violations:"
          f" rocksdb {len(result['violations']['rocksdb'])},"
          f" working {len(result['violations']['working'])}")  # fmt: skip


def figure(log: Any, tmp: str | None = None) -> Figure:
    """``python -m bench --only working`` (opt-in, about half a minute): the default
    workload on a local directory, one run of each backend; the headline is the bytes the
    checkpoint wrote, and the goal every goal of issue 18."""
    with tempfile.TemporaryDirectory(prefix="bench-working-", dir=tmp) as where:
        kw: dict[str, Any] = dict(batches=24, rows=1000, vocabulary=1000, parallelism=4, log=log)
        rocks = run_backend("rocksdb", Path(where, "r"), url=None, options={}, **kw)
        working = run_backend("working", Path(where, "w"), url=None, options={}, **kw)
    result = compare("local directory", rocks, working)
    rows = {r["figure"]: r for r in result["rows"]}
    head = rows[RATIOS[0][1]]
    amplification = working.summary()["space_amplification_end"]
    bound = 2.0
    met = all(r["met"] is not False for r in result["rows"]) and amplification <= bound
    return Figure(
        key="working_state_local",
        title="working state: bytes a checkpoint writes (SlateDB in place, local directory)",
        unit="B",
        value=head["working"],
        baseline=head["rocksdb"],
        baseline_what="--state-backend rocksdb (new SSTs uploaded), same input, storage and run",
        ratio=head["ratio"],
        ratio_what="rocksdb / working (above 1: working is better)",
        goal=f"bytes >= 10x, restores after a kill and a rescale >= 5x, amplification at "
        f"the end <= {bound}",
        met=met and result["correct"] == {"rocksdb": True, "working": True},
        cases=[
            Case(
                r["figure"],
                r["working"],
                r["rocksdb"],
                r["ratio"],
                "" if r["goal"] is None else f"goal >= {r['goal']:.0f}x",
            )
            for r in result["rows"]
        ],
        details={
            "workload": "1000 rows a batch, 1000 words, 24 batches, parallelism 4, WITHIN, "
            "worker lost before batches 6, 10, 14, 18, rescale 4 -> 3 (CLAIM) before 21",
            "correct": result["correct"],
            "violations": result["violations"],
            "seconds": result["seconds"],
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.working_state", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--vocabulary", type=int, default=1000)
    ap.add_argument("--parallelism", type=int, default=4)
    ap.add_argument("--s3", action="store_true", help="also on S3 (moto's server, loopback)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.batches < max(KILLS) + 4 or args.parallelism != 4:
        ap.error(f"--batches must be >= {max(KILLS) + 4} and --parallelism 4 (a rescale 4 -> 3)")
    kw = dict(batches=args.batches, rows=args.rows, vocabulary=args.vocabulary,
              parallelism=args.parallelism, log=print)  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-working-") as tmp:
        print("local directory")
        rocks = run_backend("rocksdb", Path(tmp, "r"), url=None, options={}, **kw)
        working = run_backend("working", Path(tmp, "w"), url=None, options={}, **kw)
        results.append(compare("local directory", rocks, working))
        print_table(results[-1])
        if args.s3:
            with _s3() as (url, options):
                print("S3 (moto's server on loopback)")
                rocks = run_backend(
                    "rocksdb", Path(tmp, "rs"), url=f"{url}/r", options=options, **kw
                )
                working = run_backend(
                    "working", Path(tmp, "ws"), url=f"{url}/w", options=options, **kw
                )
                results.append(compare("S3 (moto)", rocks, working))
                print_table(results[-1])
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    ok = all(r["correct"]["rocksdb"] and r["correct"]["working"] and not r["violations"]["working"]
             and not r["violations"]["rocksdb"] for r in results)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
