"""The coordinator's collection of SlateDB databases (R104 under ``--state-backend
working``), run in the driver between two batches, after fastimpl's own collection
(``SharedWorking.collect``: the shared SSTs no checkpoint refers to and no live database
uses) has deleted what it decided.

Three steps, in this order, for each database directory under a job base the coordinator
may delete in (the running job's, and the jobs it claimed):

1. **Release** (R104): every SlateDB checkpoint named ``chk-*`` (a snapshot's) that no
   retained or pending checkpoint names is deleted: subsumed, aborted, or a snapshot that
   was never acknowledged (its attempt died). SlateDB's own checkpoints (a clone's pin on
   its source, its expiring ones) are left to SlateDB.
2. **SlateDB's GC**, once, with ``min_age`` at least the grace of R64: it deletes what no
   manifest and no SlateDB checkpoint of the database names (old manifests and
   compactions, and SSTs below its last compaction: a fenced zombie's upload, an SST a
   compaction replaced that no TM recorded). It runs only on databases that are still
   needed, and after fastimpl's deletes are done, so the two never delete one file.
3. **Whole databases**: a directory no live database writes, no retained or pending
   checkpoint names (its pointer or a file in place) and no live database uses a file
   of, and where fastimpl records no file any more, is deleted with SlateDB's
   ``delete_db`` (which also releases the pins it held in its sources).

Nothing here runs while a task may run: the driver calls it after a checkpoint completed
and the replaced attempts were given up, when no database is open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attrs import define, field

from pipeline.stream import slate
from pipeline.stream.working_names import CHECKPOINT_PREFIX, db_dir_of


@define
class Collected:
    """What the collections of a run did (for the summary and the figures)."""

    released: int = 0
    """SlateDB checkpoints deleted (step 1)."""
    gc_runs: int = 0
    dropped: list[str] = field(factory=list)
    """Database directories deleted whole (step 3)."""
    dropped_objects: int = 0


class SlateCollection:
    """The coordinator's handle on the SlateDB databases of a base."""

    def __init__(self, url: str, storage_options: Mapping[str, Any], min_age_s: float) -> None:
        if min_age_s < 0:
            raise ValueError(f"the SlateDB GC's minimum age must be >= 0 s, got {min_age_s}")
        self.loop = slate.Loop()
        self.admin = slate.Admin(self.loop, slate.Place(url, dict(storage_options)))
        self.min_age_ms = int(min_age_s * 1000)
        self.done = Collected()

    def collect(
        self,
        on_storage: Iterable[str],
        *,
        needed: set[str],
        wanted: set[tuple[str, str]],
        recorded: Iterable[str],
    ) -> None:
        """``on_storage``: every object under the working directories of the bases the
        coordinator may delete in; ``needed``: the database directories a live database
        writes or uses a file of, or a retained or pending checkpoint names; ``wanted``:
        ``(directory, SlateDB checkpoint id)`` of every retained or pending checkpoint;
        ``recorded``: the paths fastimpl's records hold."""
        dbs: dict[str, int] = {}
        for p in on_storage:
            d = db_dir_of(p)
            if d is not None:
                dbs[d] = dbs.get(d, 0) + 1
        held = {d for p in recorded if (d := db_dir_of(p)) is not None}
        for d in sorted(dbs):
            if d in needed:
                for cid, name, _ in self.admin.checkpoints(d):
                    if name is not None and name.startswith(CHECKPOINT_PREFIX):
                        if (d, cid) not in wanted:
                            self.admin.delete_checkpoint(d, cid)
                            self.done.released += 1
                self.admin.gc(d, self.min_age_ms)
                self.done.gc_runs += 1
            elif d not in held:
                gone = self.admin.delete_db(d)
                self.done.dropped.append(d)
                self.done.dropped_objects += len(gone)

    def close(self) -> None:
        self.loop.close()
