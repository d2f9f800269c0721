"""The checkpoint coordinator in the Spark driver (``fastimpl.parties``).

The coordinator knows the subtasks' TMs (``pipeline.stream.worker_tm``) only from what
they send: each task returns its TM's encoded acknowledgement (or decline) and a report
of the TM's records. Placement is Spark's, so the coordinator learns it from the
acknowledgements: one from a TM it never heard of, for subtask ``s``, within a pending
checkpoint, is a task-level failover (R66, ``CheckpointCoordinator.replace``): the TM
``s`` ran on is given up (lost: its task may still run, a speculative original) and
whatever it acknowledged for a pending checkpoint is withdrawn, and the new TM, which
Spark started on its own from the batch's restore assignment, runs ``s``. (The first TM
of a subtask only takes its placeholder's place: a placeholder never ran.) Once the
checkpoint completes and no attempt of the job may still run, each replaced TM is known
stopped (R64, ``AttemptStopped``): its task ended before ``collect`` returned and its
records are gone, so it can write no more. The coordinator then sweeps what it left
(R64, R65: its files no live TM holds and no retained checkpoint refers to), and fails
over (R60-R62: the live TMs reset and take over the files of retained checkpoints in
their directories) when the stopped TM had written anything.

``SparkEngine`` (``pipeline.stream.spark_engine``) is the coordinator's
``CoordinatorEngine``: the mail that travels with the tasks, and the duties answered from
the TMs' last reports. The observation and the invariants on the real files are
``pipeline.stream.job_checks``'s.

With ``trace`` the coordinator writes the run's command trace (``pipeline.stream.trace``):
its own commands, and each TM's as its report brings them; a restarted driver writes on
the crashed one's trace (the recovery as the model's crash of every TM and a CLAIM
restore); the trace stops where the run does something the model has no command for. The
invariants are checked on the real files throughout (``violations``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import fsspec  # type: ignore[import-untyped]

from fastimpl import BaseInUseError
from fastimpl.parties import (
    WRITER_STATE,
    CheckpointCoordinator,
    CompletionFailed,
    RandomIds,
    Status,
    Storage,
    complete_through,
    incarnation_to_recover,
    is_working_path,
    lease_token,
    open_base,
    recover_coordinator,
    subtasks_of,
)
from pipeline.stream.checkpointing import VERTEX, CheckpointNotCompleted
from pipeline.stream.job_checks import JobChecks
from pipeline.stream.publication import StatePublisher
from pipeline.stream.spark_engine import SparkEngine
from pipeline.stream.trace import NotResumable, StreamTrace
from pipeline.stream.worker_tm import MailItem, TaskManagerRecipe
from pipeline.stream.working_names import db_dir_of, pointers
from spec import commands as cmd
from spec.config import Config, JobSpec, RestoreMode, VertexSpec
from spec.effects import COORDINATOR
from spec.errors import CommandError, UsageError
from spec.handles import InlineHandle, SegmentHandle, StateEntry, extent_of, stream_of
from spec.ids import SubtaskId, TmId
from spec.layout import job_base
from spec.messages import (
    Acknowledgement,
    Decline,
    MessageError,
    RestoreAssignment,
    decode_message,
    encode_message,
)
from spec.observation import Observation

_T = TypeVar("_T")


TOOL = "ckpt stream"
"""What the base's lease names as its holder (``lease_token``)."""

BACKENDS = ("rocksdb", "working")
"""``--state-backend``: a local RocksDB whose files each checkpoint uploads, or a SlateDB
on the checkpoint storage whose files a checkpoint refers to in place (SPEC §11)."""


@attrs.frozen
class Recovery:
    """What a restarted driver recovers (``open_coordinator``'s ``crashed_job``,
    ``abandoned``, ``restore_mode``)."""

    crashed_job: str
    abandoned: tuple[str, ...]
    restore_mode: RestoreMode


def to_recover(
    url: str,
    storage_options: Mapping[str, Any] | None,
    lineage: Sequence[tuple[str, RestoreMode | None]],
) -> Recovery:
    """``lineage``: the application's jobs oldest first, each with the mode it restored
    its predecessor's latest checkpoint in (None for the first). The newest that
    completed a checkpoint is recovered; a newer one died before its first, so its
    predecessor's checkpoint is the state still, in the mode that one restored it (a
    NO_CLAIM restore left it the user's, R73)."""
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    job, abandoned = incarnation_to_recover(fs, root, [j for j, _ in lineage])
    mode = RestoreMode.CLAIM
    if abandoned:
        first = next(m for j, m in lineage if j == abandoned[0])
        mode = first or RestoreMode.CLAIM
    return Recovery(job, abandoned, mode)


def open_coordinator(
    url: str,
    config: Config,
    parallelism: int,
    *,
    storage_options: Mapping[str, Any] | None = None,
    crashed_job: str | None = None,
    abandoned: Sequence[str] = (),
    restore_mode: RestoreMode = RestoreMode.CLAIM,
    backend: str = "rocksdb",
    gc_min_age_s: float = 10.0,
    trace: str | None = None,
) -> SparkCoordinator:
    """The coordinator of a new job on ``url`` whose keyed stage has ``parallelism``
    subtasks, one TM each. With ``crashed_job`` the job continues one whose driver died:
    the whole application died with it (every TM), so this is a recovery
    (``fastimpl.recovery``: a new job that claims the latest completed checkpoint and
    deletes what the crashed one left unfinished), not a coordinator restart under
    running TMs (R95, ``fastimpl.resume``). ``abandoned``, ``restore_mode``: the newer
    incarnations that died before their first checkpoint, and how the first of them
    restored ``crashed_job``'s latest (``recover``; ``to_recover`` picks). ``backend``
    ``working``: the subtasks' state is SlateDB on ``url`` (``slate_collect`` runs its
    collection, ``gc_min_age_s`` the minimum age of SlateDB's GC: at least the grace of
    R64)."""
    if backend not in BACKENDS:
        raise UsageError(f"--state-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    opts = dict(storage_options or {})
    fs, root = fsspec.core.url_to_fs(url, **opts)
    vertices = (VertexSpec(VERTEX, parallelism),)
    engine = SparkEngine()
    if crashed_job is not None:
        co, storage, report = recover_coordinator(
            config,
            JobSpec(vertices, num_tms=parallelism),
            fs,
            root,
            engine,
            job=crashed_job,
            ids=RandomIds(),
            lease=lease_token(TOOL),
            leave_working=backend == "working",
            abandoned=abandoned,
            mode=restore_mode,
            deletion_log=True,
        )
        restored = report.checkpoints[-1] if report.checkpoints else 0
        out = SparkCoordinator(co, engine, storage, config, url, opts, restored_from=restored)
        out.post()  # what the recovery decided
        out.use_slatedb(backend, gc_min_age_s)
        if trace is not None:
            try:
                engine.trace = StreamTrace.resume(trace, config)
            except NotResumable as err:
                out.trace_stopped = f"a driver restart: {err}"
            else:
                engine.trace.restarted(
                    vertices_of(engine.runs_on),
                    report.checkpoints,
                    engine.runs_on,
                    len(report.garbage),
                    restore_mode,
                )
        out.publish()
        return out
    try:
        storage, config = open_base(fs, root, config, lease_token(TOOL))
    except BaseInUseError as err:
        raise UsageError(f"{url}: {err} (use --resume to continue a run)") from None
    co = CheckpointCoordinator(
        config, vertices, parallelism, storage, RandomIds(), engine, "job-0", deletion_log=True
    )
    tms = [engine.start_tm(co.running_job(), 1, None) for _ in range(parallelism)]
    co.deploy(engine.place(subtasks_of(vertices), tms))
    if trace is not None:
        engine.trace = StreamTrace(trace, config, JobSpec(vertices, parallelism), engine.runs_on)
    out = SparkCoordinator(co, engine, storage, config, url, opts)
    out.use_slatedb(backend, gc_min_age_s)
    out.publish()
    return out


def vertices_of(placement: Mapping[SubtaskId, TmId]) -> tuple[VertexSpec, ...]:
    """The vertices the placed subtasks are of, in name order."""
    par = {s.vertex: s.parallelism for s in placement}
    return tuple(VertexSpec(v, n) for v, n in sorted(par.items()))


class SparkCoordinator:
    """``CoordinatorSide``: one checkpoint per micro-batch, over ``SparkEngine``."""

    def __init__(
        self,
        co: CheckpointCoordinator,
        engine: SparkEngine,
        storage: Storage,
        config: Config,
        url: str,
        storage_options: Mapping[str, Any],
        *,
        restored_from: int = 0,
    ) -> None:
        self.co = co
        self.engine = engine
        self.checkpoint_storage = storage
        """The coordinator's storage (``Storage``), which this job opened or recovered."""
        self.config = config
        self.url = url
        self.storage_options = dict(storage_options)
        self.received: set[int] = set()
        self.replaced: set[TmId] = set()
        """TMs an acknowledgement took a subtask from: given up once nothing is pending."""
        self.restored_from = restored_from
        """The checkpoint the job was restored from (0: none)."""
        self.retired: list[TmId] = []
        """Every TM given up and swept, in order (for tests and the summary)."""
        self.failovers = 0
        self.strays = 0
        """Attempts the coordinator never heard of whose files were swept."""
        self._strays = False
        self._stray_ids = 0
        self.trace_stopped: str | None = None
        """Why no trace is written, when the run could not be traced from its start."""
        self.may_still_run: Callable[[], bool] = lambda: False
        """Whether a task attempt of this job may still run: a speculative copy, or an
        attempt Spark gave up on whose Python worker has not stopped yet (a SparkListener
        knows, ``job.TaskAttempts``). While it may, no TM is given up and nothing nobody
        records is swept (R64: never while the attempt may still write); a later
        complete, or ``finish_attempts``, does it. Without speculation every attempt of a
        batch has ended when ``collect`` returns."""
        self.backend = "rocksdb"
        self.slate: Any = None
        """``--state-backend working``: the SlateDB collection (``slate_collect``)."""
        self.publisher = StatePublisher(self)
        """The writer state for outside collectors (``publication``)."""
        self.checks = JobChecks(co, engine, storage, url)
        """The observation and the invariants on the real files (``job_checks``)."""

    def publish(self, *, observe: bool = True) -> None:
        """Publish the writer state (``publication``); ``observe``: look at storage again
        (no task runs), else republish the last observation with the pending set now."""
        self.publisher.publish(observe=observe)

    def tm_reports(self) -> Mapping[TmId, Mapping[str, Any]]:
        """Each TM's last report (``worker_tm.report_of``), by TM."""
        return self.engine.reports

    def use_slatedb(self, backend: str, gc_min_age_s: float) -> None:
        self.backend = backend
        if backend == "working":
            from pipeline.stream.slate_collect import SlateCollection

            self.slate = SlateCollection(self.url, self.storage_options, gc_min_age_s)
            self.checks.working_state = True

    @property
    def job_id(self) -> str:
        return self.co.running_job()

    def restoring(self) -> bool:
        retained = self.co.retained_checkpoints()
        return self.restored_from > 0 and (
            not retained or retained[-1].job != self.co.running_job()
        )

    def task_manager_recipe(self) -> TaskManagerRecipe:
        return TaskManagerRecipe(self.url, self.co.running_job(), self.config, self.storage_options)

    def mail(self) -> tuple[MailItem, ...]:
        return self.engine.mail()

    @property
    def trace(self) -> StreamTrace | None:
        return self.engine.trace

    def heard(self, reports: Iterable[bytes]) -> None:
        """Reports of TMs a delivery reached (``worker_tm.deliver_mail``): the delivery of
        every TM's mail once no batch follows. A placed TM that did not report applying
        its mail could not be reached (its local state is gone, or held by a delivery
        attempt Spark gave up on, such as the first attempt of a task whose speculative
        copy found nothing and won): it is given up as a replaced attempt is (R66), and
        once no attempt may still run it is known stopped (R64, ``retire``), so its files
        become the coordinator's, which deletes those no retained checkpoint refers to.
        Left alive, it would keep the files its last notices subsume (I6)."""
        for r in reports:
            if r:
                report = json.loads(r)
                applied = self.engine.heard(report)
                if self.trace is not None:
                    self.trace.applied(report["tm"], applied)
        self.give_up_unreached()

    def give_up_unreached(self) -> None:
        """Give up each placed TM that still has mail after a delivery (see ``heard``)."""
        co = self.co
        if not co.is_running() or co.pending_checkpoints():
            return
        for tm in sorted(set(self.engine.runs_on.values())):
            if (
                tm in self.engine.placeholders
                or co.attempt_status(tm) is not Status.ALIVE
                or not self.engine.outbox.get(tm)
            ):
                continue
            new = co.replace(tm)  # its placeholder: the subtask's next task starts a TM
            self.post()
            if self.trace is not None:
                self.trace.given_up(tm, new)
            self.replaced.add(tm)

    def _traced(self, command: cmd.Command, run: Callable[[], _T], traced: bool = True) -> _T:
        """``run`` as ``command``: its outcome goes to the trace, if one is written."""
        trace = self.trace if traced else None
        failed: CompletionFailed | None = None
        try:
            out = run()
        except CommandError as err:
            if trace is not None:
                trace.record(command, err)
            raise
        except CompletionFailed as err:  # aborted instead (R51): its notices go out
            failed = err
        self.post()
        if trace is not None:
            trace.record(command)
        if failed is not None:
            raise failed
        return out

    def post(self) -> None:
        """What the coordinator's calls produced (its ``Ready``) is carried out, in the
        order it asks: its deletes on the checkpoint storage, then its notices into the
        mail (this job keeps no HA state to persist first: its restart reads the
        ``_metadata`` files, ``recover_coordinator``)."""
        ready = self.co.ready()
        self.checkpoint_storage.perform(ready.deletes)
        self.engine.post(ready)

    def trigger(self) -> int:
        c = self._traced(cmd.Trigger(False), self.co.trigger)
        self.publish(observe=False)  # before the batch's tasks write for it
        return c

    def receive(self, message: bytes, report: bytes = b"") -> None:
        """An acknowledgement or decline from a task, with its TM's report."""
        try:
            msg = decode_message(message)
        except MessageError as err:
            raise UsageError(f"a task's acknowledgement is not a message: {err}") from None
        if not isinstance(msg, Acknowledgement | Decline):
            raise UsageError(f"a task sent a {type(msg).__name__}, not an acknowledgement")
        if msg.job != self.co.running_job():
            raise UsageError(
                f"an acknowledgement of job {msg.job} reached job {self.co.running_job()}"
            )
        applied: list[int] = []
        r: dict[str, Any] = {}
        if report:
            r = json.loads(report)
            if r.get("tm") != msg.attempt:
                raise UsageError(f"the report of {r.get('tm')} came with {msg.attempt}'s message")
            applied = self.engine.heard(r)
            self._strays = self._strays or bool(r.get("new"))
        self._place(msg.subtask, msg.attempt, msg.checkpoint)
        attempt = self._trace_task(msg, applied, r.get("commands", ()))
        if isinstance(msg, Decline):
            decline = cmd.Decline(msg.checkpoint, msg.subtask)
            self._traced(decline, lambda: self.co.receive_decline(msg), attempt is not None)
        else:
            ack = cmd.Acknowledge(msg.checkpoint, msg.subtask, attempt or None)
            self._traced(ack, lambda: self.co.receive_ack(msg), attempt is not None)
        self.received.add(msg.checkpoint)

    def _trace_task(
        self, msg: Acknowledgement | Decline, applied: list[int], lines: Iterable[dict[str, Any]]
    ) -> str | None:
        """What a task's TM did goes to the trace: the notices it applied, its writes and
        reuses (``attempt=`` its model name when it no longer hosts the subtask: a
        zombie, R64). Its acknowledgement's ``attempt``: "" for the subtask's TM, its
        model name for a zombie; None when the acknowledgement is not traced (an attempt
        the coordinator never placed, whose files are a stray's)."""
        trace = self.trace
        if trace is None:
            return None
        tm = msg.attempt
        status = self.co.attempt_status(tm)
        name = trace.model.get(tm)
        if name is None:
            if status is None:
                trace.outside(
                    f"the {type(msg).__name__.lower()} of {tm}, an attempt the coordinator"
                    f" never placed (checkpoint {msg.checkpoint} was over): ignored, its"
                    " files swept as a stray's"
                )
            else:
                trace.stop(f"a message from {tm}, which the model does not know")
            return None
        if status is None or status is Status.STOPPED:
            trace.stop(f"{tm} acted after it was known stopped (its records came back)")
            return None
        zombie = self.engine.runs_on.get(msg.subtask) != tm
        if zombie and isinstance(msg, Decline):
            trace.stop(f"a decline from {tm}, given up on: the model has no zombie decline")
            return None
        trace.applied(tm, applied)
        trace.lines(lines, name if zombie else None)
        return name if zombie else ""

    def _place(self, subtask: SubtaskId, tm: TmId, checkpoint: int) -> None:
        co = self.co
        placement = self.engine.runs_on
        if subtask not in placement:
            raise UsageError(f"{subtask} is not a subtask of {co.running_job()}")
        old = placement[subtask]
        if old == tm:
            self.engine.hosted.setdefault(tm, set()).add(subtask)
            return
        if checkpoint not in co.pending_checkpoints() or co.attempt_status(tm) is not None:
            # Late (its checkpoint is over), or from a TM the coordinator knows for another
            # place or gave up on: it ignores it (R56), and it moves nothing (a speculative
            # loser's delayed result).
            return
        self.engine.hosted.setdefault(tm, set()).add(subtask)
        self.replaced.add(old)
        if old in self.engine.placeholders:
            # the subtask's first TM takes its placeholder's place (which never ran)
            co.adopt_attempt(subtask, tm, checkpoint)  # its files lie from here on (R64)
            self.post()
            if self.trace is not None:
                self.trace.placed(old, tm)
            return
        if self.trace is not None:
            self.trace.replaced(old, tm)  # before: ReplaceTm names the TM it replaces
        co.replace(old, tm)  # R66: a retried or speculative task's TM
        self.post()

    def complete(self, checkpoint: int) -> None:
        co = self.co
        if checkpoint in self.received and checkpoint not in co.pending_checkpoints():
            # Aborted while receiving: a subtask declined, or reused shared state whose
            # registry entry is gone (R22). The caller runs the batch again.
            self.received.discard(checkpoint)
            raise CheckpointNotCompleted(
                f"checkpoint {checkpoint} was aborted before it could complete"
            )
        self.received.discard(checkpoint)
        try:
            self._traced(
                cmd.Complete(checkpoint),
                lambda: complete_through(co, self.checkpoint_storage, checkpoint),
            )
        except CompletionFailed as err:
            if self.trace is not None:
                self.trace.stop(f"checkpoint {checkpoint} aborted at completion: {err.reason}")
            raise CheckpointNotCompleted(
                f"checkpoint {checkpoint} did not complete: {err}"
            ) from err
        if self._strays:
            self.sweep_strays()  # first: a failover below hands files over by mail
        self.retire()
        self.collect_working()
        self.publish()

    def collect_working(self) -> None:
        """R104 under ``--state-backend working``: fastimpl's collection of shared SSTs,
        then SlateDB's (``slate_collect``), between two batches (no database is open)."""
        co = self.co
        if (
            self.slate is None
            or not co.is_running()
            or co.pending_checkpoints()
            or self.may_still_run()
        ):
            return
        co.collect_working()
        self.post()
        storage = self.checkpoint_storage
        storage.drain()
        wanted = self._wanted()
        needed = self.needed_databases()
        on_storage: set[str] = set()
        for base in sorted(co.lineage_bases()):
            on_storage |= storage.files_under(f"{base}/taskowned/working")
        self.slate.collect(on_storage, needed=needed, wanted=wanted, recorded=co.file_owners())

    def _wanted(self) -> set[tuple[str, str]]:
        """``(database directory, SlateDB checkpoint id)`` of every retained checkpoint."""
        return {
            (p.lineage, p.checkpoint_id)
            for r in self.co.retained_checkpoints()
            for p in pointers(r.entries)
        }

    def needed_databases(self) -> set[str]:
        """The database directories a live database writes or uses a file of, or a
        retained or pending checkpoint names (its pointer, or a file in place)."""
        refs = self.co.working_needed()
        return (
            {d for d, _ in self._wanted()}
            | self.live_databases()
            | {d for p in refs if (d := db_dir_of(p)) is not None}
        )

    def in_place_of_latest(self) -> tuple[dict[str, int], tuple[str, ...]]:
        co = self.co
        if self.slate is None or not co.retained_checkpoints():
            return {}, ()
        files = {w.path: w.length for _, w in co.retained_checkpoints()[-1].working}
        return files, tuple(
            sorted(b for b in co.lineage_bases() if b != job_base(co.running_job()))
        )

    def retire(self) -> None:
        """Give up the replaced TMs (see the module docstring); only with nothing
        pending, since losing a TM aborts every pending checkpoint (R57)."""
        co = self.co
        if co.pending_checkpoints() or not co.is_running() or self.may_still_run():
            return
        trace = self.trace
        for tm in sorted(self.replaced):
            status = co.attempt_status(tm)
            if tm in self.engine.runs_on.values() or status in (None, Status.STOPPED):
                continue
            if status is Status.ALIVE:
                co.lose(tm)  # a placeholder, which never ran (nothing is pending: R57)
                self.post()
            if trace is not None and trace.stopped is None and tm not in trace.placeholders:
                trace.record(cmd.AttemptStopped(trace.model[tm]))  # R64, after R66
                trace.forget(tm)
            co.attempt_ended(tm, self.engine.hosted.get(tm, ()))
            self.post()
            self.retired.append(tm)
            self.engine.reports.pop(tm, None)
        self.replaced.clear()
        if self._held_segments():
            # R60-R62: the files of retained checkpoints go to live TMs
            self._traced(cmd.Failover(), co.failover)
            if trace is not None:
                trace.failover(self.engine.runs_on.values())
            self.failovers += 1

    def _held_segments(self) -> bool:
        """Whether the coordinator holds a file that segments of a retained checkpoint lie
        in (taken from a stopped TM, R64): only a failover hands it to the TM that
        manages its directory now (R61), which deletes it once its segments die. With
        ``num_retained`` 1 the new TM's checkpoint names none of the old TM's files, and
        no failover (which resets every TM and closes its pooled files) is needed."""
        co = self.co
        owners = co.file_owners()
        return any(
            isinstance(e.handle, SegmentHandle) and owners.get(e.handle.path) == COORDINATOR
            for r in co.retained_checkpoints()
            for e in r.entries
        )

    def sweep_strays(self) -> None:
        """R64, R65 for the attempts the coordinator never heard of: a task that started
        a new TM and died before its acknowledgement reached the driver (killed, or its
        result not the one Spark accepted) left files that no party records. Between two
        batches no task runs (no speculation), so a file under the job's base that the
        coordinator does not record and no live TM holds (by its last report, exact
        then) is such an attempt's: each attempt named by its exclusive directory, and
        one more for the rest, is made known as lost and stopped, and the coordinator's
        own sweep takes and deletes what no retained checkpoint refers to."""
        co = self.co
        if co.pending_checkpoints() or not co.is_running() or self.may_still_run():
            return
        self._strays = False
        known = set(co.file_owners())
        for t in co.attempts():  # alive or lost: a replaced TM's are swept at its stop
            known |= set(self.engine.reports.get(t, {}).get("held", []))
        # R61: handed to a TM by a failover whose mail it has not applied yet: its own
        known |= {path for _, path in self.engine.in_transit()}
        base = job_base(co.running_job())
        # working state (§11): SlateDB's objects are collected by ``collect_working``
        found = {
            p
            for p in self.checkpoint_storage.files_under(base)
            if p not in known and not is_working_path(p) and p != f"{base}/{WRITER_STATE}"
        }
        if not found:
            return
        if self.trace is not None:
            self.trace.outside(
                f"{len(found)} file(s) no party records (written by a task whose report"
                " never reached the driver: a killed attempt's last writes, or an attempt"
                " the coordinator never heard of), swept as a stopped attempt's (R64, R66):"
                " the model never saw them written"
            )
        owned = f"{base}/taskowned/"
        names = {p[len(owned) :].split("/", 1)[0] for p in found if p.startswith(owned)}
        self._stray_ids += 1
        tms = [
            *sorted(n for n in names if co.attempt_status(n) is None),
            f"tm-stray-{self._stray_ids}",
        ]
        everywhere = subtasks_of(vertices_of(self.engine.runs_on))
        for tm in tms:
            co.attempt_ended(tm, everywhere, first_checkpoint=1)  # R64, R65, R66
            self.post()
            self.strays += 1

    def finish_attempts(self, wait_s: float = 60.0, poll_s: float = 0.2) -> bool:
        """Wait (up to ``wait_s``) until no attempt may still run, then give up the
        replaced TMs and sweep what nobody records: before a rescale ends the job, and at
        the end of a run. Whether it could."""
        deadline = time.monotonic() + wait_s
        while self.may_still_run():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        self._strays = True
        self.sweep_strays()
        self.retire()
        # the sweeps' deletes run on the storage's deleter thread: done means done
        self.checkpoint_storage.drain()
        self.collect_working()
        self.publish()
        return True

    def abort(self, checkpoint: int) -> None:
        if checkpoint in self.co.pending_checkpoints() and self.co.is_running():
            self._traced(cmd.Abort(checkpoint), lambda: self.co.abort(checkpoint))
        self.received.discard(checkpoint)
        # What the batch's tasks handed over in results that never arrived (whole files
        # an acknowledgement gives the coordinator, R43) is nobody's now: swept once the
        # next checkpoint completes.
        self._strays = True
        self.publish()

    def rescale(self, parallelism: int, mode: RestoreMode | None = None) -> None:
        co = self.co
        self.finish_attempts()
        if not co.retained_checkpoints():
            raise CheckpointNotCompleted("no completed checkpoint to rescale from")
        latest = co.retained_checkpoints()[-1].id
        ending = sorted(
            {t for t in self.engine.runs_on.values() if co.attempt_status(t) is Status.ALIVE}
        )
        # R70: one TM per subtask, as Spark runs them
        restore = cmd.Restore(
            latest, ((VERTEX, parallelism),), mode or self.config.restore_mode, num_tms=parallelism
        )
        self._traced(restore, lambda: co.restore(restore))
        if self.trace is not None:
            self.trace.restored(ending, self.engine.runs_on, parallelism)
        self.restored_from = latest
        self.publish()

    def restore_assignment(self, subtask: SubtaskId, checkpoint: int) -> bytes:
        co = self.co
        retained = co.retained_checkpoints()
        latest = retained[-1] if retained else None
        restoring = self.restoring()
        source = (
            co.state_to_restore(subtask)
            if restoring
            else (() if latest is None else latest.entries)
        )
        entries = tuple(  # the state's bytes: in files, or in the handle (R107)
            e
            for e in source
            if e.subtask == subtask
            and (stream_of(e.handle) is not None or isinstance(e.handle, InlineHandle))
        )
        referenced = frozenset(
            s.path for r in retained for e in r.entries if (s := stream_of(e.handle)) is not None
        )
        return encode_message(
            RestoreAssignment(
                co.running_job(),
                subtask,
                self.engine.runs_on.get(subtask) or "unplaced",
                entries,
                referenced,
                checkpoint,
                self.restored_from if restoring or latest is None else latest.id,
                min(r.id for r in retained) - 1 if retained else 0,
            )
        )

    def read(self, entry: StateEntry) -> bytes:
        if isinstance(entry.handle, InlineHandle):  # R107: the bytes are in the handle
            return entry.handle.content()
        s = stream_of(entry.handle)
        if s is None:
            raise UsageError(f"{entry.name!r}: {type(entry.handle).__name__} names no bytes")
        return self.checkpoint_storage.read_range(*extent_of(s))

    def settle(self) -> None:
        self.checkpoint_storage.drain()

    def observe(self, also: Iterable[bytes] = ()) -> tuple[Observation, list[str]]:
        """The job's observation and the parties' disagreements (``JobChecks.observe``)."""
        return self.checks.observe(also)

    def kept_by_slatedb(self) -> tuple[int, int]:
        """Objects and bytes of the databases no party records (``JobChecks``)."""
        return self.checks.kept_by_slatedb()

    def violations(self, *, quiet: bool = False, also: Iterable[bytes] = ()) -> list[str]:
        """The invariants on the real files (``JobChecks.violations``)."""
        return self.checks.violations(quiet=quiet, also=also)

    def live_databases(self) -> set[str]:
        """The database directories the live TMs' databases are at (their last reports)."""
        return self.checks.live_databases()

    def close(self) -> None:
        self.checkpoint_storage.close_all()
        if self.slate is not None:
            self.slate.close()
        if self.trace is not None:
            self.trace.close()
