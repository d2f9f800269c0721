"""The streaming job on Spark: ``rate-micro-batch`` rows, keyed by word, through
``foreachBatch``.

Why ``foreachBatch`` and an RDD of our own: each micro-batch is one checkpoint, and a
subtask must own a fixed range of key groups (``g * p // 128``), keep its RocksDB, snapshot
it at the end of the batch and hand an acknowledgement back to the driver. In
``foreachBatch`` the driver runs code before and after the batch's tasks (trigger, then
receive and complete); ``partitionBy`` with our partition function makes partition ``i``
exactly subtask ``i``; ``mapPartitionsWithIndex`` runs the state update and the snapshot
once per partition, and ``collect`` returns one result per partition, from the attempt
Spark accepted. Spark's own stateful operators (``applyInPandasWithState``,
``transformWithStateInPandas``) keep state in Spark's state store, place keys by Spark's
hash, and offer no end-of-partition hook to snapshot in: two state systems, and no say
over the files.

Masters: ``local[N]`` runs the job (no task retries: a failing task fails the batch);
worker kills need ``local[N,F]`` with F >= 2 or ``local-cluster``; speculation needs a
standalone cluster with workers on distinct hosts (STREAM_NOTES §2c). The failure flags
come with fastimpl's TaskManager and Coordinator parties.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attrs import define, field, frozen

from pipeline.stream.check import Comparison, batch_counts, compare
from pipeline.stream.checkpointing import decode_assignment, open_coordinator
from pipeline.stream.driver import BatchDriver, BatchReport
from pipeline.stream.sink import read_all, write_batch
from pipeline.stream.source import RateSource
from pipeline.stream.subtask import BatchOrder, Failures, SubtaskResult, run_subtask
from pipeline.stream.windows import Windowing
from pipeline.stream.words import MAX_PARALLELISM, key_group, subtask_of, word_of
from spec.config import Config
from spec.handles import stream_of


@frozen
class StreamSettings:
    base: str
    """Checkpoint storage (a local directory or an fsspec URL)."""
    work_dir: str
    """The executors' local disk (RocksDB, local checkpoints) and Spark's own checkpoint."""
    out: str
    """The sink's directory."""
    config: Config = field(factory=Config)
    storage_options: dict[str, Any] = field(factory=dict)
    """fsspec options of ``base`` (an S3 endpoint, credentials)."""
    parallelism: int = 4
    num_tms: int | None = None
    """TMs of the store (default: one per subtask, as one Python worker runs each)."""
    source: RateSource = field(factory=lambda: RateSource(1000))
    windowing: Windowing = field(factory=lambda: Windowing(5000, 0))
    batches: int = 20
    master: str = "local[*]"
    write_buffer_size: int = 64 * 1024
    compact_every: int = 0
    failures: Failures = field(factory=Failures)
    """Injected failures: a task SIGKILLs its Python worker (needs a master that retries
    tasks: ``local[N,F]`` with F >= 2, ``local-cluster``, a cluster)."""


@define
class StreamRun:
    settings: StreamSettings
    reports: list[BatchReport]
    seconds: float
    storage: list[StorageSample]
    """What storage held after each completed checkpoint."""
    comparison: Comparison | None = None
    final_watermark: int = -1
    violations: list[str] = field(factory=list)
    """The store's invariants I1-I5 on the real files after the run."""


def retries_tasks(master: str) -> bool:
    """Whether a failed task is retried on ``master``: ``local`` and ``local[N]`` try a
    task once (``local[N,F]`` F times)."""
    m = re.fullmatch(r"local(?:\[([^,\]]+)(?:,\s*(\d+))?\])?", master.strip())
    if m is None:
        return True  # local-cluster, standalone, YARN, Kubernetes: spark.task.maxFailures
    return m.group(2) is not None and int(m.group(2)) >= 2


def _keyed(word_args: dict[str, Any], row: Any) -> tuple[int, tuple[str, int]]:
    word = word_of(int(row[0]), **word_args)
    return key_group(word), (word, int(row[1]))


def _partition(parallelism: int, group: int) -> int:
    return subtask_of(group, parallelism)


def _task(
    order: BatchOrder, index: int, rows: Iterator[tuple[int, tuple[str, int]]]
) -> Iterator[SubtaskResult]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    # Unique per attempt across the application: names the attempt's local DB directory.
    attempt = f"t{ctx.taskAttemptId()}" if ctx is not None else f"p{os.getpid()}"
    number = ctx.attemptNumber() if ctx is not None else 0
    yield run_subtask(
        order, index, attempt, ((g, w, ts) for g, (w, ts) in rows), attempt_number=number
    )


@frozen
class StorageSample:
    checkpoint: int
    files: int
    created: int
    """Files that appeared since the previous sample."""
    deleted: int
    state_bytes: int
    """Bytes of every file but the ``_metadata`` and lease files."""
    referenced_bytes: int
    """Bytes the latest completed checkpoint's state entries name (each range once)."""

    @property
    def amplification(self) -> float | None:
        """Bytes held for state per byte the latest checkpoint needs."""
        return self.state_bytes / self.referenced_bytes if self.referenced_bytes else None


class _Files:
    """What storage holds after each checkpoint, by listing it (whichever party wrote),
    against what the latest checkpoint references (from the restore assignments)."""

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        import fsspec  # type: ignore[import-untyped]

        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        self.seen: set[str] = set()
        self.samples: list[StorageSample] = []

    def sample(self, checkpoint: int, assignments: list[bytes]) -> None:
        found = self.fs.find(self.root, detail=True) if self.fs.exists(self.root) else {}
        now = set(found)
        state = sum(
            int(info.get("size") or 0)
            for path, info in found.items()
            if path.rsplit("/", 1)[-1] not in ("_metadata", "_writer")
        )
        ranges = {
            (h.path, getattr(h, "offset", 0), h.length)
            for a in assignments
            for e in decode_assignment(a).entries
            if (h := stream_of(e.handle)) is not None
        }
        self.samples.append(
            StorageSample(
                checkpoint,
                len(now),
                len(now - self.seen),
                len(self.seen - now),
                state,
                sum(r[2] for r in ranges),
            )
        )
        self.seen = now


def run_stream(
    settings: StreamSettings,
    *,
    spark: Any = None,
    on_batch: Callable[[BatchReport], None] | None = None,
    check: bool = True,
) -> StreamRun:
    """Run the job for ``settings.batches`` micro-batches; compare with the batch
    computation when ``check``."""
    p = settings.parallelism
    if settings.failures.kill_prob > 0 and not retries_tasks(settings.master):
        raise ValueError(
            f"--kill-worker-prob needs a master that retries a failed task; {settings.master}"
            " fails the job at the first (use local[N,F] with F >= 2, or local-cluster)"
        )
    if not 1 <= p <= MAX_PARALLELISM:
        raise ValueError(f"parallelism must be in 1..{MAX_PARALLELISM}, got {p}")
    if settings.config.max_parallelism != MAX_PARALLELISM:
        raise ValueError(
            f"pipeline.max-parallelism is {settings.config.max_parallelism}; the stream's"
            f" key groups are fixed at {MAX_PARALLELISM}"
        )
    coordinator = open_coordinator(
        settings.base,
        settings.config,
        p,
        num_tms=settings.num_tms,
        storage_options=settings.storage_options,
    )
    if spark is None:
        from pipeline.session import spark_session

        spark = spark_session(settings.master, app="ckpt-stream")
    files = _Files(settings.base, settings.storage_options)
    driver = BatchDriver(
        coordinator,
        settings.windowing,
        p,
        str(Path(settings.work_dir) / "local"),
        write_buffer_size=settings.write_buffer_size,
        compact_every=settings.compact_every,
        failures=settings.failures,
    )
    out = Path(settings.out)
    done = threading.Event()
    word_args = settings.source.word_args()

    def per_batch(df: Any, batch_id: int) -> None:
        if batch_id >= settings.batches:
            # Past the last batch: the query is being stopped. Spark commits this batch
            # although none of its rows were counted, so a run that continued from this
            # Spark checkpoint would skip them: a restart (--rescale-at, to come) must
            # stop without a commit (raise here, and quiet Spark's error log of it).
            done.set()
            return
        order = driver.order(batch_id)
        try:
            results: list[SubtaskResult] = (
                df.rdd.map(functools.partial(_keyed, word_args))
                .partitionBy(p, functools.partial(_partition, p))
                .mapPartitionsWithIndex(functools.partial(_task, order))
                .collect()
            )
            write_batch(out, batch_id, [w for r in results for w in r.closed])
        except BaseException:
            # The batch fails and Spark does not commit it; its checkpoint never completes.
            coordinator.abort(order.checkpoint)
            raise
        report = driver.finish(order, results)
        coordinator.settle()
        files.sample(
            order.checkpoint,
            [coordinator.restore_assignment(s, order.checkpoint + 1) for s in driver.subtasks()],
        )
        if on_batch is not None:
            on_batch(report)
        if batch_id + 1 >= settings.batches:
            done.set()

    t0 = time.perf_counter()
    query = (
        settings.source.read_stream(spark)
        .writeStream.foreachBatch(per_batch)
        .option("checkpointLocation", str(Path(settings.work_dir) / "spark"))
        .start()
    )
    try:
        while not done.wait(0.2):
            if not query.isActive:
                break
        err = query.exception()
    finally:
        query.stop()
        violations = coordinator.violations()
        coordinator.close()
    if err is not None and len(driver.reports) < settings.batches:
        raise RuntimeError(f"the streaming query failed: {err}")
    run = StreamRun(
        settings,
        list(driver.reports),
        time.perf_counter() - t0,
        files.samples,
        final_watermark=driver.watermark,
        violations=violations,
    )
    if check:
        emitted = [w for rows in read_all(out).values() for w in rows]
        last = driver.reports[-1].watermark if driver.reports else -1
        expected = batch_counts(settings.source, len(driver.reports), settings.windowing)
        run.comparison = compare(expected, emitted, settings.windowing, last)
    return run
