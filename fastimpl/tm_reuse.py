"""A TM's reuse of incremental state (R20-R23): what a subtask's backend remembers
uploading, and the old handle (its segment's last use advanced) or a placeholder when
that upload may be referred to again, instead of writing it anew.
"""

from __future__ import annotations

from fastimpl.records import BackendRef
from fastimpl.tm_attempt import TmAttempt
from spec.config import MergingMode
from spec.errors import CommandError, Reason
from spec.handles import FileHandle, PlaceholderHandle, SegmentHandle, StateEntry, stream_of
from spec.ids import SubtaskId


class TmReuse:
    """The reuse decisions of the attempt ``a``."""

    def __init__(self, a: TmAttempt) -> None:
        self.a = a

    def backend_ref(self, subtask: SubtaskId, name: str) -> BackendRef:
        ref = self.a.backend.get((subtask, name))
        if ref is None:
            raise CommandError(
                Reason.NO_SUCH_STATE, f"{subtask} on {self.a.tm} has no shared state {name!r}"
            )
        return ref

    def remembered(self, subtask: SubtaskId, name: str) -> StateEntry | None:
        """The entry ``subtask``'s backend remembers uploading as ``name`` (R20), or
        ``None``: what a host compares with the entry the latest completed checkpoint
        holds before it asks ``reuse`` (``backend_ref``)."""
        ref = self.a.backend.get((subtask, name))
        return None if ref is None else ref.entry

    def reuse(
        self, subtask: SubtaskId, checkpoint: int, ref: BackendRef, savepoint: bool = False
    ) -> StateEntry | None:
        """R21, R22: the old handle (its segment's last use advanced) or a placeholder,
        when the old upload may be reused; ``None`` when it must be uploaded again."""
        a = self.a
        a.note(checkpoint, savepoint)
        if a.is_savepoint(checkpoint) or not self._reusable(ref):
            return None
        old = ref.entry
        h = old.handle
        if isinstance(h, SegmentHandle):
            seg = a.m.segs[h.logical_id]
            a.m.touch(seg, max(seg.last_used, checkpoint))  # R21
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
        a.outputs.setdefault((subtask, checkpoint), []).append(entry)
        a.backend[(subtask, entry.name)] = BackendRef(
            ref.entry, max(ref.checkpoint, checkpoint), ref.confirmed
        )
        return entry

    def _reusable(self, ref: BackendRef) -> bool:
        if not ref.confirmed:
            return False
        h = ref.entry.handle
        m = self.a.m
        if isinstance(h, SegmentHandle):
            if h.logical_id not in m.segs:
                return False
            pf = m.pfiles.get(h.path)
            return pf is not None and pf.reusable
        return isinstance(h, FileHandle) and self.a.mode is MergingMode.NONE
