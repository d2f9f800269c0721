"""The test side's view of a running ``ckpt stream`` job (``SparkCoordinator.checks``):
the real files with the coordinator's records and the TMs' last reports merged
(``fastimpl.parties.observe``: neither party reads the other's), the working files (§11)
as they record them, and the invariants on both (``violations``), I1-I7 on what is on
storage throughout a run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import fsspec  # type: ignore[import-untyped]

from fastimpl.parties import (
    WRITER_STATE,
    CheckpointCoordinator,
    Status,
    Storage,
    observe,
)
from pipeline.stream.spark_engine import SparkEngine, tm_report
from pipeline.stream.working_names import db_dir_of
from spec.effects import COORDINATOR, USER, tm_actor
from spec.invariants import (
    check_all,
    check_safety,
    no_leak_once_quiet,
    no_working_leak_once_quiet,
    working_files_kept,
)
from spec.observation import Observation, WorkingFileView, WorkingObservation


class JobChecks:
    """The observation and the invariants of one job's coordinator and its TMs."""

    def __init__(
        self, co: CheckpointCoordinator, engine: SparkEngine, storage: Storage, url: str
    ) -> None:
        self.co = co
        self.engine = engine
        self.storage = storage
        self.url = url
        self.working_state = False
        """``--state-backend working``: SlateDB's objects are the databases' (§11)."""

    def observe(self, also: Iterable[bytes] = ()) -> tuple[Observation, list[str]]:
        """The real files with the coordinator's records and the TMs' last reports merged
        (``fastimpl.parties.observe``: neither party reads the other's, this is the test
        side's view); a path two parties record with different owners is a disagreement.
        ``also``: reports of TMs the coordinator has not heard from (a test that holds a
        task's result back)."""
        co = self.co
        storage = self.storage
        storage.drain()
        # every TM not known stopped, by its last report: the placed ones, and those
        # replaced (R66: lost at once) while an attempt of the job may still run
        # (``may_still_run``): a lost attempt keeps its files until it stopped (R64)
        live = sorted(co.attempts()) if co.is_running() else []
        reports = {t: self.engine.reports[t] for t in live if t in self.engine.reports}
        for data in also:
            if data:
                extra = json.loads(data)
                reports[extra["tm"]] = extra
        # R61: files handed by a duty a TM has not applied yet are its own already
        orphans: dict[str, str] = {}
        for tm, path in self.engine.in_transit():
            orphans.setdefault(path, tm_actor(tm))
        # the writer state of each base (``publication``) is no party's checkpoint data
        on_storage = {
            p: n for p, n in storage.list_files().items() if p.split("/", 1)[-1] != WRITER_STATE
        }
        if self.working_state:
            # working state (§11): SlateDB's own objects (manifests, compactions, SSTs no
            # party recorded) are the database's: its live TM's, or once no live TM writes
            # there the coordinator's, whose collection deletes them (slate_collect); in a
            # base the coordinator may not delete in (a NO_CLAIM source) the user's. Each
            # counts where no party records the path.
            writer = {
                d: tm_actor(t) for t in reports if isinstance(d := reports[t].get("lineage"), str)
            }
            lineage = co.lineage_bases()
            for path in on_storage:
                d = db_dir_of(path)
                if d is not None:
                    mine = d.split("/", 1)[0] in lineage
                    orphans.setdefault(path, writer.get(d, COORDINATOR) if mine else USER)
        return observe(
            co, {t: tm_report(r) for t, r in reports.items()}, on_storage, orphans=orphans
        )

    def working(self, obs: Observation) -> tuple[WorkingObservation, set[str]]:
        """What the observation shows of the working files (§11): the SSTs a party
        records, their states, users and in-place references; and every other object of
        the databases (SlateDB's own: kept by its manifests, its checkpoints and its
        GC's minimum age, judged apart, ``kept_by_slatedb``)."""
        co = self.co
        live = sorted(t for t, status in co.attempts().items() if status is Status.ALIVE)
        reports = {t: self.engine.reports[t] for t in live if t in self.engine.reports}
        uses = {f"{t}@{tm_actor(t)}": frozenset(r.get("working", ())) for t, r in reports.items()}
        # each worker TM hosts one subtask: its database's operator is that subtask's (R105)
        vertex_of = {tm: sub.vertex for sub, tm in self.engine.runs_on.items()}
        operators = {f"{t}@{tm_actor(t)}": vertex_of[t] for t in reports if t in vertex_of}
        pinned = {p for r in reports.values() for p in r.get("pinned", ())}
        retained = {
            r.id: frozenset(w.path for _, w in r.working) for r in co.retained_checkpoints()
        }
        refs: dict[str, set[int]] = {}
        for cid, paths in retained.items():
            for p in paths:
                refs.setdefault(p, set()).add(cid)
        recorded = set(co.file_owners()) | {
            p for r in reports.values() for p in r.get("owners", {})
        }
        files: dict[str, WorkingFileView] = {}
        other: set[str] = set()
        for path in obs.files:
            if db_dir_of(path) is None:
                continue
            if path not in recorded:
                other.add(path)
                continue
            owner = obs.owners.get(path, "")
            state = (
                "shared" if owner in (COORDINATOR, "user")
                else "pinned" if path in pinned else "private"
            )  # fmt: skip
            users = frozenset(db for db, ps in uses.items() if path in ps)
            files[path] = WorkingFileView(owner, state, users, frozenset(refs.get(path, ())))
        return WorkingObservation(files, uses, retained, operators), other

    def kept_by_slatedb(self) -> tuple[int, int]:
        """Objects (and bytes) of the databases that no party records: SlateDB's own
        manifests and compactions, and SSTs it still names or that are younger than its
        GC's minimum age. Reported, not called leaks (SPEC §11's table)."""
        obs, _ = self.observe()
        _, other = self.working(obs)
        return len(other), sum(obs.files[p] for p in other)

    def violations(self, *, quiet: bool = False, also: Iterable[bytes] = ()) -> list[str]:
        """I1-I5 (and I6 when ``quiet``) on the real files, and the parties' disagreements.
        Quiet needs every TM to have applied its mail (``deliver_mail``). With working
        state, I7 and the working files' I6 too; and, quiet, every database directory
        left on storage is one a live database or a retained checkpoint needs."""
        obs, disagree = self.observe(also)
        if not self.working_state:
            found = [str(v) for v in check_all(obs, quiet=quiet)] + disagree
        else:
            w, other = self.working(obs)
            checks = check_safety(obs) + working_files_kept(obs, w)
            if quiet:
                exempt = frozenset(w.files) | frozenset(other)
                checks += no_leak_once_quiet(obs, exempt) + no_working_leak_once_quiet(obs, w)
            found = [str(v) for v in checks] + disagree
            if quiet:
                needed = (
                    self.live_databases()
                    | {
                        d
                        for ps in w.retained.values()
                        for p in ps
                        if (d := db_dir_of(p)) is not None
                    }
                    | {d for ps in w.uses.values() for p in ps if (d := db_dir_of(p)) is not None}
                )
                lineage = self.co.lineage_bases()
                left = {
                    d
                    for p in obs.files
                    if (d := db_dir_of(p)) is not None and d.split("/", 1)[0] in lineage
                }
                found += [f"I6: leaked database directory {d}" for d in sorted(left - needed)]
        if fsspec.utils.get_protocol(self.url) in ("file", "local"):
            found += [
                f"directory {d} is recorded but not on storage"
                for d in obs.directories
                if not self.storage.exists_dir(d)
            ]
        return found

    def live_databases(self) -> set[str]:
        """The database directories the live TMs' databases are at (their last reports)."""
        return {
            d
            for t, status in self.co.attempts().items()
            if status is Status.ALIVE
            and isinstance(d := self.engine.reports.get(t, {}).get("lineage"), str)
        }
