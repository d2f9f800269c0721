"""``make bench-stream``: ``ckpt stream`` against Spark's own state store, by rows per batch.

    python -m bench.stream_scale [--rows 1e3,1e4,1e5,1e6] [--batches 8] [--rounds 2]
        [--vocabulary 1000000] [--out bench/stream_results.json] [--quick]

One SparkSession (``local[2]``, 4 shuffle partitions, parallelism 4), the same input in
every run: ``rate-micro-batch`` rows, each row's word drawn from a Zipf-like vocabulary
(``words.with_ranks``, in the JVM), 5 s tumbling event-time windows counted per word. The
systems, run interleaved (A B C D, A B C D ...) at each size so that the machine's load
falls on all:

- ``ckpt``: ``pipeline.stream`` (ACROSS merging), RocksDB state checkpointed into the store;
- ``ckpt-off``: the same job with state checkpointing off (the cost of checkpointing);
- ``native``: ``groupBy(window, word).count()`` on Spark's RocksDB state store provider;
- ``native-changelog``: the same with its changelog checkpointing.

The native query gets its words by the same mapping in Spark SQL (``words.with_ranks``,
then ``format_string``), so both sides pay the same for the input, and the native query
runs no Python at all. Seconds are those of batches 1 .. N-1 (batch 0 starts
the Python workers and opens the stores): for ``ckpt`` from the end of batch 0 to the end
of the last, as the driver saw them; for the native query the sum of its batches'
``triggerExecution``. Files and bytes are counted by listing the checkpoint storage, never
from either system's bookkeeping: files per batch are, for ``ckpt``, the state files each
checkpoint created (from checkpoint 2 on; listed after each), and for the native query the
files under its ``state/`` directory at the end over the batches (it deletes none within
100 batches), its ``.crc`` sidecars apart; bytes per batch are the state bytes held at the
end over the batches. Space amplification is ``ckpt``'s only: the state bytes held over
the bytes the latest checkpoint refers to, at the end (once the TMs heard of the last
subsume: the run's final delivery) and at its peak over the samples the job takes as each
checkpoint completes (before the TMs hear of it); which files a native store's latest
version needs is in its own metadata, which this bench does not read, so its cells say
n/a. Each figure is the median over rounds; the ratio of records per second is ``ckpt``
over each other system. Each goal of issue 35 is printed met, missed or not measured
(``bench.stream_goals``); the mean of ``ckpt``'s amplification samples and the fraction
above the bound say how long the peaks last. A progress bar follows the runs; beside the
JSON results the sweep is plotted (``bench.stream_plot``: ``stream_results.png``, with
matplotlib, the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress, TimeElapsedColumn

from bench.common import REPO, cell, machine_info
from bench.stream_goals import AMPLIFICATION_BOUND, judge, large_goal
from bench.stream_plot import plot
from fastimpl.parties import WRITER_STATE
from spec.config import Config, MergingMode

SYSTEMS = ("ckpt", "ckpt-off", "native", "native-changelog")
_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


@dataclass
class Sample:
    system: str
    rows: int
    batches: int
    seconds: float
    """Of batches 1 .. N-1."""
    files_per_batch: float | None
    bytes_per_batch: float | None
    """The state bytes storage holds at the end, over the batches."""
    sidecars_per_batch: float | None = None
    amplification_end: float | None = None
    """``ckpt``: the state bytes held at the end of the run, once every TM has heard of the
    last checkpoint's subsume, over the bytes that checkpoint refers to."""
    amplification_peak: float | None = None
    """``ckpt``: the largest of the job's samples, each taken as a checkpoint completes
    (before the TMs hear of the subsume, which the next batch's tasks bring them)."""
    amplification_last_completed: float | None = None
    """``ckpt``: the job's sample at the last checkpoint's completion."""
    amplification_mean: float | None = None
    """``ckpt``: the mean of the job's samples (one per completed checkpoint)."""
    amplification_over_bound: float | None = None
    """``ckpt``: the fraction of those samples above the bound (``stream_goals``)."""

    @property
    def records_per_s(self) -> float:
        return self.rows * (self.batches - 1) / self.seconds


def _listed(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def ckpt_config(merging: MergingMode = MergingMode.ACROSS_CHECKPOINT) -> Config:
    """``ckpt stream``'s configuration in the streaming benches: ``merging``, one
    checkpoint retained, the default max file size (32 MiB), private state under 20 KB in
    the ``_metadata`` (R107, Flink's default), on a local disk (whose open files are
    readable, R16)."""
    return Config.from_flink(
        {
            "state.storage.fs.memory-threshold": "20kb",
            "execution.checkpointing.file-merging.enabled": merging is not MergingMode.NONE,
            "execution.checkpointing.file-merging.across-checkpoint-boundary": (
                merging is MergingMode.ACROSS_CHECKPOINT
            ),
            "execution.checkpointing.num-retained": 1,
        },
        open_files_readable=True,
    )


def run_ckpt(spark: Any, rows: int, batches: int, vocabulary: int, tmp: Path,
             *, snapshot: bool, merging: MergingMode = MergingMode.ACROSS_CHECKPOINT) -> Sample:
    """``merging``: the job's file merging mode (``bench.peers`` runs each one); the
    max file size is the default, 32 MiB."""
    from pipeline.stream.job import StreamSettings, run_stream
    from pipeline.stream.source import RateSource
    from pipeline.stream.windows import Windowing

    config = ckpt_config(merging)
    settings = StreamSettings(
        base=str(tmp / "checkpoints"),
        work_dir=str(tmp / "work"),
        out=str(tmp / "out"),
        config=config,
        parallelism=4,
        source=RateSource(rows, vocabulary=vocabulary),
        windowing=Windowing(5000, 0),
        batches=batches,
        snapshot=snapshot,
    )
    ends: list[float] = []
    run = run_stream(
        settings, spark=spark, on_batch=lambda _r: ends.append(time.perf_counter()),
        check=False, audit=False,
    )  # fmt: skip
    seconds = ends[-1] - ends[0]
    if not snapshot:
        return Sample("ckpt-off", rows, batches, seconds, None, None)
    later = run.storage[1:]  # checkpoint 1 creates every subtask's first files
    files = statistics.fmean(s.created for s in later) if later else None
    # State files only, as the job's own samples count them (``job._Files``).
    skip = ("_metadata", "_writer", WRITER_STATE)
    held = sum(p.stat().st_size for p in _listed(tmp / "checkpoints") if p.name not in skip)
    amp = [a for s in run.storage if (a := s.amplification) is not None]
    last = run.storage[-1].referenced_bytes if run.storage else 0
    return Sample(
        "ckpt", rows, batches, seconds, files, held / batches, None,
        held / last if last else None, max(amp, default=None), amp[-1] if amp else None,
        statistics.fmean(amp) if amp else None,
        sum(a > AMPLIFICATION_BOUND for a in amp) / len(amp) if amp else None,
    )  # fmt: skip


def run_native(spark: Any, rows: int, batches: int, vocabulary: int, tmp: Path,
               *, changelog: bool) -> Sample:
    from pyspark.sql import functions as F

    from pipeline.stream.source import RateSource
    from pipeline.stream.words import WORD_FORMAT, with_ranks

    source = RateSource(rows, vocabulary=vocabulary)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", _PROVIDER)
    spark.conf.set(_CHANGELOG, "true" if changelog else "false")
    words = with_ranks(source.read_stream(spark), **source.word_args()).select(
        F.format_string(WORD_FORMAT, "rank").alias("word"), "ts"
    )
    counts = (
        words.withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", "0 seconds")
        .groupBy(F.window("t", "5 seconds"), "word")
        .count()
    )
    cp = tmp / "spark"
    query = (
        counts.writeStream.outputMode("append")
        .format("parquet")
        .option("path", str(tmp / "out"))
        .option("checkpointLocation", str(cp))
        .start()
    )
    try:
        while True:
            last = query.lastProgress
            if last is not None and int(last["batchId"]) >= batches - 1:
                break
            if not query.isActive:
                raise RuntimeError(f"the native query stopped: {query.exception()}")
            time.sleep(0.05)
        progress = [p for p in query.recentProgress if 1 <= int(p["batchId"]) < batches]
    finally:
        query.stop()
    seconds = sum(int(p["durationMs"]["triggerExecution"]) for p in progress) / 1000
    state = _listed(cp / "state") if (cp / "state").exists() else []
    data = [p for p in state if not p.name.endswith(".crc")]
    name = "native-changelog" if changelog else "native"
    return Sample(
        name, rows, batches, seconds,
        len(data) / batches, sum(p.stat().st_size for p in data) / batches,
        (len(state) - len(data)) / batches,
    )  # fmt: skip


def one(spark: Any, system: str, rows: int, batches: int, vocabulary: int, root: Path) -> Sample:
    tmp = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=root))
    try:
        if system in ("ckpt", "ckpt-off"):
            return run_ckpt(spark, rows, batches, vocabulary, tmp, snapshot=system == "ckpt")
        return run_native(
            spark, rows, batches, vocabulary, tmp, changelog=system == "native-changelog"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _median(samples: list[Sample], system: str, rows: int) -> dict[str, Any]:
    mine = [s for s in samples if s.system == system and s.rows == rows]

    def med(xs: list[float | None]) -> float | None:
        got = [x for x in xs if x is not None]
        return statistics.median(got) if got else None

    return {
        "system": system,
        "rows_per_batch": rows,
        "runs": len(mine),
        "records_per_s": med([s.records_per_s for s in mine]),
        "us_per_record": med([1e6 / s.records_per_s for s in mine]),
        "files_per_batch": med([s.files_per_batch for s in mine]),
        "bytes_per_batch": med([s.bytes_per_batch for s in mine]),
        "sidecars_per_batch": med([s.sidecars_per_batch for s in mine]),
        "amplification_end": med([s.amplification_end for s in mine]),
        "amplification_peak": med([s.amplification_peak for s in mine]),
        "amplification_last_completed": med([s.amplification_last_completed for s in mine]),
        "amplification_mean": med([s.amplification_mean for s in mine]),
        "amplification_over_bound": med([s.amplification_over_bound for s in mine]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stream_scale", description=__doc__)
    ap.add_argument("--rows", default="1e3,1e4,1e5,1e6")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--vocabulary", type=int, default=1_000_000)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--quick", action="store_true", help="1e3 and 1e4 rows, 4 batches, 1 round")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.batches, args.rounds = "1e3,1e4", 4, 1
    sizes = [int(float(x)) for x in args.rows.split(",") if x.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if set(systems) - set(SYSTEMS) or args.batches < 3 or args.rounds < 1:
        ap.error(f"systems among {SYSTEMS}, --batches >= 3, --rounds >= 1")
    from pipeline.session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[2]", app="bench-stream")
    started = time.time()
    load = os.getloadavg()
    samples: list[Sample] = []
    runs = [(rows, r, system) for rows in sizes for r in range(args.rounds) for system in systems]
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as root, Progress(
        *Progress.get_default_columns(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task("bench-stream", total=len(runs))
        for rows, r, system in runs:  # interleaved: A B C D at each size, round by round
            bar.update(task, description=f"{rows:,} rows, round {r + 1}: {system}")
            s = one(spark, system, rows, args.batches, args.vocabulary, Path(root))
            samples.append(s)
            files = cell(s.files_per_batch, ".2f")
            bar.console.print(  # one line however narrow the terminal (or a log file)
                f"{rows:>9,} rows  round {r + 1}  {system:<17} {s.records_per_s:>11,.0f}"
                f" rec/s  files/batch {files}",
                soft_wrap=True,
            )
            bar.advance(task)
    spark.stop()
    table = [_median(samples, sy, rows) for rows in sizes for sy in systems]
    ratios: list[dict[str, Any]] = []
    for rows in sizes:
        by = {t["system"]: t for t in table if t["rows_per_batch"] == rows}
        mine = by.get("ckpt", {}).get("records_per_s")
        for other in ("ckpt-off", "native", "native-changelog"):
            theirs = by.get(other, {}).get("records_per_s")
            if mine and theirs:
                ratios.append({"rows_per_batch": rows, "against": other,
                               "ratio": mine / theirs})
    print()
    print(f"{'rows/batch':>10} {'system':<17} {'rec/s':>11} {'µs/rec':>8} {'files/b':>8}"
          f" {'crc/b':>6} {'bytes/b':>11} {'amp end':>8} {'amp peak':>8}")
    for t in table:
        print(f"{t['rows_per_batch']:>10,} {t['system']:<17} {t['records_per_s']:>11,.0f}"
              f" {t['us_per_record']:>8.1f} {cell(t['files_per_batch'], '.1f'):>8}"
              f" {cell(t['sidecars_per_batch'], '.1f'):>6}"
              f" {cell(t['bytes_per_batch'], ',.0f'):>11}"
              f" {cell(t['amplification_end'], '.2f'):>8}"
              f" {cell(t['amplification_peak'], '.2f'):>8}")
    print()
    for q in ratios:
        print(f"{q['rows_per_batch']:>10,} ckpt / {q['against']:<17} {q['ratio']:.2f}")
    goals = judge(table)
    print()
    for g in goals:
        print(f"{g['rows_per_batch']:>10,} {g['verdict']:<12} {g['goal']}: {g['figures']}")
    large = large_goal(REPO / "bench" / "stream_large_results.json")
    print(f"{'':>10} {large['verdict']:<12} {large['goal']}: {large['figures']}"
          " (bench/stream_large_results.json)")
    amp = [t for t in table if t["amplification_mean"] is not None]
    for t in amp:
        print(f"{t['rows_per_batch']:>10,} ckpt amplification samples: mean"
              f" {t['amplification_mean']:.2f}, {t['amplification_over_bound']:.0%} above"
              f" {AMPLIFICATION_BOUND}")
    print(f"\nload average at the start {load[0]:.2f}, at the end {os.getloadavg()[0]:.2f};"
          f" {time.time() - started:.0f} s")
    out = args.out or (None if args.quick else REPO / "bench" / "stream_results.json")
    if out is not None:
        out.write_text(json.dumps(
            {"machine": machine_info(), "batches": args.batches, "rounds": args.rounds,
             "vocabulary": args.vocabulary, "load_start": load[0],
             "load_end": os.getloadavg()[0], "table": table, "ratios": ratios,
             "goals": goals, "samples": [asdict(s) for s in samples]}, indent=1) + "\n")
        print(f"wrote {out}")
        print(plot(table, out.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
