"""The end of a job at the coordinator (R90, R91): pending checkpoints abort, each live TM
hands over what it still owns and deletes the directories no completed checkpoint used
(R90), then the retained checkpoints become the user's (R91, a job that ends retaining
them, as a restore ends the old job) or are subsumed, and the coordinator deletes what it
owns that nothing refers to. Files a lost attempt left that a retained checkpoint uses
are recorded by whoever their names say made them (R64).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fastimpl.checkpoint_lifecycle import CheckpointLifecycle
from fastimpl.coordinated_job import CoordinatedJob
from fastimpl.failover import Failover
from fastimpl.ids import creator_of
from fastimpl.records import Deferred, ManagedDir, Status, StoredFile
from fastimpl.retention import Retention
from fastimpl.tm_book import TmBook
from fastimpl.working import SharedWorking
from spec.effects import COORDINATOR, USER, tm_actor
from spec.handles import stream_of
from spec.layout import is_under
from spec.messages import EndJob, TmEnded

log = logging.getLogger("fastimpl.coordinator")


class JobEnd:
    """Ends the running job, and records what lost attempts left that changes hands."""

    def __init__(
        self,
        run: CoordinatedJob,
        tm_book: TmBook,
        lifecycle: CheckpointLifecycle,
        retention: Retention,
        failover: Failover,
        working: SharedWorking,
    ) -> None:
        self.run = run
        self.tm_book = tm_book
        self.lifecycle = lifecycle
        self.retention = retention
        self.failover = failover
        self.working = working

    def end_job(self, *, retain: bool) -> None:
        run, retention = self.run, self.retention
        catalog = run.catalog
        for cid in sorted(self.lifecycle.pending):
            self.lifecycle.abort(cid)
        handed = {d for r in retention.retained for d in r.directories}
        keep = {
            s.logical_id
            for r in retention.retained
            for e in r.entries
            if (s := stream_of(e.handle)) is not None
        }
        for tm in self.tm_book.current_tms():
            actor = tm_actor(tm)
            ended = run.engine.duty(tm, EndJob(run.job, tm, frozenset(keep)))
            if isinstance(ended, TmEnded):
                self._handed_at_end(ended)
            for path in sorted(catalog.dirs):
                d = catalog.dirs.get(path)
                if d is None:
                    continue
                # R90: directories no completed checkpoint used go with their creator
                if d.creator == tm and path not in handed and catalog.dir_owner.get(path) == actor:
                    inside = [p for p in catalog.files if is_under(p, path)]
                    if all(catalog.files[p].owner == actor for p in inside):
                        catalog.delete_dir(path, actor)
            for f in catalog.files.values():
                if f.owner == actor:
                    f.owner = COORDINATOR
            for path, o in list(catalog.dir_owner.items()):
                if o == actor:
                    catalog.dir_owner[path] = COORDINATOR
            run.forget_tm(tm)
            self.tm_book.tms[tm].status = Status.STOPPED
            self.failover.retire(tm)
        run.running = False
        retention.restoring = ()
        if retain:
            for r in retention.retained:  # R91: the user's
                paths = {r.metadata} | {
                    s.path for e in r.entries if (s := stream_of(e.handle)) is not None
                }
                self.record_unheld(paths, USER, run.job)
                for rd in r.directories:
                    if rd in catalog.dir_owner:
                        catalog.dir_owner[rd] = USER
                for p in paths:
                    kept = catalog.files.get(p)
                    if kept is not None:
                        kept.owner = USER
                self.working.give_to_user(r)  # working state (§11): R105
        else:
            while retention.retained:
                retention.subsume(retention.retained.pop(0))
        for path in sorted(p for p, f in catalog.files.items() if f.owner == COORDINATOR):
            if (
                path in catalog.files
                and not retention.referenced(path)
                and any(is_under(path, b) for b in run.bases)
            ):
                catalog.delete_file(path, COORDINATOR)
        retention.collect_dirs()

    def record_unheld(self, paths: Iterable[str], owner: str, job: str) -> None:
        """R64 with R72, R91: files no live party handed over yet a retained checkpoint
        uses, or that lie in a claimed directory and no lost attempt keeps (R72), are an
        attempt's that may still run (a live TM hands what it owns over at ``EndJob``),
        or one that stopped and left them unrecorded. They change hands as everything
        the checkpoint uses does, so the coordinator records them, created by whoever
        their names say (its deletes of them wait while that attempt may run). The zombie
        keeps its own records: it never deletes a file a retained checkpoint uses (its
        notices are older), and one it deletes anyway is checked for once it stopped
        (``Catalog.release_waits``). Only under the base of ``job``, the one whose
        attempts wrote them (I5)."""
        catalog, storage = self.run.catalog, self.run.storage
        wanted = {p for p in paths if p not in catalog.files and self.lifecycle.may_sweep(p, job)}
        if not wanted:
            return
        try:
            here: set[str] = set()
            for d in sorted({p.rsplit("/", 1)[0] for p in wanted}):
                here |= storage.files_under(d)
        except Exception as err:  # cannot tell: nothing is recorded (a leak, not a loss)
            log.warning("listing what a lost attempt left failed: %r", err)
            return
        for p in sorted(wanted & here):
            catalog.files[p] = StoredFile(storage.size(p), False, owner, creator_of(p))

    def _handed_at_end(self, ended: TmEnded) -> None:
        """R90: what the TM still owned is recorded as its own, then handed over below.
        Records the coordinator already holds stay as they are; a path outside what this
        store writes in is never recorded (I5)."""
        catalog = self.run.catalog
        writes_in = self.lifecycle.writes_in
        actor = tm_actor(ended.tm)
        for k in ended.files:
            if k.path not in catalog.files and writes_in(k.path, ended.tm):
                catalog.files[k.path] = StoredFile(k.size, False, actor, k.creator)
        for d in ended.directories:
            if d not in catalog.dir_owner and writes_in(d, ended.tm):
                catalog.dir_owner[d] = actor
                catalog.dirs[d] = ManagedDir(d, ended.tm)
        for w in ended.waiting:  # R45, R64: carried out by whoever owns the path then (R44)
            if writes_in(w.path, ended.tm):
                catalog.take_waiting(Deferred(actor, w.path, w.directory, w.waits_for))
