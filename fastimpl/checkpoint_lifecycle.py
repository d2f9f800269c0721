"""A checkpoint's life at the coordinator: it is triggered (R50), the TMs acknowledge or
decline it (``spec.messages``), and it completes with its ``_metadata`` written (R51-R55)
or aborts (R53, R57). Acknowledgements hand whole files over (R43) and report the managed
directories (R40, R41); a late one or one from an attempt the coordinator gave up on
changes nothing else (R56). The savepoints this store triggered are kept here too, since
their directories hold files of its own (R43) until no attempt may still write there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from attrs import frozen

from fastimpl.coordinated_job import CoordinatedJob
from fastimpl.guards import CoordinatorGuards
from fastimpl.metadata import MetadataError, base_of, metadata_bytes, path_parts
from fastimpl.records import Completed, ManagedDir, Pending, Status, StoredFile
from fastimpl.retention import Retention
from fastimpl.tm_book import TmBook
from fastimpl.working import SharedWorking
from spec import commands as c
from spec.config import MergingMode
from spec.effects import COORDINATOR, USER, tm_actor
from spec.errors import CkptError, UsageError
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    InPlaceFile,
    PlaceholderHandle,
    StateEntry,
    stream_of,
)
from spec.ids import TmId
from spec.layout import (
    METADATA,
    job_base,
    metadata_path,
    savepoint_dir,
    shared_dir,
    taskowned_dir,
)
from spec.messages import Acknowledgement, CheckpointAborted, CheckpointComplete, Decline
from spec.refusals import check

log = logging.getLogger("fastimpl.coordinator")


class CompletionFailed(CkptError):
    """``complete`` could not complete ``checkpoint``: it was aborted instead (R51), and
    nothing of it is kept; its files go as an abort's do, and its abort notices are in
    the coordinator's next ``ready``. ``cause`` (also ``__cause__``) says why: the
    ``StorageFault`` of the ``_metadata`` write (a ``FencedError`` once another store took
    the base), or ``None`` when the coordinator refused to register it (two handles under
    one logical id, R54; ``reason`` says so)."""

    def __init__(self, checkpoint: int, reason: str, cause: BaseException | None) -> None:
        super().__init__(f"checkpoint {checkpoint} was aborted, not completed: {reason}")
        self.checkpoint = checkpoint
        self.reason = reason
        self.cause = cause


@frozen
class MetadataWrite:
    """A completion's storage effect, for the host to carry out (raft's ``Ready``: what
    to persist before the notices go): write ``data`` as ``path`` (``Storage.write_metadata``,
    atomically), then tell the coordinator how it went."""

    checkpoint: int
    path: str
    data: bytes


class CheckpointLifecycle:
    """The pending checkpoints and the savepoints this store triggered."""

    def __init__(
        self, run: CoordinatedJob, tm_book: TmBook, retention: Retention, working: SharedWorking
    ) -> None:
        self.run = run
        self.tm_book = tm_book
        self.retention = retention
        self.working = working
        self.guards = CoordinatorGuards(run, tm_book, lambda: self.pending)
        """The guards of ``spec/refusals.py`` the coordinator's records decide."""
        self.pending: dict[int, Pending] = {}
        self.prepared: dict[int, tuple[Completed, int]] = {}
        """Completions whose ``_metadata`` the host is writing: the checkpoint as it
        completes and the size written (``prepare``, ``written``)."""
        self.savepoint_ids: set[int] = set()
        """Savepoints an attempt may still write or acknowledge for (``forget_savepoints``);
        a completed savepoint is the user's and read back from storage (``stored_savepoint``)."""
        self.triggered_savepoints: set[int] = set()
        """Savepoints this store triggered: their directories hold files of its own (being
        written, or written late, R43) besides the completed savepoint's (the user's)."""

    def is_savepoint(self, checkpoint: int) -> bool:
        return checkpoint in self.savepoint_ids

    def trigger(self, savepoint: bool = False) -> int:
        """R50: a new checkpoint (or savepoint); its id."""
        check(c.Trigger, self.guards.running_checks())
        cid = self.run.next_checkpoint
        self.run.next_checkpoint += 1
        self.pending[cid] = Pending(cid, savepoint)
        if savepoint:
            self.savepoint_ids.add(cid)
            self.triggered_savepoints.add(cid)
        return cid

    def receive_decline(self, msg: Decline) -> None:
        """The coordinator's half: a decline from a live attempt aborts the checkpoint; one
        from an attempt it gave up on, or of a checkpoint no longer pending, changes
        nothing (R56)."""
        rec = self.tm_book.tms.get(msg.attempt)
        if msg.checkpoint in self.pending and rec is not None and rec.status is Status.ALIVE:
            self.abort(msg.checkpoint)

    def receive_ack(self, ack: Acknowledgement) -> None:
        """The coordinator's half. It knows the sender only from the message: an attempt
        it has given up on (a lost TM, or one that no longer hosts the subtask) is
        ignored (R56), and so is a late acknowledgement of a checkpoint no longer
        pending, except that its whole files are handed over and deleted (R43)."""
        rec = self.tm_book.tms.get(ack.attempt)
        current = (
            rec is not None
            and rec.status is Status.ALIVE
            and self.tm_book.placement.get(ack.subtask) == ack.attempt
        )
        entries = ack.entries
        in_place: tuple[InPlaceFile, ...] = ()
        if current:  # working state (§11): R103 hands them over, pending or not
            in_place = self.working.take(ack)
        if not current or ack.checkpoint not in self.pending:
            if current:
                # R43: a late ack still hands files over, but never one a checkpoint
                # still uses or the user's (the same acknowledgement received again)
                late = [e for e in entries if not self.kept_elsewhere(e)]
                self.take_over_files(late, ack.attempt)
                for e in late:
                    s = stream_of(e.handle)
                    if s is not None and isinstance(e.handle, FileHandle):
                        self.run.catalog.delete_file(s.path, COORDINATOR)
            elif rec is not None and rec.status is Status.LOST:
                # a stopped attempt's files were swept when it stopped (R64): its late
                # acknowledgement is ignored, as a retired one's is
                self.note_given_up(entries, ack.attempt, ack.in_place)
            return  # R56
        p = self.pending[ack.checkpoint]
        if any(self.kept_elsewhere(e) for e in entries):
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
        p.received |= self.take_over_files(entries, ack.attempt)
        if self.run.mode is not MergingMode.NONE and not p.savepoint:
            self.forget_released_dirs(ack)
        p.acks[ack.subtask] = entries
        registry = self.retention.registry
        if not all(
            e.handle.logical_id in registry
            for e in entries
            if isinstance(e.handle, PlaceholderHandle)
        ):
            self.abort(ack.checkpoint)  # R22
            return
        for e in entries:
            if isinstance(e.handle, PlaceholderHandle):
                registry.pin(e.handle.logical_id, ack.checkpoint)

    def kept_elsewhere(self, e: StateEntry) -> bool:
        """R43: whether a whole file an acknowledgement names is one the coordinator may
        not take over: a file a retained or restored checkpoint uses (its ``_metadata``
        too), or one the user holds (R73, R91)."""
        if not isinstance(e.handle, FileHandle):
            return False
        f = self.run.catalog.files.get(e.handle.path)
        return self.retention.referenced(e.handle.path) or (f is not None and f.owner == USER)

    def forget_released_dirs(self, ack: Acknowledgement) -> None:
        """R40, R41: an acknowledgement reports each of the subtask's managed directories
        that exists; one the coordinator records as the attempt's and the acknowledgement
        does not report was deleted by the TM (R41), so the record goes."""
        catalog = self.run.catalog
        reported = {e.handle.path for e in ack.entries if isinstance(e.handle, DirectoryHandle)}
        actor = tm_actor(ack.attempt)
        job = self.run.job
        for d in (shared_dir(job, ack.subtask), taskowned_dir(job, ack.attempt)):
            if d not in reported and catalog.dir_owner.get(d) == actor:
                del catalog.dir_owner[d]
                catalog.dirs.pop(d, None)

    def take_over_files(self, entries: Iterable[StateEntry], attempt: TmId) -> set[str]:
        """R43: whole-file handles (NONE mode, savepoints) become the coordinator's.

        The acknowledgement is all the coordinator needs: a file its records do not hold
        (written by a TM in another process) is recorded as its own, created by the
        acknowledging attempt (R64 reads the creator), if it lies where this store
        writes: the job's base or a savepoint it triggered (I5; a handle naming anything
        else is never taken, so never deleted). Each directory the acknowledgement
        reports (R40) is recorded as the attempt's, until a completed checkpoint hands
        it over (R42)."""
        catalog = self.run.catalog
        taken: set[str] = set()
        for e in entries:
            h = e.handle
            if isinstance(h, FileHandle):
                f = catalog.files.get(h.path)
                if f is None and self.writes_in(h.path, attempt):
                    f = StoredFile(h.length, False, COORDINATOR, attempt)
                    catalog.files[h.path] = f
                if f is not None:
                    f.owner = COORDINATOR
                    taken.add(h.path)
            elif isinstance(h, DirectoryHandle) and h.path not in catalog.dir_owner:
                if self.writes_in(h.path, attempt):
                    catalog.dir_owner[h.path] = tm_actor(attempt)
                    catalog.dirs[h.path] = ManagedDir(h.path, attempt)
        return taken

    def note_given_up(
        self,
        entries: Iterable[StateEntry],
        attempt: TmId,
        in_place: Iterable[InPlaceFile] = (),
    ) -> None:
        """R56, R64: an attempt the coordinator gave up on handed over whole files it
        will not take; the attempt forgot them when it acknowledged. Unknown to the
        coordinator's records, they are recorded as still that attempt's, as are the
        working files it referred to in place (R103): its files become the coordinator's
        when it is known stopped (``attempt_stopped``)."""
        catalog = self.run.catalog
        for e in entries:
            h = e.handle
            if (
                isinstance(h, FileHandle)
                and h.path not in catalog.files
                and self.writes_in(h.path, attempt)
            ):
                catalog.files[h.path] = StoredFile(h.length, False, tm_actor(attempt), attempt)
        for w in in_place:  # working state (§11): its database's files, handed over alike
            if w.path not in catalog.files and self.writes_in(w.path, attempt):
                catalog.files[w.path] = StoredFile(w.length, False, tm_actor(attempt), attempt)
                self.working.shared.add(w.path)  # no database deletes it again (R102)

    def writes_in(self, path: str, attempt: TmId) -> bool:
        """Whether ``attempt``'s handle may name ``path`` as a file the store wrote: under
        the running job's base, or in the directory of a savepoint this store triggered."""
        return attempt in self.tm_book.tms and self.may_sweep(path, self.run.job)

    def may_sweep(self, path: str, job: str) -> bool:
        """I5: only under the base of the job the attempt ran for (one this coordinator
        started) or in a savepoint it triggered, never the user's."""
        try:
            path_parts(path, "<sweep>", "path")
        except MetadataError:
            return False
        base = base_of(path)
        own_sp = {savepoint_dir(i) for i in self.triggered_savepoints}
        return base == job_base(job) or base in own_sp

    def claimed(self) -> set[str]:
        """The files the coordinator claims while its job runs (for the observation): the
        shared state it owns in the registry, the whole files pending checkpoints
        received, and every retained checkpoint's ``_metadata``."""
        if not self.run.running:
            return set()
        paths = {r.path for r in self.retention.registry.entries() if r.owned and not r.is_dir}
        paths |= {path for p in self.pending.values() for path in p.received}
        paths |= {r.metadata for r in self.retention.retained}
        return paths

    def _notify_complete(self, checkpoint: int, savepoint: bool) -> None:
        open_sps = frozenset(k for k, p in self.pending.items() if p.savepoint)
        msg = CheckpointComplete(
            self.run.job, checkpoint, self.retention.watermark, savepoint, open_sps
        )
        for tm in self.tm_book.current_tms():
            self.run.notify(tm, msg)

    def _notify_abort(self, checkpoint: int, savepoint: bool) -> None:
        msg = CheckpointAborted(
            self.run.job, checkpoint, self.retention.latest_completed, savepoint
        )
        for tm in self.tm_book.current_tms():
            self.run.notify(tm, msg)

    def abort(self, checkpoint: int) -> None:
        p = self.pending.pop(checkpoint)
        retention = self.retention
        retention.delete_unused(retention.registry.unpin(checkpoint, retention.lowest_retained()))
        catalog = self.run.catalog
        for path in sorted(p.received):  # R43
            f = catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR and not retention.referenced(path):
                catalog.delete_file(path, COORDINATOR)
        self._notify_abort(checkpoint, p.savepoint)

    def prepare(self, checkpoint: int) -> MetadataWrite:
        """R51-R54: the ``_metadata`` a completion of ``checkpoint`` writes, for the host
        to write; nothing changes until it says how the write went (``written`` or
        ``write_failed``). Raises ``CompletionFailed`` once the checkpoint was aborted
        instead because it cannot be registered (R54)."""
        check(c.Complete, self.guards.complete_checks(checkpoint))
        p = self.pending[checkpoint]
        entries: list[StateEntry] = []
        directories: list[str] = []
        for s in sorted(p.acks):
            for e in p.acks[s]:
                h = e.handle
                if isinstance(h, DirectoryHandle):
                    if h.path not in directories:
                        directories.append(h.path)
                elif isinstance(h, PlaceholderHandle):
                    reg = self.retention.registry.get(h.logical_id)
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
        clash = self.retention.id_clash(entries)
        if clash is not None:
            # R54: TMs in other processes are not trusted to keep logical ids unique; a
            # checkpoint that cannot be registered is not written
            log.warning("checkpoint %d aborted: %s", checkpoint, clash)
            self.abort(checkpoint)
            raise CompletionFailed(checkpoint, clash, None)
        meta = (
            f"{savepoint_dir(checkpoint)}/{METADATA}"
            if p.savepoint
            else metadata_path(self.run.job, checkpoint)
        )
        done = Completed(
            checkpoint,
            self.run.job,
            p.savepoint,
            tuple(entries),
            tuple(directories),
            meta,
            self.run.cfg.max_parallelism,
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
        self.prepared = {k: v for k, v in self.prepared.items() if k in self.pending}
        self.prepared[checkpoint] = (done, len(data))
        return MetadataWrite(checkpoint, meta, data)

    def write_failed(self, checkpoint: int, fault: BaseException) -> CompletionFailed:
        """R51: the host could not write the prepared ``_metadata``: the checkpoint aborts
        (if it is still pending); the error to raise, naming the path and the fault."""
        prepared = self.prepared.pop(checkpoint, None)
        what = "its _metadata" if prepared is None else prepared[0].metadata
        if checkpoint in self.pending:
            self.abort(checkpoint)
        return CompletionFailed(checkpoint, f"writing {what} failed: {fault}", fault)

    def written(self, checkpoint: int) -> Completed:
        """R51-R55: the host wrote the prepared ``_metadata``: the checkpoint completes
        (retained, or the user's as a savepoint), the TMs are told, the checkpoints it
        subsumes go. A checkpoint aborted since it was prepared does not complete: the
        ``_metadata`` written for it is the coordinator's, deleted at once (R95: nothing
        unreferenced is kept), and ``CompletionFailed`` says so."""
        prepared = self.prepared.pop(checkpoint, None)
        if prepared is None:
            raise UsageError(f"checkpoint {checkpoint} has no _metadata prepared to complete")
        done, size = prepared
        catalog = self.run.catalog
        catalog.files[done.metadata] = StoredFile(size, False, COORDINATOR, None)
        p = self.pending.pop(checkpoint, None)
        if p is None:
            catalog.delete_file(done.metadata, COORDINATOR)
            raise CompletionFailed(checkpoint, "aborted while its _metadata was written", None)
        if p.savepoint:
            # R55: a completed savepoint belongs to the user
            for path in [*sorted(p.received), done.metadata]:
                f = catalog.files.get(path)
                if f is not None:
                    f.owner = USER
            self._notify_complete(done.id, True)
            self.forget_savepoints()
            return done
        self.retention.retain(done)
        self._notify_complete(checkpoint, False)
        for older in sorted(
            k for k, v in self.pending.items() if k < checkpoint and not v.savepoint
        ):
            self.abort(older)  # R53
        self.retention.collect_dirs()
        return done

    def forget_savepoints(self) -> None:
        """A finished savepoint's id goes once no attempt that may still write or
        acknowledge for it is alive or lost: one started for a later checkpoint never
        does (it refuses, R56), nor does one assigned by a later failover (R60), and a
        stopped one's files were swept when it stopped; and once no delete in its
        directory is still to come."""
        book = self.tm_book
        horizon = self.run.next_checkpoint
        for tm, (_, first) in book.started.items():
            assigned = book.tms[tm].status is Status.ALIVE  # a lost one missed the failovers
            horizon = min(horizon, max(first, book.assigned_from) if assigned else first)
        done = [n for n in self.savepoint_ids if n < horizon and n not in self.pending]
        if not done:
            return
        # a delete still to come in its directory (a party's file, a delete that failed
        # or waits) needs the id: the catalog deletes there only in savepoints it made
        cat = self.run.catalog
        busy = {base_of(p) for p, f in cat.files.items() if f.owner != USER}
        busy |= {base_of(d.path) for d in cat.deferred}
        busy |= {base_of(p) for p in self.run.storage.failed_deletes}
        for cid in done:
            if savepoint_dir(cid) not in busy:
                self.savepoint_ids.discard(cid)
                self.triggered_savepoints.discard(cid)
