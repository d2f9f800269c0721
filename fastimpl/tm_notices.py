"""What a TM does with the coordinator's notices (R30-R35), which may arrive in any
order, twice or never (R34): a completion discards the segments used up to its watermark
(R31), confirms what the subtasks acknowledged as their backends' baseline (R23) and
hands the directories it used to the coordinator (R42); an abort discards what the
checkpoint created (R32) and releases the directories only aborted checkpoints used
(R41); savepoints end with their own notice or once a completion no longer lists them
as pending (R35).
"""

from __future__ import annotations

from fastimpl.tm_attempt import BackendKey, TmAttempt
from fastimpl.tm_files import TmFiles
from spec.config import StateKind
from spec.effects import COORDINATOR
from spec.handles import PlaceholderHandle, SegmentHandle, StateEntry
from spec.ids import SubtaskId
from spec.messages import CheckpointAborted, CheckpointComplete


class TmNotices:
    """The notices the attempt ``a`` hears, applied to it and its ``files``."""

    def __init__(self, a: TmAttempt, files: TmFiles) -> None:
        self.a = a
        self.files = files

    def on_notice(self, msg: CheckpointComplete | CheckpointAborted) -> None:
        """R34: any notice may arrive at any time, twice or never; each is idempotent."""
        a = self.a
        a.note(msg.checkpoint, msg.savepoint)
        if isinstance(msg, CheckpointComplete):
            a.savepoints |= msg.pending_savepoints
            self._tm_complete(msg.checkpoint, msg.subsumed, msg.savepoint)
            if not msg.savepoint:
                self._finish_savepoints(msg.checkpoint, msg.pending_savepoints)
        else:
            self._tm_abort(msg.checkpoint, msg.latest_completed, msg.savepoint)

    def _finish_savepoints(self, checkpoint: int, still_open: frozenset[int]) -> None:
        """R35: savepoints up to c that are not listed as pending are finished."""
        a = self.a
        mine = {k[1] for k in a.outputs} | {k[1] for k in a.acked}
        done = sorted(
            sp for sp in mine if sp <= checkpoint and sp not in still_open and a.is_savepoint(sp)
        )
        for sp in done:
            self._savepoint_finished(sp)

    def _savepoint_finished(self, savepoint: int) -> None:
        a = self.a
        a.finished_savepoints.add(savepoint)
        self.files.drop_outputs_where(lambda cp: cp == savepoint)
        for key in [k for k in a.acked if k[1] == savepoint]:
            del a.acked[key]

    def _tm_complete(self, checkpoint: int, watermark: int, savepoint: bool) -> None:
        if savepoint:
            self._savepoint_finished(checkpoint)  # R35
            return
        a = self.a
        a.known_completed = max(a.known_completed, checkpoint)
        a.finished_mark = max(a.finished_mark, checkpoint)
        self._handed_over(checkpoint)
        a.known_watermark = max(a.known_watermark, watermark)
        self._confirm(checkpoint)
        self.files.discard_all(a.m.used_up_to(watermark))  # R31
        is_sp = a.is_savepoint
        self.files.drop_outputs_where(lambda cp: cp <= checkpoint and not is_sp(cp))
        self.files.close_within_files(lambda cp: cp <= checkpoint)
        self._forget_settled_aborts()

    def _handed_over(self, checkpoint: int) -> None:
        """R42, learnt from the notice: a directory this TM reported for a checkpoint
        that completed is the coordinator's (its segment files stay the TM's)."""
        a = self.a
        for path, d in sorted(a.catalog.dirs.items()):
            if d.creator == a.tm and not d.handed_over and checkpoint in d.used_by:
                d.handed_over = True
                a.catalog.dir_owner[path] = COORDINATOR

    def _forget_settled_aborts(self) -> None:
        """Keep the aborts a TM heard only while they still decide something: whether a
        write is late (not once the checkpoint is below the finished mark, or a finished
        savepoint) and whether a directory it made may go (R41, while one of its
        directories that was not handed over lists the checkpoint). Without this the
        set grows with every abort the job ever had."""
        a = self.a
        if not a.known_aborted:
            return
        listed = {
            cp
            for d in a.catalog.dirs.values()
            if d.creator == a.tm and not d.handed_over
            for cp in d.used_by
        }
        is_sp = a.is_savepoint
        a.known_aborted = {
            cp
            for cp in a.known_aborted
            if cp in listed
            or not (cp in a.finished_savepoints or (cp <= a.finished_mark and not is_sp(cp)))
        }

    def _tm_abort(self, checkpoint: int, latest_completed: int, savepoint: bool) -> None:
        a = self.a
        a.known_aborted.add(checkpoint)
        a.known_completed = max(a.known_completed, latest_completed)
        if latest_completed:
            self._confirm(latest_completed)  # R32
        self.files.discard_all(a.m.created_for(checkpoint))
        self.files.drop_outputs_where(lambda cp: cp == checkpoint)
        self.files.close_within_files(lambda cp: cp == checkpoint)
        if savepoint:
            self._savepoint_finished(checkpoint)
        else:
            self.files._release_dirs()

    def _confirm(self, checkpoint: int) -> None:
        """R23: what a subtask acknowledged for a completed checkpoint becomes its baseline.

        One pass over the backends' records for all the subtasks that acknowledged it
        (each record is one subtask's, so the order of the subtasks does not matter)."""
        a = self.a
        names_of: dict[SubtaskId, dict[str, StateEntry]] = {}
        for (subtask, cp), entries in a.acked.items():
            if cp == checkpoint:
                names_of[subtask] = {e.name: e for e in entries if e.kind is StateKind.KEYED_SHARED}
        if names_of:
            gone: list[BackendKey] = []
            for bkey, ref in a.backend.items():
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
                del a.backend[bkey]
            segs = a.m.segs
            for names in names_of.values():
                for e in names.values():
                    h = e.handle
                    if isinstance(h, SegmentHandle):
                        seg = segs.get(h.logical_id)
                        if seg is not None:
                            seg.confirmed = True
        is_sp = a.is_savepoint
        for key in [k for k in a.acked if k[1] < checkpoint]:
            if not is_sp(key[1]):
                del a.acked[key]
