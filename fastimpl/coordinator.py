"""The coordinator's side of the store (Flink's CheckpointCoordinator): it triggers,
receives acknowledgements and declines (``spec.messages``), completes a checkpoint by
writing its ``_metadata``, aborts, keeps ``num_retained`` checkpoints and subsumes the
rest, holds the shared-state registry, deletes what it owns (R42-R45, R54), plans
restores and rescales, fails over, restarts from the metadata on storage and ends the job.

It knows TMs from what it is told: acknowledgements name their attempt, and the engine
(``CoordinatorEngine``) tells it where subtasks run and starts, resets, restores and
stops the TMs. Its notices go out through ``engine.send``. Calls return what they
produced (raft's ``Ready``): ``trigger`` the id, ``complete`` the completed checkpoint
or ``None``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from fastimpl.attempts import TmTable
from fastimpl.catalog import Catalog
from fastimpl.ids import IdSource, creator_of
from fastimpl.metadata import MetadataError, base_of, metadata_bytes, path_parts
from fastimpl.records import (
    Completed,
    ManagedDir,
    Pending,
    Status,
    StoredFile,
    Tm,
)
from fastimpl.redistribute import assign
from fastimpl.shared_registry import (
    DIR_PREFIX,
    SharedEntry,
    SharedStateRegistry,
    shared_handles,
    shared_keys,
)
from fastimpl.storage import Storage, StorageFault
from fastimpl.working import SharedWorking
from spec import commands as c
from spec.config import (
    MAX_TMS,
    Config,
    MergingMode,
    RestoreMode,
    Scope,
    StateKind,
    VertexSpec,
    check_parallelism,
)
from spec.effects import COORDINATOR, USER, tm_actor
from spec.errors import CommandError, Reason
from spec.handles import (
    DirectoryHandle,
    Extent,
    FileHandle,
    InPlaceFile,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
    extent_of,
    stream_of,
)
from spec.ids import SubtaskId, TmId
from spec.keygroups import max_parallelism_refusal
from spec.layout import (
    METADATA,
    SAVEPOINTS,
    checkpoint_dir,
    is_under,
    job_base,
    metadata_path,
    savepoint_dir,
    shared_dir,
    taskowned_dir,
)
from spec.messages import (
    Acknowledgement,
    Answer,
    AttemptStopped,
    CheckpointAborted,
    CheckpointComplete,
    Decline,
    Duty,
    EndJob,
    Held,
    Holdings,
    KeptFile,
    LostAttemptStopped,
    ResetTm,
    RetainedCheckpoint,
    ReusableFiles,
    TmAssignment,
    TmEnded,
)

Notice = CheckpointComplete | CheckpointAborted
log = logging.getLogger("fastimpl.coordinator")


def subtasks_of(vertices: tuple[VertexSpec, ...]) -> list[SubtaskId]:
    return [SubtaskId(v.name, i, v.parallelism) for v in vertices for i in range(v.parallelism)]


class CoordinatorEngine(Protocol):
    """What the coordinator asks of the engine that runs the job's TMs (in process:
    ``fastimpl.engine.InProcessEngine``; across processes, messages to TM processes).

    Starting, placing and stopping TM processes is the engine's (Flink's scheduler
    deploys TaskManagers, a Spark driver its executors); everything else a TM must do for
    the coordinator is a message (``spec.messages``): notices through ``send``, which
    may be lost, repeated or reordered, and duties through ``duty``, the engine's reliable
    call to one TM (Flink's task deployment and TaskExecutor RPCs)."""

    def send(self, tm: TmId, msg: Notice) -> None:
        """Queue a notice for ``tm`` (the transport may lose, repeat or reorder it)."""

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        """Start a new TM attempt for ``job``; its id."""

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        """Where each subtask runs (the engine's choice)."""

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        """Where the subtasks run now (each TM learns which are its own)."""

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        """Hand ``msg`` to ``tm`` and return its answer (``TmEnded`` for ``EndJob``,
        ``Held`` for ``Holdings``). A
        ``ResetTm`` also drops the notices still queued for ``tm`` (its old attempt's
        connections go with the redeploy)."""

    def forget_tm(self, tm: TmId) -> None:
        """The TM is gone: its process stops, the notices queued for it go."""


class CheckpointCoordinator:
    """One job's checkpoint coordinator, across restores (each restore starts a new job)."""

    def __init__(
        self,
        config: Config,
        vertices: tuple[VertexSpec, ...],
        num_tms: int,
        storage: Storage,
        ids: IdSource,
        engine: CoordinatorEngine,
        job_id: str = "job-0",
        *,
        deletion_log: bool = False,
    ) -> None:
        check_parallelism(config, vertices)  # R78: before anything is built or written
        self.cfg = config
        self.mode = config.merging_mode
        self.storage = storage
        self.engine = engine
        self.catalog = Catalog(storage, ids, self, deletion_log=deletion_log)
        """Every path on storage, who owns it, and the guarded deletes (``fastimpl.catalog``)."""
        self.catalog.dir_rules[COORDINATOR] = self._collectable
        self._hot: tuple[object, frozenset[str]] | None = None
        self.num_tms = num_tms
        self.job = job_id
        self.job_seq = 0
        self.running = True
        self.vertices = vertices
        self.placement: dict[SubtaskId, TmId] = {}
        """Where the engine runs each subtask of the running job."""
        self.tms: dict[TmId, Tm] = TmTable()
        """Live and lost attempts; stopped ones are retired (``fastimpl.attempts``)."""
        self.next_checkpoint = 1
        self.pending: dict[int, Pending] = {}
        self.retained: list[Completed] = []
        self.savepoint_ids: set[int] = set()
        """Savepoints an attempt may still write or acknowledge for (``_forget_savepoints``);
        a completed savepoint is the user's and read back from storage (``stored_savepoint``)."""
        self.latest_completed = 0
        self.watermark = 0
        self.registry = SharedStateRegistry()
        """The shared state the retained checkpoints use (``fastimpl.shared_registry``)."""
        self.restoring: tuple[StateEntry, ...] = ()
        self.assignment: dict[SubtaskId, tuple[StateEntry, ...]] = {}
        """Each new subtask's share of the checkpoint restored last (R75, R76)."""
        self.restored_from: str | None = None
        """The ``_metadata`` restored last (the HA state keeps it while ``restoring``)."""
        self.bases: set[str] = {job_base(job_id), SAVEPOINTS}
        self.lineage: set[str] = {job_base(job_id)}
        """Bases whose files a CLAIM may give the coordinator (R72, I5): the running job's
        own and those its predecessors held when claimed; a NO_CLAIM restore starts a
        lineage of its own (R73). Never a savepoint's, never what a file merely names."""
        self.triggered_savepoints: set[int] = set()
        """Savepoints this store triggered: their directories hold files of its own (being
        written, or written late, R43) besides the completed savepoint's (the user's)."""
        self.started: dict[TmId, tuple[str, int]] = {}
        """The job each TM attempt ran for and the first checkpoint it could write for:
        where a stopped attempt's files may lie (R64)."""
        self.epoch = 0
        """Failovers so far: each TM applies a failover's duties once (``spec.messages``)."""
        self.assigned_from = 0
        """The first checkpoint of the last failover: a TM assigned there refuses to write
        or acknowledge for any earlier one (R60), which ``_forget_savepoints`` relies on."""
        self.hosted_before: dict[TmId, frozenset[SubtaskId]] = {}
        """What a lost attempt hosted in a job a restore ended (its shared directories
        are swept when it stops, R64); gone with the attempt."""
        self.kept_from_lost: dict[str, TmId] = {}
        """R61, R64: files of retained checkpoints created by a lost attempt (by their
        names, ``fastimpl.ids.creator_of``), each with the attempt a failover handed it to:
        that attempt's, not its creator's, when it stops; gone once either has stopped."""
        self.told_lost: dict[TmId, frozenset[TmId]] = {}
        """The lost attempts each TM was told of at its last failover (``TmAssignment``)
        and not yet told stopped: its deletes of their files wait (R64)."""
        self.working = SharedWorking(self)
        """Working files handed over in place, and their collection (§11, R103-R105)."""

    def deploy(self, placement: dict[SubtaskId, TmId]) -> None:
        """The engine runs the job's subtasks on these TMs (all alive)."""
        self.placement = dict(placement)
        self.engine.placed(self.placement)
        for t in placement.values():
            if t not in self.tms:
                self._add_tm(t)

    def _add_tm(self, tm: TmId) -> None:
        self.tms[tm] = Tm(tm, Status.ALIVE)
        self.started[tm] = (self.job, self.next_checkpoint)

    def require_running(self) -> None:
        if not self.running:
            raise CommandError(Reason.JOB_NOT_RUNNING, f"job {self.job} has ended")

    def require_pending(self, checkpoint: int) -> Pending:
        p = self.pending.get(checkpoint)
        if p is None:
            if 1 <= checkpoint < self.next_checkpoint:
                raise CommandError(
                    Reason.CHECKPOINT_NOT_PENDING, f"checkpoint {checkpoint} is not pending"
                )
            raise CommandError(Reason.UNKNOWN_CHECKPOINT, f"checkpoint {checkpoint} unknown")
        return p

    def _is_savepoint(self, checkpoint: int) -> bool:
        return checkpoint in self.savepoint_ids

    def hot_dirs(self) -> frozenset[str]:
        key = (self.job, tuple(self.placement))
        if self._hot is None or self._hot[0] != key:
            hot = {shared_dir(self.job, s) for s in self.placement}
            hot |= {d.rsplit("/", 1)[0] for d in hot}
            hot |= {f"{job_base(self.job)}/taskowned", SAVEPOINTS}
            self._hot = (key, frozenset(hot))
        return self._hot[1]

    def trigger(self, savepoint: bool = False) -> int:
        """R50: a new checkpoint (or savepoint); its id."""
        self.require_running()
        cid = self.next_checkpoint
        self.next_checkpoint += 1
        self.pending[cid] = Pending(cid, savepoint)
        if savepoint:
            self.savepoint_ids.add(cid)
            self.triggered_savepoints.add(cid)
        return cid

    def receive_decline(self, msg: Decline) -> None:
        """The coordinator's half: a decline from a live attempt aborts the checkpoint; one
        from an attempt it gave up on, or of a checkpoint no longer pending, changes
        nothing (R56)."""
        rec = self.tms.get(msg.attempt)
        if msg.checkpoint in self.pending and rec is not None and rec.status is Status.ALIVE:
            self.abort(msg.checkpoint)

    def receive_ack(self, ack: Acknowledgement) -> None:
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
        in_place: tuple[InPlaceFile, ...] = ()
        if current:  # working state (§11): R103 hands them over, pending or not
            in_place = self.working.take(ack)
        if not current or ack.checkpoint not in self.pending:
            if current:
                # R43: a late ack still hands files over, but never one a checkpoint
                # still uses or the user's (the same acknowledgement received again)
                late = [e for e in entries if not self._kept_elsewhere(e)]
                self._take_over_files(late, ack.attempt)
                for e in late:
                    s = stream_of(e.handle)
                    if s is not None and isinstance(e.handle, FileHandle):
                        self.catalog.delete_file(s.path, COORDINATOR)
            elif rec is not None and rec.status is Status.LOST:
                # a stopped attempt's files were swept when it stopped (R64): its late
                # acknowledgement is ignored, as a retired one's is
                self._note_given_up(entries, ack.attempt)
            return  # R56
        p = self.pending[ack.checkpoint]
        if any(self._kept_elsewhere(e) for e in entries):
            # R43: a TM of its own is not trusted to name only files it wrote; the
            # checkpoint would share a whole file with one that deletes it
            log.warning(
                "checkpoint %d aborted: %s's acknowledgement names as its own a file a "
                "checkpoint uses or the user holds",
                ack.checkpoint,
                ack.attempt,
            )
            self.abort(ack.checkpoint)
            return
        if in_place:
            p.working[ack.subtask] = in_place
        p.received |= self._take_over_files(entries, ack.attempt)
        if self.mode is not MergingMode.NONE and not p.savepoint:
            self._forget_released_dirs(ack)
        p.acks[ack.subtask] = entries
        if not all(
            e.handle.logical_id in self.registry
            for e in entries
            if isinstance(e.handle, PlaceholderHandle)
        ):
            self.abort(ack.checkpoint)  # R22
            return
        for e in entries:
            if isinstance(e.handle, PlaceholderHandle):
                self.registry.pin(e.handle.logical_id, ack.checkpoint)

    def _kept_elsewhere(self, e: StateEntry) -> bool:
        """R43: whether a whole file an acknowledgement names is one the coordinator may
        not take over: a file a retained or restored checkpoint uses (its ``_metadata``
        too), or one the user holds (R73, R91)."""
        if not isinstance(e.handle, FileHandle):
            return False
        f = self.catalog.files.get(e.handle.path)
        return self.referenced(e.handle.path) or (f is not None and f.owner == USER)

    def _forget_released_dirs(self, ack: Acknowledgement) -> None:
        """R40, R41: an acknowledgement reports each of the subtask's managed directories
        that exists; one the coordinator records as the attempt's and the acknowledgement
        does not report was deleted by the TM (R41), so the record goes. (With one table
        shared in process the TM's delete already removed it.)"""
        reported = {e.handle.path for e in ack.entries if isinstance(e.handle, DirectoryHandle)}
        actor = tm_actor(ack.attempt)
        for d in (shared_dir(self.job, ack.subtask), taskowned_dir(self.job, ack.attempt)):
            if d not in reported and self.catalog.dir_owner.get(d) == actor:
                del self.catalog.dir_owner[d]
                self.catalog.dirs.pop(d, None)

    def _take_over_files(self, entries: Iterable[StateEntry], attempt: TmId) -> set[str]:
        """R43: whole-file handles (NONE mode, savepoints) become the coordinator's.

        The acknowledgement is all the coordinator needs: a file its records do not hold
        (written by a TM in another process) is recorded as its own, created by the
        acknowledging attempt (R64 reads the creator), if it lies where this store
        writes: the job's base or a savepoint it triggered (I5; a handle naming anything
        else is never taken, so never deleted). Each directory the acknowledgement
        reports (R40) is recorded as the attempt's, until a completed checkpoint hands
        it over (R42)."""
        taken: set[str] = set()
        for e in entries:
            h = e.handle
            if isinstance(h, FileHandle):
                f = self.catalog.files.get(h.path)
                if f is None and self._writes_in(h.path, attempt):
                    f = StoredFile(h.length, False, COORDINATOR, attempt)
                    self.catalog.files[h.path] = f
                if f is not None:
                    f.owner = COORDINATOR
                    taken.add(h.path)
            elif isinstance(h, DirectoryHandle) and h.path not in self.catalog.dir_owner:
                if self._writes_in(h.path, attempt):
                    self.catalog.dir_owner[h.path] = tm_actor(attempt)
                    self.catalog.dirs[h.path] = ManagedDir(h.path, attempt)
        return taken

    def _note_given_up(self, entries: Iterable[StateEntry], attempt: TmId) -> None:
        """R56, R64: an attempt the coordinator gave up on handed over whole files it
        will not take; the attempt forgot them when it acknowledged. Unknown to the
        coordinator's records (a TM in another process), they are recorded as still
        that attempt's: its files become the coordinator's when it is known stopped
        (``attempt_stopped``), as they would in one shared table."""
        for e in entries:
            h = e.handle
            if (
                isinstance(h, FileHandle)
                and h.path not in self.catalog.files
                and self._writes_in(h.path, attempt)
            ):
                self.catalog.files[h.path] = StoredFile(h.length, False, tm_actor(attempt), attempt)

    def _writes_in(self, path: str, attempt: TmId) -> bool:
        """Whether ``attempt``'s handle may name ``path`` as a file the store wrote: under
        the running job's base, or in the directory of a savepoint this store triggered."""
        return attempt in self.tms and self._may_sweep(path, self.job)

    def claimed(self) -> set[str]:
        """The files the coordinator claims while its job runs (for the observation): the
        shared state it owns in the registry, the whole files pending checkpoints
        received, and every retained checkpoint's ``_metadata``."""
        if not self.running:
            return set()
        paths = {r.path for r in self.registry.entries() if r.owned and not r.is_dir}
        paths |= {path for p in self.pending.values() for path in p.received}
        paths |= {r.metadata for r in self.retained}
        return paths

    def current_tms(self) -> list[TmId]:
        return sorted({t for t in self.placement.values() if self.tms[t].status is Status.ALIVE})

    def _notify_complete(self, checkpoint: int, savepoint: bool) -> None:
        open_sps = frozenset(k for k, p in self.pending.items() if p.savepoint)
        msg = CheckpointComplete(self.job, checkpoint, self.watermark, savepoint, open_sps)
        for tm in self.current_tms():
            self.engine.send(tm, msg)

    def _notify_abort(self, checkpoint: int, savepoint: bool) -> None:
        msg = CheckpointAborted(self.job, checkpoint, self.latest_completed, savepoint)
        for tm in self.current_tms():
            self.engine.send(tm, msg)

    def abort(self, checkpoint: int) -> None:
        p = self.pending.pop(checkpoint)
        self._delete_unused(self.registry.unpin(checkpoint, self._lowest_retained()))
        for path in sorted(p.received):  # R43
            f = self.catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR and not self.referenced(path):
                self.catalog.delete_file(path, COORDINATOR)
        self._notify_abort(checkpoint, p.savepoint)

    def complete(self, checkpoint: int) -> Completed | None:
        """R51-R55: the completed checkpoint, its ``_metadata`` written, or ``None`` if
        writing it failed and the checkpoint was aborted (R51)."""
        self.require_running()
        p = self.require_pending(checkpoint)
        missing = [s for s in self.placement if s not in p.acks]
        if missing:
            raise CommandError(
                Reason.NOT_ALL_ACKNOWLEDGED,
                f"checkpoint {checkpoint} lacks acks from {[str(s) for s in missing]}",
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
                    reg = self.registry.get(h.logical_id)
                    assert reg is not None and reg.handle is not None
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
        clash = self._id_clash(entries)
        if clash is not None:
            # R54: TMs in other processes are not trusted to keep logical ids unique; a
            # checkpoint that cannot be registered is not written (nor raised from here)
            log.warning("checkpoint %d aborted: %s", checkpoint, clash)
            self.abort(checkpoint)
            return None
        meta = (
            f"{savepoint_dir(checkpoint)}/{METADATA}"
            if p.savepoint
            else metadata_path(self.job, checkpoint)
        )
        done = Completed(
            checkpoint,
            self.job,
            p.savepoint,
            tuple(entries),
            tuple(directories),
            meta,
            self.cfg.max_parallelism,
            tuple((s, w) for s in sorted(p.working) for w in p.working[s]),  # R103
        )
        data = metadata_bytes(
            done.id,
            done.job,
            done.savepoint,
            done.entries,
            done.directories,
            max_parallelism=done.max_parallelism,  # R77
            working=done.working,
        )
        try:
            self.storage.write_metadata(meta, data)
        except StorageFault:
            self.abort(checkpoint)  # R51
            return None
        self.catalog.files[meta] = StoredFile(len(data), False, COORDINATOR, None)
        del self.pending[checkpoint]
        if p.savepoint:
            # R55: a completed savepoint belongs to the user
            for path in [*sorted(p.received), done.metadata]:
                f = self.catalog.files.get(path)
                if f is not None:
                    f.owner = USER
            self._notify_complete(done.id, True)
            self._forget_savepoints()
            return done
        self.restoring = ()
        self.latest_completed = checkpoint
        self._register(done)
        self.retained.append(done)
        while len(self.retained) > self.cfg.num_retained:  # R52
            self._subsume(self.retained.pop(0))
        self._notify_complete(checkpoint, False)
        for older in sorted(
            k for k, v in self.pending.items() if k < checkpoint and not v.savepoint
        ):
            self.abort(older)  # R53
        self.collect_dirs()
        return done

    def _id_clash(self, entries: Iterable[StateEntry]) -> str | None:
        """R54: a logical id the acknowledgements name for another extent than another of
        these entries or a retained checkpoint does (path, offset, length: a whole file
        starts at 0), or of shared state for another path than the registry holds, said
        in words; else None. Exclusive state counts too: the reader refuses such a
        ``_metadata`` (``metadata.check_ids``), and recovery such kept checkpoints."""
        seen: dict[str, Extent] = {}
        for r in self.retained:
            for old in r.entries:
                if (s := stream_of(old.handle)) is not None:
                    seen.setdefault(s.logical_id, extent_of(s))
        for e in entries:
            h = stream_of(e.handle)
            if h is None:
                continue
            if h.scope is Scope.SHARED:
                other = self.registry.conflict(h.logical_id, h.path)
                if other is not None:
                    return f"logical id {h.logical_id!r} names {h.path!r} and {other!r}"
            extent = extent_of(h)
            prev = seen.setdefault(h.logical_id, extent)
            if prev != extent:
                return f"logical id {h.logical_id!r} names {extent} and {prev}"
        return None

    def _lowest_retained(self) -> int | None:
        return self.retained[0].id if self.retained else None

    def _delete_unused(self, released: list[SharedEntry]) -> None:
        """R54: the coordinator deletes the unused shared files it owns (directories go
        through ``collect_dirs``, which knows who still works in them)."""
        for reg in released:
            if reg.owned and not reg.is_dir:
                f = self.catalog.files.get(reg.path)
                if f is not None and f.owner == COORDINATOR:
                    self.catalog.delete_file(reg.path, COORDINATOR)

    def _register(self, done: Completed, recorded: Completed | None = None) -> None:
        """R54: a completed (or claimed) checkpoint registers the shared state it uses,
        keyed by unique handle ids, and its directories (``dir:<path>``), which become
        the coordinator's (R42).

        A logical id already registered for another path is a ``MetadataError`` naming
        the file (checked for every retained checkpoint before anything changes, see
        ``conflicting_ids``; here it is the last line of defence)."""
        for h in shared_handles(done):
            other = self.registry.conflict(h.logical_id, h.path)
            if other is not None:
                raise MetadataError(
                    done.metadata,
                    "payload.entries",
                    f"logical id {h.logical_id!r} names {h.path!r}, already registered "
                    f"for {other!r} (conflicting registration)",
                )
            # I5: the registry deletes a whole file only if it may be the coordinator's; a
            # file the user holds (another base's, R72 outside the lineage) is only read
            f = self.catalog.files.get(h.path)
            owned = isinstance(h, FileHandle) and (f is None or f.owner != USER)
            self.registry.register(h.logical_id, h.path, h, owned, done.id)
        for d in done.directories:
            self.registry.register(f"{DIR_PREFIX}{d}", d, None, True, done.id)
            md = self.catalog.dirs.get(d)
            if md is not None:
                md.handed_over = True
            if self._may_claim(d, recorded or done, is_dir=True):
                self.catalog.dir_owner[d] = COORDINATOR  # R42

    def _subsume(self, old: Completed) -> None:
        """R52, R54: ``old`` is no longer retained (already removed from ``retained``):
        the shared state no retained checkpoint uses any more goes, then its exclusive
        files and its ``_metadata``."""
        self.watermark = max(self.watermark, old.id)
        unused = self.registry.unregister_unused(self._lowest_retained(), shared_keys(old))
        self._delete_unused(unused)
        for e in old.entries:
            h = e.handle
            if isinstance(h, FileHandle) and h.scope is Scope.EXCLUSIVE:
                f = self.catalog.files.get(h.path)
                if f is not None and f.owner == COORDINATOR:
                    self.catalog.delete_file(h.path, COORDINATOR)
        f = self.catalog.files.get(old.metadata)
        if f is not None and f.owner == COORDINATOR:
            self.catalog.delete_file(old.metadata, COORDINATOR)

    def lose(self, tm: TmId) -> None:
        """R57: every pending checkpoint aborts when a TM is lost."""
        rec = self.tms[tm]
        rec.status = Status.LOST
        rec.hosted = frozenset(s for s, t in self.placement.items() if t == tm)
        for cid in sorted(self.pending):
            self.abort(cid)

    def replace(self, tm: TmId, new: TmId | None = None) -> TmId:
        """R66: task-level failover. ``tm`` is lost (a zombie until it stops, R64) and its
        acknowledgements of pending checkpoints are withdrawn; a new attempt runs its
        subtasks, may write for every pending checkpoint and later ones, and starts them
        as a restarting TM does (R61, R62, R105). Nothing is aborted, no other TM is reset
        or told. The new attempt's id.

        ``new``: an attempt the engine started on its own, which the coordinator first
        hears of now (Spark: the TM of a retried or speculative task, by its
        acknowledgement). It started from what the engine gave it and is sent nothing:
        it holds nothing of ``tm``'s, whose files stay ``tm``'s until it stops (R64).
        Without ``new`` the engine starts the attempt here, and it is told what it starts
        from (``TmAssignment``)."""
        rec = self.tms[tm]
        hosted = sorted(s for s, t in self.placement.items() if t == tm)
        rec.status = Status.LOST
        rec.hosted = frozenset(hosted)
        self._withdraw_acks(hosted)
        first = min(self.pending, default=self.next_checkpoint)
        lowest = min(
            (k for k, p in self.pending.items() if not p.savepoint), default=self.next_checkpoint
        )
        starting = new is None
        if new is None:
            new = self.engine.start_tm(self.job, first, lowest - 1)
        self.tms[new] = Tm(new, Status.ALIVE)
        self.started[new] = (self.job, first)
        self.placement = {s: new if t == tm else t for s, t in self.placement.items()}
        self.engine.placed(self.placement)
        d = taskowned_dir(self.job, tm)  # R63: abandoned to the coordinator
        if d in self.catalog.dir_owner and self.catalog.dir_owner[d] != COORDINATOR:
            self.catalog.dir_owner[d] = COORDINATOR
        if starting:
            # R10, R66: every checkpoint from ``first`` on that is no longer pending is
            # over for it: aborted (above the lowest pending one, completing it would have
            # aborted that, R53), or a finished savepoint
            over = [k for k in range(first, self.next_checkpoint) if k not in self.pending]
            self.epoch += 1  # its assignment is applied once; a later failover's after it
            self._assign(
                new,
                hosted,
                first,
                lowest - 1,
                frozenset(k for k in over if k > lowest and not self._is_savepoint(k)),
                frozenset(k for k in over if self._is_savepoint(k)),
            )
            # working state (§11): R105 opens the checkpointed working files in place
            latest = self.retained[-1] if self.retained else None
            self.working.open_databases(latest, self.epoch, only=new)
        self.collect_dirs()
        return new

    def _withdraw_acks(self, subtasks: list[SubtaskId]) -> None:
        """R66, R56: the acknowledgements a replaced attempt sent for pending checkpoints
        are withdrawn with what they handed over: the pins of their placeholders (R22),
        their in-place references (R103), and their whole files (R43), which the
        coordinator deletes once the attempt stopped (R64)."""
        for cid in sorted(self.pending):
            p = self.pending[cid]
            gone = [s for s in subtasks if s in p.acks]
            if not gone:
                continue
            entries = [e for s in gone for e in p.acks.pop(s)]
            for s in gone:
                p.working.pop(s, None)
            handed = {e.handle.path for e in entries if isinstance(e.handle, FileHandle)}
            handed &= p.received
            p.received -= handed
            still = {
                e.handle.logical_id
                for v in p.acks.values()
                for e in v
                if isinstance(e.handle, PlaceholderHandle)
            }
            pinned = {
                e.handle.logical_id
                for e in entries
                if isinstance(e.handle, PlaceholderHandle) and e.handle.logical_id not in still
            }
            self._delete_unused(self.registry.unpin_keys(pinned, cid, self._lowest_retained()))
            for path in sorted(handed):
                f = self.catalog.files.get(path)
                if f is not None and f.owner == COORDINATOR and not self.referenced(path):
                    self.catalog.delete_file(path, COORDINATOR)

    def receive_stopped(self, msg: AttemptStopped) -> None:
        """R64, as the engine's message says it (an attempt the coordinator gave up on
        has stopped): the same as ``attempt_stopped``. The message's job is the one the
        attempt ran for, which may be an earlier job of this coordinator (a zombie)."""
        self.attempt_stopped(msg.tm)

    def attempt_stopped(self, tm: TmId) -> None:
        """R64: what waited for a stopped attempt runs; the coordinator takes the rest."""
        rec = self.tms.get(tm)
        if rec is None:
            raise CommandError(Reason.UNKNOWN_TM, f"no TM {tm}")
        if rec.status is not Status.LOST:
            raise CommandError(Reason.TM_NOT_LOST, f"{tm} is {rec.status.value}, not lost")
        rec.status = Status.STOPPED
        hosted = rec.hosted
        rec.hosted = frozenset()
        for path in sorted(self.catalog.files):
            f = self.catalog.files[path]
            if f.creator == tm and f.open:
                if self.cfg.open_files_readable:
                    self.storage.abandon(path)  # its process is gone
                    f.open = False
                else:
                    # R65: an object store writes an object when its file is closed (R12);
                    # its writer is gone, so it never will be, whoever owns it by now
                    self.storage.discard(path)
                    del self.catalog.files[path]
        self.engine.forget_tm(tm)
        actor = tm_actor(tm)
        formerly = sorted(p for p, f in self.catalog.files.items() if f.owner == actor)
        for path in formerly:
            self.catalog.files[path].owner = COORDINATOR
        for path in sorted(p for p, o in self.catalog.dir_owner.items() if o == actor):
            self.catalog.dir_owner[path] = COORDINATOR
        self.catalog.release_waits(tm)
        self._tell_stopped(tm)
        for path in formerly:
            if path in self.catalog.files and not self.referenced(path):
                self.catalog.delete_file(path, COORDINATOR)
        self._sweep_stopped(tm, hosted)
        self.collect_dirs()
        self._retire(tm)

    def _tell_stopped(self, tm: TmId) -> None:
        """R64: the live TMs told that ``tm`` may still run learn that it stopped, and
        their deletes that waited for it run; what a failover handed over of its files
        waits for nobody now."""
        for live in self.current_tms():
            told = self.told_lost.get(live, frozenset())
            if tm in told:
                self.engine.duty(live, LostAttemptStopped(self.job, live, tm))
                self.told_lost[live] = told - {tm}
        for path in [p for p in self.kept_from_lost if creator_of(p) == tm]:
            del self.kept_from_lost[path]

    def _retire(self, tm: TmId) -> None:
        """A stopped attempt's record goes (``fastimpl.attempts``): nothing depends on it
        any more, and its id stays known as a stopped one's."""
        self.tms.retire(tm)  # type: ignore[attr-defined]
        self.started.pop(tm, None)
        self.hosted_before.pop(tm, None)
        self.told_lost.pop(tm, None)
        for path in [p for p, t in self.kept_from_lost.items() if t == tm]:
            del self.kept_from_lost[path]
        self._forget_savepoints()

    def _forget_savepoints(self) -> None:
        """A finished savepoint's id goes once no attempt that may still write or
        acknowledge for it is alive or lost: one started for a later checkpoint never
        does (it refuses, R56), nor does one assigned by a later failover (R60), and a
        stopped one's files were swept when it stopped; and once no delete in its
        directory is still to come."""
        horizon = self.next_checkpoint
        for tm, (_, first) in self.started.items():
            assigned = self.tms[tm].status is Status.ALIVE  # a lost one missed the failovers
            horizon = min(horizon, max(first, self.assigned_from) if assigned else first)
        done = [n for n in self.savepoint_ids if n < horizon and n not in self.pending]
        if not done:
            return
        # a delete still to come in its directory (a party's file, a delete that failed
        # or waits) needs the id: the catalog deletes there only in savepoints it made
        cat = self.catalog
        busy = {base_of(p) for p, f in cat.files.items() if f.owner != USER}
        busy |= {base_of(d.path) for d in cat.deferred}
        busy |= {base_of(p) for p in self.storage.failed_deletes}
        for cid in done:
            if savepoint_dir(cid) not in busy:
                self.savepoint_ids.discard(cid)
                self.triggered_savepoints.discard(cid)

    def stored_savepoint(self, checkpoint: int) -> Completed | None:
        """A completed savepoint, read back from its directory (the user's, R55, where
        the user may have deleted it), validated; None if storage holds none."""
        path = f"{savepoint_dir(checkpoint)}/{METADATA}"
        if path not in self.storage.files_under(savepoint_dir(checkpoint)):
            return None
        done = self.load_completed(path)
        return done if done.savepoint and done.id == checkpoint else None

    def stored_savepoints(self) -> list[int]:
        """The completed savepoints on storage, by id."""
        found = self.storage.files_under(SAVEPOINTS)
        out = []
        for path in found:
            parts = path.split("/")
            if len(parts) == 3 and parts[2] == METADATA and parts[1].startswith("savepoint-"):
                num = parts[1][len("savepoint-") :]
                if num.isdigit():
                    out.append(int(num))
        return sorted(out)

    def _sweep_stopped(self, tm: TmId, hosted: frozenset[SubtaskId]) -> None:
        """R64, R65: what a stopped attempt still owned is the coordinator's. Its records
        may have died with its process (a TM killed with SIGKILL): then the files it wrote
        and never handed over are those in the directories it could write in that no
        live party records. They are listed, each live TM of the job says which it
        records (``Holdings``), and the rest are taken and deleted unless a retained
        checkpoint refers to them. With one table shared in process nothing is unknown
        and nothing is asked.

        A subtask's shared directory and a checkpoint's directory are written by every
        attempt that ran the subtask or wrote for the checkpoint, a zombie included,
        whose records the coordinator cannot ask for and whose deletes it cannot see. A
        file another lost attempt created (its name says whose, ``fastimpl.ids.creator_of``)
        is that attempt's to delete, not the stopped one's (R64): it is left to it, and
        swept when it stops; unless a failover handed it to the stopped attempt (R61,
        ``kept_from_lost``), whose it then was. What a live attempt records it says
        (``Holdings``); what it does not, it will never delete, and is taken."""
        job, first = self.started.pop(tm, (self.job, 1))
        hosted |= self.hosted_before.pop(tm, frozenset())
        dirs = [taskowned_dir(job, tm)] + [shared_dir(job, s) for s in sorted(hosted)]
        last = self.next_checkpoint
        dirs += [checkpoint_dir(job, n) for n in range(first, last)]
        sps = [savepoint_dir(n) for n in sorted(self.triggered_savepoints) if first <= n < last]
        known = self.catalog.owners()
        found: set[str] = set()
        try:
            for top in [job_base(job), *sps]:
                found |= {p for p in self.storage.files_under(top) if p not in known}
        except Exception as err:  # cannot tell: nothing is taken (a leak, not a loss)
            log.warning("listing what %s left after it stopped failed: %r", tm, err)
            return
        where = set(dirs) | set(sps)
        found = {p for p in found if p.rsplit("/", 1)[0] in where}
        if not found:
            return
        held: set[str] = set()
        asked = sorted({p.rsplit("/", 1)[0] for p in found})
        if self.running:
            for live in self.current_tms():
                answer = self.engine.duty(live, Holdings(self.job, live, tuple(asked)))
                if isinstance(answer, Held):
                    held |= set(answer.paths)
        for path in sorted(found - held):
            if path in self.catalog.files or not self._may_sweep(path, job):
                continue
            made = creator_of(path)
            if made is not None and made != tm and self._is_lost(made):
                if self.kept_from_lost.get(path) != tm:
                    continue  # R64: a zombie's, left to it
            creator = tm if made is None else made
            self.catalog.files[path] = StoredFile(
                self.storage.size(path), False, COORDINATOR, creator
            )
            if not self.referenced(path):
                self.catalog.delete_file(path, COORDINATOR)  # waits while its creator runs

    def _is_lost(self, tm: TmId) -> bool:
        """Whether attempt ``tm`` is lost and not known stopped: it may still run, and no
        one can ask it what it records (a live one answers ``Holdings``)."""
        rec = self.tms.get(tm)
        return rec is not None and rec.status is Status.LOST

    def _may_sweep(self, path: str, job: str) -> bool:
        """I5: only under the base of the job the attempt ran for (one this coordinator
        started) or in a savepoint it triggered, never the user's."""
        try:
            path_parts(path, "<sweep>", "path")
        except MetadataError:
            return False
        base = base_of(path)
        own_sp = {savepoint_dir(i) for i in self.triggered_savepoints}
        return base == job_base(job) or base in own_sp

    def referenced(self, path: str) -> bool:
        if self.working.needed(path):  # working state (§11): R104
            return True
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

    def collect_dirs(self) -> None:
        """R42: the coordinator deletes a directory it owns once nothing refers to it."""
        for path in sorted(self.catalog.dir_owner):
            if self._collectable(path):
                self.catalog.delete_dir(path, COORDINATOR)

    def _collectable(self, path: str) -> bool:
        """R42 for one directory: the coordinator may delete it now."""
        if self.catalog.dir_owner.get(path) != COORDINATOR:
            return False
        if f"{DIR_PREFIX}{path}" in self.registry:
            return False
        if any(path in r.directories for r in self.retained):
            return False
        live = set(self.current_tms())
        d = self.catalog.dirs.get(path)
        if d is not None and d.creator in live and self.running:
            return False
        if self.running and path in self._managed_dirs(live):
            return False  # R42: a live TM works there: it writes there at its next write
        inside = [f for p, f in self.catalog.files.items() if is_under(p, path)]
        if any(f.owner in {tm_actor(t) for t in live} for f in inside):
            # R42: a live TM works there, with a file it has not acknowledged yet (a
            # subtask's new attempt in a directory a zombie created, R66, R64)
            return False
        return all(f.owner in (COORDINATOR, tm_actor(f.creator or "")) for f in inside)

    def _managed_dirs(self, tms: set[TmId]) -> set[str]:
        """R42, R61: the directories the TMs ``tms`` manage in the running job, holding a
        file there yet or not: the shared directories of the subtasks they host and their
        own exclusive ones. A TM told that such a directory is the coordinator's (R61)
        writes into it without creating it again, so it must not go under it."""
        hosted = {shared_dir(self.job, s) for s, t in self.placement.items() if t in tms}
        return hosted | {taskowned_dir(self.job, t) for t in tms}

    def failover(self) -> None:
        for cid in sorted(self.pending):
            self.abort(cid)
        replaced: dict[TmId, TmId] = {}
        for tm in sorted(set(self.placement.values())):
            if self.tms[tm].status is not Status.ALIVE:
                new = self.engine.start_tm(self.job, self.next_checkpoint, None)
                replaced[tm] = new
                self._add_tm(new)
        self.placement = {s: replaced.get(t, t) for s, t in self.placement.items()}
        self.engine.placed(self.placement)
        survivors = sorted(set(self.placement.values()) - set(replaced.values()))
        self.epoch += 1
        for tm in survivors:  # R60: no stale manager survives (FLINK-35400)
            self.engine.duty(tm, ResetTm(self.job, tm, self.epoch))
        for old in sorted(replaced):
            d = taskowned_dir(self.job, old)  # R63
            if d in self.catalog.dir_owner and self.catalog.dir_owner[d] != COORDINATOR:
                self.catalog.dir_owner[d] = COORDINATOR
        for tm in sorted(set(self.placement.values())):
            hosted = sorted(s for s, t in self.placement.items() if t == tm)
            self._assign(tm, hosted, self.next_checkpoint, self.next_checkpoint - 1)
        self.assigned_from = self.next_checkpoint
        self._forget_savepoints()
        # working state (§11): R105 opens the checkpointed working files in place
        self.working.open_databases(self.retained[-1] if self.retained else None, self.epoch)
        self.collect_dirs()

    def _assign(
        self,
        tm: TmId,
        hosted: list[SubtaskId],
        first: int,
        mark: int,
        aborted: frozenset[int] = frozenset(),
        savepoints: frozenset[int] = frozenset(),
    ) -> None:
        """R60-R62, R66: ``tm`` restarts ``hosted`` from the retained checkpoints, and
        writes for ``first`` and later checkpoints that are not over (``mark``,
        ``aborted``, ``savepoints``)."""
        latest = self.retained[-1] if self.retained and self.retained[-1].job == self.job else None
        lost = frozenset(t for t, r in self.tms.items() if r.status is Status.LOST)
        self.told_lost[tm] = lost
        for path in self._kept_paths(tm, hosted):
            if creator_of(path) in lost:  # R61: tm's now, its creator may still run
                self.kept_from_lost[path] = tm
        self.engine.duty(
            tm,
            TmAssignment(
                self.job,
                tm,
                self.epoch,
                tuple(hosted),
                tuple(RetainedCheckpoint(r.id, r.entries) for r in self.retained),
                None if latest is None else RetainedCheckpoint(latest.id, latest.entries),
                lost,
                *self._hand_dirs(tm, hosted),
                self._hand_files(tm, hosted),
                first,
                self.latest_completed,
                mark,
                self.watermark,
                aborted,
                savepoints,
            ),
        )

    def _hand_files(self, tm: TmId, hosted: list[SubtaskId]) -> tuple[KeptFile, ...]:
        """R61: files of retained checkpoints' segments in the directories ``tm`` manages
        now that the coordinator holds (taken from a stopped attempt, R64) go to ``tm``
        with their records."""
        out: list[KeptFile] = []
        for path in self._kept_paths(tm, hosted):
            f = self.catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR:
                del self.catalog.files[path]
                out.append(KeptFile(path, f.size, f.creator))
        return tuple(out)

    def _kept_paths(self, tm: TmId, hosted: list[SubtaskId]) -> list[str]:
        """R61: the files of retained checkpoints' segments in the directories ``tm``
        manages now (its subtasks' shared ones, its own exclusive one): ``tm`` takes them
        over. Merging modes only (NONE restarts nothing from files)."""
        if self.mode is MergingMode.NONE:
            return []
        managed = [shared_dir(self.job, s) for s in hosted] + [taskowned_dir(self.job, tm)]
        return sorted(
            {
                h.path
                for r in self.retained
                for e in r.entries
                if isinstance(h := e.handle, SegmentHandle)
                and any(is_under(h.path, d) for d in managed)
            }
        )

    def _hand_dirs(
        self, tm: TmId, hosted: list[SubtaskId]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """R61: the directories ``tm`` manages now (its subtasks' shared ones, its own
        exclusive one) that a TM owns become its own, as it records them; those the
        coordinator owns stay the coordinator's (R42), and the TM is told so. Merging
        modes only (NONE restarts nothing from files, R61)."""
        if self.mode is MergingMode.NONE:
            return (), ()
        managed = [shared_dir(self.job, s) for s in hosted] + [taskowned_dir(self.job, tm)]
        taken: list[str] = []
        coordinators: list[str] = []
        for d in managed:
            owner = self.catalog.dir_owner.get(d)
            if owner == COORDINATOR:
                coordinators.append(d)
            if owner is None or owner == COORDINATOR:
                continue
            self.catalog.dir_owner[d] = tm_actor(tm)
            md = self.catalog.dirs.get(d)
            if md is not None:
                md.creator = tm
                md.used_by = set()
            taken.append(d)
        return tuple(taken), tuple(coordinators)

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
            meta.working,
        )

    def restart(self) -> None:
        """R95: rebuild retention and the registry from the persisted metadata alone.

        The checkpoint store (Flink's HA store) survives as the list of ``_metadata`` paths;
        their contents are read back and validated before anything changes, so a corrupt
        file fails the restart with a ``MetadataError`` and deletes nothing.
        """
        listed = [r for r in self.retained if r.metadata in self.catalog.files]
        rebuilt = [self.load_completed(r.metadata, r.job) for r in listed]
        self.retained = []
        self.registry.clear()
        for done in rebuilt:
            self._register(done)
            self.retained.append(done)
        received = {p for pend in self.pending.values() for p in pend.received}
        self.pending = {}
        for path in sorted(received):
            f = self.catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR and not self.referenced(path):
                self.catalog.delete_file(path, COORDINATOR)
        self.catalog.retry_deletes_of(COORDINATOR)
        self.failover()

    def restore(self, cmd: c.Restore) -> None:
        source = next((r for r in self.retained if r.id == cmd.checkpoint), None)
        if source is None:
            source = self.stored_savepoint(cmd.checkpoint)
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
        if cmd.num_tms is not None and not 1 <= cmd.num_tms <= MAX_TMS:
            raise CommandError(Reason.BAD_ARGUMENT, f"num_tms {cmd.num_tms} not in 1 .. {MAX_TMS}")
        self._check_max_parallelism(source, cmd)
        old_vertices = self.vertices
        if self.running:
            self.end_job(retain=True)
        for rec in self.tms.values():
            if rec.status is Status.LOST:
                # R64: a zombie stays in its job; where it wrote is still swept at its stop
                before = self.hosted_before.get(rec.id, frozenset())
                self.hosted_before[rec.id] = rec.hosted | before
                rec.hosted = frozenset()
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
        if cmd.num_tms is not None:
            self.num_tms = cmd.num_tms  # R70: Spark runs one TM per subtask
        tms = [
            self.engine.start_tm(self.job, self.next_checkpoint, self.next_checkpoint - 1)
            for _ in range(self.num_tms)
        ]
        for t in tms:
            self._add_tm(t)
        subtasks = subtasks_of(self.vertices)
        self.placement = self.engine.place(subtasks, tms)
        self.engine.placed(self.placement)
        self.running = True
        self.pending = {}
        self.retained = []
        self.registry.clear()
        self.watermark = 0
        self.latest_completed = 0
        assignment = assign(source.entries, self.vertices, self.cfg.max_parallelism)
        self.restoring = tuple(e for s in sorted(assignment) for e in assignment[s])
        self.assignment = {s: tuple(v) for s, v in assignment.items()}
        self.restored_from = source.metadata
        if mode is RestoreMode.CLAIM:
            self._claim(source, recorded)
        # working state (§11): R105, in place; NO_CLAIM: the user's files
        self.working.open_databases(source, self.epoch, users=mode is RestoreMode.NO_CLAIM)
        same = all(
            v.parallelism == ov.parallelism
            for v, ov in zip(self.vertices, old_vertices, strict=True)
        )
        if mode is RestoreMode.CLAIM and same and self.mode is MergingMode.NONE:
            reusable: dict[TmId, list[StateEntry]] = {}
            for s in subtasks:  # R72: NONE mode may reuse the claimed files
                for e in assignment.get(s, ()):
                    if e.kind is StateKind.KEYED_SHARED and isinstance(e.handle, FileHandle):
                        reusable.setdefault(self.placement[s], []).append(e)
            for t, found in sorted(reusable.items()):
                msg = ReusableFiles(self.job, t, self.epoch, source.id, tuple(found))
                self.engine.duty(t, msg)

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
        return (
            {done.metadata}
            | {s.path for e in done.entries if (s := stream_of(e.handle)) is not None}
            | {w.path for _, w in done.working}  # working state (§11): R105, in place
        )

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
            self._record_unheld(self._attempts_files_under(d), COORDINATOR, source.job)
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

    def _unrecorded_under(self, directory: str) -> set[str]:
        """The files in ``directory`` on storage that no record here holds; none if it
        cannot be listed (then nothing unrecorded is taken: a leak, not a loss)."""
        try:
            return self.storage.files_under(directory) - set(self.catalog.files)
        except Exception as err:
            log.warning("listing %s failed: %r", directory, err)
            return set()

    def _attempts_files_under(self, directory: str) -> set[str]:
        """R72 with R64: the files in a claimed ``directory`` that no record here holds
        yet an attempt of this store wrote: a zombie in a process of its own, whose name
        mark (``fastimpl.ids.creator_of``) names an attempt these records know. Anything
        else there (unmarked, or marked by no attempt of ours) is not the store's: a
        claim never takes it, and the directory's delete leaves it (issue 14)."""
        return {
            p
            for p in self._unrecorded_under(directory)
            if (made := creator_of(p)) is not None and made in self.tms
        }

    def end_job(self, *, retain: bool) -> None:
        for cid in sorted(self.pending):
            self.abort(cid)
        handed = {d for r in self.retained for d in r.directories}
        keep = {
            s.logical_id
            for r in self.retained
            for e in r.entries
            if (s := stream_of(e.handle)) is not None
        }
        for tm in self.current_tms():
            actor = tm_actor(tm)
            ended = self.engine.duty(tm, EndJob(self.job, tm, frozenset(keep)))
            if isinstance(ended, TmEnded):
                self._handed_at_end(ended)
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
            self.engine.forget_tm(tm)
            self.tms[tm].status = Status.STOPPED
            self._retire(tm)
        self.running = False
        self.restoring = ()
        if retain:
            for r in self.retained:  # R91: the user's
                paths = {r.metadata} | {
                    s.path for e in r.entries if (s := stream_of(e.handle)) is not None
                }
                self._record_unheld(paths, USER, self.job)
                for rd in r.directories:
                    if rd in self.catalog.dir_owner:
                        self.catalog.dir_owner[rd] = USER
                for p in paths:
                    kept = self.catalog.files.get(p)
                    if kept is not None:
                        kept.owner = USER
                self.working.give_to_user(r)  # working state (§11): R105
        else:
            while self.retained:
                self._subsume(self.retained.pop(0))
        for path in sorted(p for p, f in self.catalog.files.items() if f.owner == COORDINATOR):
            if (
                path in self.catalog.files
                and not self.referenced(path)
                and any(is_under(path, b) for b in self.bases)
            ):
                self.catalog.delete_file(path, COORDINATOR)
        self.collect_dirs()

    def _record_unheld(self, paths: Iterable[str], owner: str, job: str) -> None:
        """R64 with R72, R91: files no live party handed over yet a retained checkpoint
        uses, or that lie in a claimed directory, are a lost attempt's that may still run
        (a live TM hands what it owns over at ``EndJob``). They change hands as everything
        the checkpoint uses does, so the coordinator records them, created by whoever
        their names say (its deletes of them wait while that attempt may run). The zombie
        keeps its own records: it never deletes a file a retained checkpoint uses (its
        notices are older), and one it deletes anyway is checked for once it stopped
        (``Catalog.release_waits``). Only under the base of ``job``, the one whose
        attempts wrote them (I5)."""
        wanted = {p for p in paths if p not in self.catalog.files and self._may_sweep(p, job)}
        if not wanted:
            return
        try:
            here: set[str] = set()
            for d in sorted({p.rsplit("/", 1)[0] for p in wanted}):
                here |= self.storage.files_under(d)
        except Exception as err:  # cannot tell: nothing is recorded (a leak, not a loss)
            log.warning("listing what a lost attempt left failed: %r", err)
            return
        for p in sorted(wanted & here):
            self.catalog.files[p] = StoredFile(self.storage.size(p), False, owner, creator_of(p))

    def _handed_at_end(self, ended: TmEnded) -> None:
        """R90: what the TM still owned is recorded as its own, then handed over below.
        Records the coordinator already holds (one table shared in process) stay as they
        are; a path outside what this store writes in is never recorded (I5)."""
        actor = tm_actor(ended.tm)
        for k in ended.files:
            if k.path not in self.catalog.files and self._writes_in(k.path, ended.tm):
                self.catalog.files[k.path] = StoredFile(k.size, False, actor, k.creator)
        for d in ended.directories:
            if d not in self.catalog.dir_owner and self._writes_in(d, ended.tm):
                self.catalog.dir_owner[d] = actor
                self.catalog.dirs[d] = ManagedDir(d, ended.tm)

    def state_to_restore(self, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        """What ``subtask`` starts from: its share of a restored checkpoint until the new
        job completes one, else its entries of the latest completed checkpoint."""
        if self.restoring:
            return self.assignment.get(subtask, ())
        latest = self.retained[-1] if self.retained else None
        if latest is None:
            return ()
        return tuple(e for e in latest.entries if e.subtask == subtask)
