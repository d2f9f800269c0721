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
4. **Unfinished uploads** (``working_names.STAGED``): an object a writer killed
   mid-upload left under its staging name (``<object>#<n>``, local disks only). SlateDB
   lists no such name, so neither its GC (step 2) nor ``delete_db`` (step 3) removes
   it, and a dropped database's directory would keep it for good: an orphan no party
   records, the directory leaked (I6). In a dropped directory it goes with the rest; in
   a needed one once older than the GC's minimum age, as SlateDB's GC treats an SST no
   manifest names. No writer can finish it: none runs while this does.

Nothing here runs while a task may run: the driver calls it after a checkpoint completed
and the replaced attempts were given up, when no database is open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec  # type: ignore[import-untyped]
from attrs import define, field

from pipeline.stream import slate
from pipeline.stream.working_names import CHECKPOINT_PREFIX, db_dir_of, is_staged
from spec.errors import UsageError

log = logging.getLogger(__name__)


@define
class Collected:
    """What the collections of a run did (for the summary and the figures)."""

    released: int = 0
    """SlateDB checkpoints deleted (step 1)."""
    gc_runs: int = 0
    dropped: list[str] = field(factory=list)
    """Database directories deleted whole (step 3)."""
    dropped_objects: int = 0
    staged: list[str] = field(factory=list)
    """Unfinished uploads deleted (step 4)."""

    def count_release(self) -> None:
        """One more SlateDB checkpoint deleted (step 1)."""
        self.released += 1


class SlateCollection:
    """The coordinator's handle on the SlateDB databases of a base."""

    def __init__(self, url: str, storage_options: Mapping[str, Any], min_age_s: float) -> None:
        if min_age_s < 0:
            raise UsageError(f"the SlateDB GC's minimum age must be >= 0 s, got {min_age_s}")
        self.loop = slate.Loop()
        self.admin = slate.Admin(self.loop, slate.Place(url, dict(storage_options)))
        self.min_age_ms = int(min_age_s * 1000)
        self.done = Collected()
        self.fs, root = fsspec.core.url_to_fs(url, **dict(storage_options))
        self.root = str(root).rstrip("/")

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
        dbs: dict[str, list[str]] = {}
        for p in on_storage:
            d = db_dir_of(p)
            if d is not None:
                dbs.setdefault(d, []).append(p)
        held = {d for p in recorded if (d := db_dir_of(p)) is not None}
        for d in sorted(dbs):
            staged = sorted(p for p in dbs[d] if is_staged(p))
            if d in needed:
                for cid, name, _ in self.admin.checkpoints(d):
                    if name is not None and name.startswith(CHECKPOINT_PREFIX):
                        if (d, cid) not in wanted:
                            self.admin.delete_checkpoint(d, cid)
                            self.done.count_release()
                self.admin.gc(d, self.min_age_ms)
                self.done.gc_runs += 1
                self._remove_staged(staged, self.min_age_ms)
            elif d not in held:
                if len(staged) < len(dbs[d]):  # else SlateDB sees nothing there
                    gone = self.admin.delete_db(d)
                    self.done.dropped_objects += len(gone)
                self.done.dropped.append(d)
                self._remove_staged(staged, 0)

    def _remove_staged(self, paths: Iterable[str], min_age_ms: int) -> None:
        """Step 4: delete the unfinished uploads ``paths`` at least ``min_age_ms`` old."""
        now = time.time()
        for p in paths:
            full = f"{self.root}/{p}" if self.root else p
            try:
                age_ms = (now - self.fs.modified(full).timestamp()) * 1000
                if age_ms >= min_age_ms:
                    log.warning("deleting %s: an upload its writer, killed, left unfinished", p)
                    self.fs.rm_file(full)
                    self.done.staged.append(p)
            except FileNotFoundError:
                continue

    def close(self) -> None:
        self.loop.close()
