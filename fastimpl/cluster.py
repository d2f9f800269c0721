"""The store: a coordinator, its TMs, the notification channel and storage, in one
process. ``Cluster.apply(command)`` accepts every command of ``spec/commands.py`` and
``observe()`` shows the store in ``spec/observation.py`` vocabulary.

A command is validated before anything changes: a ``CommandError`` leaves files and
bookkeeping as they were. Storage calls happen in the order SPEC.md's rules give them,
so with ``CounterIds`` the names match the reference model's, file by file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs

from fastimpl.coordinator import CheckpointCoordinator, subtasks_of
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.records import (
    BackendRef,
    Completed,
    Pending,
    Status,
    Tm,
)
from fastimpl.storage import Storage, StorageFault
from fastimpl.taskmanager import TaskManager
from fastimpl.trace import CommandTrace
from fastimpl.transport import InMemoryTransport
from spec import commands as c
from spec.config import Config, JobSpec, VertexSpec
from spec.effects import COORDINATOR, tm_actor
from spec.errors import CommandError, Reason
from spec.handles import (
    FileHandle,
    SegmentHandle,
    StateEntry,
    stream_of,
)
from spec.ids import SubtaskId, TmId
from spec.layout import (
    METADATA,
)
from spec.messages import CheckpointAborted, CheckpointComplete, Decline
from spec.observation import Observation, RegistryView, RetainedView

log = logging.getLogger("fastimpl.cluster")
_T = TypeVar("_T")
OutKey = tuple[TmId, SubtaskId, int]
BackendKey = tuple[TmId, SubtaskId, str]
_METADATA_SUFFIX = "/" + METADATA


def _subtasks(vertices: tuple[VertexSpec, ...]) -> list[SubtaskId]:
    return [SubtaskId(v.name, i, v.parallelism) for v in vertices for i in range(v.parallelism)]


def _place(subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
    return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}


class Cluster:
    """A job's checkpoint storage with its coordinator and TMs."""

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
    ) -> None:
        self.storage = Storage(fs, root, background_deletes=background_deletes)
        if not self.storage.open_files_readable and config.open_files_readable:
            # The store decides (an object store shows a file only once closed), and the
            # configuration says so from here on, as the model is told (traces record it).
            # Raises Config's R16 error for ACROSS merging.
            config = attrs.evolve(config, open_files_readable=False)
        self.cfg = config
        self.copy_bytes = False
        """Re-uploads (R20) copy the old bytes; off where every byte is a zero (tests)."""
        self.ids: IdSource = ids if ids is not None else RandomIds()
        """One id source for every party: with ``CounterIds`` names follow the model's."""
        self.channel = InMemoryTransport()
        """The coordinator's notices in flight to TMs, encoded (``spec.messages``)."""
        self.parties: dict[TmId, TaskManager] = {}
        """Each TM attempt's own side (``fastimpl.taskmanager``), by id."""
        self.next_tm = 1
        self.coord = CheckpointCoordinator(
            config,
            job_spec.vertices,
            job_spec.num_tms,
            self.storage,
            self.ids,
            self,
            job_id,
            deletion_log=deletion_log,
        )
        self.catalog = self.coord.catalog
        tms = [self.start_tm(job_id, 1, None) for _ in range(job_spec.num_tms)]
        self.coord.deploy(self.place(subtasks_of(job_spec.vertices), tms))
        self.job_spec = job_spec
        self.trace: CommandTrace | None = None
        """Where executed commands are logged (``start_trace``); None: not logged."""
        self.on_applied: Callable[[c.Command], None] | None = None
        """Told each command applied (``fastimpl.writer_state`` publishes the writer's state)."""

    # ------------------------------------------------------------------ the coordinator's

    @property
    def job(self) -> str:
        return self.coord.job

    @property
    def placement(self) -> dict[SubtaskId, TmId]:
        return self.coord.placement

    @property
    def tms(self) -> dict[TmId, Tm]:
        return self.coord.tms

    @property
    def running(self) -> bool:
        return self.coord.running

    @property
    def next_checkpoint(self) -> int:
        return self.coord.next_checkpoint

    @property
    def pending(self) -> dict[int, Pending]:
        return self.coord.pending

    @property
    def retained(self) -> list[Completed]:
        return self.coord.retained

    @property
    def savepoints(self) -> dict[int, Completed]:
        return self.coord.savepoints

    @property
    def latest_completed(self) -> int:
        return self.coord.latest_completed

    def _is_savepoint(self, checkpoint: int) -> bool:
        """The checkpoint's type, as Flink's CheckpointOptions carry it with the barrier."""
        return self.coord._is_savepoint(checkpoint)

    def hosted_by(self, tm: TmId) -> list[SubtaskId]:
        """The subtasks the engine placed on ``tm``."""
        return [s for s, t in self.coord.placement.items() if t == tm]

    def load_completed(self, metadata: str, job: str | None = None) -> Completed:
        return self.coord.load_completed(metadata, job)

    def state_to_restore(self, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        return self.coord.state_to_restore(subtask)

    # ------------------------------------------------------------------ the engine

    def send(self, tm: TmId, msg: CheckpointComplete | CheckpointAborted) -> None:
        self.channel.send(tm, msg)

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        tm = f"tm-{self.next_tm}"
        self.next_tm += 1
        party = TaskManager(tm, job, self.cfg, self, first_checkpoint)
        if finished_mark is not None:
            party.finished_mark = finished_mark
        self.parties[tm] = party
        return tm

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        """Round-robin: the in-process engine's choice."""
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def pool_files(self, tm: TmId) -> Iterable[str]:
        return self.parties[tm].m.pfiles

    def reset_tm(self, tm: TmId) -> None:
        party = self.parties[tm]
        party.drop_outputs_where(lambda cp: True)
        for path in sorted(party.m.pfiles):
            if party.m.pfiles[path].open:
                self.catalog.close(path)
        self.forget_tm(tm)

    def restart_tm(
        self,
        tm: TmId,
        known: tuple[int, int, int],
        first_checkpoint: int,
        hosted: list[SubtaskId],
        retained: list[tuple[int, tuple[StateEntry, ...]]],
        latest: tuple[int, tuple[StateEntry, ...]] | None,
    ) -> None:
        party = self.parties[tm]
        party.restart_knowledge(known[0], known[1], known[2], first_checkpoint)
        party.restore(hosted, retained, latest)

    def seed_backend(self, tm: TmId, subtask: SubtaskId, entry: StateEntry, cp: int) -> None:
        self.parties[tm].backend[(subtask, entry.name)] = BackendRef(entry, cp, True)

    def end_tm(self, tm: TmId, keep: set[str]) -> None:
        self.parties[tm].end_job(keep)

    def forget_tm(self, tm: TmId) -> None:
        """A TM that is gone keeps no memory: its tables go, its files stay on storage."""
        self.parties[tm].forget()
        self.channel.forget(tm)

    # ------------------------------------------------------------------ dispatch

    def apply(self, cmd: c.Command) -> None:
        """Apply one command; raise ``CommandError`` (nothing changed) if it is invalid."""
        self._run(cmd, lambda: self._dispatch(cmd))

    def _run(self, cmd: c.Command, run: Callable[[], _T]) -> _T:
        result = run() if self.trace is None else self._traced(cmd, run)
        if self.on_applied is not None:
            self.on_applied(cmd)
        return result

    # The coordinator's calls return what they produced (raft's ``Ready``): callers never
    # read it back from the tables afterwards.

    def trigger(self, savepoint: bool = False) -> int:
        """``Trigger``; the new checkpoint's id."""
        cmd = c.Trigger(savepoint)
        return self._run(cmd, lambda: self.coord.trigger(savepoint))

    def acknowledge(self, cmd: c.Acknowledge) -> tuple[StateEntry, ...]:
        """``Acknowledge``; the entries the subtask wrote and reports (its directory
        handles, R40, are added by the acknowledgement itself and not listed)."""
        return self._run(cmd, lambda: self._acknowledge(cmd))

    def complete(self, checkpoint: int) -> Completed | None:
        """``Complete``; the completed checkpoint, or ``None`` if writing its
        ``_metadata`` failed and it was aborted (R51)."""
        cmd = c.Complete(checkpoint)
        return self._run(cmd, lambda: self.coord.complete(checkpoint))

    def start_trace(self, trace: CommandTrace) -> None:
        """Log every command executed from now on to ``trace`` (``fastimpl.trace``). A
        replay starts from the model's initial state, so the trace must start with the
        store: before its first command, on an empty root."""
        if self.next_checkpoint != 1 or self.catalog.files or self.job != "job-0" or self.channel:
            raise ValueError("a trace starts with the store, before its first command")
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

    def _dispatch(self, cmd: c.Command) -> None:
        match cmd:
            case c.Trigger():
                self.coord.trigger(cmd.savepoint)
            case c.WriteState():
                self._write_state(cmd)
            case c.ReuseShared():
                self._reuse_shared(cmd)
            case c.Acknowledge():
                self._acknowledge(cmd)
            case c.Decline():
                tm = self._writer_tm(cmd.checkpoint, cmd.subtask, None)
                self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            case c.Complete():
                self.coord.complete(cmd.checkpoint)
            case c.Abort():
                self.coord.require_running()
                self.coord.require_pending(cmd.checkpoint)
                self.coord.abort(cmd.checkpoint)
            case c.DeliverNotification():
                self._deliver(cmd.index)
            case c.DropNotification():
                self.channel.drop(cmd.index)
            case c.DuplicateNotification():
                self.channel.duplicate(cmd.index)
            case c.CrashTm():
                self._crash_tm(cmd.tm)
            case c.AttemptStopped():
                self.coord.attempt_stopped(cmd.tm)
            case c.CrashDuringWrite():
                self._crash_during_write(cmd)
            case c.Failover():
                self.coord.require_running()
                self.coord.failover()
            case c.RestartCoordinator():
                self.coord.require_running()
                self.coord.restart()
            case c.Restore():
                self.coord.restore(cmd)
            case c.FailNextCall():
                self.storage.arm(cmd.op)
            case c.RetryDeletes():
                self.catalog.retry_deletes()
            case c.Cancel():
                self.coord.require_running()
                self.coord.end_job(retain=cmd.retain)
            case _:
                raise CommandError(Reason.BAD_ARGUMENT, f"unknown command {cmd!r}")

    # ------------------------------------------------------------------ validation

    def _writer_tm(self, checkpoint: int, subtask: SubtaskId, attempt: TmId | None) -> TmId:
        """The TM a write or acknowledgement comes from, checked (R10, R56, R64)."""
        self.coord.require_running()
        if subtask not in self.placement:
            raise CommandError(Reason.UNKNOWN_SUBTASK, f"{subtask} is not a subtask of {self.job}")
        if not 1 <= checkpoint < self.next_checkpoint:
            raise CommandError(Reason.UNKNOWN_CHECKPOINT, f"checkpoint {checkpoint} unknown")
        tm = self.placement[subtask] if attempt is None else attempt
        rec = self.tms.get(tm)
        if rec is None:
            raise CommandError(Reason.UNKNOWN_TM, f"no TM {tm}")
        if attempt is None and rec.status is not Status.ALIVE:
            raise CommandError(Reason.TM_NOT_ALIVE, f"{tm} hosting {subtask} is not alive")
        if attempt is not None:
            if rec.status is not Status.LOST:
                raise CommandError(Reason.TM_NOT_LOST, f"attempt {tm} is not a lost TM")
            if subtask not in rec.hosted:
                raise CommandError(Reason.NOT_HOSTED, f"{tm} never hosted {subtask}")
        party = self.parties[tm]
        if party.finished(checkpoint):
            raise CommandError(
                Reason.CHECKPOINT_FINISHED_FOR_TM,
                f"{tm} already knows checkpoint {checkpoint} is finished",
            )
        if party.acknowledged(subtask, checkpoint):
            raise CommandError(
                Reason.ALREADY_ACKNOWLEDGED, f"{subtask} already acknowledged {checkpoint}"
            )
        return tm

    def write_state(self, cmd: c.WriteState, data: bytes | None = None) -> StateEntry | None:
        """``WriteState`` with the bytes themselves; returns the entry acknowledged later.

        ``None`` for an empty snapshot (R10). A failing storage call declines the
        checkpoint for the subtask (R17) and is raised as ``StorageFault``.
        """
        if data is not None and len(data) != cmd.size:
            raise CommandError(Reason.BAD_ARGUMENT, f"size {cmd.size} but {len(data)} bytes given")
        if self.trace is not None:
            return self._traced(cmd, lambda: self._write_state(cmd, data, raise_fault=True))
        return self._write_state(cmd, data, raise_fault=True)

    def _write_state(
        self, cmd: c.WriteState, data: bytes | None = None, *, raise_fault: bool = False
    ) -> StateEntry | None:
        tm = self._writer_tm(cmd.checkpoint, cmd.subtask, cmd.attempt)
        if cmd.size == 0:
            return None  # R10
        try:
            return self.parties[tm].write(
                cmd.subtask, cmd.checkpoint, cmd.kind, cmd.name, cmd.size, cmd.entries, data
            )
        except StorageFault:
            self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            if raise_fault:
                raise
            return None

    def _write_failed(self, tm: TmId, subtask: SubtaskId, checkpoint: int) -> None:
        """R17: the subtask declines and writes no more for the checkpoint (R14)."""
        self.parties[tm].write_failed(subtask, checkpoint)
        self.coord.receive_decline(Decline(self.job, checkpoint, subtask, tm))

    def reuse_shared(self, cmd: c.ReuseShared) -> StateEntry | None:
        """``ReuseShared`` returning the entry the subtask acknowledges: the old handle, a
        placeholder, or a new upload of the same bytes when the old file is not reusable."""
        if self.trace is not None:
            return self._traced(cmd, lambda: self._reuse_shared(cmd, raise_fault=True))
        return self._reuse_shared(cmd, raise_fault=True)

    def _reuse_shared(self, cmd: c.ReuseShared, *, raise_fault: bool = False) -> StateEntry | None:
        tm = self._writer_tm(cmd.checkpoint, cmd.subtask, cmd.attempt)
        party = self.parties[tm]
        ref = party.backend_ref(cmd.subtask, cmd.name)
        reused = party.reuse(cmd.subtask, cmd.checkpoint, ref)
        if reused is not None:
            return reused
        old = ref.entry
        stream = stream_of(old.handle)
        size = 0 if stream is None else stream.length
        # R20: not reusable: upload the same local state again
        data = None
        if (
            self.copy_bytes
            and stream is not None
            and size > 0
            and stream.path not in self.catalog.files
        ):
            # The store keeps no local copy: the bytes come from the old upload, which the
            # store itself deleted (its checkpoint was aborted). Nothing changes; the
            # caller writes the state again.
            raise CommandError(
                Reason.NO_SUCH_STATE,
                f"{cmd.subtask} on {tm}: the bytes of {cmd.name!r} were deleted with "
                f"{stream.path}; write the state again",
            )
        try:
            if self.copy_bytes and stream is not None and size > 0:
                # A file the store still tracks that cannot be read in full is damage,
                # not a choice: the subtask declines (R17), naming the path and sizes.
                at = stream.offset if isinstance(stream, SegmentHandle) else 0
                data = self.storage.read_range(stream.path, at, size)
            return party.write(
                cmd.subtask, cmd.checkpoint, old.kind, old.name, size, old.entries, data
            )
        except StorageFault:
            self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            if raise_fault:
                raise
            return None

    # ------------------------------------------------------------------ acknowledge

    def _acknowledge(self, cmd: c.Acknowledge) -> tuple[StateEntry, ...]:
        tm = self._writer_tm(cmd.checkpoint, cmd.subtask, cmd.attempt)
        try:
            written, ack = self.parties[tm].acknowledge(cmd.subtask, cmd.checkpoint)
        except StorageFault:
            self.coord.receive_decline(Decline(self.job, cmd.checkpoint, cmd.subtask, tm))
            raise
        self.coord.receive_ack(ack)
        return written

    def _deliver(self, index: int) -> None:
        """R34: any notice may arrive at any time, twice or never."""
        tm, msg = self.channel.take(index)
        rec = self.tms.get(tm)
        if rec is None or rec.status is Status.STOPPED:
            return
        if isinstance(msg, CheckpointComplete | CheckpointAborted):
            self.parties[tm].on_notice(msg)

    # ------------------------------------------------------------------ crashes (R57-R65)

    def _crash_tm(self, tm: TmId) -> None:
        self.coord.require_running()
        rec = self.tms.get(tm)
        if rec is None:
            raise CommandError(Reason.UNKNOWN_TM, f"no TM {tm}")
        if rec.status is not Status.ALIVE or tm not in self.placement.values():
            raise CommandError(Reason.TM_NOT_ALIVE, f"{tm} is not a live TM of {self.job}")
        self.coord.lose(tm)

    def _crash_during_write(self, cmd: c.CrashDuringWrite) -> None:
        tm = self._writer_tm(cmd.checkpoint, cmd.subtask, None)
        if not 0 < cmd.written < cmd.size:
            raise CommandError(Reason.BAD_ARGUMENT, "a crash mid-write needs 0 < written < size")
        try:
            self.parties[tm].write(
                cmd.subtask, cmd.checkpoint, cmd.kind, cmd.name, cmd.size, 1, partial=cmd.written
            )
        except StorageFault:
            pass  # R65: the half-written bytes stay with the crashed attempt
        self.coord.lose(tm)

    def observe(self) -> Observation:
        """The real files on storage, and the bookkeeping that decides who deletes them."""
        alive = (
            {t for t in self.placement.values() if self.tms[t].status is Status.ALIVE}
            if self.running
            else set()
        )
        claims: dict[str, set[str]] = {}
        ref_counts: dict[str, int] = {}
        live: dict[str, list[tuple[int, int]]] = {}
        pool_files: set[str] = set()
        for tm in sorted(alive):
            party = self.parties[tm]
            m = party.m
            actor = tm_actor(tm)
            for path, pf in m.pfiles.items():
                claims.setdefault(path, set()).add(actor)
                ref_counts[path] = pf.ref_count
            for seg in m.segs.values():
                live.setdefault(seg.path, []).append((seg.offset, seg.length))
            pool_files.update(m.pools.values())
            for entries in party.outputs.values():
                for e in entries:
                    if isinstance(e.handle, FileHandle):
                        claims.setdefault(e.handle.path, set()).add(actor)
        if self.running:
            for reg in self.coord.registry.values():
                if reg.owned and not reg.key.startswith("dir:"):
                    claims.setdefault(reg.path, set()).add(COORDINATOR)
            for p in self.pending.values():
                for path in p.received:
                    claims.setdefault(path, set()).add(COORDINATOR)
            for r in self.retained:
                claims.setdefault(r.metadata, set()).add(COORDINATOR)
        on_storage = self.storage.list_files()
        return Observation(
            files=on_storage,
            open_files=frozenset(p for p, f in self.catalog.files.items() if f.open),
            directories=dict(self.catalog.dir_owner),
            owners=self.catalog.owners(),
            claims={p: frozenset(v) for p, v in claims.items()},
            retained=tuple(
                RetainedView(r.id, r.job, r.metadata, r.entries, r.directories)
                for r in self.retained
            ),
            restoring=self.coord.restoring,
            ref_counts=ref_counts,
            live_segments={p: tuple(sorted(v)) for p, v in live.items()},
            registry={
                k: RegistryView(r.path, frozenset(r.refs), r.owned)
                for k, r in self.coord.registry.items()
            },
            deletions=tuple(
                self.catalog.bad_deletions
                if self.catalog.deletions is None
                else self.catalog.deletions
            ),
            pending_deletes=(
                *(d.path for d in self.catalog.deferred),
                *sorted(self.storage.failed_deletes),
            ),
            pool_files=frozenset(pool_files),
            metadata_files=frozenset(p for p in on_storage if p.endswith(_METADATA_SUFFIX)),
            live_parties=frozenset({COORDINATOR} | {tm_actor(t) for t in alive}),
        )
