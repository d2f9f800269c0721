"""The streaming job's coordinator publishes its writer state (``fastimpl.writer_state``,
SPEC "Outside collectors"), so that an outside collector (``ckpt audit --delete-orphans``)
never takes a file a live writer still needs, and the audit tells a working file a
database still has from a leak (§11).

It publishes into every job base the coordinator may delete in (its lineage: the running
job's, and those a CLAIM restore or a recovery after a driver kill gave it) and every
other base a database it needs lies in (a clone refers to its source's SSTs in place and
SlateDB writes its pin there: after a second recovery the base the first one claimed is
the user's, R95), at each trigger, complete and abort, after a restore, and at the end of
a run. A base that is no longer one of those (the source of a NO_CLAIM restore) gets one
last state, with nothing pending and not running; one that holds nothing else any more
(a claimed job whose files all went once subsumed) has its state deleted. Per base:

* the pending checkpoints, each with its trigger time and the checkpoints retained then;
* ``open_files``: the pool files the live TMs hold open (their last reports, exact between
  two batches) and those of the coordinator;
* ``working_files`` (``--state-backend working``): what SlateDB keeps in every database
  directory still needed (a live database writes there or uses a file of it, a retained
  checkpoint names it or a file in it): its own objects (manifests, compactor state, WAL
  fences, GC boundaries), every SST its latest manifest or one of its SlateDB checkpoints
  names, every other SST SlateDB's own garbage collector would keep whatever its age (one
  written at or after the oldest compaction of its latest compactor state or its newest
  L0 SST: a compaction's output, and an L0, are written before a manifest names them, and
  a database closed while a compaction ran leaves one the next compactor commits), and
  every file a live database uses or a snapshot pins. In a base outside the lineage every
  database directory is the user's and counts as needed. Anything else in a working
  directory (a database directory nothing needs, which the coordinator's collection
  drops; an older SST no kept manifest names, such as a fenced zombie's upload; a stray)
  is not listed: an orphan once older than the grace and the fence. With the RocksDB
  backend the list is empty: its databases are on the workers' disks.

The state is observed (the working directories listed, the manifests read) when no task
runs: at a complete (after the collection), an abort, a restore and the end of a run; a
trigger republishes the last observation with the new pending checkpoint. Its
``published_at`` is when that observation began, so every object written since is newer
than the fence and is never collected. Manifests and compactor states are immutable:
each is read once. If one cannot be read, the state omits ``working_files``, and the
collector keeps every working file.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from fastimpl.parties import (
    WRITER_STATE,
    CheckpointCoordinator,
    PendingAt,
    Status,
    Storage,
    note_pending,
    state_document,
    withdraw_state,
    write_state,
)
from pipeline.stream.working_names import BOOKKEEPING, SST, db_dir_of, ulid_ms
from spec.ids import TmId
from spec.layout import SAVEPOINTS, job_base

if TYPE_CHECKING:
    from pipeline.stream.slate import Manifest


def base_of(path: str) -> str:
    """The base a root-relative path lies under: a job base or a savepoint directory."""
    parts = path.split("/")
    if parts[0] == SAVEPOINTS and len(parts) > 1:
        return "/".join(parts[:2])
    return parts[0]


class Publishing(Protocol):
    """What the publisher reads of the streaming coordinator it publishes for
    (``pipeline.stream.coordination.SparkCoordinator``). That coordinator builds its
    publisher with itself, so this module names what it needs here instead of importing
    it (no import circle)."""

    @property
    def co(self) -> CheckpointCoordinator: ...
    @property
    def checkpoint_storage(self) -> Storage: ...
    @property
    def slate(self) -> Any: ...

    def tm_reports(self) -> Mapping[TmId, Mapping[str, Any]]:
        """Each TM's last report (``SparkEngine.reports``): the pool files it holds open
        and the working files its databases use or its snapshots pin."""

    def needed_databases(self) -> set[str]:
        """The database directories still needed (their bases are published to)."""


class StatePublisher:
    """The writer state of one ``SparkCoordinator`` (see the module docstring)."""

    def __init__(self, sc: Publishing) -> None:
        self.sc = sc
        self.triggered: PendingAt = {}
        self.seq = 0
        self.bases: set[str] = set()
        """The bases the last publication went to."""
        self.targets: set[str] = set()
        """The bases the last observation found the coordinator needs (see above)."""
        self.emptied: set[str] = set()
        """Bases that hold nothing but a state published before: it goes."""
        self.observed_at = 0.0
        self.open: set[str] = set()
        self.working: set[str] | None = set()
        self._manifests: dict[tuple[str, int], Manifest] = {}
        self._compactions: dict[tuple[str, int], str | None] = {}
        self.manifest_reads = 0

    def publish(self, *, observe: bool = True) -> None:
        co = self.sc.co
        storage = self.sc.checkpoint_storage
        if observe or not self.seq:
            self._observe()
        retained = tuple(r.id for r in co.retained_checkpoints())
        note_pending(self.triggered, co.pending_checkpoints(), retained, time.time())
        own = job_base(co.running_job())
        targets = self.targets
        for base in sorted((targets | self.bases) - self.emptied):
            inside = f"{base}/"
            kept = base in targets
            self.seq += 1
            doc = state_document(
                job=base,
                seq=self.seq,
                published_at=self.observed_at,
                running=co.is_running() and base == own,
                latest_completed=co.latest_checkpoint(),
                retained=retained,
                triggered=self.triggered if kept else {},
                open_files=[p for p in self.open if p.startswith(inside)],
                working_files=None
                if self.working is None
                else [p for p in self.working if p.startswith(inside)],
            )
            write_state(storage, base, doc)
        for base in sorted(self.emptied):
            withdraw_state(storage, base)
        self.bases = set(targets) - self.emptied
        self.emptied = set()

    def _observe(self) -> None:
        sc, co, storage = self.sc, self.sc.co, self.sc.checkpoint_storage
        self.observed_at = time.time()  # before the listing: anything later is newer
        storage.drain()
        running = co.is_running()
        live = [t for t, s in co.attempts().items() if s is Status.ALIVE] if running else []
        last = sc.tm_reports()
        reports = [last[t] for t in live if t in last]
        self.open = set(co.open_files())
        self.open |= {p for r in reports for p in r.get("open", ())}
        own = job_base(co.running_job())
        lineage = set(co.lineage_bases())
        needed = set() if sc.slate is None else sc.needed_databases()
        self.targets = lineage | {base_of(d) for d in needed}
        user = (self.targets | self.bases) - lineage
        recorded = {base_of(p) for p in co.file_owners()}
        dirs: dict[str, list[str]] = {}
        for base in sorted(self.targets | self.bases):
            found: set[str] = set()
            if sc.slate is not None:
                found = storage.files_under(f"{base}/taskowned/working")
            if base != own and not found and base not in recorded:
                # nothing here the coordinator knows of (a claimed job whose files all went
                # once subsumed): listed whole, and if the state is all it holds, the
                # state goes too (it would keep the base for good, the lineage never shrinks)
                state = f"{base}/{WRITER_STATE}"
                rest = storage.files_under(base)
                if not rest - {state}:
                    self.targets.discard(base)
                    if state in rest:
                        self.emptied.add(base)
                    continue
            for p in found:
                d = db_dir_of(p)
                if d is not None:
                    dirs.setdefault(d, []).append(p)
        if sc.slate is None:
            self.working = set()
            return
        working = {p for r in reports for k in ("working", "pinned") for p in r.get(k, ())}
        try:
            for d, paths in sorted(dirs.items()):
                if d in needed or base_of(d) in user:
                    working |= self._kept(d, paths)
        except Exception:  # a manifest that cannot be read: say nothing, keep everything
            self.working = None
            return
        present = set(dirs)
        self._manifests = {k: v for k, v in self._manifests.items() if k[0] in present}
        self._compactions = {k: v for k, v in self._compactions.items() if k[0] in present}
        self.working = working

    def _kept(self, d: str, paths: list[str]) -> set[str]:
        """What SlateDB keeps in database directory ``d`` (its objects ``paths``)."""
        out: set[str] = set()
        manifests: list[int] = []
        states: list[int] = []
        for p in paths:
            m = BOOKKEEPING.fullmatch(p[len(d) + 1 :])
            if m is not None:
                out.add(p)
                if m["manifest"] is not None:
                    manifests.append(int(m["manifest"]))
                if m["compactions"] is not None:
                    states.append(int(m["compactions"]))
        if not manifests:
            return out | set(paths)  # a database being created: all of it is SlateDB's
        latest = self._manifest(d, max(manifests))
        out |= set(latest.files.all)
        for mid in latest.checkpoints:
            out |= set(self._manifest(d, mid).files.all)
        # SlateDB's GC keeps every SST written at or after the oldest compaction its
        # compactor state lists (its output may not be in the manifest yet) or the newest
        # L0 SST (an L0 is written before the manifest names it), whatever its age: with
        # neither, every SST (``compacted_gc.rs``)
        marks = [latest.newest_l0, self._oldest(d, max(states)) if states else None]
        if any(x is None for x in marks):
            cutoff = 0
        else:
            cutoff = min(ulid_ms(x) for x in marks if x is not None)
        for p in paths:
            m = SST.fullmatch(p[len(d) + 1 :])
            if m is not None and ulid_ms(m["ulid"]) >= cutoff:
                out.add(p)
        return out

    def _manifest(self, d: str, manifest_id: int) -> Manifest:
        key = (d, manifest_id)
        got = self._manifests.get(key)
        if got is None:
            admin: Any = self.sc.slate.admin
            got = admin.manifest(d, manifest_id)
            self.manifest_reads += 1
            self._manifests[key] = got
        return got

    def _oldest(self, d: str, compactions_id: int) -> str | None:
        key = (d, compactions_id)
        if key not in self._compactions:
            admin: Any = self.sc.slate.admin
            self._compactions[key] = admin.oldest_compaction(d, compactions_id)
            self.manifest_reads += 1
        return self._compactions[key]
