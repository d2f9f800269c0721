"""The writer's published state: what an outside garbage collector must not take.

A live writer's files are not all referenced by a ``_metadata`` yet: a checkpoint in flight
has written files that no completed checkpoint names, an ACROSS pool file stays open and
takes segments of the next checkpoint although it was created for an older one, and an in-
flight checkpoint may reuse a segment of a retained checkpoint that is subsumed before it
completes. Age by modification time cannot tell these from garbage. So the coordinator
publishes, whenever its pending or retained set changes (trigger, complete, abort, failover,
restore, cancel), a small JSON file in the job base, ``_writer_state.json``:

* ``published_at`` and, per pending checkpoint, ``triggered_at`` (the writer's clock) and
  ``retained_at_trigger`` (the checkpoints it may reuse from);
* ``open_files``: every physical file open in a TM's pool at publication;
* ``working_files``: every working file a live database uses or a snapshot pins (§11,
  R100): the audit never takes one for an orphan. A file a database writes after the
  publication is newer than the fence, and one it stops using stays listed until the
  next publication: the list errs on keeping.

The audit (``pipeline.deletion``) reads it before listing and again before deleting; it
never collects a file that is open, nor one modified at or after the fence (the oldest
pending trigger, or the publication when nothing is pending): every file a later write
touches is newer than that (a file opened after a publication is newer than it), and it
stops collecting when a checkpoint some pending one may reuse from is gone.

Publishing is opt-in (``fastimpl.api.publish_state``: it reaches into the store, whose
module imports this one), written with ``Storage.publish`` (not a
checkpoint write: no armed fault fires, no lease is checked), atomically: a temporary file,
then a rename, through the store's descriptor walk, which never follows a link (a single
PUT on object stores). The streaming job's coordinator publishes the same document
(``state_document``, ``write_state``) from its own view (``pipeline.stream.publication``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from spec import commands as c
from spec.layout import job_base

if TYPE_CHECKING:
    from fastimpl.engine import InProcessEngine
    from fastimpl.storage import Storage

WRITER_STATE = "_writer_state.json"
FORMAT = "ckpt-writer-state"
VERSION = 1

_QUIET = (
    c.WriteState,
    c.ReuseShared,
    c.Acknowledge,
    c.DeliverNotification,
    c.DropNotification,
    c.DuplicateNotification,
    c.FailNextCall,
    c.RetryDeletes,
    c.WriteWorking,
    c.DropWorking,
    c.SnapshotWorking,
    c.CollectWorking,
)
"""Commands that change neither the pending nor the retained set."""


PendingAt = dict[int, tuple[float, tuple[int, ...]]]
"""Per pending checkpoint: the writer's time of its trigger and the checkpoints retained
then (what it may reuse from)."""


def note_pending(triggered: PendingAt, pending: Iterable[int], retained: tuple[int, ...],
                 now: float) -> None:  # fmt: skip
    """Record the trigger of each checkpoint pending now that ``triggered`` does not hold
    yet (``now``, retaining ``retained``), and forget those no longer pending."""
    live = set(pending)
    for cid in live:
        triggered.setdefault(cid, (now, retained))
    for cid in [k for k in triggered if k not in live]:
        del triggered[cid]


def state_document(
    *,
    job: str,
    seq: int,
    published_at: float,
    running: bool,
    latest_completed: int,
    retained: tuple[int, ...],
    triggered: PendingAt,
    open_files: Iterable[str],
    working_files: Iterable[str] | None,
) -> bytes:
    """The published state (``working_files`` ``None``: the writer does not say which
    working files its databases use, and the collector keeps them all)."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "job": job,
        "seq": seq,
        "published_at": published_at,
        "running": running,
        "latest_completed": latest_completed,
        "retained": list(retained),
        "pending": [
            {"checkpoint": cid, "triggered_at": t, "retained_at_trigger": list(pins)}
            for cid, (t, pins) in sorted(triggered.items())
        ],
        "open_files": sorted(open_files),
    }
    if working_files is not None:
        doc["working_files"] = sorted(working_files)
    return json.dumps(doc).encode()


class WriterStatePublisher:
    """Called by the engine after each call it applied (``InProcessEngine.on_applied``)."""

    def __init__(self, cluster: InProcessEngine) -> None:
        self.cluster = cluster
        self.triggered: PendingAt = {}
        self.seq = 0
        self._last: object = None

    def __call__(self, cmd: c.Command) -> None:
        if isinstance(cmd, _QUIET):
            return
        self.publish()

    def publish(self) -> None:
        cl = self.cluster
        co = cl.coord
        now = time.time()
        retained = tuple(r.id for r in co.retained)
        note_pending(self.triggered, co.pending, retained, now)
        open_files = [p for t in cl.parties.values() for p, pf in t.m.pfiles.items() if pf.open]
        working: set[str] = set()
        if co.running:
            for tm in cl.coord.current_tms():
                dbs = cl.parties[tm].working
                working |= set(dbs.in_use()) | {p for ps in dbs.pins.values() for p in ps}
        self.seq += 1
        doc = state_document(
            job=cl.job,
            seq=self.seq,
            published_at=now,
            running=co.running,
            latest_completed=co.latest_completed,
            retained=retained,
            triggered=self.triggered,
            open_files=open_files,
            working_files=working,
        )
        write_state(cl.storage, job_base(cl.job), doc)


def write_state(storage: Storage, base: str, data: bytes) -> None:
    """``data`` as ``<base>/_writer_state.json``, whole or not at all
    (``Storage.publish``)."""
    storage.publish(f"{base}/{WRITER_STATE}", data)


def withdraw_state(storage: Storage, base: str) -> None:
    """Delete ``<base>/_writer_state.json``: the writer has nothing left there
    (``Storage.unpublish``: as its publication, no checkpoint delete)."""
    storage.unpublish(f"{base}/{WRITER_STATE}")
