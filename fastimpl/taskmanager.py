"""One TM's side of the store: its pools, segments and physical files, what its
subtasks wrote and acknowledged, what their backends remember uploading, and what the
TM has heard from the coordinator (R30-R35).

The TM never calls the coordinator: ``acknowledge`` returns the ``Acknowledgement``
to send, a failed write leaves the ``Decline`` to its caller, and the coordinator's
notices are applied by ``on_notice`` in whatever order they arrive, duplicated or late.
What it knows of the job it learns from the engine's calls: the subtasks it runs, each
checkpoint's type (with the write, as Flink's barrier carries it), and on a restart the
retained checkpoints and which attempts are lost.

Its records of files and directories (``fastimpl.catalog``) are its own, in a process
of its own (``TaskManager.alone``, built from the storage, the config, the job id and its
TM id) or beside the other parties in one (``TaskManager.own``, as ``fastimpl.engine``
composes them): they hold only what it created and still owns. It learns each hand-over
from a message: a whole file stops being its own when it acknowledges it (R43), a
directory when the notice of a checkpoint that reported it completes (R42).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]

from fastimpl.catalog import Catalog
from fastimpl.ids import IdSource, RandomIds, creator_of
from fastimpl.manager import Manager
from fastimpl.records import BackendRef, ManagedDir, PFile, PoolKey, Seg, Status, StoredFile, Tm
from fastimpl.storage import Storage, StorageFault
from fastimpl.storage_hooks import HookedStorage, StorageHooks
from fastimpl.working import Databases
from spec.commands import StorageOp
from spec.config import Config, MergingMode, Scope, StateKind
from spec.effects import COORDINATOR, tm_actor
from spec.errors import CommandError, Reason, UsageError
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    InPlaceFile,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
    extent_of,
    stream_of,
)
from spec.ids import SubtaskId, TmId
from spec.keygroups import key_group_range
from spec.layout import (
    SAVEPOINTS,
    checkpoint_dir,
    is_under,
    job_base,
    savepoint_dir,
    shared_dir,
    taskowned_dir,
)
from spec.messages import (
    Acknowledgement,
    CheckpointAborted,
    CheckpointComplete,
    DatabaseFiles,
    DatabasesOpened,
    Duty,
    EndJob,
    Held,
    Holdings,
    InUse,
    KeptFile,
    LostAttemptStopped,
    OpenDatabase,
    ResetTm,
    ReusableFiles,
    TmAssignment,
    TmEnded,
    WaitingDelete,
)

OutKey = tuple[SubtaskId, int]
BackendKey = tuple[SubtaskId, str]
_SHARED = Scope.SHARED.value
_EXCLUSIVE = Scope.EXCLUSIVE.value


class _SubtaskFacts:
    """A subtask's shared directory, key groups and name (its pool key's owner, R13),
    and the key of the SHARED pool it last appended to, with that checkpoint."""

    __slots__ = ("directory", "key_groups", "name", "pool_checkpoint", "pool_key")

    def __init__(self, directory: str, key_groups: tuple[int, int], name: str) -> None:
        self.directory = directory
        self.key_groups = key_groups
        self.name = name
        self.pool_checkpoint = 0
        self.pool_key: PoolKey | None = None


class TaskManager:
    """One TM attempt (``tm``) of job ``job``."""

    def __init__(
        self,
        tm: TmId,
        job: str,
        config: Config,
        catalog: Catalog,
        ids: IdSource,
        first_checkpoint: int = 1,
    ) -> None:
        self.tm = tm
        self.actor = tm_actor(tm)
        self.job = job
        self.cfg = config
        self.mode = config.merging_mode
        self.catalog = catalog
        self.ids = ids
        self.hosted: list[SubtaskId] = []
        """The subtasks the engine runs on this TM (none once it moved them away)."""
        self.savepoints: set[int] = set()
        """Checkpoints the TM was told are savepoints: by the call that writes for one
        (Flink's CheckpointOptions travel with the barrier) or by a notice."""
        self.m = Manager()
        self.outputs: dict[OutKey, list[StateEntry]] = {}
        """What each subtask wrote for a checkpoint and has not acknowledged yet."""
        self.acked: dict[OutKey, tuple[StateEntry, ...]] = {}
        """What each subtask acknowledged, until the TM hears how it ended (R23)."""
        self.backend: dict[BackendKey, BackendRef] = {}
        """What each subtask's backend remembers uploading, by local name (R20-R23)."""
        # What the TM heard from the coordinator (R30-R35)
        self.known_completed = 0
        self.finished_mark = 0
        self.known_aborted: set[int] = set()
        self.known_watermark = 0
        self.first_checkpoint = first_checkpoint
        self.finished_savepoints: set[int] = set()
        self._per_subtask: dict[SubtaskId, _SubtaskFacts] = {}
        """What every append of a subtask needs and never changes: its shared directory,
        its key groups, its pool key's owner. Computed once per subtask, not per append;
        one entry per subtask the TM ever wrote for (cleared by ``forget``)."""
        self._taskowned = taskowned_dir(job, tm)
        self.reset_epoch = 0
        """The newest failover whose reset this TM applied (``ResetTm``, R60)."""
        self.assigned_epoch = 0
        """The newest failover whose ``TmAssignment`` this TM applied (R61, R62)."""
        self.lost: set[TmId] = set()
        """Attempts the TM was told may still run (``TmAssignment.lost``) and not yet told
        stopped (``LostAttemptStopped``): with records of its own, its deletes of files
        they created wait for them (R64)."""
        self.ended: TmEnded | None = None
        """Its answer to ``EndJob`` once the job ended for it (R90): given again if asked."""
        catalog.dir_rules[self.actor] = self._releasable
        # working state (§11): the attempt's live databases (fastimpl.working)
        self.working = Databases(catalog, job, tm, config.max_parallelism)

    @classmethod
    def alone(
        cls,
        storage: Any,
        root: str,
        config: Config,
        job: str,
        tm: TmId,
        *,
        ids: IdSource | None = None,
        first_checkpoint: int = 1,
        hooks: StorageHooks | None = None,
        finished_mark: int = 0,
    ) -> TaskManager:
        """A TM in a process of its own: ``storage`` is an fsspec file system (or a URL,
        ``root`` then the path under it), and nothing else of the job is needed. It keeps
        its own ``Storage`` and records of the files and directories it created and
        still owns, and deletes only what those say is its own, under its job's base and
        the savepoints it heard of (I5). ``hooks``: the host's observer of its storage
        calls (``fastimpl.storage_hooks``), if any. ``finished_mark``: every checkpoint
        up to it is over for this attempt (R66: a new attempt writes for the checkpoints
        pending when it starts and later ones, for no other), as ``finished`` says."""
        if isinstance(storage, str):
            fs, path = fsspec.core.url_to_fs(storage)
            root = f"{path.rstrip('/')}/{root.strip('/')}" if root else path
        else:
            fs = storage
        store = Storage(fs, root) if hooks is None else HookedStorage(fs, root, hooks)
        if not store.open_files_readable and config.open_files_readable:
            config = attrs.evolve(config, open_files_readable=False)  # as the engine does
        ids = ids if ids is not None else RandomIds()
        party = cls.own(store, config, job, tm, ids, first_checkpoint)
        party.finished_mark = finished_mark
        return party

    @classmethod
    def own(
        cls,
        store: Storage,
        config: Config,
        job: str,
        tm: TmId,
        ids: IdSource,
        first_checkpoint: int = 1,
    ) -> TaskManager:
        """A TM with records of its own over ``store``. The names it draws carry its
        attempt id (R64: what it creates may be found on storage with nobody's record of
        it, its process killed; the name says whose it is)."""
        view = _OwnView(job)
        party = cls(tm, job, config, Catalog(store, ids, view), ids, first_checkpoint)
        view.party = party
        party.catalog.creator_mark = tm
        return party

    def host(self, subtasks: list[SubtaskId]) -> None:
        """The subtasks the engine runs on this TM now (the placement is the engine's)."""
        self.hosted = list(subtasks)

    def restart_knowledge(self, latest: int, mark: int, watermark: int, first: int) -> None:
        """R60: after a failover the TM starts from what the coordinator restores."""
        self.known_completed = latest
        self.finished_mark = mark
        self.known_watermark = watermark
        self.first_checkpoint = first

    def forget(self) -> None:
        """A TM that is gone keeps no memory: its tables go, its files stay on storage."""
        self.m = Manager()
        self.outputs = {}
        self.acked = {}
        self.backend = {}
        self._per_subtask = {}
        self.working.forget()  # working state (§11)

    # ------------------------------------------------------------------ duties (R60-R62, R72, R90)

    def on_duty(self, msg: Duty) -> TmEnded | Held | InUse | None:
        """Apply one of the coordinator's duties (``spec.messages``) to this TM's records;
        each is applied once, so a duty repeated or arriving after a newer one changes
        nothing. ``EndJob`` is answered with what the TM hands over (``TmEnded``),
        ``Holdings`` with the files it records under the directories asked (``Held``)."""
        if msg.tm != self.tm or msg.job != self.job:
            raise UsageError(f"{type(msg).__name__} for {msg.tm} of {msg.job} reached {self.tm}")
        if isinstance(msg, Holdings):
            return self.holdings(msg)
        if isinstance(msg, DatabaseFiles):  # working state (§11): R104
            return InUse(self.job, self.tm, () if self.ended else self.working.in_use())
        if self.ended is not None:
            return self.ended if isinstance(msg, EndJob) else None  # the job is over here
        if isinstance(msg, OpenDatabase):  # working state (§11): R105
            self.working.open(msg, self._read_segment)
            return None
        if isinstance(msg, DatabasesOpened):  # working state (§11): R62, R102
            self.working.release()
            return None
        if isinstance(msg, LostAttemptStopped):
            self.lost.discard(msg.stopped)
            self.catalog.release_waits(msg.stopped)  # R64: its deletes that waited run
        elif isinstance(msg, ResetTm):
            if msg.epoch > max(self.reset_epoch, self.assigned_epoch):
                self.reset_epoch = msg.epoch
                self.reset()
        elif isinstance(msg, TmAssignment):
            self.on_assignment(msg)
        elif isinstance(msg, ReusableFiles):
            if msg.epoch >= self.assigned_epoch:
                hosted = set(self.hosted)
                for e in msg.entries:  # R72: the claimed files the backends may reuse
                    if e.subtask in hosted:
                        self.backend[(e.subtask, e.name)] = BackendRef(e, msg.checkpoint, True)
        else:
            return self.end(msg)
        return None

    def _read_segment(self, e: StateEntry) -> bytes:
        """The bytes of a restored handle (a small working file's segment, R105)."""
        s = stream_of(e.handle)
        assert s is not None
        return self.catalog.storage.read_range(*extent_of(s))

    def holdings(self, msg: Holdings) -> Held:
        """The files this TM records under the directories asked, and those of the
        directories asked that it owns: R64's sweep of what a stopped attempt left leaves
        these alone."""
        dirs = msg.directories
        paths = [p for p in self.catalog.files if any(is_under(p, d) for d in dirs)]
        paths += [p for p in self.m.pfiles if any(is_under(p, d) for d in dirs)]
        paths += [d for d in dirs if self.catalog.dir_owner.get(d) == self.actor]  # R40
        return Held(self.job, self.tm, tuple(sorted(set(paths))))

    def reset(self) -> None:
        """R60: drop what was written and never acknowledged, close the open files (they
        stay on storage, still this TM's) and forget the tables: no stale manager
        survives a failover (FLINK-35400)."""
        self.drop_outputs_where(lambda cp: True)
        for path in sorted(self.m.pfiles):
            if self.m.pfiles[path].open:
                self.catalog.close(path)
        self.forget()

    def on_assignment(self, msg: TmAssignment) -> None:
        """R60-R62: restart from the retained checkpoints (a reset first, if this
        failover's ``ResetTm`` has not been applied: a new TM has nothing to reset)."""
        if msg.epoch <= self.assigned_epoch:
            return
        if msg.epoch > self.reset_epoch:
            self.reset_epoch = msg.epoch
            self.reset()
        self.assigned_epoch = msg.epoch
        self.lost = set(msg.lost)
        self.restart_knowledge(
            msg.latest_completed, msg.finished_mark, msg.subsumed, msg.first_checkpoint
        )
        # R66: a replacement starts for the pending checkpoints; those between that are over
        self.known_aborted |= msg.aborted
        self.finished_savepoints |= msg.finished_savepoints
        self.savepoints |= msg.finished_savepoints
        cat = self.catalog
        for d in msg.taken_over:  # R61: the coordinator's word that it is not its own
            # unless this TM deleted it (R41) before the coordinator heard (R40)
            if d not in cat.dir_owner and cat.storage.exists_dir(d):
                cat.dir_owner[d] = self.actor
                cat.dirs[d] = ManagedDir(d, self.tm)
        for d in msg.handed_over:  # R42: written in, never deleted by this TM
            cat.dir_owner[d] = COORDINATOR
            md = cat.dirs.setdefault(d, ManagedDir(d, self.tm))
            md.handed_over = True
        for k in msg.files:  # R61: handed with its record by the coordinator
            if k.path not in self.catalog.files:
                self.catalog.files[k.path] = StoredFile(k.size, False, self.actor, k.creator)
        latest = None if msg.latest is None else (msg.latest.checkpoint, msg.latest.entries)
        retained = [(r.checkpoint, r.entries) for r in msg.retained]
        self.restore(list(msg.hosted), retained, latest, msg.lost)

    def end(self, msg: EndJob) -> TmEnded:
        """R90: discard what no retained checkpoint keeps, close every file, and hand
        what remains to the coordinator (``TmEnded``) and forget it (the coordinator
        deletes the directories no completed checkpoint used, with everything in them,
        from what the answer lists)."""
        self.end_job(set(msg.keep))
        cat = self.catalog
        files = tuple(
            KeptFile(p, f.size, f.creator)
            for p, f in sorted(cat.files.items())
            if f.owner == self.actor
        )
        dirs = tuple(sorted(p for p, o in cat.dir_owner.items() if o == self.actor))
        waiting = tuple(WaitingDelete(d.path, d.is_dir, d.waits_for) for d in cat.deferred)
        cat.deferred = []
        for k in files:
            cat.files.pop(k.path, None)
        for d in dirs:
            del cat.dir_owner[d]
            cat.dirs.pop(d, None)
        self.ended = TmEnded(self.job, self.tm, files, dirs, waiting)
        return self.ended

    # ------------------------------------------------------------------ guards

    def note(self, checkpoint: int, savepoint: bool) -> None:
        """The checkpoint's type, as the engine passes it with a barrier."""
        if savepoint:
            self.savepoints.add(checkpoint)

    def finished(self, checkpoint: int, savepoint: bool = False) -> bool:
        """Whether the TM already knows ``checkpoint`` is over (a write is late, R56)."""
        if checkpoint in self.known_aborted or checkpoint < self.first_checkpoint:
            return True
        if checkpoint in self.finished_savepoints:
            return True
        savepoint = savepoint or checkpoint in self.savepoints
        return not savepoint and checkpoint <= self.finished_mark

    def _is_savepoint(self, checkpoint: int) -> bool:
        return checkpoint in self.savepoints

    def acknowledged(self, subtask: SubtaskId, checkpoint: int) -> bool:
        return (subtask, checkpoint) in self.acked

    # ------------------------------------------------------------------ writing (R10-R17)

    def write(
        self,
        subtask: SubtaskId,
        checkpoint: int,
        kind: StateKind,
        name: str,
        size: int,
        entries: int,
        data: bytes,
        savepoint: bool = False,
    ) -> StateEntry:
        """Write one state handle's bytes; a ``StorageFault`` leaves the decline to the
        caller (``write_failed``)."""
        self.note(checkpoint, savepoint)
        entry = self._write_stream(subtask, checkpoint, kind, name, size, entries, data)
        self._add_output(subtask, checkpoint, entry)
        return entry

    def _add_output(self, subtask: SubtaskId, checkpoint: int, e: StateEntry) -> None:
        out = self.outputs.get((subtask, checkpoint))
        if out is None:
            out = self.outputs[(subtask, checkpoint)] = []
        out.append(e)
        if e.kind is StateKind.KEYED_SHARED and checkpoint not in self.savepoints:
            self.backend[(subtask, e.name)] = BackendRef(e, checkpoint, False)

    def _facts(self, subtask: SubtaskId) -> _SubtaskFacts:
        facts = self._per_subtask.get(subtask)
        if facts is None:
            kg = key_group_range(self.cfg.max_parallelism, subtask.parallelism, subtask.index)
            facts = _SubtaskFacts(shared_dir(self.job, subtask), kg, str(subtask))
            self._per_subtask[subtask] = facts
        return facts

    def _write_stream(
        self,
        subtask: SubtaskId,
        checkpoint: int,
        kind: StateKind,
        name: str,
        size: int,
        entries: int,
        data: bytes,
        partial: bool = False,
    ) -> StateEntry:
        """``data`` is what reaches storage; ``partial``: the process dies after writing
        it, short of ``size`` (R65, the test adapter's crash mid-write)."""
        actor = self.actor
        lid = self.ids.logical_id()
        facts = self._facts(subtask)
        kg = facts.key_groups if kind.keyed else None
        scope = kind.scope
        savepoint = self._is_savepoint(checkpoint)
        if savepoint or self.mode is MergingMode.NONE:
            # R11, R55: one file per handle, the writing TM's until acknowledged
            if savepoint:
                directory = savepoint_dir(checkpoint)
            elif scope is Scope.SHARED:
                directory = shared_dir(self.job, subtask)
            else:
                directory = checkpoint_dir(self.job, checkpoint)
            path = self.catalog.new_file_name(directory)
            self.catalog.create(path, actor, self.tm)
            try:
                self.catalog.append(path, data)
            except StorageFault:
                self.catalog.close(path)
                self.catalog.delete_file(path, actor)
                raise
            if partial:
                raise StorageFault(StorageOp.APPEND, path)
            self.catalog.close(path)  # R12: durable before the handle exists
            return StateEntry(subtask, kind, name, FileHandle(path, size, lid, scope), entries, kg)
        path, offset, pf = self._append_segment(facts, checkpoint, scope, size, partial, data)
        self.m.add(Seg(lid, path, offset, size, checkpoint, checkpoint, False))
        pf.ref_count += 1
        pf.live_bytes += size
        if pf.open and pf.size >= self.cfg.max_file_size:
            self._close_pfile(path)  # R12: roll at max file size
        handle = SegmentHandle(path, offset, size, lid, scope)
        return StateEntry(subtask, kind, name, handle, entries, kg)

    def _pool_key(self, facts: _SubtaskFacts, checkpoint: int, scope: Scope) -> PoolKey:
        """R13: SHARED merged per subtask, EXCLUSIVE per TM; WITHIN pools per checkpoint.
        A subtask's SHARED key is built once per checkpoint, not once per append."""
        shared = scope is Scope.SHARED
        if shared and facts.pool_checkpoint == checkpoint and facts.pool_key is not None:
            return facts.pool_key
        prefix = (self.tm, _SHARED, facts.name) if shared else (self.tm, _EXCLUSIVE, self.tm)
        if self.mode is MergingMode.WITHIN_CHECKPOINT:
            key = (*prefix, str(checkpoint))
        else:
            key = (*prefix, "*")
        if shared:
            facts.pool_checkpoint, facts.pool_key = checkpoint, key
        return key

    def _append_segment(
        self,
        facts: _SubtaskFacts,
        checkpoint: int,
        scope: Scope,
        size: int,
        partial: bool,
        data: bytes,
    ) -> tuple[str, int, PFile]:
        """Append ``data`` to the pool's open file (a new one if there is none or it
        would grow past the size): its path, the offset, its record."""
        key = self._pool_key(facts, checkpoint, scope)
        directory = facts.directory if scope is Scope.SHARED else self._taskowned
        self.catalog.mkdir(directory, self.actor, self.tm)  # R40
        m = self.m
        path = m.pools.get(key)
        pf = None if path is None else m.pfiles[path]
        if pf is not None and pf.size > 0 and pf.size + size > self.cfg.max_file_size:
            self._close_pfile(pf.path)  # R12: roll before exceeding the size
            pf = None
        if pf is None:
            path = self.catalog.new_file_name(directory)
            self.catalog.create(path, self.actor, self.tm)
            cp = checkpoint if key[3] != "*" else None
            pf = m.pfiles[path] = PFile(path, scope, key, cp, True, 0)
            m.pools[key] = path
        path = pf.path
        try:
            offset = self.catalog.append(path, data)
        except StorageFault:
            self._poison(path)
            raise
        pf.size += len(data)
        if partial:
            raise StorageFault(StorageOp.APPEND, path)
        return path, offset, pf

    def _poison(self, path: str) -> None:
        """R17: a file whose write failed is closed and never written or reused again."""
        self.m.pfiles[path].reusable = False
        self._close_pfile(path)

    def write_failed(self, subtask: SubtaskId, checkpoint: int, savepoint: bool = False) -> None:
        """R17: the subtask declines and writes no more for the checkpoint (R14); the
        caller sends the ``Decline``."""
        self.note(checkpoint, savepoint)
        self.drop_outputs(subtask, checkpoint)
        self.acked[(subtask, checkpoint)] = ()
        self.close_within_files(lambda cp: cp == checkpoint, subtask)

    # ------------------------------------------------------------------ reuse (R20-R23)

    def backend_ref(self, subtask: SubtaskId, name: str) -> BackendRef:
        ref = self.backend.get((subtask, name))
        if ref is None:
            raise CommandError(
                Reason.NO_SUCH_STATE, f"{subtask} on {self.tm} has no shared state {name!r}"
            )
        return ref

    def reuse(
        self, subtask: SubtaskId, checkpoint: int, ref: BackendRef, savepoint: bool = False
    ) -> StateEntry | None:
        """R21, R22: the old handle (its segment's last use advanced) or a placeholder,
        when the old upload may be reused; ``None`` when it must be uploaded again."""
        self.note(checkpoint, savepoint)
        if self._is_savepoint(checkpoint) or not self._reusable(ref):
            return None
        old = ref.entry
        h = old.handle
        if isinstance(h, SegmentHandle):
            seg = self.m.segs[h.logical_id]
            self.m.touch(seg, max(seg.last_used, checkpoint))  # R21
            entry = old
        else:
            stream = stream_of(h)
            assert stream is not None
            entry = StateEntry(
                old.subtask,
                old.kind,
                old.name,
                PlaceholderHandle(stream.logical_id),
                old.entries,
                old.key_groups,
                old.entry_range,
            )
        self.outputs.setdefault((subtask, checkpoint), []).append(entry)
        self.backend[(subtask, entry.name)] = BackendRef(
            ref.entry, max(ref.checkpoint, checkpoint), ref.confirmed
        )
        return entry

    def _reusable(self, ref: BackendRef) -> bool:
        if not ref.confirmed:
            return False
        h = ref.entry.handle
        if isinstance(h, SegmentHandle):
            if h.logical_id not in self.m.segs:
                return False
            pf = self.m.pfiles.get(h.path)
            return pf is not None and pf.reusable
        return isinstance(h, FileHandle) and self.mode is MergingMode.NONE

    # ------------------------------------------------------------------ acknowledge

    def acknowledge(
        self, subtask: SubtaskId, checkpoint: int, savepoint: bool = False
    ) -> tuple[tuple[StateEntry, ...], Acknowledgement]:
        """What the subtask wrote, plus the managed directories that exist (R40), as the
        message to the coordinator; the subtask's WITHIN files close (R14). Raises
        ``StorageFault`` (the subtask declines, R17) if a handle names bytes whose upload
        failed."""
        self.note(checkpoint, savepoint)
        key = (subtask, checkpoint)
        in_place = self.working.unpin(subtask, checkpoint)  # working state (§11): R103
        written = tuple(self.outputs.pop(key, ()))
        entries = list(written)
        if self.mode is not MergingMode.NONE and not self._is_savepoint(checkpoint):
            # R40: every acknowledgement reports the managed directories that exist
            for directory in (shared_dir(self.job, subtask), taskowned_dir(self.job, self.tm)):
                if directory in self.catalog.dir_owner or directory in self.catalog.dirs:
                    d = self.catalog.dirs[directory]
                    if d.creator == self.tm and not d.handed_over:  # R41; once handed over,
                        d.used_by.add(checkpoint)  # the coordinator's (R42)
                    entries.append(
                        StateEntry(subtask, StateKind.CHANNEL, "dir", DirectoryHandle(directory), 0)
                    )
        self.acked[key] = tuple(entries)
        self.close_within_files(lambda cp: cp == checkpoint, subtask)
        failed = self.catalog.failed_uploads
        lost = failed and failed & {
            s.path for e in entries if (s := stream_of(e.handle)) is not None
        }
        if lost:  # R17: the handles name bytes that never reached storage
            self.write_failed(subtask, checkpoint)
            raise StorageFault(StorageOp.APPEND, min(lost))
        # R43: an acknowledged whole file is the coordinator's from now on, whether the
        # checkpoint is still pending or not: the TM forgets it (never deletes it)
        for e in entries:
            if isinstance(e.handle, FileHandle):
                self.catalog.files.pop(e.handle.path, None)
        self.working.handed_over(f.path for f in in_place)  # working state (§11)
        ack = Acknowledgement(self.job, checkpoint, subtask, self.tm, tuple(entries), in_place)
        return written, ack

    # ------------------------------------------------------------------ notices (R30-R35)

    def on_notice(self, msg: CheckpointComplete | CheckpointAborted) -> None:
        """R34: any notice may arrive at any time, twice or never; each is idempotent."""
        self.note(msg.checkpoint, msg.savepoint)
        if isinstance(msg, CheckpointComplete):
            self.savepoints |= msg.pending_savepoints
            self._tm_complete(msg.checkpoint, msg.subsumed, msg.savepoint)
            if not msg.savepoint:
                self._finish_savepoints(msg.checkpoint, msg.pending_savepoints)
        else:
            self._tm_abort(msg.checkpoint, msg.latest_completed, msg.savepoint)

    def _finish_savepoints(self, checkpoint: int, still_open: frozenset[int]) -> None:
        """R35: savepoints up to c that are not listed as pending are finished."""
        mine = {k[1] for k in self.outputs} | {k[1] for k in self.acked}
        done = sorted(
            sp
            for sp in mine
            if sp <= checkpoint and sp not in still_open and self._is_savepoint(sp)
        )
        for sp in done:
            self._savepoint_finished(sp)

    def _savepoint_finished(self, savepoint: int) -> None:
        self.finished_savepoints.add(savepoint)
        self.drop_outputs_where(lambda cp: cp == savepoint)
        for key in [k for k in self.acked if k[1] == savepoint]:
            del self.acked[key]

    def _tm_complete(self, checkpoint: int, watermark: int, savepoint: bool) -> None:
        if savepoint:
            self._savepoint_finished(checkpoint)  # R35
            return
        self.known_completed = max(self.known_completed, checkpoint)
        self.finished_mark = max(self.finished_mark, checkpoint)
        self._handed_over(checkpoint)
        self.known_watermark = max(self.known_watermark, watermark)
        self._confirm(checkpoint)
        for lid in self.m.used_up_to(watermark):  # R31
            self._discard(lid)
        is_sp = self._is_savepoint
        self.drop_outputs_where(lambda cp: cp <= checkpoint and not is_sp(cp))
        self.close_within_files(lambda cp: cp <= checkpoint)
        self._forget_settled_aborts()

    def _handed_over(self, checkpoint: int) -> None:
        """R42, learnt from the notice: a directory this TM reported for a checkpoint
        that completed is the coordinator's (its segment files stay the TM's)."""
        for path, d in sorted(self.catalog.dirs.items()):
            if d.creator == self.tm and not d.handed_over and checkpoint in d.used_by:
                d.handed_over = True
                self.catalog.dir_owner[path] = COORDINATOR

    def _forget_settled_aborts(self) -> None:
        """Keep the aborts a TM heard only while they still decide something: whether a
        write is late (not once the checkpoint is below the finished mark, or a finished
        savepoint) and whether a directory it made may go (R41, while one of its
        directories that was not handed over lists the checkpoint). Without this the
        set grows with every abort the job ever had."""
        if not self.known_aborted:
            return
        listed = {
            cp
            for d in self.catalog.dirs.values()
            if d.creator == self.tm and not d.handed_over
            for cp in d.used_by
        }
        is_sp = self._is_savepoint
        self.known_aborted = {
            cp
            for cp in self.known_aborted
            if cp in listed
            or not (cp in self.finished_savepoints or (cp <= self.finished_mark and not is_sp(cp)))
        }

    def _tm_abort(self, checkpoint: int, latest_completed: int, savepoint: bool) -> None:
        self.known_aborted.add(checkpoint)
        self.known_completed = max(self.known_completed, latest_completed)
        if latest_completed:
            self._confirm(latest_completed)  # R32
        for lid in self.m.created_for(checkpoint):
            self._discard(lid)
        self.drop_outputs_where(lambda cp: cp == checkpoint)
        self.close_within_files(lambda cp: cp == checkpoint)
        if savepoint:
            self._savepoint_finished(checkpoint)
        else:
            self._release_dirs()

    def _confirm(self, checkpoint: int) -> None:
        """R23: what a subtask acknowledged for a completed checkpoint becomes its baseline.

        One pass over the backends' records for all the subtasks that acknowledged it
        (each record is one subtask's, so the order of the subtasks does not matter)."""
        names_of: dict[SubtaskId, dict[str, StateEntry]] = {}
        for (subtask, cp), entries in self.acked.items():
            if cp == checkpoint:
                names_of[subtask] = {e.name: e for e in entries if e.kind is StateKind.KEYED_SHARED}
        if names_of:
            gone: list[BackendKey] = []
            for bkey, ref in self.backend.items():
                names = names_of.get(bkey[0])
                if names is None:
                    continue
                acked = names.get(bkey[1])
                if acked is not None:  # updated in place: no new record per name
                    if not isinstance(acked.handle, PlaceholderHandle):
                        ref.entry = acked
                    ref.checkpoint = max(ref.checkpoint, checkpoint)
                    ref.confirmed = True
                elif ref.checkpoint <= checkpoint:
                    gone.append(bkey)
            for bkey in gone:
                del self.backend[bkey]
            segs = self.m.segs
            for names in names_of.values():
                for e in names.values():
                    h = e.handle
                    if isinstance(h, SegmentHandle):
                        seg = segs.get(h.logical_id)
                        if seg is not None:
                            seg.confirmed = True
        is_sp = self._is_savepoint
        for key in [k for k in self.acked if k[1] < checkpoint]:
            if not is_sp(key[1]):
                del self.acked[key]

    # ------------------------------------------------------------------ segments and files

    def _discard(self, lid: str) -> None:
        """R33: a segment leaves the table once and decrements its file's count once."""
        seg = self.m.remove(lid)
        if seg is None:
            return
        pf = self.m.pfiles[seg.path]
        pf.ref_count -= 1
        pf.live_bytes -= seg.length
        self._check_file(seg.path)

    def _check_file(self, path: str) -> None:
        """R15, R80, R81: delete a closed unreferenced file; bound space amplification."""
        pf = self.m.pfiles.get(path)
        if pf is None:
            return
        bound = self.cfg.amplification_bound
        if bound is not None and pf.size > bound * pf.live_bytes:
            pf.reusable = False
            if pf.open:
                self._close_pfile(path)  # R81
                return
        if not pf.open and pf.ref_count == 0:
            del self.m.pfiles[path]
            f = self.catalog.files.get(path)
            if f is not None and f.owner == self.actor:
                self.catalog.delete_file(path, self.actor)

    def _close_pfile(self, path: str) -> None:
        m = self.m
        pf = m.pfiles[path]
        if pf.pool_key is not None and m.pools.get(pf.pool_key) == path:
            del m.pools[pf.pool_key]
        if pf.open:
            try:
                self.catalog.close(path)
            except StorageFault:
                # R17: an upload that failed is never written again. Whoever closed it
                # for a checkpoint being acknowledged declines; on other paths (a
                # notification closing a garbage file) there is nothing to decline.
                pf.reusable = False
                f = self.catalog.files.get(path)
                if f is not None:
                    f.open = False
                self.catalog.failed_uploads.add(path)
            pf.open = False
        self._check_file(path)

    def close_open_files(self) -> None:
        for path in sorted(self.m.pfiles):
            pf = self.m.pfiles.get(path)
            if pf is not None and pf.open:
                self._close_pfile(path)

    def close_within_files(
        self, which: Callable[[int], bool], subtask_done: SubtaskId | None = None
    ) -> None:
        """R14: a WITHIN file closes once nobody can still write to it for its checkpoint."""
        m = self.m
        for path in sorted(m.pfiles):
            pf = m.pfiles.get(path)
            if pf is None or not pf.open or pf.checkpoint is None or not which(pf.checkpoint):
                continue
            if subtask_done is not None:
                assert pf.pool_key is not None
                if pf.scope is Scope.SHARED and pf.pool_key[2] != str(subtask_done):
                    continue
                if (
                    pf.scope is Scope.EXCLUSIVE
                    and self.cfg.open_files_readable
                    and not self._done_with(pf.checkpoint)
                ):
                    continue  # R12: on an object store the acknowledgement uploads it now
            self._close_pfile(path)

    def _done_with(self, checkpoint: int) -> bool:
        return all((s, checkpoint) in self.acked for s in self.hosted)

    def drop_outputs_where(self, which: Callable[[int], bool]) -> None:
        keys = {k for k in self.outputs if which(k[1])}
        keys |= {k for k in self.working.pin_keys() if which(k[1])}  # working state (§11)
        for key in sorted(keys, key=str):
            self.drop_outputs(key[0], key[1])

    def drop_outputs(self, subtask: SubtaskId, checkpoint: int) -> None:
        """Discard what a subtask wrote for a checkpoint and never acknowledged."""
        self.working.drop_pins(subtask, checkpoint)  # working state (§11): R102
        for e in self.outputs.pop((subtask, checkpoint), ()):
            h = e.handle
            bkey = (subtask, e.name)
            if isinstance(h, FileHandle):
                f = self.catalog.files.get(h.path)
                if f is not None and f.owner == self.actor:
                    self.catalog.delete_file(h.path, self.actor)
                ref = self.backend.get(bkey)
                if ref is not None and ref.entry == e:
                    del self.backend[bkey]
            elif isinstance(h, SegmentHandle):
                seg = self.m.segs.get(h.logical_id)
                if seg is not None and seg.created_for == checkpoint:
                    if seg.last_used <= checkpoint:
                        self._discard(h.logical_id)
                ref = self.backend.get(bkey)
                if ref is not None and ref.entry == e and not ref.confirmed:
                    del self.backend[bkey]

    def _release_dirs(self) -> None:
        """R41: delete a directory only when every checkpoint that reported it aborted."""
        for path in sorted(self.catalog.dirs):
            if self._releasable(path):
                self.catalog.delete_dir(path, self.actor)

    def _releasable(self, path: str) -> bool:
        """R41 for one directory: this TM may delete it now."""
        d = self.catalog.dirs.get(path)
        if d is None or d.creator != self.tm or d.handed_over or not d.used_by:
            return False
        if self.catalog.dir_owner.get(path) != self.actor:
            return False
        if not d.used_by <= self.known_aborted:
            return False
        if any(is_under(p, path) for p in self.m.pfiles):
            return False
        # and nothing else is in it on storage (``Catalog.delete_dir``, R66)
        return not any(is_under(f, path) for f in self.catalog.files)

    # ------------------------------------------------------------------ restore (R61, R62)

    def end_job(self, keep: set[str]) -> None:
        """R90: what no retained checkpoint keeps (logical ids ``keep``) is discarded;
        every open file closes."""
        self.drop_outputs_where(lambda cp: True)
        self.working.close_all()  # working state (§11): R90, R102
        for lid in sorted(lid for lid in self.m.segs if lid not in keep):
            self._discard(lid)
        self.close_open_files()

    def restore(
        self,
        hosted: list[SubtaskId],
        retained: list[tuple[int, tuple[StateEntry, ...]]],
        latest: tuple[int, tuple[StateEntry, ...]] | None,
        lost: frozenset[TmId] = frozenset(),
    ) -> None:
        """R61, R62: take over what retained checkpoints (id, entries; oldest first) use
        in this TM's directories; everything else there that a TM owns and no live writer
        holds is garbage. ``latest`` (the running job's latest completed checkpoint) is
        what the subtasks' backends may reuse. ``lost``: attempts that may still run,
        whose files wait for them (R64)."""
        self.hosted = list(hosted)
        if self.mode is MergingMode.NONE:
            self._reload_backend(hosted, latest)
            return
        managed = [shared_dir(self.job, s) for s in hosted] + [taskowned_dir(self.job, self.tm)]
        keep: dict[str, tuple[StateEntry, int, int]] = {}
        for rid, entries in retained:
            for e in entries:
                h = e.handle
                if isinstance(h, SegmentHandle) and any(is_under(h.path, d) for d in managed):
                    prev = keep.get(h.logical_id)
                    first = rid if prev is None else min(prev[1], rid)
                    keep[h.logical_id] = (e, first, rid)
        m = self.m
        kept: dict[str, PFile] = {}
        for lid, (e, first, last) in sorted(keep.items()):
            h = e.handle
            assert isinstance(h, SegmentHandle)
            pf = kept.get(h.path)
            if pf is None:
                f = self.catalog.files.get(h.path)
                if f is None:
                    # R61: a file another attempt wrote; its size is storage's, its creator
                    # its name's (R64: a delete of it waits while that attempt may run)
                    size = self.catalog.storage.size(h.path)
                    f = StoredFile(size, False, self.actor, creator_of(h.path))
                    self.catalog.files[h.path] = f
                pf = PFile(h.path, h.scope, None, None, False, 0 if f is None else f.size)
                kept[h.path] = pf
            pf.ref_count += 1
            pf.live_bytes += h.length
            m.add(Seg(lid, h.path, h.offset, h.length, first, last, True))
        for path, pf in kept.items():
            m.pfiles[path] = pf
            f = self.catalog.files.get(path)
            if f is not None:
                f.owner = self.actor
        for d in managed:
            md = self.catalog.dirs.get(d)
            if d in self.catalog.dir_owner and self.catalog.dir_owner[d] != COORDINATOR:
                self.catalog.dir_owner[d] = self.actor
                if md is not None:
                    md.creator = self.tm
                    md.used_by = set()
            for path in sorted(p for p in self.catalog.files if is_under(p, d) and p not in kept):
                f = self.catalog.files.get(path)
                if f is None or not f.owner.startswith("tm:"):
                    continue
                if f.owner[3:] in lost:
                    continue  # R64
                f.owner = self.actor
                self.catalog.delete_file(path, self.actor)  # R62
        for path in list(kept):
            self._check_file(path)
        self._reload_backend(hosted, latest)

    def _reload_backend(
        self, hosted: list[SubtaskId], latest: tuple[int, tuple[StateEntry, ...]] | None
    ) -> None:
        if latest is None:
            return
        lid, entries = latest
        hosted_set = set(hosted)
        for e in entries:
            if e.subtask in hosted_set and e.kind is StateKind.KEYED_SHARED:
                h = e.handle
                ok = (isinstance(h, SegmentHandle) and h.logical_id in self.m.segs) or (
                    isinstance(h, FileHandle) and self.mode is MergingMode.NONE
                )
                if ok:
                    self.backend[(e.subtask, e.name)] = BackendRef(e, lid, True)

    # ------------------------------------------------------------------ for a host (parties)

    def flush(self) -> None:
        """Wait until every delete this TM decided has been carried out. Its storage
        deletes in a background thread, which dies with the process: a host calls this
        before it answers a message whose effects it reports, and before its process
        exits, or a delete decided and lost leaves an orphan (R45 keeps only the deletes
        that failed)."""
        self.catalog.storage.drain()

    def kept_files(self) -> tuple[KeptFile, ...]:
        """The files this TM owns, by path, with their sizes and creators: what it would
        hand to the coordinator if its job ended now (R90, ``TmEnded.files``)."""
        return tuple(
            KeptFile(p, f.size, f.creator)
            for p, f in sorted(self.catalog.files.items())
            if f.owner == self.actor
        )

    def held_files(self) -> tuple[str, ...]:
        """Every file this TM records (in its file records or its file-merging tables),
        by path: its answer to ``Holdings`` for every directory (R64)."""
        return tuple(sorted(set(self.catalog.files) | set(self.m.pfiles)))

    def remembered(self, subtask: SubtaskId, name: str) -> StateEntry | None:
        """The entry ``subtask``'s backend remembers uploading as ``name`` (R20), or
        ``None``: what a host compares with the entry the latest completed checkpoint
        holds before it asks ``reuse`` (``backend_ref``)."""
        ref = self.backend.get((subtask, name))
        return None if ref is None else ref.entry

    def detach(self) -> tuple[str, ...]:
        """Give up this process's handles of the TM's open pooled files without closing
        them on storage (every append is durable already), for a host that continues
        this attempt in another process from its records (``export_state``, then
        ``rebuild`` there reopens them); the TM is not used in this process afterwards.
        Local disks only: elsewhere an open file's bytes are its writer process's until
        it closes (R16), so ``ValueError``, nothing given up. Returns the files given
        up, by path."""
        storage = self.catalog.storage
        still_open = tuple(sorted(p for p, f in self.catalog.files.items() if f.open))
        if still_open and storage.protocol not in ("file", "local"):
            raise UsageError(f"{still_open[0]} is still open on {storage.protocol}: not detached")
        for path in still_open:
            storage.abandon(path)
        return still_open

    # working state (§11): the TM's side of its subtasks' live databases, for a host
    # whose database writes its own files (SlateDB) and tells the TM what it uses

    def track_database(self, subtask: SubtaskId, files: Mapping[str, int], lineage: str) -> None:
        """R101, R102: the database of ``subtask`` in the directory ``lineage`` uses
        exactly ``files`` (path -> size) now; what it wrote there since is recorded as
        this attempt's, and each private file it no longer uses and no snapshot pins is
        deleted (``flush`` waits for the deletes). ``ValueError``, nothing recorded, for a
        file outside ``lineage`` it was not opened on (R105)."""
        self.working.track(subtask, files, lineage)

    def close_database(self, subtask: SubtaskId) -> None:
        """R102: the database of ``subtask`` is given up (a restore replaces it): it uses
        nothing from now on, and each private file of it that no pending snapshot pins is
        deleted."""
        self.working.uses.pop(subtask, None)
        self.working.release()

    def snapshot_database(
        self, subtask: SubtaskId, checkpoint: int, inline_below: int, savepoint: bool = False
    ) -> tuple[InPlaceFile, ...]:
        """R103: the snapshot of ``subtask``'s database for ``checkpoint``: each file
        smaller than ``inline_below`` (every file, for a savepoint, R55) written as shared
        state ``db:<file>`` (``write``), every other file referred to in place and pinned
        until the acknowledgement carries it. Returns the files referred to in place. A
        ``StorageFault`` is the host's, as from ``write``: the subtask declines (R17)."""

        def write(name: str, data: bytes) -> object:
            return self.write(
                subtask, checkpoint, StateKind.KEYED_SHARED, name, len(data), 1, data, savepoint
            )

        self.working.snapshot(subtask, checkpoint, inline_below, savepoint, write)
        w = self.working
        return tuple(w.known[p] for p in w.pins.get((subtask, checkpoint), ()))

    def database_files(self) -> tuple[str, ...]:
        """The files this TM's databases use, by path: its answer to ``DatabaseFiles``
        (R104)."""
        return self.working.in_use()

    def pinned_files(self) -> tuple[str, ...]:
        """The files an unacknowledged snapshot of this TM refers to in place, by path
        (R103: none of them is deleted until the snapshot is acknowledged or dropped)."""
        return tuple(sorted({p for ps in self.working.pins.values() for p in ps}))

    def working_files(self) -> Mapping[str, InPlaceFile]:
        """Every working file a database of this TM uses or a snapshot pins, with its size
        and key groups (read-only): what a host need not list storage for."""
        return MappingProxyType(self.working.known)


class _OwnView:
    """What the guards of a TM's own records ask (``CatalogHost``): the TM deletes only
    under its job's base and in savepoints it was told of, and a delete of a file another
    attempt created waits while the TM knows that attempt may still run (R64: told by
    ``TmAssignment.lost``, released by ``LostAttemptStopped``)."""

    def __init__(self, job: str) -> None:
        self._bases = {job_base(job), SAVEPOINTS}
        self._job = job
        self.party: TaskManager | None = None

    @property
    def bases(self) -> set[str]:
        return self._bases

    @property
    def triggered_savepoints(self) -> set[int]:
        return set() if self.party is None else self.party.savepoints

    @property
    def tms(self) -> dict[TmId, Tm]:
        lost = () if self.party is None else self.party.lost
        return {t: Tm(t, Status.LOST) for t in lost}

    def hot_dirs(self) -> frozenset[str]:
        """Directories about to be written again: the hosted subtasks' shared ones."""
        hosted = [] if self.party is None else self.party.hosted
        hot = {shared_dir(self._job, s) for s in hosted}
        hot |= {d.rsplit("/", 1)[0] for d in hot}
        return frozenset(hot | {f"{job_base(self._job)}/taskowned", SAVEPOINTS})
