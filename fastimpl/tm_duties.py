"""A TM's duties from the coordinator (R60-R66, R72, R90, R104, R105), each applied
once: a failover's reset (R60) and assignment, which restarts the TM from the retained
checkpoints (R61, R62); the attempts that may still run and the word that they stopped
(R64); the claimed files the backends may reuse (R72); what the TM records under some
directories (R64); its databases' files (R104, R105); and the end of the job, when it
hands what remains to the coordinator (R90).
"""

from __future__ import annotations

from fastimpl.ids import creator_of
from fastimpl.records import BackendRef, ManagedDir, PFile, Seg, StoredFile
from fastimpl.tm_attempt import TmAttempt
from fastimpl.tm_files import TmFiles
from spec.config import MergingMode, StateKind
from spec.effects import COORDINATOR
from spec.errors import UsageError
from spec.handles import FileHandle, SegmentHandle, StateEntry, extent_of, stream_of
from spec.ids import SubtaskId, TmId
from spec.layout import is_under, shared_dir, taskowned_dir
from spec.messages import (
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


class TmDuties:
    """The duties of the attempt ``a``, applied to it and its ``files``."""

    def __init__(self, a: TmAttempt, files: TmFiles) -> None:
        self.a = a
        self.files = files

    def on_duty(self, msg: Duty) -> TmEnded | Held | InUse | None:
        """Apply one of the coordinator's duties (``spec.messages``) to this TM's records;
        each is applied once, so a duty repeated or arriving after a newer one changes
        nothing. ``EndJob`` is answered with what the TM hands over (``TmEnded``),
        ``Holdings`` with the files it records under the directories asked (``Held``)."""
        a = self.a
        if msg.tm != a.tm or msg.job != a.job:
            raise UsageError(f"{type(msg).__name__} for {msg.tm} of {msg.job} reached {a.tm}")
        if isinstance(msg, Holdings):
            return self.holdings(msg)
        if isinstance(msg, DatabaseFiles):  # working state (§11): R104
            return InUse(a.job, a.tm, () if a.ended else a.working.in_use())
        if a.ended is not None:
            return a.ended if isinstance(msg, EndJob) else None  # the job is over here
        if isinstance(msg, OpenDatabase):  # working state (§11): R105
            a.working.open(msg, self._read_segment)
            return None
        if isinstance(msg, DatabasesOpened):  # working state (§11): R62, R102
            a.working.release()
            return None
        if isinstance(msg, LostAttemptStopped):
            a.lost.discard(msg.stopped)
            a.catalog.release_waits(msg.stopped)  # R64: its deletes that waited run
            if a.mode is not MergingMode.NONE:  # R40: what it made there may stay (R64)
                for s in a.hosted:
                    a.catalog.sees_dir(shared_dir(a.job, s), True)
        elif isinstance(msg, ResetTm):
            if msg.epoch > max(a.reset_epoch, a.assigned_epoch):
                a.reset_epoch = msg.epoch
                self.reset()
        elif isinstance(msg, TmAssignment):
            self.on_assignment(msg)
        elif isinstance(msg, ReusableFiles):
            if msg.epoch >= a.assigned_epoch:
                hosted = set(a.hosted)
                for e in msg.entries:  # R72: the claimed files the backends may reuse
                    if e.subtask in hosted:
                        a.backend[(e.subtask, e.name)] = BackendRef(e, msg.checkpoint, True)
        else:
            return self.end(msg)
        return None

    def _read_segment(self, e: StateEntry) -> bytes:
        """The bytes of a restored handle (a small working file's segment, R105)."""
        s = stream_of(e.handle)
        assert s is not None
        return self.a.catalog.storage.read_range(*extent_of(s))

    def holdings(self, msg: Holdings) -> Held:
        """The files this TM records under the directories asked, and those of the
        directories asked that it owns: R64's sweep of what a stopped attempt left leaves
        these alone."""
        a = self.a
        dirs = msg.directories
        paths = [p for p in a.catalog.files if any(is_under(p, d) for d in dirs)]
        paths += [p for p in a.m.pfiles if any(is_under(p, d) for d in dirs)]
        paths += [d for d in dirs if a.catalog.dir_owner.get(d) == a.actor]  # R40
        return Held(a.job, a.tm, tuple(sorted(set(paths))))

    def reset(self) -> None:
        """R60: drop what was written and never acknowledged, close the open files (they
        stay on storage, still this TM's) and forget the tables: no stale manager
        survives a failover (FLINK-35400)."""
        a = self.a
        self.files.drop_outputs_where(lambda cp: True)
        for path in sorted(a.m.pfiles):
            if a.m.pfiles[path].open:
                a.catalog.close(path)
        a.forget()

    def on_assignment(self, msg: TmAssignment) -> None:
        """R60-R62: restart from the retained checkpoints (a reset first, if this
        failover's ``ResetTm`` has not been applied: a new TM has nothing to reset)."""
        a = self.a
        if msg.epoch <= a.assigned_epoch:
            return
        if msg.epoch > a.reset_epoch:
            a.reset_epoch = msg.epoch
            self.reset()
        a.assigned_epoch = msg.epoch
        a.lost = set(msg.lost)
        a.restart_knowledge(
            msg.latest_completed, msg.finished_mark, msg.subsumed, msg.first_checkpoint
        )
        # R66: a replacement starts for the pending checkpoints; those between that are over
        a.known_aborted |= msg.aborted
        a.finished_savepoints |= msg.finished_savepoints
        a.savepoints |= msg.finished_savepoints
        cat = a.catalog
        for d in msg.taken_over:  # R61: the coordinator's word that it is not its own
            # unless this TM deleted it (R41) before the coordinator heard (R40)
            if d not in cat.dir_owner and cat.storage.exists_dir(d):
                cat.dir_owner[d] = a.actor
                cat.dirs[d] = ManagedDir(d, a.tm)
        for d in msg.handed_over:  # R42: written in, never deleted by this TM
            cat.dir_owner[d] = COORDINATOR
            md = cat.dirs.setdefault(d, ManagedDir(d, a.tm))
            md.handed_over = True
        for k in msg.files:  # R61: handed with its record by the coordinator
            if k.path not in a.catalog.files:
                a.catalog.files[k.path] = StoredFile(k.size, False, a.actor, k.creator)
        latest = None if msg.latest is None else (msg.latest.checkpoint, msg.latest.entries)
        retained = [(r.checkpoint, r.entries) for r in msg.retained]
        self.restore(list(msg.hosted), retained, latest, msg.lost)

    def end(self, msg: EndJob) -> TmEnded:
        """R90: discard what no retained checkpoint keeps, close every file, and hand
        what remains to the coordinator (``TmEnded``) and forget it (the coordinator
        deletes the directories no completed checkpoint used, with everything in them,
        from what the answer lists)."""
        a = self.a
        self.end_job(set(msg.keep))
        cat = a.catalog
        files = tuple(
            KeptFile(p, f.size, f.creator)
            for p, f in sorted(cat.files.items())
            if f.owner == a.actor
        )
        dirs = tuple(sorted(p for p, o in cat.dir_owner.items() if o == a.actor))
        waiting = tuple(WaitingDelete(d.path, d.is_dir, d.waits_for) for d in cat.deferred)
        cat.deferred = []
        for k in files:
            cat.files.pop(k.path, None)
        for d in dirs:
            del cat.dir_owner[d]
            cat.dirs.pop(d, None)
        a.ended = TmEnded(a.job, a.tm, files, dirs, waiting)
        return a.ended

    def end_job(self, keep: set[str]) -> None:
        """R90: what no retained checkpoint keeps (logical ids ``keep``) is discarded;
        every open file closes."""
        self.files.drop_outputs_where(lambda cp: True)
        self.a.working.close_all()  # working state (§11): R90, R102
        self.files.discard_all([lid for lid in self.a.m.segs if lid not in keep])
        self.files.close_open_files()

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
        a = self.a
        a.hosted = list(hosted)
        if a.mode is MergingMode.NONE:
            self._reload_backend(hosted, latest)
            return
        managed = [shared_dir(a.job, s) for s in hosted] + [taskowned_dir(a.job, a.tm)]
        keep: dict[str, tuple[StateEntry, int, int]] = {}
        for rid, entries in retained:
            for e in entries:
                h = e.handle
                if isinstance(h, SegmentHandle) and any(is_under(h.path, d) for d in managed):
                    prev = keep.get(h.logical_id)
                    first = rid if prev is None else min(prev[1], rid)
                    keep[h.logical_id] = (e, first, rid)
        m = a.m
        kept: dict[str, PFile] = {}
        for lid, (e, first, last) in sorted(keep.items()):
            h = e.handle
            assert isinstance(h, SegmentHandle)
            pf = kept.get(h.path)
            if pf is None:
                f = a.catalog.files.get(h.path)
                if f is None:
                    # R61: a file another attempt wrote; its size is storage's, its creator
                    # its name's (R64: a delete of it waits while that attempt may run)
                    size = a.catalog.storage.size(h.path)
                    f = StoredFile(size, False, a.actor, creator_of(h.path))
                    a.catalog.files[h.path] = f
                pf = PFile(h.path, h.scope, None, None, False, 0 if f is None else f.size)
                kept[h.path] = pf
            pf.ref_count += 1
            pf.live_bytes += h.length
            m.add(Seg(lid, h.path, h.offset, h.length, first, last, True))
        for path, pf in kept.items():
            m.pfiles[path] = pf
            f = a.catalog.files.get(path)
            if f is not None:
                f.owner = a.actor
        for d in managed:
            md = a.catalog.dirs.get(d)
            if d in a.catalog.dir_owner and a.catalog.dir_owner[d] != COORDINATOR:
                a.catalog.dir_owner[d] = a.actor
                if md is not None:
                    md.creator = a.tm
                    md.used_by = set()
            for path in sorted(p for p in a.catalog.files if is_under(p, d) and p not in kept):
                f = a.catalog.files.get(path)
                if f is None or not f.owner.startswith("tm:"):
                    continue
                if f.owner[3:] in lost:
                    continue  # R64
                f.owner = a.actor
                a.catalog.delete_file(path, a.actor)  # R62
        for path in list(kept):
            self.files._check_file(path)
        self._reload_backend(hosted, latest)

    def _reload_backend(
        self, hosted: list[SubtaskId], latest: tuple[int, tuple[StateEntry, ...]] | None
    ) -> None:
        a = self.a
        if latest is None:
            return
        lid, entries = latest
        hosted_set = set(hosted)
        for e in entries:
            if e.subtask in hosted_set and e.kind is StateKind.KEYED_SHARED:
                h = e.handle
                ok = (isinstance(h, SegmentHandle) and h.logical_id in a.m.segs) or (
                    isinstance(h, FileHandle) and a.mode is MergingMode.NONE
                )
                if ok:
                    a.backend[(e.subtask, e.name)] = BackendRef(e, lid, True)
