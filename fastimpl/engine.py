"""The in-process engine: one coordinator party and one TaskManager party per TM,
wired by an in-memory transport, in one process. It does what an engine (Flink's
scheduler, a Spark driver) does around the two parties: it names and places TMs
(round-robin), carries the notices (``fastimpl.transport``, encoded ``spec.messages``),
checks who may write (R10, R56, R64), and shares one id source, so that with
``CounterIds`` the names match the reference model's, file by file (each TM attempt
marks the names it draws with its id, as in a process of its own; ``conformance.compare``
reads past the mark). Each party keeps records of its own (``TaskManager.own``), and
the parties meet only through messages and storage; the one thing they share is the
deletion log, which keeps the order of every party's deletes for the observation.

Each call is validated before anything changes (a ``CommandError`` leaves files and
bookkeeping as they were): ``spec.refusals.check`` walks the command's guards in the
table's order over the product's predicates (``InProcessEngine.checks``), asked where the
records are: the coordinator's (``fastimpl.guards``), the acting TM's, the transport's.
Each call returns what it produced, and is logged to the trace (if any) as the
``spec.commands`` command it is. ``CheckpointStore`` (``fastimpl.api``)
wraps it with a lock; the test adapters drive it from spec commands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastimpl.base_opening import readable_config
from fastimpl.catalog import DeletionLog
from fastimpl.completion import complete_through
from fastimpl.coordinator import CheckpointCoordinator, subtasks_of
from fastimpl.engine_guards import checks as guard_checks
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.party_observation import observe as observe_in_process
from fastimpl.records import (
    Completed,
    Status,
)
from fastimpl.resume import ha_state, rebuild
from fastimpl.storage import Storage, StorageFault
from fastimpl.taskmanager import TaskManager
from fastimpl.trace import CommandTrace
from fastimpl.transport import InMemoryTransport
from spec import commands as c
from spec import refusals
from spec.config import Config, JobSpec, RestoreMode, StateKind
from spec.errors import CommandError, Reason, UsageError
from spec.handles import (
    StateEntry,
    StreamHandle,
    extent_of,
    stream_of,
)
from spec.ids import SubtaskId, TmId
from spec.layout import (
    METADATA,
)
from spec.messages import (
    Answer,
    AttemptStopped,
    CheckpointAborted,
    CheckpointComplete,
    DatabaseFiles,
    DatabasesOpened,
    Decline,
    Duty,
    EndJob,
    Held,
    Holdings,
    InUse,
    LostAttemptStopped,
    OpenDatabase,
    ResetTm,
    ReusableFiles,
    TmAssignment,
    TmEnded,
    decode_message,
    encode_message,
)
from spec.observation import (
    Observation,
)
from spec.refusals import Check

_T = TypeVar("_T")
OutKey = tuple[TmId, SubtaskId, int]
BackendKey = tuple[TmId, SubtaskId, str]
_METADATA_SUFFIX = "/" + METADATA


class InProcessEngine:
    """A job's checkpoint storage: its coordinator and TMs in one process."""

    def __init__(
        self,
        config: Config,
        job_spec: JobSpec,
        fs: Any,
        root: str,
        ids: IdSource | None = None,
        job_id: str = "job-0",
        *,
        background_deletes: bool = True,
        deletion_log: bool = False,
        start_tms: bool = True,
    ) -> None:
        """``start_tms``: deploy the job on ``job_spec.num_tms`` new TMs; False: start
        none, for a coordinator the engine will ``host`` (a recovered one, which starts
        its TMs through this engine)."""
        # R16: the store decides (an object store shows a file only once closed), and the
        # configuration says so from here on, as the model is told (traces record it)
        config = readable_config(fs, config)
        self.storage = Storage(fs, root, background_deletes=background_deletes)
        self.cfg = config
        self.ids: IdSource = ids if ids is not None else RandomIds()
        """One id source for every party: with ``CounterIds`` names follow the model's."""
        self.channel = InMemoryTransport()
        """The coordinator's notices in flight to TMs, encoded (``spec.messages``)."""
        self.parties: dict[TmId, TaskManager] = {}
        """Each TM attempt's own side (``fastimpl.taskmanager``), by id."""
        self.next_tm = 1
        self.log = DeletionLog(deletion_log)
        """One log keeps the order of every party's deletes (``observe().deletions``)."""
        self.coord = CheckpointCoordinator(
            config,
            job_spec.vertices,
            job_spec.num_tms,
            self.storage,
            self.ids,
            self,
            job_id,
            log=self.log,
        )
        self.catalog = self.coord.catalog
        self.disagreements: list[str] = []
        """Where the parties' records disagreed at the last ``observe``."""
        if start_tms:
            tms = [self.start_tm(job_id, 1, None) for _ in range(job_spec.num_tms)]
            self.coord.deploy(self.place(subtasks_of(job_spec.vertices), tms))
        self.job_spec = job_spec
        self.trace: CommandTrace | None = None
        """Where executed commands are logged (``start_trace``); None: not logged."""
        self.on_applied: Callable[[c.Command], None] | None = None
        """Told each command applied (``fastimpl.writer_state`` publishes the writer's state)."""
        self.working = WorkingCalls(self)  # working state (§11): the database calls

    # ------------------------------------------------------------------ the coordinator's

    @property
    def job(self) -> str:
        return self.coord.job

    @property
    def placement(self) -> dict[SubtaskId, TmId]:
        return self.coord.placement

    def _is_savepoint(self, checkpoint: int) -> bool:
        """The checkpoint's type, as Flink's CheckpointOptions carry it with the barrier."""
        return self.coord._is_savepoint(checkpoint)

    def host(self, coord: CheckpointCoordinator) -> None:
        """Host ``coord`` from now on in place of the one built here: a coordinator
        recovered on this engine (``fastimpl.recovery.recover_coordinator``), whose TMs
        it started through ``start_tm`` and whose deletes are logged in ``self.log``."""
        self.coord = coord
        self.catalog = coord.catalog
        self.send_ready()  # what its recovery decided

    # ------------------------------------------------------------------ the engine

    def send_ready(self) -> None:
        """What the coordinator produced since the last call (its ``Ready``): its
        deletes carried out, then its notices into the transport, in order. Nothing is
        persisted first: this engine keeps no HA state apart from the coordinator
        (``restart`` reads it from the one it replaces)."""
        ready = self.coord.ready()
        self.storage.perform(ready.deletes)
        for tm, msg in ready.notices:
            self.channel.send(tm, msg)

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        tm = f"tm-{self.next_tm}"
        self.next_tm += 1
        party = TaskManager.own(self.storage, self.cfg, job, tm, self.ids, first_checkpoint)
        party.catalog.log = self.log
        if finished_mark is not None:
            party.finished_mark = finished_mark
        self.parties[tm] = party
        return tm

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        """Round-robin: the in-process engine's choice."""
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        for tm, party in self.parties.items():
            party.hosted = [s for s, t in placement.items() if t == tm]

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        """The coordinator's duty for one TM, handed over as the bytes a TM process would
        get (``spec.messages``); the answer comes back the same way."""
        if isinstance(msg, ResetTm):
            self.channel.forget(tm)  # the old attempt's notices go with the redeploy
        sent = decode_message(encode_message(msg))
        assert isinstance(
            sent,
            ResetTm
            | TmAssignment
            | ReusableFiles
            | LostAttemptStopped
            | EndJob
            | Holdings
            | OpenDatabase
            | DatabasesOpened
            | DatabaseFiles,
        )
        answer = self.parties[tm].on_duty(sent)
        if answer is None:
            return None
        back = decode_message(encode_message(answer))
        assert isinstance(back, TmEnded | Held | InUse)
        return back

    def forget_tm(self, tm: TmId) -> None:
        """A TM that is gone keeps no memory: its records go with its process, its files
        stay on storage (what it left is the coordinator's to find, R64)."""
        party = self.parties.pop(tm, None)
        if party is not None:
            for path, f in sorted(party.catalog.files.items()):
                if f.open:  # its process is gone, and its open uploads with it (R65)
                    if self.cfg.open_files_readable:
                        self.storage.abandon(path)
                    else:
                        self.storage.discard(path)
            party.forget()
        self.channel.forget(tm)

    # ------------------------------------------------------------------ calls

    # Every call returns what it produced (raft's ``Ready``) and is logged to the trace
    # (if any) as the ``spec.commands`` command it is, so the model can replay it.

    def recorded(self, cmd: c.Command, run: Callable[[], _T]) -> _T:
        """Run ``run`` as ``cmd``: logged to the trace, and told to ``on_applied``."""

        def step() -> _T:
            try:
                return run()
            finally:
                self.send_ready()

        result = step() if self.trace is None else self._traced(cmd, step)
        if self.on_applied is not None:
            self.on_applied(cmd)
        return result

    def trigger(self, savepoint: bool = False) -> int:
        """R50: a new checkpoint (or savepoint); its id."""
        return self.recorded(c.Trigger(savepoint), lambda: self.coord.trigger(savepoint))

    def write(
        self,
        checkpoint: int,
        subtask: SubtaskId,
        kind: StateKind,
        name: str,
        data: bytes,
        entries: int = 1,
        attempt: TmId | None = None,
    ) -> StateEntry | None:
        """One state handle's bytes, written by the TM that hosts ``subtask`` (or by the
        lost ``attempt``); the entry acknowledged later, ``None`` for no bytes (R10). A
        failing storage call declines the checkpoint for the subtask (R17) and is raised
        as ``StorageFault``."""
        cmd = c.WriteState(checkpoint, subtask, kind, name, len(data), entries, attempt)
        return self.recorded(cmd, lambda: self._write(cmd, data))

    def _write(self, cmd: c.WriteState, data: bytes) -> StateEntry | None:
        self.check(cmd)
        tm = self.acting(cmd.subtask, cmd.attempt)
        if cmd.size == 0:
            return None  # R10
        try:
            return self.parties[tm].write(
                cmd.subtask,
                cmd.checkpoint,
                cmd.kind,
                cmd.name,
                cmd.size,
                cmd.entries,
                data,
                self._is_savepoint(cmd.checkpoint),
            )
        except StorageFault:
            self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            raise

    def _write_failed(self, tm: TmId, subtask: SubtaskId, checkpoint: int) -> None:
        """R17: the subtask declines and writes no more for the checkpoint (R14)."""
        self.parties[tm].write_failed(subtask, checkpoint, self._is_savepoint(checkpoint))
        self.coord.receive_decline(Decline(self.job, checkpoint, subtask, tm))

    def decline(self, checkpoint: int, subtask: SubtaskId) -> None:
        """The subtask declines the checkpoint (R17)."""

        cmd = c.Decline(checkpoint, subtask)

        def run() -> None:
            self.check(cmd)
            self._write_failed(self.acting(subtask, None), subtask, checkpoint)

        self.recorded(cmd, run)

    def reuse_shared(
        self,
        checkpoint: int,
        subtask: SubtaskId,
        name: str,
        attempt: TmId | None = None,
        upload: Callable[[StreamHandle], bytes] | None = None,
    ) -> StateEntry | None:
        """R20-R23: the old handle, a placeholder, or, when the old upload may not be
        reused, a new upload of the same bytes: ``upload(old handle)`` gives them (by
        default read back from the old upload, ``copy_of``). A failing storage call
        declines (R17) and is raised as ``StorageFault``."""
        cmd = c.ReuseShared(checkpoint, subtask, name, attempt)
        return self.recorded(cmd, lambda: self._reuse_shared(cmd, upload or self.copy_of))

    def copy_of(self, stream: StreamHandle) -> bytes:
        """The bytes of an earlier upload, read back: the store keeps no local copy."""
        catalogs = [self.catalog, *(p.catalog for p in self.parties.values())]
        if not any(stream.path in cat.files for cat in catalogs):
            # The old upload was deleted by the store itself (its checkpoint was aborted).
            # Nothing changes; the caller writes the state again.
            raise CommandError(
                Reason.NO_SUCH_STATE,
                f"the bytes were deleted with {stream.path}; write the state again",
            )
        # A file the store still tracks that cannot be read in full is damage, not a
        # choice: the subtask declines (R17), naming the path and sizes.
        return self.storage.read_range(*extent_of(stream))

    def _reuse_shared(
        self, cmd: c.ReuseShared, upload: Callable[[StreamHandle], bytes]
    ) -> StateEntry | None:
        self.check(cmd)
        tm = self.acting(cmd.subtask, cmd.attempt)
        party = self.parties[tm]
        ref = party.backend_ref(cmd.subtask, cmd.name)
        savepoint = self._is_savepoint(cmd.checkpoint)
        reused = party.reuse(cmd.subtask, cmd.checkpoint, ref, savepoint)
        if reused is not None:
            return reused
        old = ref.entry  # R20: not reusable: upload the same local state again
        stream = stream_of(old.handle)
        try:
            data = b"" if stream is None or stream.length == 0 else upload(stream)
            return party.write(
                cmd.subtask,
                cmd.checkpoint,
                old.kind,
                old.name,
                len(data),
                old.entries,
                data,
                savepoint,
            )
        except StorageFault:
            self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            raise

    def acknowledge(
        self, checkpoint: int, subtask: SubtaskId, attempt: TmId | None = None
    ) -> tuple[StateEntry, ...]:
        """The subtask's TM sends its ``Acknowledgement``; the entries the subtask wrote
        (its directory handles, R40, are added by the acknowledgement itself)."""
        cmd = c.Acknowledge(checkpoint, subtask, attempt)
        return self.recorded(cmd, lambda: self._acknowledge(cmd))

    def _acknowledge(self, cmd: c.Acknowledge) -> tuple[StateEntry, ...]:
        self.check(cmd)
        tm = self.acting(cmd.subtask, cmd.attempt)
        try:
            written, ack = self.parties[tm].acknowledge(
                cmd.subtask, cmd.checkpoint, self._is_savepoint(cmd.checkpoint)
            )
        except StorageFault:
            self.coord.receive_decline(Decline(self.job, cmd.checkpoint, cmd.subtask, tm))
            self.parties[tm].working.release()  # working state (§11): the pins went
            raise
        self.coord.receive_ack(ack)
        self.parties[tm].working.release()  # working state (§11): R102, after the hand-over
        return written

    def complete(self, checkpoint: int) -> Completed:
        """The completed checkpoint; ``CompletionFailed`` if writing its ``_metadata``
        failed or it could not be registered, and it was aborted instead (R51, R54)."""
        return self.recorded(
            c.Complete(checkpoint),
            lambda: complete_through(self.coord, self.storage, checkpoint),
        )

    def abort(self, checkpoint: int) -> None:
        cmd = c.Abort(checkpoint)

        def run() -> None:
            self.check(cmd)
            self.coord.abort(checkpoint)

        self.recorded(cmd, run)

    def deliver(self, index: int) -> None:
        """Hand the ``index``-th notice in flight to its TM (R34: any notice may arrive at
        any time, twice or never)."""
        self.recorded(c.DeliverNotification(index), lambda: self._deliver(index))

    def _deliver(self, index: int) -> None:
        self.check(c.DeliverNotification(index))
        tm, msg = self.channel.take(index)
        rec = self.coord.tms.get(tm)
        if rec is None or rec.status is Status.STOPPED:
            return
        if isinstance(msg, CheckpointComplete | CheckpointAborted):
            self.parties[tm].on_notice(msg)

    def crash_tm(self, tm: TmId) -> None:
        """R57: the TM is lost (its process may still run)."""
        self.recorded(c.CrashTm(tm), lambda: self._crash_tm(tm))

    def _crash_tm(self, tm: TmId) -> None:
        self.check(c.CrashTm(tm))
        self.coord.lose(tm)

    def replace_tm(self, tm: TmId) -> TmId:
        """R66: task-level failover: a new attempt runs ``tm``'s subtasks, pending
        checkpoints stay pending, ``tm`` is lost (it may still run); the new attempt's id."""

        cmd = c.ReplaceTm(tm)

        def run() -> TmId:
            self.check(cmd)
            return self.coord.replace(tm)

        return self.recorded(cmd, run)

    def attempt_stopped(self, tm: TmId) -> None:
        """R64: a lost TM is known to have stopped. Its guards are checked before the
        message is sent (an unknown id may be no name a message can carry), and again by
        the coordinator that receives it, as from any engine."""
        cmd = c.AttemptStopped(tm)

        def run() -> None:
            self.check(cmd)
            party = self.parties.get(tm)  # gone once stopped: the coordinator says so
            job = self.job if party is None else party.job
            msg = decode_message(encode_message(AttemptStopped(job, tm)))
            assert isinstance(msg, AttemptStopped)
            self.coord.receive_stopped(msg)  # the coordinator learns it as a message

        self.recorded(cmd, run)

    def failover(self) -> None:
        def run() -> None:
            self.check(c.Failover())
            self.coord.failover()

        self.recorded(c.Failover(), run)

    def restart(self) -> None:
        """R95: the coordinator's process dies and a new one is built from storage and
        the HA state the engine kept (``fastimpl.resume``, as for any engine): the old
        object is dropped as it is, the running TMs answer what they hold, and every
        subtask fails over to the new coordinator."""

        def run() -> None:
            self.check(c.RestartCoordinator())
            old = self.coord
            ha, placement = ha_state(old), dict(old.placement)
            coord, _ = rebuild(
                self.cfg,
                old.vertices,
                old.num_tms,
                self.storage,
                self.ids,
                self,
                ha,
                placement,
                log=self.log,
            )
            self.host(coord)
            coord.failover()

        self.recorded(c.RestartCoordinator(), run)

    def restore(
        self,
        checkpoint: int,
        parallelism: tuple[tuple[str, int], ...] = (),
        mode: RestoreMode = RestoreMode.NO_CLAIM,
        max_parallelism: int | None = None,
        num_tms: int | None = None,
    ) -> str:
        """R70-R77: a new job from a retained checkpoint or a savepoint; its id."""
        cmd = c.Restore(checkpoint, parallelism, mode, max_parallelism, num_tms)
        self.recorded(cmd, lambda: self.coord.restore(cmd))
        return self.job

    def cancel(self, retain: bool) -> None:
        cmd = c.Cancel(retain)

        def run() -> None:
            self.check(cmd)
            self.coord.end_job(retain=retain)

        self.recorded(cmd, run)

    # working state (§11): the live databases' calls (fastimpl.working)

    def write_working(
        self, subtask: SubtaskId, data: bytes, attempt: TmId | None = None
    ) -> str | None:
        """R101: ``subtask``'s database writes one working file; its path (``None``: a
        storage call failed and nothing is used, R45)."""
        cmd = c.WriteWorking(subtask, len(data), attempt)
        return self.recorded(cmd, lambda: self.working.write(subtask, data, attempt))

    def drop_working(self, subtask: SubtaskId, path: str, attempt: TmId | None = None) -> None:
        """R102: ``subtask``'s database stops using ``path``."""
        cmd = c.DropWorking(subtask, path, attempt)
        self.recorded(cmd, lambda: self.working.drop(subtask, path, attempt))

    def snapshot_working(
        self,
        checkpoint: int,
        subtask: SubtaskId,
        inline_below: int = 0,
        attempt: TmId | None = None,
    ) -> None:
        """R103: ``subtask`` snapshots its database for ``checkpoint``."""
        cmd = c.SnapshotWorking(checkpoint, subtask, inline_below, attempt)
        self.recorded(
            cmd, lambda: self.working.snapshot(checkpoint, subtask, inline_below, attempt)
        )

    def collect_working(self) -> None:
        """R104: the coordinator's collection of working files."""
        self.recorded(c.CollectWorking(), self.working.collect)

    def retry_deletes(self) -> None:
        """R45: retry the deletes that failed."""

        def run() -> None:
            self.catalog.retry_deletes()
            for tm in sorted(self.parties):  # each party retries its own (R45)
                self.parties[tm].catalog.retry_deletes(storage=False)

        self.recorded(c.RetryDeletes(), run)

    def start_trace(self, trace: CommandTrace) -> None:
        """Log every call from now on to ``trace`` (``fastimpl.trace``). A replay starts
        from the model's initial state, so the trace must start with the store: before
        its first call, on an empty root."""
        if (
            self.coord.next_checkpoint != 1
            or self.catalog.files
            or self.job != "job-0"
            or self.channel
        ):
            raise UsageError("a trace starts with the store, before its first command")
        ids = "counter" if isinstance(self.ids, CounterIds) else "random"
        trace.header(self.cfg, self.job_spec, ids)
        self.trace = trace
        if trace.observations:  # a replay compares the whole history
            self.catalog.keep_deletion_log()

    def _traced(self, cmd: c.Command, run: Callable[[], _T]) -> _T:
        trace = self.trace
        assert trace is not None
        before = self.storage.real_faults
        error: BaseException | None = None
        try:
            return run()
        except (CommandError, StorageFault) as err:
            error = err
            raise
        finally:
            obs = self.observe() if trace.observations else None
            trace.record(cmd, error, self.storage.real_faults - before, obs)

    # ------------------------------------------------------------------ guards (spec/refusals.py)

    def check(self, cmd: c.Command) -> None:
        """Refuse ``cmd`` (``CommandError``) at the first of its guards, in the table's
        order, that the product's records say fails; nothing has changed yet."""
        refusals.check(cmd, self.checks(cmd))

    def checks(self, cmd: c.Command) -> dict[str, Check]:
        """The product's predicate for each guard of ``cmd``, by name
        (``fastimpl.engine_guards``)."""
        return guard_checks(self.coord, self.parties, len(self.channel), cmd)

    def acting(self, subtask: SubtaskId, attempt: TmId | None) -> TmId:
        """The attempt that acts for a subtask of the running job: its TM, or the lost
        ``attempt`` named (a zombie, R64), once the guards let it (``check``)."""
        return self.coord.guards.acting_tm(subtask, attempt)

    # ------------------------------------------------------------------ observation

    def observe(self) -> Observation:
        """The parties' records merged over storage (``fastimpl.party_observation``);
        what they disagree on is kept in ``disagreements``."""
        obs, self.disagreements = observe_in_process(self.coord, self.parties, self.storage)
        return obs


# ------------------------------------------------------------------ the working state's calls


class WorkingCalls:
    """The working commands on an in-process engine (§11, R101-R106), checked by the
    engine's predicates (``fastimpl.engine_guards``) in the order ``spec/refusals.py``
    lists. They reach into the engine's parties, so they are the engine's:
    ``fastimpl.working``, which the coordinator and the TM import, stays free of the
    engine. The acting attempt is the subtask's live TM, or a lost attempt that hosted it
    (a zombie, R106)."""

    def __init__(self, engine: InProcessEngine) -> None:
        self.engine = engine

    def write(self, subtask: SubtaskId, data: bytes, attempt: TmId | None = None) -> str | None:
        """R101: the database writes one working file; its path, or ``None`` if a
        storage call failed (nothing is used, R45)."""
        self.engine.check(c.WriteWorking(subtask, len(data), attempt))
        tm = self.engine.acting(subtask, attempt)
        try:
            return self.engine.parties[tm].working.write(subtask, data)
        except StorageFault:
            return None

    def drop(self, subtask: SubtaskId, path: str, attempt: TmId | None = None) -> None:
        """R102: the database stops using ``path`` (a compaction replaced it)."""
        self.engine.check(c.DropWorking(subtask, path, attempt))
        tm = self.engine.acting(subtask, attempt)
        self.engine.parties[tm].working.drop(subtask, path)

    def snapshot(
        self, checkpoint: int, subtask: SubtaskId, inline_below: int, attempt: TmId | None
    ) -> None:
        """R103: the subtask snapshots its database for ``checkpoint``; a failing write
        declines the checkpoint (R17)."""
        e = self.engine
        e.check(c.SnapshotWorking(checkpoint, subtask, inline_below, attempt))
        tm = e.acting(subtask, attempt)
        party = e.parties[tm]
        savepoint = e._is_savepoint(checkpoint)

        def write(name: str, data: bytes) -> object:
            return party.write(
                subtask, checkpoint, StateKind.KEYED_SHARED, name, len(data), 1, data, savepoint
            )

        try:
            party.working.snapshot(subtask, checkpoint, inline_below, savepoint, write)
        except StorageFault:
            e._write_failed(tm, subtask, checkpoint)

    def collect(self) -> None:
        """R104: the coordinator's collection."""
        self.engine.check(c.CollectWorking())
        self.engine.coord.working.collect()
