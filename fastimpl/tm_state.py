"""A TM's records as data (``spec.tm_state``), and a TM rebuilt from them.

``export_state`` reads a ``TaskManager`` with records of its own (``TaskManager.alone``)
into a ``spec.tm_state.TaskManagerState``; ``rebuild`` makes a TM of this process from
one: a fresh ``Storage`` (with the host's hooks, if any) and ids of this process, every
record as it was, the open pooled files taken up again (``Storage.reopen``: local disks
only, R16). The pair is exact: a TM rebuilt from a state exports that same state, and
acts from then on as the TM it was exported from would have (the order of its
dictionaries included, where a report shows it).

What is not exported is what belongs to the process, not to the TM: the storage's open
handles (the exporting host abandons them, ``Storage.abandon``), its queued background
deletes (drained before a state is taken: a queued delete is in neither), its counters,
armed faults and lease, and the id source (``ids``: a rebuilt TM draws new names, which
is safe as every name is unique across processes).
"""

from __future__ import annotations

from typing import Any

from fastimpl.catalog import RefusedDelete
from fastimpl.ids import IdSource
from fastimpl.records import BackendRef, Deferred, ManagedDir, PFile, Seg, StoredFile
from fastimpl.storage import DeleteFailure
from fastimpl.storage_hooks import StorageHooks
from fastimpl.taskmanager import TaskManager
from spec import tm_state as t
from spec.errors import CkptError, UsageError
from spec.ids import SubtaskId


class EarlierError(CkptError):
    """The error of a failed delete (R45) that another process of the TM met: only its
    text travels with the state."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _error_text(error: BaseException) -> str:
    return error.text if isinstance(error, EarlierError) else repr(error)


def _opened_order(o: tuple[int, SubtaskId]) -> tuple[int, str, int, int]:
    epoch, s = o
    return epoch, s.vertex, s.index, s.parallelism


def export_state(tm: TaskManager) -> t.TaskManagerState:
    """The records of ``tm``. Its storage should have no queued delete
    (``Storage.drain``): a queued delete is in no record."""
    cat = tm.catalog
    m = tm.m
    w = tm.working
    for path, d in cat.dirs.items():
        if d.path != path:
            raise UsageError(f"directory record {path} names {d.path}")
    for path, pf in m.pfiles.items():
        if pf.path != path:
            raise UsageError(f"physical file record {path} names {pf.path}")
    for lid, seg in m.segs.items():
        if seg.logical_id != lid:
            raise UsageError(f"segment record {lid} names {seg.logical_id}")
    for path, k in w.known.items():
        if k.path != path:
            raise UsageError(f"working file record {path} names {k.path}")
    deletions = None if cat.deletions is None else tuple(cat.deletions)
    return t.TaskManagerState(
        job=tm.job,
        tm=tm.tm,
        config=tm.cfg,
        first_checkpoint=tm.first_checkpoint,
        hosted=tuple(tm.hosted),
        savepoints=tuple(sorted(tm.savepoints)),
        known_completed=tm.known_completed,
        finished_mark=tm.finished_mark,
        known_aborted=tuple(sorted(tm.known_aborted)),
        known_watermark=tm.known_watermark,
        finished_savepoints=tuple(sorted(tm.finished_savepoints)),
        reset_epoch=tm.reset_epoch,
        assigned_epoch=tm.assigned_epoch,
        lost=tuple(sorted(tm.lost)),
        ended=tm.ended,
        files=tuple(
            t.FileRecord(p, f.size, f.open, f.owner, f.creator) for p, f in cat.files.items()
        ),
        directories=tuple(
            t.DirectoryRecord(p, d.creator, tuple(sorted(d.used_by)), d.handed_over)
            for p, d in cat.dirs.items()
        ),
        directory_owners=tuple(t.DirectoryOwner(p, o) for p, o in cat.dir_owner.items()),
        failed_uploads=tuple(sorted(cat.failed_uploads)),
        deferred_deletes=tuple(
            t.DeferredDelete(d.actor, d.path, d.is_dir, d.waits_for) for d in cat.deferred
        ),
        refused_deletes=tuple(
            t.RefusedDelete(r.path, r.actor, r.is_dir, r.reason) for r in cat.refused_deletes
        ),
        failed_deletes=tuple(
            t.FailedDelete(
                f.path,
                f.is_dir,
                _error_text(f.error),
                f.attempts,
                tuple(t.DeletedBy(p, a) for p, a in f.deleted_by.items()),
            )
            for f in cat.storage.failed_deletes.values()
        ),
        bad_deletions=tuple(cat.bad_deletions),
        deletions=deletions,
        segments=tuple(
            t.SegmentRecord(
                s.logical_id, s.path, s.offset, s.length, s.created_for, s.last_used, s.confirmed
            )
            for s in m.segs.values()
        ),
        physical_files=tuple(
            t.PhysicalFile(
                pf.path,
                pf.scope,
                pf.pool_key,
                pf.checkpoint,
                pf.open,
                pf.size,
                pf.ref_count,
                pf.live_bytes,
                pf.reusable,
            )
            for pf in m.pfiles.values()
        ),
        pools=tuple(t.Pool(k, p) for k, p in m.pools.items()),
        outputs=tuple(t.Written(s, cp, tuple(es)) for (s, cp), es in tm.outputs.items()),
        acked=tuple(t.Written(s, cp, es) for (s, cp), es in tm.acked.items()),
        backend=tuple(
            t.BackendRecord(s, name, ref.entry, ref.checkpoint, ref.confirmed)
            for (s, name), ref in tm.backend.items()
        ),
        subtask_pools=tuple(
            t.SubtaskPool(s, f.pool_checkpoint, f.pool_key) for s, f in tm._per_subtask.items()
        ),
        working=t.WorkingRecords(
            uses=tuple(t.DatabaseUse(s, tuple(sorted(ps))) for s, ps in w.uses.items()),
            pins=tuple(t.Pin(s, cp, ps) for (s, cp), ps in w.pins.items()),
            known=tuple(w.known.values()),
            written=tuple(sorted(w.written)),
            opened=tuple(t.Opened(e, s) for e, s in sorted(w.opened, key=_opened_order)),
            users=tuple(sorted(w.users)),
        ),
    )


def rebuild(
    state: t.TaskManagerState,
    storage: Any,
    root: str,
    *,
    ids: IdSource | None = None,
    hooks: StorageHooks | None = None,
) -> TaskManager:
    """The TM ``state`` is of, in this process: built as ``TaskManager.alone`` builds
    one (``storage``, ``root``, ``ids`` and ``hooks`` as there), then given every record
    of ``state``; its open pooled files are reopened (``Storage.reopen``: a file that is
    gone, or storage that is not a local disk, raises)."""
    r = state
    tm = TaskManager.alone(
        storage, root, r.config, r.job, r.tm,
        ids=ids, first_checkpoint=r.first_checkpoint, hooks=hooks,
    )  # fmt: skip
    tm.hosted = list(r.hosted)
    tm.savepoints = set(r.savepoints)
    tm.known_completed = r.known_completed
    tm.finished_mark = r.finished_mark
    tm.known_aborted = set(r.known_aborted)
    tm.known_watermark = r.known_watermark
    tm.finished_savepoints = set(r.finished_savepoints)
    tm.reset_epoch = r.reset_epoch
    tm.assigned_epoch = r.assigned_epoch
    tm.lost = set(r.lost)
    tm.ended = r.ended

    cat = tm.catalog
    cat.files = {f.path: StoredFile(f.size, f.open, f.owner, f.creator) for f in r.files}
    cat.dirs = {}
    for d in r.directories:
        md = ManagedDir(d.path, d.creator)
        md.used_by = set(d.used_by)
        md.handed_over = d.handed_over
        cat.dirs[d.path] = md
    cat.dir_owner = {d.path: d.owner for d in r.directory_owners}
    cat.failed_uploads = set(r.failed_uploads)
    cat.deferred = [Deferred(d.actor, d.path, d.is_dir, d.waits_for) for d in r.deferred_deletes]
    cat.refused_deletes = [
        RefusedDelete(x.path, x.actor, x.is_dir, x.reason) for x in r.refused_deletes
    ]
    cat.log.bad = list(r.bad_deletions)
    cat.log.records = None if r.deletions is None else list(r.deletions)
    cat.storage.failed_deletes = {
        f.path: DeleteFailure(
            f.path,
            f.is_dir,
            EarlierError(f.error),
            f.attempts,
            {d.path: d.actor for d in f.deleted_by},
        )
        for f in r.failed_deletes
    }

    m = tm.m
    for p in r.physical_files:
        pf = PFile(p.path, p.scope, p.pool_key, p.checkpoint, p.open, p.size)
        pf.ref_count = p.ref_count
        pf.live_bytes = p.live_bytes
        pf.reusable = p.reusable
        m.pfiles[p.path] = pf
    for s in r.segments:
        m.add(Seg(s.logical_id, s.path, s.offset, s.length, s.created_for, s.last_used,
                  s.confirmed))  # fmt: skip
    m.pools = {pool.key: pool.path for pool in r.pools}

    tm.outputs = {(o.subtask, o.checkpoint): list(o.entries) for o in r.outputs}
    tm.acked = {(a.subtask, a.checkpoint): a.entries for a in r.acked}
    tm.backend = {(b.subtask, b.name): BackendRef(b.entry, b.checkpoint, b.confirmed)
                  for b in r.backend}  # fmt: skip
    for sp in r.subtask_pools:
        facts = tm._facts(sp.subtask)
        facts.pool_checkpoint = sp.pool_checkpoint
        facts.pool_key = sp.pool_key

    w = tm.working
    w.uses = {u.subtask: set(u.files) for u in r.working.uses}
    w.pins = {(p.subtask, p.checkpoint): p.files for p in r.working.pins}
    w.known = {k.path: k for k in r.working.known}
    w.written = set(r.working.written)
    w.opened = {(o.epoch, o.subtask) for o in r.working.opened}
    w.users = set(r.working.users)

    for path, f in sorted(cat.files.items()):
        if f.open:
            cat.storage.reopen(path)
    return tm
