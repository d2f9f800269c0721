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

from fastimpl.catalog import Catalog
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.metadata import MetadataError, base_of, metadata_bytes
from fastimpl.records import (
    BackendRef,
    Completed,
    Deferred,
    Pending,
    RegEntry,
    Status,
    StoredFile,
    Tm,
)
from fastimpl.redistribute import assign
from fastimpl.storage import Storage, StorageFault
from fastimpl.taskmanager import TaskManager
from fastimpl.trace import CommandTrace
from fastimpl.transport import InMemoryTransport
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode, RestoreMode, Scope, StateKind, VertexSpec
from spec.effects import COORDINATOR, USER, tm_actor
from spec.errors import CommandError, Reason
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
    stream_of,
)
from spec.ids import SubtaskId, TmId
from spec.keygroups import max_parallelism_refusal
from spec.layout import (
    METADATA,
    SAVEPOINTS,
    is_under,
    job_base,
    metadata_path,
    savepoint_dir,
    shared_dir,
    taskowned_dir,
)
from spec.messages import Acknowledgement, CheckpointAborted, CheckpointComplete, Decline
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
        self.mode = config.merging_mode
        self._hot: tuple[object, frozenset[str]] | None = None
        self.copy_bytes = False
        """Re-uploads (R20) copy the old bytes; off where every byte is a zero (tests)."""
        self.ids: IdSource = ids if ids is not None else RandomIds()
        self.catalog = Catalog(self.storage, self.ids, self, deletion_log=deletion_log)
        """Every path on storage, who owns it, and the guarded deletes (``fastimpl.catalog``)."""
        self.num_tms = job_spec.num_tms
        self.job = job_id
        self.job_seq = 0
        self.running = True
        self.vertices = job_spec.vertices
        tm_ids = [f"tm-{i}" for i in range(1, job_spec.num_tms + 1)]
        self.placement: dict[SubtaskId, TmId] = _place(_subtasks(self.vertices), tm_ids)
        self.tms: dict[TmId, Tm] = {t: Tm(t, Status.ALIVE) for t in tm_ids}
        self.parties: dict[TmId, TaskManager] = {
            t: TaskManager(t, job_id, config, self) for t in tm_ids
        }
        """Each TM attempt's own side (``fastimpl.taskmanager``), by id."""
        self.next_tm = job_spec.num_tms + 1
        self.next_checkpoint = 1
        self.pending: dict[int, Pending] = {}
        self.retained: list[Completed] = []
        self.savepoints: dict[int, Completed] = {}
        self.savepoint_ids: set[int] = set()
        self.latest_completed = 0
        self.watermark = 0
        self.registry: dict[str, RegEntry] = {}
        self.channel = InMemoryTransport()
        """The coordinator's notices in flight to TMs, encoded (``spec.messages``)."""
        self.restoring: tuple[StateEntry, ...] = ()
        self.assignment: dict[SubtaskId, tuple[StateEntry, ...]] = {}
        """Each new subtask's share of the checkpoint restored last (R75, R76)."""
        self.bases: set[str] = {job_base(job_id), SAVEPOINTS}
        self.lineage: set[str] = {job_base(job_id)}
        """Bases whose files a CLAIM may give the coordinator (R72, I5): the running job's
        own and those its predecessors held when claimed; a NO_CLAIM restore starts a
        lineage of its own (R73). Never a savepoint's, never what a file merely names."""
        self.triggered_savepoints: set[int] = set()
        """Savepoints this store triggered: their directories hold files of its own (being
        written, or written late, R43) besides the completed savepoint's (the user's)."""
        self.job_spec = job_spec
        self.trace: CommandTrace | None = None
        """Where executed commands are logged (``start_trace``); None: not logged."""
        self.on_applied: Callable[[c.Command], None] | None = None
        """Told each command applied (``fastimpl.writer_state`` publishes the writer's state)."""

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
        return self._run(cmd, lambda: self._trigger(cmd))

    def acknowledge(self, cmd: c.Acknowledge) -> tuple[StateEntry, ...]:
        """``Acknowledge``; the entries the subtask wrote and reports (its directory
        handles, R40, are added by the acknowledgement itself and not listed)."""
        return self._run(cmd, lambda: self._acknowledge(cmd))

    def complete(self, checkpoint: int) -> Completed | None:
        """``Complete``; the completed checkpoint, or ``None`` if writing its
        ``_metadata`` failed and it was aborted (R51)."""
        cmd = c.Complete(checkpoint)
        return self._run(cmd, lambda: self._complete(cmd))

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
                self._trigger(cmd)
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
                self._complete(cmd)
            case c.Abort():
                self._require_running()
                self._require_pending(cmd.checkpoint)
                self._coordinator_abort(cmd.checkpoint)
            case c.DeliverNotification():
                self._deliver(cmd.index)
            case c.DropNotification():
                self.channel.drop(cmd.index)
            case c.DuplicateNotification():
                self.channel.duplicate(cmd.index)
            case c.CrashTm():
                self._crash_tm(cmd.tm)
            case c.AttemptStopped():
                self._attempt_stopped(cmd.tm)
            case c.CrashDuringWrite():
                self._crash_during_write(cmd)
            case c.Failover():
                self._require_running()
                self._failover()
            case c.RestartCoordinator():
                self._require_running()
                self._restart_coordinator()
            case c.Restore():
                self._restore(cmd)
            case c.FailNextCall():
                self.storage.arm(cmd.op)
            case c.RetryDeletes():
                self.catalog.retry_deletes()
            case c.Cancel():
                self._require_running()
                self._end_job(retain=cmd.retain)
            case _:
                raise CommandError(Reason.BAD_ARGUMENT, f"unknown command {cmd!r}")

    # ------------------------------------------------------------------ validation

    def _require_running(self) -> None:
        if not self.running:
            raise CommandError(Reason.JOB_NOT_RUNNING, f"job {self.job} has ended")

    def _require_pending(self, checkpoint: int) -> Pending:
        p = self.pending.get(checkpoint)
        if p is None:
            if 1 <= checkpoint < self.next_checkpoint:
                raise CommandError(
                    Reason.CHECKPOINT_NOT_PENDING, f"checkpoint {checkpoint} is not pending"
                )
            raise CommandError(Reason.UNKNOWN_CHECKPOINT, f"checkpoint {checkpoint} unknown")
        return p

    def _writer_tm(self, checkpoint: int, subtask: SubtaskId, attempt: TmId | None) -> TmId:
        """The TM a write or acknowledgement comes from, checked (R10, R56, R64)."""
        self._require_running()
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

    def _is_savepoint(self, checkpoint: int) -> bool:
        return checkpoint in self.savepoint_ids

    # ------------------------------------------------------------------ the engine's view

    def hot_dirs(self) -> frozenset[str]:
        key = (self.job, tuple(self.placement))
        if self._hot is None or self._hot[0] != key:
            hot = {shared_dir(self.job, s) for s in self.placement}
            hot |= {d.rsplit("/", 1)[0] for d in hot}
            hot |= {f"{job_base(self.job)}/taskowned", SAVEPOINTS}
            self._hot = (key, frozenset(hot))
        return self._hot[1]

    # ------------------------------------------------------------------ trigger (R50)

    def _trigger(self, cmd: c.Trigger) -> int:
        self._require_running()
        cid = self.next_checkpoint
        self.next_checkpoint += 1
        self.pending[cid] = Pending(cid, cmd.savepoint)
        if cmd.savepoint:
            self.savepoint_ids.add(cid)
            self.triggered_savepoints.add(cid)
        return cid

    # ------------------------------------------------------------------ writing (R10-R17)

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
        self._receive_decline(Decline(self.job, checkpoint, subtask, tm))

    def _receive_decline(self, msg: Decline) -> None:
        """The coordinator's half: a decline from a live attempt aborts the checkpoint; one
        from an attempt it gave up on, or of a checkpoint no longer pending, changes
        nothing (R56)."""
        rec = self.tms.get(msg.attempt)
        if msg.checkpoint in self.pending and rec is not None and rec.status is Status.ALIVE:
            self._coordinator_abort(msg.checkpoint)

    # ------------------------------------------------------------------ reuse (R20-R23)

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
            self._receive_decline(Decline(self.job, cmd.checkpoint, cmd.subtask, tm))
            raise
        self._receive_ack(ack)
        return written

    def _receive_ack(self, ack: Acknowledgement) -> None:
        """The coordinator's half. It knows the sender only from the message: an attempt
        it has given up on (a lost TM, or one that no longer hosts the subtask) is
        ignored (R56), and so is a late acknowledgement of a checkpoint no longer
        pending, except that its whole files are handed over and deleted (R43)."""
        rec = self.tms.get(ack.attempt)
        current = (
            rec is not None
            and rec.status is Status.ALIVE
            and self.placement.get(ack.subtask) == ack.attempt
        )
        entries = ack.entries
        if not current or ack.checkpoint not in self.pending:
            if current:
                self._take_over_files(entries)  # R43: a late ack still hands files over
                for e in entries:
                    s = stream_of(e.handle)
                    if s is not None and isinstance(e.handle, FileHandle):
                        self.catalog.delete_file(s.path, COORDINATOR)
            return  # R56
        p = self.pending[ack.checkpoint]
        p.received |= self._take_over_files(entries)
        p.acks[ack.subtask] = entries
        if not all(
            e.handle.logical_id in self.registry
            for e in entries
            if isinstance(e.handle, PlaceholderHandle)
        ):
            self._coordinator_abort(ack.checkpoint)  # R22
            return
        for e in entries:
            if isinstance(e.handle, PlaceholderHandle):
                self.registry[e.handle.logical_id].pins.add(ack.checkpoint)

    def _take_over_files(self, entries: Iterable[StateEntry]) -> set[str]:
        """R43: whole-file handles (NONE mode, savepoints) become the coordinator's."""
        taken: set[str] = set()
        for e in entries:
            h = e.handle
            if isinstance(h, FileHandle):
                f = self.catalog.files.get(h.path)
                if f is not None:
                    f.owner = COORDINATOR
                    taken.add(h.path)
        return taken

    # ------------------------------------------------------------------ coordinator

    def _current_tms(self) -> list[TmId]:
        return sorted({t for t in self.placement.values() if self.tms[t].status is Status.ALIVE})

    def _notify_complete(self, checkpoint: int, savepoint: bool) -> None:
        open_sps = frozenset(k for k, p in self.pending.items() if p.savepoint)
        msg = CheckpointComplete(self.job, checkpoint, self.watermark, savepoint, open_sps)
        for tm in self._current_tms():
            self.channel.send(tm, msg)

    def _notify_abort(self, checkpoint: int, savepoint: bool) -> None:
        msg = CheckpointAborted(self.job, checkpoint, self.latest_completed, savepoint)
        for tm in self._current_tms():
            self.channel.send(tm, msg)

    def _coordinator_abort(self, checkpoint: int) -> None:
        p = self.pending.pop(checkpoint)
        for key in sorted(k for k, r in self.registry.items() if checkpoint in r.pins):
            self.registry[key].pins.discard(checkpoint)
            self._release_entry(key)
        for path in sorted(p.received):  # R43
            f = self.catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR:
                self.catalog.delete_file(path, COORDINATOR)
        self._notify_abort(checkpoint, p.savepoint)

    def _complete(self, cmd: c.Complete) -> Completed | None:
        self._require_running()
        p = self._require_pending(cmd.checkpoint)
        missing = [s for s in self.placement if s not in p.acks]
        if missing:
            raise CommandError(
                Reason.NOT_ALL_ACKNOWLEDGED,
                f"checkpoint {cmd.checkpoint} lacks acks from {[str(s) for s in missing]}",
            )
        entries: list[StateEntry] = []
        directories: list[str] = []
        for s in sorted(p.acks):
            for e in p.acks[s]:
                h = e.handle
                if isinstance(h, DirectoryHandle):
                    if h.path not in directories:
                        directories.append(h.path)
                elif isinstance(h, PlaceholderHandle):
                    reg = self.registry[h.logical_id]
                    assert reg.handle is not None
                    entries.append(
                        StateEntry(
                            e.subtask,
                            e.kind,
                            e.name,
                            reg.handle,
                            e.entries,
                            e.key_groups,
                            e.entry_range,
                        )
                    )
                else:
                    entries.append(e)
        meta = (
            f"{savepoint_dir(cmd.checkpoint)}/{METADATA}"
            if p.savepoint
            else metadata_path(self.job, cmd.checkpoint)
        )
        done = Completed(
            cmd.checkpoint,
            self.job,
            p.savepoint,
            tuple(entries),
            tuple(directories),
            meta,
            self.cfg.max_parallelism,
        )
        try:
            self.storage.write_metadata(
                meta,
                metadata_bytes(
                    done.id,
                    done.job,
                    done.savepoint,
                    done.entries,
                    done.directories,
                    max_parallelism=done.max_parallelism,  # R77
                ),
            )
        except StorageFault:
            self._coordinator_abort(cmd.checkpoint)  # R51
            return None
        self.catalog.files[meta] = StoredFile(len(entries), False, COORDINATOR, None)
        del self.pending[cmd.checkpoint]
        if p.savepoint:
            # R55: a completed savepoint belongs to the user
            for path in [*sorted(p.received), done.metadata]:
                f = self.catalog.files.get(path)
                if f is not None:
                    f.owner = USER
            self.savepoints[done.id] = done
            self._notify_complete(done.id, True)
            return done
        self.restoring = ()
        self.latest_completed = cmd.checkpoint
        self._register(done)
        self.retained.append(done)
        while len(self.retained) > self.cfg.num_retained:  # R52
            self._subsume(self.retained.pop(0))
        self._notify_complete(cmd.checkpoint, False)
        for older in sorted(
            k for k, v in self.pending.items() if k < cmd.checkpoint and not v.savepoint
        ):
            self._coordinator_abort(older)  # R53
        self._collect_dirs()
        return done

    def _release_entry(self, key: str) -> None:
        """R54: an entry nobody refers to goes; the coordinator deletes what it owns."""
        reg = self.registry[key]
        if reg.refs or reg.pins:
            return
        del self.registry[key]
        if reg.owned and not key.startswith("dir:"):
            f = self.catalog.files.get(reg.path)
            if f is not None and f.owner == COORDINATOR:
                self.catalog.delete_file(reg.path, COORDINATOR)

    def _register(self, done: Completed, recorded: Completed | None = None) -> None:
        """R54: keyed by unique handle ids; refs are the checkpoint ids that use them.

        A logical id already registered for another path is a ``MetadataError`` naming
        the file (checked for every retained checkpoint before anything changes, see
        ``conflicting_ids``; here it is the last line of defence)."""
        for e in done.entries:
            h = e.handle
            if not isinstance(h, SegmentHandle | FileHandle) or h.scope is not Scope.SHARED:
                continue
            reg = self.registry.get(h.logical_id)
            if reg is not None and reg.path != h.path:
                raise MetadataError(
                    done.metadata,
                    "payload.entries",
                    f"logical id {h.logical_id!r} names {h.path!r}, already registered "
                    f"for {reg.path!r} (conflicting registration)",
                )
            # I5: the registry deletes a whole file only if it may be the coordinator's; a
            # file the user holds (another base's, R72 outside the lineage) is only read
            f = self.catalog.files.get(h.path)
            owned = isinstance(h, FileHandle) and (f is None or f.owner != USER)
            new = RegEntry(h.logical_id, h.path, h, owned)
            if reg is not None:
                new.refs = reg.refs
                new.pins = reg.pins
            new.refs.add(done.id)
            new.pins.discard(done.id)
            self.registry[h.logical_id] = new
        for d in done.directories:
            key = f"dir:{d}"
            reg = self.registry.get(key)
            new = RegEntry(key, d, None, True)
            if reg is not None:
                new.refs = reg.refs
            new.refs.add(done.id)
            self.registry[key] = new
            md = self.catalog.dirs.get(d)
            if md is not None:
                md.handed_over = True
            if self._may_claim(d, recorded or done, is_dir=True):
                self.catalog.dir_owner[d] = COORDINATOR  # R42

    def _subsume(self, old: Completed) -> None:
        """R52, R54: drop a checkpoint's references; delete what nobody refers to."""
        self.watermark = max(self.watermark, old.id)
        keys = [
            h.logical_id
            for e in old.entries
            if isinstance(h := e.handle, SegmentHandle | FileHandle) and h.scope is Scope.SHARED
        ] + [f"dir:{d}" for d in old.directories]
        for key in dict.fromkeys(keys):
            reg = self.registry.get(key)
            if reg is None:
                continue
            reg.refs.discard(old.id)
            self._release_entry(key)
        for e in old.entries:
            h = e.handle
            if isinstance(h, FileHandle) and h.scope is Scope.EXCLUSIVE:
                f = self.catalog.files.get(h.path)
                if f is not None and f.owner == COORDINATOR:
                    self.catalog.delete_file(h.path, COORDINATOR)
        f = self.catalog.files.get(old.metadata)
        if f is not None and f.owner == COORDINATOR:
            self.catalog.delete_file(old.metadata, COORDINATOR)

    # ------------------------------------------------------------------ notifications

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
        self._require_running()
        rec = self.tms.get(tm)
        if rec is None:
            raise CommandError(Reason.UNKNOWN_TM, f"no TM {tm}")
        if rec.status is not Status.ALIVE or tm not in self.placement.values():
            raise CommandError(Reason.TM_NOT_ALIVE, f"{tm} is not a live TM of {self.job}")
        self._lose(tm)

    def _lose(self, tm: TmId) -> None:
        """R57: every pending checkpoint aborts when a TM is lost."""
        rec = self.tms[tm]
        rec.status = Status.LOST
        rec.hosted = frozenset(s for s, t in self.placement.items() if t == tm)
        for cid in sorted(self.pending):
            self._coordinator_abort(cid)

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
        self._lose(tm)

    def _attempt_stopped(self, tm: TmId) -> None:
        """R64: what waited for a stopped attempt runs; the coordinator takes the rest."""
        rec = self.tms.get(tm)
        if rec is None:
            raise CommandError(Reason.UNKNOWN_TM, f"no TM {tm}")
        if rec.status is not Status.LOST:
            raise CommandError(Reason.TM_NOT_LOST, f"{tm} is {rec.status.value}, not lost")
        rec.status = Status.STOPPED
        rec.hosted = frozenset()
        for path in sorted(self.catalog.files):
            f = self.catalog.files[path]
            if f.creator == tm and f.open:
                self.storage.abandon(path)  # its process is gone
                f.open = False
        self._forget_tm(tm)
        actor = tm_actor(tm)
        formerly = sorted(p for p, f in self.catalog.files.items() if f.owner == actor)
        for path in formerly:
            self.catalog.files[path].owner = COORDINATOR
        for path in sorted(p for p, o in self.catalog.dir_owner.items() if o == actor):
            self.catalog.dir_owner[path] = COORDINATOR
        waiting = [d for d in self.catalog.deferred if d.waits_for == tm]
        self.catalog.deferred = [d for d in self.catalog.deferred if d.waits_for != tm]
        for d in waiting:
            self.catalog._run_deferred(Deferred(d.actor, d.path, d.is_dir, None))
        for path in formerly:
            if path in self.catalog.files and not self._referenced(path):
                self.catalog.delete_file(path, COORDINATOR)
        self._collect_dirs()

    def _forget_tm(self, tm: TmId) -> None:
        """A TM that is gone keeps no memory: its tables go, its files stay on storage."""
        self.parties[tm].forget()
        self.channel.forget(tm)

    def _referenced(self, path: str) -> bool:
        for r in self.retained:
            if path == r.metadata:
                return True
            for e in r.entries:
                s = stream_of(e.handle)
                if s is not None and s.path == path:
                    return True
        return any(
            (s := stream_of(e.handle)) is not None and s.path == path for e in self.restoring
        )

    def _collect_dirs(self) -> None:
        """R42: the coordinator deletes a directory it owns once nothing refers to it."""
        live = set(self._current_tms())
        used = {d for r in self.retained for d in r.directories}
        for path, owner in sorted(self.catalog.dir_owner.items()):
            if owner != COORDINATOR or path in used or f"dir:{path}" in self.registry:
                continue
            d = self.catalog.dirs.get(path)
            if d is not None and d.creator in live and self.running:
                continue
            if any(is_under(p, path) for t in live for p in self.parties[t].m.pfiles):
                continue
            inside = [f for p, f in self.catalog.files.items() if is_under(p, path)]
            if any(f.owner not in (COORDINATOR, tm_actor(f.creator or "")) for f in inside):
                continue
            self.catalog.delete_dir(path, COORDINATOR)

    # ------------------------------------------------------------------ failover (R60-R63)

    def _failover(self) -> None:
        for cid in sorted(self.pending):
            self._coordinator_abort(cid)
        replaced: dict[TmId, TmId] = {}
        for tm in sorted(set(self.placement.values())):
            if self.tms[tm].status is not Status.ALIVE:
                new = f"tm-{self.next_tm}"
                self.next_tm += 1
                replaced[tm] = new
                self.tms[new] = Tm(new, Status.ALIVE)
                self.parties[new] = TaskManager(new, self.job, self.cfg, self, self.next_checkpoint)
        self.placement = {s: replaced.get(t, t) for s, t in self.placement.items()}
        survivors = sorted(set(self.placement.values()) - set(replaced.values()))
        for tm in survivors:  # R60: no stale manager survives (FLINK-35400)
            party = self.parties[tm]
            party.drop_outputs_where(lambda cp: True)
            for path in sorted(party.m.pfiles):
                if party.m.pfiles[path].open:
                    self.catalog.close(path)
            self._forget_tm(tm)
        for old in sorted(replaced):
            d = taskowned_dir(self.job, old)  # R63
            if d in self.catalog.dir_owner and self.catalog.dir_owner[d] != COORDINATOR:
                self.catalog.dir_owner[d] = COORDINATOR
        for tm in sorted(set(self.placement.values())):
            self.parties[tm].restart_knowledge(
                self.latest_completed,
                self.next_checkpoint - 1,
                self.watermark,
                self.next_checkpoint,
            )
            self._restore_manager(tm)
        self._collect_dirs()

    def _restore_manager(self, tm: TmId) -> None:
        """R61, R62: the TM rebuilds its tables from the retained checkpoints."""
        hosted = sorted(s for s, t in self.placement.items() if t == tm)
        latest = self.retained[-1] if self.retained and self.retained[-1].job == self.job else None
        self.parties[tm].restore(
            hosted,
            [(r.id, r.entries) for r in self.retained],
            None if latest is None else (latest.id, latest.entries),
        )

    def hosted_by(self, tm: TmId) -> list[SubtaskId]:
        """The subtasks the engine placed on ``tm``."""
        return [s for s, t in self.placement.items() if t == tm]

    def load_completed(self, metadata: str, job: str | None = None) -> Completed:
        """Read a completed checkpoint back from its ``_metadata`` file, validated.

        Raises ``MetadataError`` naming the file and the problem; reading changes nothing.
        """
        meta = self.storage.read_metadata(metadata, expected_job=job)
        return Completed(
            meta.checkpoint,
            meta.job,
            meta.savepoint,
            meta.entries,
            meta.directories,
            metadata,
            meta.max_parallelism,
        )

    def _restart_coordinator(self) -> None:
        """R95: rebuild retention and the registry from the persisted metadata alone.

        The checkpoint store (Flink's HA store) survives as the list of ``_metadata`` paths;
        their contents are read back and validated before anything changes, so a corrupt
        file fails the restart with a ``MetadataError`` and deletes nothing.
        """
        listed = [r for r in self.retained if r.metadata in self.catalog.files]
        rebuilt = [self.load_completed(r.metadata, r.job) for r in listed]
        self.retained = []
        self.registry = {}
        for done in rebuilt:
            self._register(done)
            self.retained.append(done)
        received = {p for pend in self.pending.values() for p in pend.received}
        self.pending = {}
        for path in sorted(received):
            f = self.catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR and not self._referenced(path):
                self.catalog.delete_file(path, COORDINATOR)
        self._failover()

    # ------------------------------------------------------------------ restore (R70-R76)

    def _restore(self, cmd: c.Restore) -> None:
        source = next((r for r in self.retained if r.id == cmd.checkpoint), None)
        if source is None:
            source = self.savepoints.get(cmd.checkpoint)
        if source is None:
            raise CommandError(
                Reason.NOT_RETAINED, f"checkpoint {cmd.checkpoint} is not retained nor a savepoint"
            )
        recorded = source
        source = self.load_completed(source.metadata, source.job)  # validated before any change
        mode = RestoreMode.NO_CLAIM if source.savepoint else cmd.mode  # R73
        if mode is RestoreMode.CLAIM:
            self._check_claim(source, recorded)
        names = {v.name for v in self.vertices}
        new_par = dict(cmd.parallelism)
        if not set(new_par) <= names or any(
            p < 1 or p > self.cfg.max_parallelism for p in new_par.values()
        ):
            raise CommandError(Reason.BAD_ARGUMENT, f"bad parallelism {cmd.parallelism}")
        self._check_max_parallelism(source, cmd)
        old_vertices = self.vertices
        if self.running:
            self._end_job(retain=True)
        for rec in self.tms.values():
            if rec.status is Status.LOST:
                rec.hosted = frozenset()  # R64: a zombie stays in its job
        self.job_seq += 1
        self.job = f"job-{self.job_seq}"
        self.bases.add(job_base(self.job))
        if mode is RestoreMode.CLAIM:
            self.lineage.add(job_base(self.job))
        else:
            self.lineage = {job_base(self.job)}  # R73: the source stays outside for good
        self.vertices = tuple(
            VertexSpec(v.name, new_par.get(v.name, v.parallelism)) for v in self.vertices
        )
        tms = []
        for _ in range(self.num_tms):
            tms.append(f"tm-{self.next_tm}")
            self.next_tm += 1
        for t in tms:
            self.tms[t] = Tm(t, Status.ALIVE)
            party = TaskManager(t, self.job, self.cfg, self, self.next_checkpoint)
            party.finished_mark = self.next_checkpoint - 1
            self.parties[t] = party
        subtasks = _subtasks(self.vertices)
        self.placement = _place(subtasks, tms)
        self.running = True
        self.pending = {}
        self.retained = []
        self.registry = {}
        self.watermark = 0
        self.latest_completed = 0
        assignment = assign(source.entries, self.vertices, self.cfg.max_parallelism)
        self.restoring = tuple(e for s in sorted(assignment) for e in assignment[s])
        self.assignment = {s: tuple(v) for s, v in assignment.items()}
        if mode is RestoreMode.CLAIM:
            self._claim(source, recorded)
        same = all(
            v.parallelism == ov.parallelism
            for v, ov in zip(self.vertices, old_vertices, strict=True)
        )
        if mode is RestoreMode.CLAIM and same and self.mode is MergingMode.NONE:
            for s in subtasks:  # R72: NONE mode may reuse the claimed files
                for e in assignment.get(s, ()):
                    if e.kind is StateKind.KEYED_SHARED and isinstance(e.handle, FileHandle):
                        t = self.placement[s]
                        self.parties[t].backend[(s, e.name)] = BackendRef(e, source.id, True)

    def _check_max_parallelism(self, source: Completed, cmd: c.Restore) -> None:
        """R77: refused unless the new job's max parallelism (the command's, else the
        configured one) is the one the checkpoint's metadata records."""
        configured = self.cfg.max_parallelism
        wanted = configured if cmd.max_parallelism is None else cmd.max_parallelism
        why = max_parallelism_refusal(source.max_parallelism, wanted, source.entries)
        if why is None and wanted != configured:
            why = f"the restore asks for max parallelism {wanted}, the job runs with {configured}"
        if why is not None:
            raise CommandError(
                Reason.MAX_PARALLELISM_CHANGED, f"checkpoint {source.id} ({source.metadata}): {why}"
            )

    @staticmethod
    def _paths_of(done: Completed) -> set[str]:
        return {done.metadata} | {
            s.path for e in done.entries if (s := stream_of(e.handle)) is not None
        }

    def _check_claim(self, source: Completed, recorded: Completed) -> None:
        """R72, I5: a CLAIM takes what the checkpoint held when it completed, no more. A
        ``_metadata`` that names a file or directory the store did not record for it
        (changed since, however well its checksum matches) is refused before any change."""
        extra = sorted(
            (self._paths_of(source) - self._paths_of(recorded))
            | (set(source.directories) - set(recorded.directories))
        )
        if extra:
            raise MetadataError(
                source.metadata,
                "payload",
                f"names {extra[0]!r}, which checkpoint {source.id} did not hold when it "
                "completed: a claim takes only what the store recorded",
            )

    def _may_claim(self, path: str, recorded: Completed | None, is_dir: bool = False) -> bool:
        """I5: the coordinator takes a path only in a base of its lineage, and never a
        path of the user's that the claimed checkpoint did not itself hold (its files, and
        its directories with everything in them, R72, as the store recorded them)."""
        if base_of(path) not in self.lineage:
            return False
        f = self.catalog.files.get(path)
        owner = self.catalog.dir_owner.get(path) if is_dir else (f.owner if f is not None else None)
        if owner != USER:
            return True
        if recorded is None:
            return False
        if is_dir:
            return path in recorded.directories
        return path in self._paths_of(recorded) or any(
            is_under(path, d) for d in recorded.directories
        )

    def _claim(self, source: Completed, recorded: Completed | None = None) -> None:
        """R72: the new job's coordinator owns the restored checkpoint: what of it lies in
        its lineage (I5); anything else it names stays whose it was (read, never deleted)."""
        self.bases.add(base_of(source.metadata))
        paths = self._paths_of(source)
        for d in source.directories:
            if not self._may_claim(d, recorded, is_dir=True):
                continue
            paths |= {p for p in self.catalog.files if is_under(p, d)}
            if d in self.catalog.dir_owner:
                self.catalog.dir_owner[d] = COORDINATOR
        for p in sorted(paths):
            f = self.catalog.files.get(p)
            if f is not None and self._may_claim(p, recorded):
                f.owner = COORDINATOR
        self._register(source, recorded)
        for d in source.directories:
            md = self.catalog.dirs.get(d)
            if md is not None:
                md.handed_over = True
        self.retained = [source]
        self.latest_completed = source.id

    # ------------------------------------------------------------------ job end (R90, R91)

    def _end_job(self, *, retain: bool) -> None:
        for cid in sorted(self.pending):
            self._coordinator_abort(cid)
        handed = {d for r in self.retained for d in r.directories}
        keep = {
            s.logical_id
            for r in self.retained
            for e in r.entries
            if (s := stream_of(e.handle)) is not None
        }
        for tm in self._current_tms():
            actor = tm_actor(tm)
            self.parties[tm].end_job(keep)
            for path in sorted(self.catalog.dirs):
                d = self.catalog.dirs.get(path)
                if d is None:
                    continue
                # R90: directories no completed checkpoint used go with their creator
                if (
                    d.creator == tm
                    and path not in handed
                    and self.catalog.dir_owner.get(path) == actor
                ):
                    inside = [p for p in self.catalog.files if is_under(p, path)]
                    if all(self.catalog.files[p].owner == actor for p in inside):
                        self.catalog.delete_dir(path, actor)
            for f in self.catalog.files.values():
                if f.owner == actor:
                    f.owner = COORDINATOR
            for path, o in list(self.catalog.dir_owner.items()):
                if o == actor:
                    self.catalog.dir_owner[path] = COORDINATOR
            self._forget_tm(tm)
            self.tms[tm].status = Status.STOPPED
        self.running = False
        self.restoring = ()
        if retain:
            for r in self.retained:  # R91: the user's
                paths = {r.metadata} | {
                    s.path for e in r.entries if (s := stream_of(e.handle)) is not None
                }
                for rd in r.directories:
                    if rd in self.catalog.dir_owner:
                        self.catalog.dir_owner[rd] = USER
                for p in paths:
                    kept = self.catalog.files.get(p)
                    if kept is not None:
                        kept.owner = USER
        else:
            while self.retained:
                self._subsume(self.retained.pop(0))
        for path in sorted(p for p, f in self.catalog.files.items() if f.owner == COORDINATOR):
            if (
                path in self.catalog.files
                and not self._referenced(path)
                and any(is_under(path, b) for b in self.bases)
            ):
                self.catalog.delete_file(path, COORDINATOR)
        self._collect_dirs()

    def state_to_restore(self, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        """What ``subtask`` starts from: its share of a restored checkpoint until the new
        job completes one, else its entries of the latest completed checkpoint."""
        if self.restoring:
            return self.assignment.get(subtask, ())
        latest = self.retained[-1] if self.retained else None
        if latest is None:
            return ()
        return tuple(e for e in latest.entries if e.subtask == subtask)

    # ------------------------------------------------------------------ observation

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
            for reg in self.registry.values():
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
            restoring=self.restoring,
            ref_counts=ref_counts,
            live_segments={p: tuple(sorted(v)) for p, v in live.items()},
            registry={
                k: RegistryView(r.path, frozenset(r.refs), r.owned)
                for k, r in self.registry.items()
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
