"""The streaming job on Spark: ``rate-micro-batch`` rows, keyed by word, through
``foreachBatch``.

Why ``foreachBatch`` and an RDD of our own: each micro-batch is one checkpoint, and a
subtask must own a fixed range of key groups (``g * p // 128``), keep its RocksDB, snapshot
it at the end of the batch and hand an acknowledgement back to the driver. In
``foreachBatch`` the driver runs code before and after the batch's tasks (trigger, then
receive and complete); the map side adds the batch's records up on Arrow batches
(``partial_counts``: no record crosses into Python one by one), ``partitionBy`` with our
partition function makes partition ``i`` exactly subtask ``i``;
``mapPartitionsWithIndex`` runs the state update and the snapshot once per partition,
and ``collect`` returns one result per partition, from the attempt Spark accepted.
Spark's own stateful operators (``applyInPandasWithState``, ``transformWithStateInPandas``)
keep state in Spark's state store, place keys by Spark's hash, and offer no
end-of-partition hook to snapshot in: two state systems, and no say over the files.

Masters: ``local[N]`` runs the job (no task retries: a failing task fails the batch);
worker kills need ``local[N,F]`` with F >= 2 or ``local-cluster``; speculation needs
executors on two hosts, which ``local-cluster`` never has (Spark launches a speculative
copy only on a host where no attempt of the task ran): a standalone cluster, on one
machine with its workers bound to two loopback addresses (docs/stream.md, "Masters";
``tests/spark_cluster.py``). A rescale or a restarted driver runs on any master.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
from attrs import define, field, frozen

from fastimpl.parties import WRITER_STATE
from pipeline.stream.audit import JobAudit, audit_jobs
from pipeline.stream.batch_order import BatchOrder, SubtaskResult
from pipeline.stream.check import Comparison, batch_counts, compare
from pipeline.stream.checkpointing import CoordinatorSide, decode_assignment
from pipeline.stream.coordination import SparkCoordinator, open_coordinator, to_recover
from pipeline.stream.driver import BatchDriver, BatchReport
from pipeline.stream.kills import Failures, Kill, read_kills
from pipeline.stream.partial_counts import SHUFFLED, partial_counts
from pipeline.stream.rocks import BLOOM_BITS
from pipeline.stream.sink import read_all, write_batch
from pipeline.stream.source import RateSource
from pipeline.stream.subtask import deliver, run_subtask
from pipeline.stream.windows import Windowing
from pipeline.stream.words import MAX_PARALLELISM, with_ranks
from spec.config import Config, RestoreMode
from spec.errors import OperationFailed, UsageError
from spec.handles import extent_of, stream_of

if TYPE_CHECKING:  # SlateDB is imported only when the working backend runs
    from pipeline.stream.slate_collect import Collected


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
    source: RateSource = field(factory=lambda: RateSource(1000))
    windowing: Windowing = field(factory=lambda: Windowing(5000, 0))
    batches: int = 20
    master: str = "local[*]"
    write_buffer_size: int = 64 * 1024
    l0_compaction_trigger: int = 4
    """RocksDB's level-0 compaction trigger (its default, 4): each compaction rewrites the
    small state whole, retiring every shared upload of the subtask at once."""
    bloom_bits: int = BLOOM_BITS
    """Bits per key of RocksDB's bloom filters (0: none; ``rocks.options``)."""
    compact_every: int = 0
    failures: Failures = field(factory=Failures)
    """Injected failures: a task SIGKILLs its Python worker (needs a master that retries
    tasks: ``local[N,F]`` with F >= 2, ``local-cluster``, a cluster)."""
    rescale_at: tuple[int, int] | None = None
    """``(N, P)``: stop after batch N and restart with parallelism P, restoring the
    latest completed checkpoint with rescale (the configured restore mode)."""
    die_at: tuple[int, str] | None = None
    """``(b, point)``: the driver SIGKILLs itself in batch b at ``point`` (DRIVER_KILL_POINTS)."""
    snapshot: bool = True
    """Checkpoint the state (off: the baseline of the records-per-second ratio)."""
    state_backend: str = "rocksdb"
    """``rocksdb``: a RocksDB per subtask on the executor's disk, its SSTs uploaded at each
    checkpoint; ``working``: a SlateDB per subtask on the checkpoint storage itself
    (``pipeline.stream.slate``), its files referred to in place (SPEC §11)."""
    gc_min_age_s: float = 10.0
    """``working``: the minimum age of the objects SlateDB's GC deletes (the grace of R64:
    no attempt outlives its task here, whose worker is dead or done when ``collect``
    returns)."""
    trace: bool = False
    """Write the run's command trace (``TRACE`` in the work directory) for
    ``model_tests.replay``; it stops where the model has no command (a driver restart,
    ``pipeline.stream.trace``)."""
    speculation: bool = False
    """Spark's speculative execution (a master with separate executors: not ``local``).
    Two attempts of one subtask may then write at once; the coordinator gives a TM up,
    and sweeps files nobody records, only once no attempt may still run
    (``TaskAttempts``)."""


SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
}
"""Spark looks every 100 ms, once half of a stage's tasks finished, for a task running
1.5 times their median and at least 0.5 s, and copies it: what the tests on the loopback
standalone cluster run with (``tests/test_stream_failures.py``)."""


@frozen
class TaskAttempt:
    """One task attempt as Spark's listener bus reported it."""

    task_id: int
    stage: int
    index: int
    """The partition: for a snapshot stage, the subtask."""
    attempt: int
    host: str
    speculative: bool
    """A copy Spark launched while another attempt of the task ran (speculation)."""
    end: str | None = None
    """How it ended (``Success``, ``TaskKilled``, ``ExceptionFailure``...); None: not seen."""


class TaskAttempts:
    """The driver's view of task attempts, from Spark's listener bus (a SparkListener
    through py4j). An attempt may still run from its start event to its end event and a
    grace after it: a cancelled attempt's Python worker is force-killed only
    ``spark.python.task.killTimeout`` after the interrupt, which a monitor polls every
    2 s, so a TaskKilled end may come before its last write. Every attempt is kept
    (``attempts``): the run's record of which were speculative copies and how each
    ended."""

    def __init__(self, sc: Any, grace_s: float = 10.0) -> None:
        self._sc = sc
        self.grace_s = grace_s
        self.running: set[int] = set()
        self.last_end = float("-inf")
        self.started = self.ended = 0
        self.attempts: dict[int, TaskAttempt] = {}
        self._lock = threading.Lock()
        self.proxy: Any = None
        """The one Java proxy of this listener (Spark removes a listener by identity)."""

    def onTaskStart(self, event: Any) -> None:
        info = event.taskInfo()
        a = TaskAttempt(
            int(info.taskId()),
            int(event.stageId()),
            int(info.index()),
            int(info.attemptNumber()),
            str(info.host()),
            bool(info.speculative()),
        )
        with self._lock:
            self.running.add(a.task_id)
            self.attempts[a.task_id] = a
            self.started += 1

    def onTaskEnd(self, event: Any) -> None:
        tid = int(event.taskInfo().taskId())
        reason = str(event.reason().getClass().getSimpleName()).rstrip("$")
        with self._lock:
            self.running.discard(tid)
            if tid in self.attempts:
                self.attempts[tid] = attrs.evolve(self.attempts[tid], end=reason)
            self.last_end = time.monotonic()
            self.ended += 1

    def may_still_run(self) -> bool:
        try:  # the events of what already happened first (delivery is asynchronous)
            self._sc._jsc.sc().listenerBus().waitUntilEmpty(10_000)
        except Exception:
            pass
        with self._lock:
            return bool(self.running) or time.monotonic() - self.last_end < self.grace_s

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on"):  # every other SparkListenerInterface callback
            return lambda *_args: None
        raise AttributeError(name)

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.scheduler.SparkListenerInterface"]

    @classmethod
    def register(cls, spark: Any) -> TaskAttempts:
        from pyspark.java_gateway import ensure_callback_server_started

        # PySpark has no public call to register a JVM SparkListener: its own py4j handles
        # (``_gateway``, ``_jvm``, ``_jsc``) are the one way; none of ours is reached.
        sc = spark.sparkContext
        listener = cls(sc)
        ensure_callback_server_started(sc._gateway)  # type: ignore[no-untyped-call]
        # py4j makes a new Java proxy each time a Python object is passed, and Spark
        # removes a listener by identity: keep the one proxy (through a Java list, whose
        # element comes back as a reference) to remove it again.
        holder = sc._jvm.java.util.ArrayList()
        holder.add(listener)
        listener.proxy = holder.get(0)
        sc._jsc.sc().addSparkListener(listener.proxy)
        return listener

    def unregister(self) -> None:
        self._sc._jsc.sc().removeSparkListener(self.proxy)


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
    """The store's invariants I1-I6 on the real files after the run (quiet)."""
    rescaled: tuple[int, int, str] | None = None
    """``(after batch, new parallelism, restore mode)`` when the run rescaled."""
    skipped: tuple[int, ...] = ()
    """Batches Spark ran again after a restart that the state already held (not counted
    again: their checkpoint had completed before the driver died)."""
    recovered: str | None = None
    """The job this run recovered from (a driver restart), if any."""
    abandoned: tuple[str, ...] = ()
    """Newer jobs of the application the restart found with no completed checkpoint:
    their driver died before it; their bases were deleted as garbage."""
    jobs: tuple[str, ...] = ()
    """Every job id the run's checkpoints were written under, oldest first."""
    audits: list[JobAudit] = field(factory=list)
    """The storage audit of each job's base after the run (``pipeline.stream.audit``)."""
    slatedb: tuple[int, int, int, int] | None = None
    """``--state-backend working``: SlateDB checkpoints released, databases dropped, and
    the objects (and bytes) SlateDB still keeps at the end (``kept_by_slatedb``)."""
    kills: tuple[Kill, ...] = ()
    """The injected worker kills, as the killed tasks logged them (``kills.KILL_LOG``;
    a resumed run's include those of the runs before it in the same work directory)."""
    attempts: tuple[TaskAttempt, ...] = ()
    """Every task attempt Spark's listener reported (with ``--speculation``; else none)."""
    trace: str | None = None
    """The command trace written (``StreamSettings.trace``), if any."""
    trace_commands: int = 0
    trace_stopped: str | None = None
    """Why the trace ends before the run (None: it holds the whole run)."""
    trace_outside: tuple[str, ...] = ()
    """What the run did outside the model, left out of the trace (strays' files,
    ``pipeline.stream.trace``)."""

    def speculative_copies(self) -> list[TaskAttempt]:
        """The speculative attempts Spark launched of this run's snapshot tasks (the
        stages the accepted results came from)."""
        stages = {r.stage for r in self.reports if r.stage >= 0}
        return [a for a in self.attempts if a.speculative and a.stage in stages]


DRIVER_KILL_POINTS = ("running", "sunk", "completed")
"""Where ``die_at`` kills the driver in its batch: while the batch's snapshot tasks run
(half a second after the first of them started: the TMs write the checkpoint's files as
the application dies); after the sink holds the batch's windows but before its
checkpoint completes; after the checkpoint completed but before Spark commits the
batch."""

TRACE = "trace.ndjson"
"""In the work directory: the run's command trace (``StreamSettings.trace``)."""

DRIVER_STATE = "driver.json"
"""In the work directory: the running job's id and parallelism, for a restart."""


class _Stop(Exception):
    """Raised in ``foreachBatch`` for the first batch past the segment: the query ends
    and Spark does not commit that batch, so a restart runs it (returning normally would
    commit it unprocessed and lose its rows; R96)."""


def retries_tasks(master: str) -> bool:
    """Whether a failed task is retried on ``master``: ``local`` and ``local[N]`` try a
    task once (``local[N,F]`` F times)."""
    m = re.fullmatch(r"local(?:\[([^,\]]+)(?:,\s*(\d+))?\])?", master.strip())
    if m is None:
        return True  # local-cluster, standalone, YARN, Kubernetes: spark.task.maxFailures
    return m.group(2) is not None and int(m.group(2)) >= 2


def _shuffled(row: Any) -> tuple[int, bytes]:
    return int(row[0]), bytes(row[1])


def _partition(parallelism: int, subtask: int) -> int:
    if not 0 <= subtask < parallelism:
        raise OperationFailed(f"partial counts for subtask {subtask} of {parallelism}")
    return subtask


def _task(
    order: BatchOrder, index: int, rows: Iterator[tuple[int, bytes]]
) -> Iterator[SubtaskResult]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    # Unique per attempt across the application: names the attempt's local DB directory.
    attempt = f"t{ctx.taskAttemptId()}" if ctx is not None else f"p{os.getpid()}"
    number = ctx.attemptNumber() if ctx is not None else 0
    streams = []
    for subtask, stream in rows:
        if subtask != index:  # ``_partition`` puts subtask i's counts in partition i
            raise OperationFailed(f"partition {index} got the counts of subtask {subtask}")
        streams.append(stream)
    result = run_subtask(order, index, attempt, streams, attempt_number=number)
    yield result if ctx is None else attrs.evolve(result, stage=ctx.stageId())


@frozen
class StorageSample:
    checkpoint: int
    files: int
    created: int
    """Files that appeared since the previous sample."""
    deleted: int
    state_bytes: int
    """Bytes of the running job's files but its ``_metadata``."""
    referenced_bytes: int
    """Bytes the latest completed checkpoint's state entries name (each range once)."""
    referenced_jobs: tuple[str, ...] = ()
    """The job bases the files of the latest completed checkpoint lie in (after a NO_CLAIM
    restore: the new job's own only, R73)."""

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

    def sample(
        self,
        checkpoint: int,
        assignments: list[bytes],
        job: str,
        in_place: Mapping[str, int] | None = None,
        bases: Iterable[str] = (),
    ) -> None:
        """``job``: the running job; the space amplification counts the bytes under its
        base only (after a NO_CLAIM restore the old job's checkpoint is the user's), and
        under ``bases`` (``--state-backend working``: the claimed jobs whose databases
        the running job's clones refer to). ``in_place``: the working files the latest
        checkpoint refers to in place, with their sizes (R103)."""
        found = self.fs.find(self.root, detail=True) if self.fs.exists(self.root) else {}
        root = str(self.root).rstrip("/")
        mine = tuple(f"{root}/{b}/" for b in {job, *bases})
        # State files only, as Flink's figures count them: not the ``_metadata`` of each
        # checkpoint, nor the lease, nor the writer's published state.
        skip = ("_metadata", "_writer", WRITER_STATE)
        now = {path for path in found if path.rsplit("/", 1)[-1] not in skip}
        state = sum(
            int(info.get("size") or 0)
            for path, info in found.items()
            if path.rsplit("/", 1)[-1] not in skip and path.startswith(mine)
        )
        ranges = {
            extent_of(h)
            for a in assignments
            for e in decode_assignment(a).entries
            if (h := stream_of(e.handle)) is not None
        }
        places = dict(in_place or {})
        self.samples.append(
            StorageSample(
                checkpoint,
                len(now),
                len(now - self.seen),
                len(self.seen - now),
                state,
                sum(r[2] for r in ranges) + sum(places.values()),
                tuple(sorted({p.split("/", 1)[0] for p in [*(r[0] for r in ranges), *places]})),
            )
        )
        self.seen = now


def _read_state(work_dir: str) -> dict[str, Any] | None:
    """The driver state: ``jobs``, the application's jobs oldest first, each with the mode
    it restored its predecessor in (``null`` for the first), and the parallelism the
    newest runs at. A file of the first format (one ``job``) is a lineage of one."""
    path = Path(work_dir) / DRIVER_STATE
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise UsageError(f"{path}: not a driver state file ({err})") from None
    if isinstance(d, dict) and "jobs" not in d and isinstance(d.get("job"), str):
        d = {"jobs": [[d["job"], None]], "parallelism": d.get("parallelism")}
    modes = {m.name for m in RestoreMode}
    if (
        not isinstance(d, dict)
        or type(d.get("parallelism")) is not int
        or not isinstance(d.get("jobs"), list)
        or not d["jobs"]
        or not all(
            isinstance(e, list)
            and len(e) == 2
            and isinstance(e[0], str)
            and (e[1] is None or e[1] in modes)
            for e in d["jobs"]
        )
    ):
        raise UsageError(f"{path}: not a driver state file")
    d["lineage"] = [(j, None if m is None else RestoreMode[m]) for j, m in d["jobs"]]
    return d


def _write_state(
    work_dir: str, lineage: list[tuple[str, RestoreMode | None]], parallelism: int
) -> None:
    """Every job the application started, not only the newest: a new job that dies before
    its first checkpoint holds nothing, and the restart recovers the one before it
    (``coordination.to_recover``)."""
    path = Path(work_dir) / DRIVER_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    jobs = [[j, None if m is None else m.name] for j, m in lineage]
    tmp.write_text(json.dumps({"jobs": jobs, "parallelism": parallelism}))
    os.replace(tmp, path)


def _quiet_query_errors(spark: Any) -> None:
    """Spark logs a query that ends by an exception at ERROR with the whole stack, and every
    segment ends so (``_Stop``); a real failure is raised here with Spark's message."""
    try:
        # PySpark has no public call to set one JVM logger's level (``setLogLevel`` sets
        # the root's): its own py4j handle is the one way
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming", jvm.org.apache.logging.log4j.Level.OFF
        )
    except Exception:  # a different logging backend: the log stays noisy
        pass


def _die(point: str) -> None:
    """The driver dies as a killed process does: no cleanup, no reply to Spark."""
    os.kill(os.getpid(), signal.SIGKILL)


def _die_while_running(sc: Any, seen_jobs: set[int], delay_s: float = 0.5) -> None:
    """Kill the driver once a task of the batch's snapshot stage runs (the stage with the
    highest id of a job not in ``seen_jobs``, the jobs active before the batch: the
    collect's result stage)."""
    tracker = sc.statusTracker()

    def watch() -> None:
        while True:
            for job in tracker.getActiveJobsIds():
                info = tracker.getJobInfo(job)
                if job in seen_jobs or info is None or not info.stageIds:
                    continue
                stage = tracker.getStageInfo(max(info.stageIds))
                if stage is not None and stage.numActiveTasks + stage.numCompletedTasks > 0:
                    time.sleep(delay_s)
                    _die("running")
            time.sleep(0.05)

    threading.Thread(target=watch, name="die-while-running", daemon=True).start()


def run_stream(
    settings: StreamSettings,
    *,
    spark: Any = None,
    on_batch: Callable[[BatchReport], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    check: bool = True,
    audit: bool = True,
    resume: bool = False,
) -> StreamRun:
    """Run the job until ``settings.batches`` micro-batches are done; compare with the
    batch computation when ``check``. ``resume`` continues a run whose driver died (the
    same work directory): the store recovers from the persisted ``_metadata``, Spark
    from its own offsets and commits, the watermark and the last batch the state holds
    from the operator state."""
    say = on_event or (lambda _m: None)
    p = settings.parallelism
    if settings.speculation and settings.master.strip().startswith("local"):
        raise UsageError(
            f"--speculation needs a master with separate executors; Spark never speculates"
            f" on {settings.master} (use a standalone cluster with workers on two hosts)"
        )
    if settings.failures.any and not retries_tasks(settings.master):
        raise UsageError(
            f"--kill-worker-prob needs a master that retries a failed task; {settings.master}"
            " fails the job at the first (use local[N,F] with F >= 2, or local-cluster)"
        )
    for q in (p, *(() if settings.rescale_at is None else (settings.rescale_at[1],))):
        if not 1 <= q <= MAX_PARALLELISM:
            raise UsageError(f"parallelism must be in 1..{MAX_PARALLELISM}, got {q}")
    if settings.rescale_at is not None and not 0 <= settings.rescale_at[0] < settings.batches - 1:
        raise UsageError(
            f"--rescale-at {settings.rescale_at[0]}:...: the batch must be in"
            f" 0..{settings.batches - 2} (a batch must follow it)"
        )
    if settings.state_backend == "working":
        if settings.speculation:
            raise UsageError(
                "--state-backend working runs without --speculation: two attempts of a"
                " subtask would open its one database directory (the second fences the first)"
            )
        if not settings.snapshot:
            raise UsageError(
                "--state-backend working is the checkpointed state: not with --no-snapshot"
            )
    if settings.config.max_parallelism != MAX_PARALLELISM:
        raise UsageError(
            f"pipeline.max-parallelism is {settings.config.max_parallelism}; the stream's"
            f" key groups are fixed at {MAX_PARALLELISM}"
        )
    state = _read_state(settings.work_dir) if resume else None
    if resume and state is None:
        raise UsageError(f"nothing to resume in {settings.work_dir} (no {DRIVER_STATE})")
    lineage: list[tuple[str, RestoreMode | None]] = []
    back = None
    if state is not None:
        p = state["parallelism"]
        lineage = list(state["lineage"])
        back = to_recover(settings.base, settings.storage_options, lineage)
    coordinator = open_coordinator(
        settings.base,
        settings.config,
        p,
        storage_options=settings.storage_options,
        crashed_job=None if back is None else back.crashed_job,
        abandoned=() if back is None else back.abandoned,
        restore_mode=RestoreMode.CLAIM if back is None else back.restore_mode,
        backend=settings.state_backend,
        gc_min_age_s=settings.gc_min_age_s,
        trace=str(Path(settings.work_dir) / TRACE) if settings.trace else None,
    )
    jobs = [coordinator.job_id]
    lineage.append((coordinator.job_id, None if back is None else back.restore_mode))
    _write_state(settings.work_dir, lineage, p)
    if back is not None:
        gone = f" (abandoned, no checkpoint: {', '.join(back.abandoned)})" if back.abandoned else ""
        say(f"driver restarted: job {back.crashed_job} recovered as {coordinator.job_id}{gone}")
    own_session = spark is None
    if spark is None:
        from pipeline.session import spark_session

        spark = spark_session(
            settings.master,
            app="ckpt-stream",
            conf=dict(SPECULATION) if settings.speculation else None,
        )
    attempts = TaskAttempts.register(spark) if settings.speculation else None
    if attempts is not None and isinstance(coordinator, SparkCoordinator):
        coordinator.may_still_run = attempts.may_still_run
    files = _Files(settings.base, settings.storage_options)
    local = str(Path(settings.work_dir) / "local")

    def new_driver(parallelism: int, no_claim: bool = False) -> BatchDriver:
        d = BatchDriver(
            coordinator,
            settings.windowing,
            parallelism,
            local,
            write_buffer_size=settings.write_buffer_size,
            compact_every=settings.compact_every,
            l0_compaction_trigger=settings.l0_compaction_trigger,
            bloom_bits=settings.bloom_bits,
            failures=settings.failures,
            snapshot=settings.snapshot,
            sweep_local=not settings.speculation,
            backend=settings.state_backend,
            no_claim=no_claim,
        )
        if settings.snapshot:
            d.recover_progress()
        return d

    driver: BatchDriver = new_driver(
        p, no_claim=back is not None and back.restore_mode is RestoreMode.NO_CLAIM
    )
    reports: list[BatchReport] = []
    skipped: list[int] = []
    run = StreamRun(
        settings,
        reports,
        0.0,
        files.samples,
        recovered=None if back is None else back.crashed_job,
        abandoned=() if back is None else back.abandoned,
    )
    t0 = time.perf_counter()
    try:
        if settings.rescale_at is not None and p != settings.rescale_at[1]:
            n, new_p = settings.rescale_at
            if driver.last_batch < n:
                _segment(spark, settings, coordinator, driver, files, n, on_batch, skipped, say)
                reports.extend(driver.reports)
            mode = settings.config.restore_mode
            coordinator.rescale(new_p, mode)
            lineage.append((coordinator.job_id, mode))
            _write_state(settings.work_dir, lineage, new_p)
            jobs.append(coordinator.job_id)
            say(
                f"rescaled after batch {driver.last_batch}: parallelism {p} -> {new_p}"
                f" ({mode.name}), job {coordinator.job_id}"
            )
            run.rescaled = (driver.last_batch, new_p, mode.name)
            driver = new_driver(new_p, no_claim=mode is RestoreMode.NO_CLAIM)
        _segment(
            spark,
            settings,
            coordinator,
            driver,
            files,
            settings.batches - 1,
            on_batch,
            skipped,
            say,
        )
        reports.extend(driver.reports)
        if settings.snapshot:
            _deliver(spark, coordinator, driver)
            if not coordinator.finish_attempts():
                say("an attempt may still run: what it wrote is left to the audit")
        coordinator.settle()
        run.violations = coordinator.violations(quiet=True) if settings.snapshot else []
        if coordinator.slate is not None:
            done: Collected = coordinator.slate.done
            run.slatedb = (done.released, len(done.dropped), *coordinator.kept_by_slatedb())
    finally:
        coordinator.close()
        if settings.trace:
            t = coordinator.trace
            run.trace = None if t is None else str(Path(settings.work_dir) / TRACE)
            run.trace_commands = 0 if t is None else t.commands
            run.trace_stopped = coordinator.trace_stopped if t is None else t.stopped
            run.trace_outside = () if t is None else tuple(t.left_out)
        if attempts is not None:
            attempts.unregister()
            run.attempts = tuple(sorted(attempts.attempts.values(), key=lambda a: a.task_id))
    run.seconds = time.perf_counter() - t0
    run.final_watermark = driver.watermark
    run.skipped = tuple(skipped)
    run.jobs = tuple(jobs)
    run.kills = tuple(read_kills(local))
    if audit and settings.snapshot:
        say("auditing the checkpoint storage")
        run.audits = audit_jobs(spark, settings.base, run.jobs, settings.storage_options)
    if own_session:
        spark.stop()  # before the interpreter's exit takes py4j's callback server away
    if check:
        emitted = [w for rows in read_all(out_dir(settings)).values() for w in rows]
        expected = batch_counts(settings.source, driver.last_batch + 1, settings.windowing)
        run.comparison = compare(expected, emitted, settings.windowing, driver.ran_watermark)
    return run


def _deliver_task(order: BatchOrder, index: int, _rows: Iterator[Any]) -> Iterator[bytes]:
    yield deliver(order, index)


def _deliver(spark: Any, coordinator: CoordinatorSide, driver: BatchDriver) -> None:
    """The mail no batch will carry (the last complete's notices) to every subtask's TM,
    by a job of one task per subtask: then every TM has deleted what it no longer needs,
    and the invariants are checked quiet (I6) and the audit finds no orphan."""
    order = driver.delivery()
    if not order.mail:
        return
    p = driver.parallelism
    sc = spark.sparkContext
    reports = (
        sc.parallelize(range(p), p)
        .mapPartitionsWithIndex(functools.partial(_deliver_task, order))
        .collect()
    )
    coordinator.heard(reports)


def out_dir(settings: StreamSettings) -> Path:
    return Path(settings.out)


def _segment(
    spark: Any,
    settings: StreamSettings,
    coordinator: CoordinatorSide,
    driver: BatchDriver,
    files: _Files,
    last: int,
    on_batch: Callable[[BatchReport], None] | None,
    skipped: list[int],
    say: Callable[[str], None],
) -> None:
    """Run the query until batch ``last`` is done, then stop it without committing the
    next one (``_Stop``)."""
    p = driver.parallelism
    out = out_dir(settings)
    word_args = settings.source.word_args()
    vocabulary = settings.source.vocabulary
    stopping = threading.Event()

    def per_batch(df: Any, batch_id: int) -> None:
        if batch_id > last:
            stopping.set()
            raise _Stop(f"batch {batch_id} is past the segment's last, {last}")
        if batch_id <= driver.last_batch:
            # Spark runs again a batch it had not committed when the driver died, but
            # the checkpoint that holds it completed: its windows are in the sink, its
            # records in the state. Returning lets Spark commit it (SPEC R96).
            skipped.append(batch_id)
            say(f"batch {batch_id}: already in the latest completed checkpoint, not run again")
            return
        order = driver.order(batch_id)
        die = settings.die_at if settings.die_at and settings.die_at[0] == batch_id else None
        if die is not None and die[1] == "running":
            sc = spark.sparkContext
            _die_while_running(sc, set(sc.statusTracker().getActiveJobsIds()))
        try:
            results: list[SubtaskResult] = (
                df.mapInArrow(functools.partial(partial_counts, vocabulary, p), SHUFFLED)
                .rdd.map(_shuffled)
                .partitionBy(p, functools.partial(_partition, p))
                .mapPartitionsWithIndex(functools.partial(_task, order))
                .collect()
            )
            if die is not None and die[1] == "running":
                # The watcher waits a moment into the tasks and can miss a short batch
                # (seen once in CI, at a load of 4): the driver then dies with every task
                # done, before the sink and the checkpoint's completion, never after.
                _die("running")
            write_batch(out, batch_id, [w for r in results for w in r.closed])
        except BaseException:
            # The batch fails and Spark does not commit it; its checkpoint never completes.
            if settings.snapshot:
                coordinator.abort(order.checkpoint)
            raise
        if die is not None and die[1] == "sunk":
            _die("sunk")
        report = driver.finish(order, results)
        if die is not None and die[1] == "completed":
            _die("completed")
        if settings.snapshot:
            coordinator.settle()
            files.sample(
                order.checkpoint,
                [
                    coordinator.restore_assignment(s, order.checkpoint + 1)
                    for s in driver.subtasks()
                ],
                coordinator.job_id,
                *coordinator.in_place_of_latest(),
            )
        if on_batch is not None:
            on_batch(report)

    _quiet_query_errors(spark)
    query = (
        # each row's word is named in the JVM, once in the query's plan, so that a
        # micro-batch costs the driver no call of its own for it (words.with_ranks)
        with_ranks(settings.source.read_stream(spark), **word_args)
        .writeStream.foreachBatch(per_batch)
        .option("checkpointLocation", str(Path(settings.work_dir) / "spark"))
        .start()
    )
    try:
        while query.isActive:
            time.sleep(0.1)
        err = query.exception()
    finally:
        query.stop()
    if err is not None and not stopping.is_set():
        raise OperationFailed(f"the streaming query failed: {err}")
    if driver.last_batch < last:
        raise OperationFailed(f"the query stopped at batch {driver.last_batch}, before {last}")
