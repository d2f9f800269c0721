"""``make bench-stream-large``: ``ckpt stream`` on a keyed state that grows without bound
(issue 35, "Large state").

    python -m bench.stream_large [--rows 1e6] [--batches 140] [--vocabulary 1000000]
        [--target-gib 1.0] [--write-buffer-mb 64] [--no-kill] [--rescale-to 2]
        [--backend rocksdb] [--restore-mode no_claim] [--out bench/stream_large_results.json]
        [--quick]

The job of ``bench.stream_scale`` (``local[2,4]``: 2 cores, a failed task tried up to 4
times; parallelism 4, ACROSS merging, num-retained 1), on a workload whose state only
grows: each row's word drawn uniformly (Zipf exponent 0) from ``--vocabulary`` words,
1 s tumbling windows (one per micro-batch: the source advances its event time by 1 s a
batch) and a watermark delay longer than any run, so no window ever closes. Each batch
adds a new key (key group, window, word) per distinct word of the batch, about
``vocabulary * (1 - exp(-rows / vocabulary))`` of them: the change per batch is constant
while the state grows linearly. The memtable is RocksDB's default size (64 MiB), so a
subtask flushes one SST per checkpoint and RocksDB's leveled compactions run as they
would on a long-running job.

After each checkpoint completes (the job's ``on_batch``, before the next batch starts),
this bench lists, itself:

- the checkpoint storage: the bytes newly written since the previous listing (new files,
  and the growth of files appended to: ACROSS appends to pooled files), the bytes deleted,
  and the state bytes held (every file but ``_metadata`` and the writer's own, as the
  job's samples count them);
- the live RocksDB directories of the subtasks on the executors' disk (``<work>/local/
  <subtask>/db``): their bytes, and their SSTs' bytes.

The bytes the latest checkpoint refers to are the job's own sample
(``StorageSample.referenced_bytes``: the ranges its restore assignments name), taken just
before. A batch's seconds run from the end of the previous listing to the start of this
one (the listing is not counted); records per second and µs per record are the batch's
records over them. Batch 0 (starting the Python workers) is left out of every figure.

Cost per record as the state grows: the seconds over the records of the first tenth of
the growth batches against the last tenth, and its ratio (goal: at most 1.5, judged by
``bench.stream_goals.judge_large`` only when the live state reached ``--target-gib``).
Incremental checkpoints: the bytes written per checkpoint in those tenths against the state
held then.

``--kill`` (on unless ``--no-kill``): after the growth batches, one batch's subtask 0
SIGKILLs its Python worker before its snapshot (having taken the subtask's DB); Spark
retries the task, which restores the DB from the latest completed checkpoint.
``--rescale-to P`` (2; 0: none): the run then stops and restarts at parallelism P, every
subtask restoring its key groups from the old subtasks' files, in the mode
``--restore-mode`` names (``no_claim``, Flink's default: the new job refers to none of the
old job's files, so the working backend copies the rows; ``claim``: it takes them over,
and the working backend clones). Each restore is timed by
the job itself (``BatchReport.restore_seconds``: the longest time a restoring subtask took
until its DB was open) and by the batch's seconds against the median of the last tenth of
the growth batches'.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import attrs

from bench.common import REPO, machine_info
from bench.stream_goals import AMPLIFICATION_BOUND, judge_large, judge_working
from bench.stream_scale import ckpt_config
from fastimpl.parties import WRITER_STATE
from spec.config import RestoreMode

_SKIP = ("_metadata", "_writer", WRITER_STATE)
NO_CLOSE_MS = 10**12
"""The watermark delay: longer than any run, so the watermark stays below every window's
end and no window closes (the state only grows)."""


@dataclass
class Listing:
    """One listing of a directory tree: each file's size."""

    sizes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, root: Path, skip: tuple[str, ...] = ()) -> Listing:
        sizes: dict[str, int] = {}
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                if name in skip:
                    continue
                path = os.path.join(dirpath, name)
                try:
                    sizes[path] = os.stat(path).st_size
                except FileNotFoundError:  # deleted while listed
                    continue
        return cls(sizes)

    def total(self) -> int:
        return sum(self.sizes.values())

    def written_since(self, before: Listing) -> tuple[int, int, int]:
        """Bytes of new files, bytes appended to files listed before, bytes deleted."""
        new = appended = deleted = 0
        for path, size in self.sizes.items():
            old = before.sizes.get(path)
            if old is None:
                new += size
            elif size > old:
                appended += size - old
        for path, size in before.sizes.items():
            if path not in self.sizes:
                deleted += size
        return new, appended, deleted


@dataclass
class Checkpoint:
    """One completed checkpoint, as listed right after it."""

    batch: int
    checkpoint: int
    records: int
    seconds: float
    """From the end of the previous listing to the start of this one."""
    written_bytes: int
    """New files' bytes plus the growth of files appended to, on the checkpoint storage."""
    new_file_bytes: int
    appended_bytes: int
    deleted_bytes: int
    state_bytes: int
    """The state bytes the checkpoint storage holds."""
    state_files: int
    live_db_bytes: int
    """Every file of the subtasks' live RocksDB directories."""
    live_sst_bytes: int
    parallelism: int
    restored: int
    restore_seconds: float
    retried: int
    job_uploaded_bytes: int
    """The job's own count of bytes uploaded (a cross-check only: not a figure here)."""
    referenced_bytes: int | None = None
    """The bytes the latest checkpoint refers to (the job's sample)."""
    load_1min: float | None = None
    """The machine's load average as the checkpoint was listed."""

    @property
    def us_per_record(self) -> float:
        return 1e6 * self.seconds / self.records if self.records else math.nan


def _live(local: Path, parallelism: int) -> tuple[int, int]:
    """The bytes of the running job's subtasks' live DBs (``<vertex>-<i>-<parallelism>/db``,
    as the tasks put them back; a rescale leaves the old parallelism's behind) and of their
    SSTs."""
    total = sst = 0
    for db in local.glob(f"*-{parallelism}/db"):
        for path, size in Listing.of(db).sizes.items():
            total += size
            sst += size if path.endswith(".sst") else 0
    return total, sst


@dataclass
class Phase:
    """The figures of a run of batches (a tenth)."""

    batches: list[int]
    us_per_record: float
    records_per_s: float
    written_per_checkpoint: float
    state_bytes: float
    """The mean state bytes held on the checkpoint storage."""
    live_db_bytes: float


def _phase(samples: list[Checkpoint]) -> Phase:
    seconds = sum(s.seconds for s in samples)
    records = sum(s.records for s in samples)
    return Phase(
        [s.batch for s in samples],
        1e6 * seconds / records,
        records / seconds,
        statistics.fmean(s.written_bytes for s in samples),
        statistics.fmean(s.state_bytes for s in samples),
        statistics.fmean(s.live_db_bytes for s in samples),
    )


def _amplification(samples: list[Checkpoint]) -> dict[str, float | None]:
    """The state bytes held on the checkpoint storage over the bytes the latest checkpoint
    refers to, at each sample: at the last, the peak, the mean, the fraction above the
    bound."""
    amp = [s.state_bytes / s.referenced_bytes for s in samples if s.referenced_bytes]
    if not amp:
        return {"amplification_end": None, "amplification_peak": None,
                "amplification_mean": None, "amplification_over_bound": None}  # fmt: skip
    return {
        "amplification_end": amp[-1],
        "amplification_peak": max(amp),
        "amplification_mean": statistics.fmean(amp),
        "amplification_over_bound": sum(a > AMPLIFICATION_BOUND for a in amp) / len(amp),
    }


def compare(upload: dict[str, Any], working: dict[str, Any]) -> dict[str, Any]:
    """The working backend against the upload backend on the growth batches both ran
    (1 .. the shorter run's last): mean bytes written per checkpoint, and the restore
    after the worker kill (the first batch after growth, when both killed)."""
    n = min(upload["summary"].get("growth_batches", 0), working["summary"].get("growth_batches", 0))

    def written(run: dict[str, Any]) -> float | None:
        got = [s["written_bytes"] for s in run["samples"] if 1 <= s["batch"] < n]
        return statistics.fmean(got) if got else None

    def killed(run: dict[str, Any]) -> dict[str, Any] | None:
        after = run["summary"].get("after_growth") or []
        return after[0] if after and after[0]["retried"] else None

    up, wk = written(upload), written(working)
    ku, kw = killed(upload), killed(working)
    return {
        "batches": [1, n - 1],
        "upload_written_per_checkpoint": up,
        "working_written_per_checkpoint": wk,
        "bytes_ratio": up / wk if up and wk else None,
        "upload_restore_seconds": ku["restore_seconds"] if ku else None,
        "working_restore_seconds": kw["restore_seconds"] if kw else None,
        "restore_ratio": (
            ku["restore_seconds"] / kw["restore_seconds"]
            if ku and kw and kw["restore_seconds"] > 0 else None
        ),
        "same_growth": upload["summary"].get("growth_batches")
        == working["summary"].get("growth_batches"),
        "upload_state_at_kill": upload["summary"].get("state_bytes_end"),
        "working_state_at_kill": working["summary"].get("state_bytes_end"),
        "working_amplification_end": working["summary"].get("amplification_end"),
        "working_amplification_peak": working["summary"].get("amplification_peak"),
    }


def summarize(
    samples: list[Checkpoint], growth: int, target: int, *, local_db: bool = True
) -> dict[str, Any]:
    """The figures of the growth batches (1 .. ``growth`` - 1; batch 0 starts the
    workers) and of the restores after them. ``target``: the state bytes the run set out
    to reach: of the live RocksDB directories, or without a ``local_db`` (the working
    backend, whose databases live on the checkpoint storage) held on the storage."""
    grow = [s for s in samples if 1 <= s.batch < growth]
    out: dict[str, Any] = {"target_bytes": target, "growth_batches": growth}
    if len(grow) < 2:
        out["not_measured"] = f"{len(grow)} growth batches: at least 2 are needed"
        return out
    tenth = max(1, len(grow) // 10)
    first, last = _phase(grow[:tenth]), _phase(grow[-tenth:])
    live = local_db
    peak = max(s.live_db_bytes if live else s.state_bytes for s in grow)
    out.update(
        first_tenth=asdict(first),
        last_tenth=asdict(last),
        cost_ratio=last.us_per_record / first.us_per_record,
        live_db_bytes_end=grow[-1].live_db_bytes,
        live_db_bytes_peak=peak if live else None,
        state_measured="live RocksDB directories" if live else "checkpoint storage",
        state_peak=peak,
        state_bytes_end=grow[-1].state_bytes,
        referenced_bytes_end=grow[-1].referenced_bytes,
        reached_target=peak >= target,
        written_over_state_last=last.written_per_checkpoint / last.state_bytes,
        written_growth=last.written_per_checkpoint / first.written_per_checkpoint,
        state_growth=last.state_bytes / first.state_bytes,
        written_mean=statistics.fmean(s.written_bytes for s in grow),
        written_median=statistics.median(s.written_bytes for s in grow),
        **_amplification(grow),
    )
    median = statistics.median(s.seconds for s in grow[-tenth:])
    restores = []
    for s in samples[samples.index(grow[-1]) + 1 :]:  # the kill's batch, the rescale's
        restores.append({
            "batch": s.batch, "restored_subtasks": s.restored, "retried": s.retried,
            "parallelism": s.parallelism, "restore_seconds": s.restore_seconds,
            "batch_seconds": s.seconds, "batch_over_growth_median": s.seconds / median,
        })  # fmt: skip
    out["after_growth"] = restores
    out["growth_batch_seconds_median_last_tenth"] = median
    return out


def run(args: argparse.Namespace, spark: Any, tmp: Path, on_line: Any,
        partial: Path | None = None) -> dict[str, Any]:
    """``partial``: after each checkpoint the raw samples so far go there (a run cut short
    leaves them)."""
    from pipeline.stream.driver import BatchReport
    from pipeline.stream.job import StreamSettings, run_stream
    from pipeline.stream.kills import Failures
    from pipeline.stream.source import RateSource
    from pipeline.stream.windows import Windowing

    # ACROSS, one checkpoint retained; the rescale restores in the mode asked (Flink's
    # default, NO_CLAIM, unless --restore-mode claim)
    config = attrs.evolve(ckpt_config(), restore_mode=RestoreMode[args.restore_mode.upper()])
    growth = args.batches
    extra = (1 if args.kill else 0) + (2 if args.rescale_to else 0)
    total = growth + extra
    kill = (growth, 0, "before-snapshot") if args.kill else None
    rescale = (total - 2, args.rescale_to) if args.rescale_to else None
    settings = StreamSettings(
        base=str(tmp / "checkpoints"),
        work_dir=str(tmp / "work"),
        out=str(tmp / "out"),
        config=config,
        parallelism=4,
        source=RateSource(args.rows, vocabulary=args.vocabulary, exponent=0.0),
        windowing=Windowing(1000, NO_CLOSE_MS),
        batches=total,
        master=args.master,
        write_buffer_size=args.write_buffer_mb << 20,
        bloom_bits=args.bloom_bits,
        failures=Failures(kill_at=kill),
        rescale_at=rescale,
        state_backend=args.backend,
    )
    storage = tmp / "checkpoints"
    local = tmp / "work" / "local"
    samples: list[Checkpoint] = []
    listed = [Listing()]  # the previous listing
    ended = [time.perf_counter()]  # when it ended

    def on_batch(report: BatchReport) -> None:
        start = time.perf_counter()
        now = Listing.of(storage, _SKIP)
        new, appended, deleted = now.written_since(listed[0])
        p = rescale[1] if rescale and report.batch_id > rescale[0] else 4
        live, sst = _live(local, p)
        s = Checkpoint(
            report.batch_id, report.checkpoint, report.records, start - ended[0],
            new + appended, new, appended, deleted, now.total(), len(now.sizes), live, sst,
            p, report.restored, report.restore_seconds,
            report.retried, report.uploaded_bytes, None, os.getloadavg()[0],
        )  # fmt: skip
        samples.append(s)
        on_line(s)
        if partial is not None:
            partial.write_text(json.dumps([asdict(x) for x in samples]) + "\n")
        listed[0] = now
        ended[0] = time.perf_counter()

    started = time.perf_counter()
    result = run_stream(settings, spark=spark, on_batch=on_batch, check=False, audit=False)
    wall = time.perf_counter() - started
    referenced = {x.checkpoint: x.referenced_bytes for x in result.storage}
    for s in samples:
        s.referenced_bytes = referenced.get(s.checkpoint)
    return {
        "backend": args.backend,
        "wall_seconds": wall,
        "kills": [attrs.asdict(k) for k in result.kills],
        "rescaled": result.rescaled,
        "summary": summarize(samples, growth, int(args.target_gib * (1 << 30)),
                             local_db=args.backend == "rocksdb"),
        "samples": [{**asdict(s), "us_per_record": s.us_per_record} for s in samples],
    }


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / (1 << 30):.3f} GiB"


def report(result: dict[str, Any]) -> list[str]:
    s = result["summary"]
    if "not_measured" in s:
        return [f"{result['backend']}: not measured ({s['not_measured']})"]
    f, la = s["first_tenth"], s["last_tenth"]
    lines = [
        f"{result['backend']}: state ({s['state_measured']}) at the end of growth"
        f" {_gib(s['live_db_bytes_end'] if s['live_db_bytes_peak'] else s['state_bytes_end'])}"
        f" (peak {_gib(s['state_peak'])}, target {_gib(s['target_bytes'])}:"
        f" {'reached' if s['reached_target'] else 'NOT reached'}); checkpoint storage holds"
        f" {_gib(s['state_bytes_end'])}, the latest checkpoint refers to"
        f" {_gib(s['referenced_bytes_end'])}",
        f"  first tenth (batches {f['batches'][0]}-{f['batches'][-1]}):"
        f" {f['us_per_record']:.2f} µs/record, {f['records_per_s']:,.0f} rec/s,"
        f" {f['written_per_checkpoint'] / 2**20:.1f} MiB written/checkpoint, state"
        f" {f['state_bytes'] / 2**20:.0f} MiB",
        f"  last tenth (batches {la['batches'][0]}-{la['batches'][-1]}):"
        f" {la['us_per_record']:.2f} µs/record, {la['records_per_s']:,.0f} rec/s,"
        f" {la['written_per_checkpoint'] / 2**20:.1f} MiB written/checkpoint, state"
        f" {la['state_bytes'] / 2**20:.0f} MiB",
        f"  cost per record last/first tenth {s['cost_ratio']:.2f}x; bytes written per"
        f" checkpoint grew {s['written_growth']:.2f}x while the state grew"
        f" {s['state_growth']:.2f}x ({s['written_over_state_last']:.1%} of the state per"
        f" checkpoint at the end)",
    ]
    for r in s["after_growth"]:
        lines.append(
            f"  batch {r['batch']}: {r['restored_subtasks']} subtasks restored (parallelism"
            f" {r['parallelism']}, {r['retried']} retried), restore {r['restore_seconds']:.2f} s,"
            f" batch {r['batch_seconds']:.2f} s = {r['batch_over_growth_median']:.2f}x the"
            f" growth batches' median"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    from pipeline.stream.rocks import BLOOM_BITS

    ap = argparse.ArgumentParser(
        prog="python -m bench.stream_large",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rows", type=float, default=1e6, help="rows per batch")
    ap.add_argument("--batches", type=int, default=140, help="growth batches")
    ap.add_argument("--vocabulary", type=int, default=1_000_000)
    ap.add_argument("--target-gib", type=float, default=1.0,
                    help="the live RocksDB state the run must reach (GiB)")
    ap.add_argument("--write-buffer-mb", type=int, default=64, help="RocksDB memtable (MiB)")
    ap.add_argument("--bloom-bits", type=int, default=BLOOM_BITS,
                    help="bits per key of RocksDB's bloom filters (0: none)")
    ap.add_argument("--kill", action=argparse.BooleanOptionalAction, default=True,
                    help="after growth, kill subtask 0's worker before its snapshot")
    ap.add_argument("--rescale-to", type=int, default=2, help="then rescale to P (0: no)")
    ap.add_argument("--backend", default="rocksdb", choices=("rocksdb", "working"))
    ap.add_argument("--restore-mode", default="no_claim", choices=("no_claim", "claim"),
                    help="the rescale's restore mode (Flink's default: no_claim)")
    ap.add_argument("--master", default="local[2,4]")
    ap.add_argument("--quick", action="store_true",
                    help="1e5 rows, vocabulary 1e5, 12 batches, target 0.01 GiB")
    ap.add_argument("--work", type=Path, default=None, help="where the run's files go")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--from-partial", type=Path, default=None,
                    help="no run: the results of a run cut short, from the samples it left"
                    " (<work>/bench-stream-large-*.partial; the same options as that run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.vocabulary, args.batches, args.target_gib = 1e5, 100_000, 12, 0.01
    args.rows = int(args.rows)
    if args.batches < 3:
        ap.error("--batches >= 3")
    if args.from_partial is not None:
        return _from_partial(args)
    from pipeline.session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session(args.master, app="bench-stream-large")
    machine = machine_info()
    load = os.getloadavg()

    def line(s: Checkpoint) -> None:
        print(
            f"batch {s.batch:>4} p{s.parallelism} {s.seconds:7.2f} s {s.us_per_record:6.2f} µs/rec"
            f"  written {s.written_bytes / 2**20:8.1f} MiB  held {s.state_bytes / 2**20:8.1f} MiB"
            f"  live {s.live_db_bytes / 2**20:8.1f} MiB  restored {s.restored}"
            f" ({s.restore_seconds:.2f} s)  load {os.getloadavg()[0]:.2f}",
            flush=True,
        )

    root = Path(tempfile.mkdtemp(prefix="bench-stream-large-", dir=args.work))
    partial = root.with_suffix(".partial")
    try:
        result = run(args, spark, root, line, None if args.quick else partial)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    partial.unlink(missing_ok=True)
    result.update(machine=machine, load_start=load[0], load_end=os.getloadavg()[0])
    print()
    print("\n".join(report(result)))
    print(f"\nload average at the start {load[0]:.2f}, at the end {os.getloadavg()[0]:.2f};"
          f" {result['wall_seconds']:.0f} s")
    return _write(args, result)


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def _from_partial(args: argparse.Namespace) -> int:
    """The results of a run cut short (stopped before its end: no restore figures unless
    it got that far), from the samples it left after each checkpoint."""
    samples = [Checkpoint(**x) for x in json.loads(args.from_partial.read_text())]
    last = samples[-1].batch if samples else -1
    result: dict[str, Any] = {
        "backend": args.backend, "wall_seconds": None, "kills": [], "rescaled": None,
        "cut_short": f"stopped after batch {last}: the results of the samples it left",
        "summary": summarize(samples, args.batches, int(args.target_gib * (1 << 30)),
                             local_db=args.backend == "rocksdb"),
        "samples": [{**asdict(s), "us_per_record": s.us_per_record} for s in samples],
        "machine": machine_info(), "load_start": None, "load_end": os.getloadavg()[0],
    }  # fmt: skip
    print("\n".join(report(result)))
    return _write(args, result)


def _write(args: argparse.Namespace, result: dict[str, Any]) -> int:
    """Print the goals and write the results file: this run beside the other backend's
    run of the same workload that the file already holds."""
    result["parameters"] = _parameters(args)
    out = args.out or (None if args.quick else REPO / "bench" / "stream_large_results.json")
    runs = [result]
    if out is not None and out.exists():
        kept = _runs(json.loads(out.read_text()), args)
        runs = [*(r for r in kept if r["backend"] != args.backend), result]
    doc = results(runs)
    for g in doc["goals"]:
        print(f"{g['verdict']:<12} {g['goal']}: {g['figures']}")
    if out is not None:
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


WORKLOAD = {"parallelism": 4, "merging": "ACROSS_CHECKPOINT", "num_retained": 1,
            "window_ms": 1000, "watermark_delay_ms": NO_CLOSE_MS, "exponent": 0.0}  # fmt: skip


def _runs(doc: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs of a results file on the same workload as ``args`` (rows per batch and
    vocabulary), each with its parameters and machine (a file of one run keeps them at
    its top level)."""
    out = []
    for r in doc.get("runs", []):
        r = {"machine": doc.get("machine"), "load_start": doc.get("load_start"),
             "load_end": doc.get("load_end"), "parameters": doc.get("parameters"), **r}  # fmt: skip
        p = r.get("parameters") or {}
        if p.get("rows") == args.rows and p.get("vocabulary") == args.vocabulary:
            out.append(r)
    return out


def results(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The results file's document: each run summarized anew from its raw samples, the
    backends compared when both ran, and the goals."""
    for r in runs:
        p = r["parameters"]
        samples = [Checkpoint(**{k: v for k, v in x.items() if k != "us_per_record"})
                   for x in r["samples"]]  # fmt: skip
        r["summary"] = summarize(samples, int(p["batches"]), int(p["target_gib"] * (1 << 30)),
                                 local_db=r["backend"] == "rocksdb")
    by = {r["backend"]: r for r in runs}
    upload = by.get("rocksdb")
    goals = [judge_large(upload["summary"] if upload else None)]
    comparison = compare(upload, by["working"]) if upload and "working" in by else None
    goals.extend(judge_working(comparison))
    return {"workload": WORKLOAD, "runs": runs, "comparison": comparison, "goals": goals}


if __name__ == "__main__":
    sys.exit(main())
