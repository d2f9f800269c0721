"""A TM's writes (R10-R17): one file per handle where nothing is merged or for a
savepoint (R11, R55), else segments appended to pooled files (R12, R13) in the managed
directories it creates (R40); a write that failed poisons its file and the subtask
declines (R17); an acknowledgement reports what was written and the managed directories
(R40, R41) and hands its whole files to the coordinator (R43).
"""

from __future__ import annotations

from fastimpl.records import BackendRef, PFile, PoolKey, Seg
from fastimpl.storage import StorageFault
from fastimpl.tm_attempt import SubtaskFacts, TmAttempt
from fastimpl.tm_files import TmFiles
from spec.commands import StorageOp
from spec.config import MergingMode, Scope, StateKind
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    InlineHandle,
    SegmentHandle,
    StateEntry,
    stream_of,
)
from spec.ids import SubtaskId
from spec.layout import checkpoint_dir, savepoint_dir, shared_dir, taskowned_dir
from spec.messages import Acknowledgement

_SHARED = Scope.SHARED.value
_EXCLUSIVE = Scope.EXCLUSIVE.value


class TmWriter:
    """The writes and acknowledgements of the attempt ``a``, over its ``files``."""

    def __init__(self, a: TmAttempt, files: TmFiles) -> None:
        self.a = a
        self.files = files

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
        self.a.note(checkpoint, savepoint)
        entry = self._write_stream(subtask, checkpoint, kind, name, size, entries, data)
        self._add_output(subtask, checkpoint, entry)
        return entry

    def _add_output(self, subtask: SubtaskId, checkpoint: int, e: StateEntry) -> None:
        a = self.a
        out = a.outputs.get((subtask, checkpoint))
        if out is None:
            out = a.outputs[(subtask, checkpoint)] = []
        out.append(e)
        if e.kind is StateKind.KEYED_SHARED and checkpoint not in a.savepoints:
            a.backend[(subtask, e.name)] = BackendRef(e, checkpoint, False)

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
        a = self.a
        actor = a.actor
        catalog = a.catalog
        lid = a.ids.logical_id()
        facts = a.facts(subtask)
        kg = facts.key_groups if kind.keyed else None
        scope = kind.scope
        if scope is Scope.EXCLUSIVE and size < a.cfg.inline_threshold:
            # R107: small private state travels in its handle; no file, nothing to own
            if partial:
                raise StorageFault(StorageOp.APPEND, "")  # the process died; nothing stored
            inline = InlineHandle.of(data, lid)
            return StateEntry(subtask, kind, name, inline, entries, kg)
        savepoint = a.is_savepoint(checkpoint)
        if savepoint or a.mode is MergingMode.NONE:
            # R11, R55: one file per handle, the writing TM's until acknowledged
            if savepoint:
                directory = savepoint_dir(checkpoint)
            elif scope is Scope.SHARED:
                directory = shared_dir(a.job, subtask)
            else:
                directory = checkpoint_dir(a.job, checkpoint)
            path = catalog.new_file_name(directory)
            catalog.create(path, actor, a.tm)
            try:
                catalog.append(path, data)
            except StorageFault:
                catalog.close(path)
                catalog.delete_file(path, actor)
                raise
            if partial:
                raise StorageFault(StorageOp.APPEND, path)
            catalog.close(path)  # R12: durable before the handle exists
            return StateEntry(subtask, kind, name, FileHandle(path, size, lid, scope), entries, kg)
        path, offset, pf = self._append_segment(facts, checkpoint, scope, size, partial, data)
        a.m.add(Seg(lid, path, offset, size, checkpoint, checkpoint, False))
        pf.ref_count += 1
        pf.live_bytes += size
        if pf.open and pf.size >= a.cfg.max_file_size:
            self.files._close_pfile(path)  # R12: roll at max file size
        handle = SegmentHandle(path, offset, size, lid, scope)
        return StateEntry(subtask, kind, name, handle, entries, kg)

    def _pool_key(self, facts: SubtaskFacts, checkpoint: int, scope: Scope) -> PoolKey:
        """R13: SHARED merged per subtask, EXCLUSIVE per TM; WITHIN pools per checkpoint.
        A subtask's SHARED key is built once per checkpoint, not once per append."""
        shared = scope is Scope.SHARED
        if shared and facts.pool_checkpoint == checkpoint and facts.pool_key is not None:
            return facts.pool_key
        tm = self.a.tm
        prefix = (tm, _SHARED, facts.name) if shared else (tm, _EXCLUSIVE, tm)
        if self.a.mode is MergingMode.WITHIN_CHECKPOINT:
            key = (*prefix, str(checkpoint))
        else:
            key = (*prefix, "*")
        if shared:
            facts.pool_checkpoint, facts.pool_key = checkpoint, key
        return key

    def _append_segment(
        self,
        facts: SubtaskFacts,
        checkpoint: int,
        scope: Scope,
        size: int,
        partial: bool,
        data: bytes,
    ) -> tuple[str, int, PFile]:
        """Append ``data`` to the pool's open file (a new one if there is none or it
        would grow past the size): its path, the offset, its record."""
        a = self.a
        catalog = a.catalog
        key = self._pool_key(facts, checkpoint, scope)
        directory = facts.directory if scope is Scope.SHARED else a.taskowned
        catalog.mkdir(directory, a.actor, a.tm)  # R40
        m = a.m
        path = m.pools.get(key)
        pf = None if path is None else m.pfiles[path]
        if pf is not None and pf.size > 0 and pf.size + size > a.cfg.max_file_size:
            self.files._close_pfile(pf.path)  # R12: roll before exceeding the size
            pf = None
        if pf is None:
            path = catalog.new_file_name(directory)
            catalog.create(path, a.actor, a.tm)
            cp = checkpoint if key[3] != "*" else None
            pf = m.pfiles[path] = PFile(path, scope, key, cp, True, 0)
            m.pools[key] = path
        path = pf.path
        try:
            offset = catalog.append(path, data)
        except StorageFault:
            self._poison(path)
            raise
        pf.size += len(data)
        if partial:
            raise StorageFault(StorageOp.APPEND, path)
        return path, offset, pf

    def _poison(self, path: str) -> None:
        """R17: a file whose write failed is closed and never written or reused again."""
        self.a.m.pfiles[path].reusable = False
        self.files._close_pfile(path)

    def write_failed(self, subtask: SubtaskId, checkpoint: int, savepoint: bool = False) -> None:
        """R17: the subtask declines and writes no more for the checkpoint (R14); the
        caller sends the ``Decline``."""
        self.a.note(checkpoint, savepoint)
        self.files.drop_outputs(subtask, checkpoint)
        self.a.acked[(subtask, checkpoint)] = ()
        self.files.close_within_files(lambda cp: cp == checkpoint, subtask)

    def acknowledge(
        self, subtask: SubtaskId, checkpoint: int, savepoint: bool = False
    ) -> tuple[tuple[StateEntry, ...], Acknowledgement]:
        """What the subtask wrote, plus the managed directories that exist (R40), as the
        message to the coordinator; the subtask's WITHIN files close (R14). Raises
        ``StorageFault`` (the subtask declines, R17) if a handle names bytes whose upload
        failed."""
        a = self.a
        catalog = a.catalog
        a.note(checkpoint, savepoint)
        key = (subtask, checkpoint)
        in_place = a.working.unpin(subtask, checkpoint)  # working state (§11): R103
        written = tuple(a.outputs.pop(key, ()))
        entries = list(written)
        if a.mode is not MergingMode.NONE and not a.is_savepoint(checkpoint):
            # R40: every acknowledgement reports the managed directories that exist
            shared = shared_dir(a.job, subtask)
            for directory in (shared, taskowned_dir(a.job, a.tm)):
                # a lost attempt of the subtask may make or delete its shared one (R64, R66)
                if catalog.sees_dir(directory, directory == shared and bool(a.lost)):
                    d = catalog.dirs[directory]
                    if d.creator == a.tm and not d.handed_over:  # R41; once handed over,
                        d.used_by.add(checkpoint)  # the coordinator's (R42)
                    entries.append(
                        StateEntry(subtask, StateKind.CHANNEL, "dir", DirectoryHandle(directory), 0)
                    )
        a.acked[key] = tuple(entries)
        self.files.close_within_files(lambda cp: cp == checkpoint, subtask)
        failed = catalog.failed_uploads
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
                catalog.files.pop(e.handle.path, None)
        a.working.handed_over(f.path for f in in_place)  # working state (§11)
        ack = Acknowledgement(a.job, checkpoint, subtask, a.tm, tuple(entries), in_place)
        return written, ack
