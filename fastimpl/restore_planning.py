"""Restores at the coordinator (R70-R77): a retained checkpoint or a savepoint, read back
and validated, starts a new job, possibly at other parallelisms (a rescale: each new
subtask's share of the state is redistributed by key groups, R75, R76, under the same max
parallelism, R77), in CLAIM mode (the new job owns what it restores, R72) or NO_CLAIM
(the user keeps it, R73). Until the new job completes a checkpoint, each subtask starts
from its share (``state_to_restore``).
"""

from __future__ import annotations

import logging

from fastimpl.checkpoint_lifecycle import CheckpointLifecycle
from fastimpl.coordinated_job import CoordinatedJob, subtasks_of
from fastimpl.failover import Failover
from fastimpl.ids import creator_of
from fastimpl.job_end import JobEnd
from fastimpl.metadata import MetadataError, base_of
from fastimpl.records import Completed, Status
from fastimpl.redistribute import assign
from fastimpl.retention import Retention
from fastimpl.tm_book import TmBook
from fastimpl.working import SharedWorking
from spec import commands as c
from spec.config import MAX_TMS, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.effects import COORDINATOR, tm_actor
from spec.handles import FileHandle, StateEntry
from spec.ids import SubtaskId, TmId
from spec.keygroups import max_parallelism_refusal
from spec.layout import METADATA, SAVEPOINTS, is_under, job_base, savepoint_dir
from spec.messages import ReusableFiles
from spec.refusals import Check, check

log = logging.getLogger("fastimpl.coordinator")


class RestorePlanner:
    """What the running job restored from, each new subtask's share of it, and the
    restores that start new jobs."""

    def __init__(
        self,
        run: CoordinatedJob,
        tm_book: TmBook,
        lifecycle: CheckpointLifecycle,
        retention: Retention,
        failover: Failover,
        job_end: JobEnd,
        working: SharedWorking,
    ) -> None:
        self.run = run
        self.tm_book = tm_book
        self.lifecycle = lifecycle
        self.retention = retention
        self.failover = failover
        self.job_end = job_end
        self.working = working
        self.assignment: dict[SubtaskId, tuple[StateEntry, ...]] = {}
        """Each new subtask's share of the checkpoint restored last (R75, R76)."""
        self.restored_from: str | None = None
        """The ``_metadata`` restored last (the HA state keeps it while ``restoring``)."""

    def stored_savepoint(self, checkpoint: int) -> Completed | None:
        """A completed savepoint, read back from its directory (the user's, R55, where
        the user may have deleted it), validated; None if storage holds none."""
        path = f"{savepoint_dir(checkpoint)}/{METADATA}"
        if path not in self.run.storage.files_under(savepoint_dir(checkpoint)):
            return None
        done = self.retention.load_completed(path)
        return done if done.savepoint and done.id == checkpoint else None

    def stored_savepoints(self) -> list[int]:
        """The completed savepoints on storage, by id."""
        found = self.run.storage.files_under(SAVEPOINTS)
        out = []
        for path in found:
            parts = path.split("/")
            if len(parts) == 3 and parts[2] == METADATA and parts[1].startswith("savepoint-"):
                num = parts[1][len("savepoint-") :]
                if num.isdigit():
                    out.append(int(num))
        return sorted(out)

    def checks(self, cmd: c.Restore) -> RestoreChecks:
        """The restore's guards (``spec/refusals.py``), which find and read its source."""
        return RestoreChecks(self, cmd)

    def restore(self, cmd: c.Restore) -> None:
        run, book, retention = self.run, self.tm_book, self.retention
        guards = self.checks(cmd)
        check(cmd, guards.table())
        source, recorded = guards.read()
        mode = RestoreMode.NO_CLAIM if source.savepoint else cmd.mode  # R73
        new_par = dict(cmd.parallelism)
        old_vertices = run.vertices
        if run.running:
            self.job_end.end_job(retain=True)
        for rec in book.tms.values():
            if rec.status is Status.LOST:
                # R64: a zombie stays in its job; where it wrote is still swept at its stop
                before = book.hosted_before.get(rec.id, frozenset())
                book.hosted_before[rec.id] = rec.hosted | before
                rec.hosted = frozenset()
        run.job_seq += 1
        run.job = f"job-{run.job_seq}"
        run.bases.add(job_base(run.job))
        if mode is RestoreMode.CLAIM:
            run.lineage.add(job_base(run.job))
        else:
            run.lineage = {job_base(run.job)}  # R73: the source stays outside for good
        run.vertices = tuple(
            VertexSpec(v.name, new_par.get(v.name, v.parallelism)) for v in run.vertices
        )
        if cmd.num_tms is not None:
            run.num_tms = cmd.num_tms  # R70: Spark runs one TM per subtask
        tms = [
            run.engine.start_tm(run.job, run.next_checkpoint, run.next_checkpoint - 1)
            for _ in range(run.num_tms)
        ]
        for t in tms:
            book.add_tm(t)
        subtasks = subtasks_of(run.vertices)
        book.placement = run.engine.place(subtasks, tms)
        run.engine.placed(book.placement)
        run.running = True
        self.lifecycle.pending = {}
        retention.retained = []
        retention.registry.clear()
        retention.watermark = 0
        retention.latest_completed = 0
        assignment = assign(source.entries, run.vertices, run.cfg.max_parallelism)
        retention.restoring = tuple(e for s in sorted(assignment) for e in assignment[s])
        self.assignment = {s: tuple(v) for s, v in assignment.items()}
        self.restored_from = source.metadata
        if mode is RestoreMode.CLAIM:
            self._claim(source, recorded)
        # working state (§11): R105, in place; NO_CLAIM: the user's files
        epoch = self.failover.epoch
        self.working.open_databases(source, epoch, users=mode is RestoreMode.NO_CLAIM)
        same = all(
            v.parallelism == ov.parallelism
            for v, ov in zip(run.vertices, old_vertices, strict=True)
        )
        if mode is RestoreMode.CLAIM and same and run.mode is MergingMode.NONE:
            reusable: dict[TmId, list[StateEntry]] = {}
            for s in subtasks:  # R72: NONE mode may reuse the claimed files
                for e in assignment.get(s, ()):
                    if e.kind is StateKind.KEYED_SHARED and isinstance(e.handle, FileHandle):
                        reusable.setdefault(book.placement[s], []).append(e)
            for t, found in sorted(reusable.items()):
                msg = ReusableFiles(run.job, t, epoch, source.id, tuple(found))
                run.engine.duty(t, msg)

    def _check_claim(self, source: Completed, recorded: Completed) -> None:
        """R72, I5: a CLAIM takes what the checkpoint held when it completed, no more. A
        ``_metadata`` that names a file or directory the store did not record for it
        (changed since, however well its checksum matches) is refused before any change."""
        paths_of = self.retention.paths_of
        extra = sorted(
            (paths_of(source) - paths_of(recorded))
            | (set(source.directories) - set(recorded.directories))
        )
        if extra:
            raise MetadataError(
                source.metadata,
                "payload",
                f"names {extra[0]!r}, which checkpoint {source.id} did not hold when it "
                "completed: a claim takes only what the store recorded",
            )

    def _claim(self, source: Completed, recorded: Completed | None = None) -> None:
        """R72: the new job's coordinator owns the restored checkpoint: what of it lies in
        its lineage (I5); anything else it names stays whose it was (read, never deleted).
        What a lost attempt owns in its directories and it does not reference stays the
        attempt's until it is known stopped (R64): it may still delete it."""
        retention, catalog = self.retention, self.run.catalog
        self.run.bases.add(base_of(source.metadata))
        paths = retention.paths_of(source)
        lost = {t for t, rec in self.tm_book.tms.items() if rec.status is Status.LOST}
        lost_actors = {tm_actor(t) for t in lost}
        for d in source.directories:
            if not retention.may_claim(d, recorded, is_dir=True):
                continue
            # a zombie's own files stay in its records, swept at its stop (R64)
            unheld = {
                p for p in self._attempts_files_under(d) if p in paths or creator_of(p) not in lost
            }
            self.job_end.record_unheld(unheld, COORDINATOR, source.job)
            paths |= {
                p for p, f in catalog.files.items() if is_under(p, d) and f.owner not in lost_actors
            }
            if d in catalog.dir_owner:
                catalog.dir_owner[d] = COORDINATOR
        for p in sorted(paths):
            f = catalog.files.get(p)
            if f is not None and retention.may_claim(p, recorded):
                f.owner = COORDINATOR
        retention.register(source, recorded)
        for d in source.directories:
            md = catalog.dirs.get(d)
            if md is not None:
                md.handed_over = True
        retention.retained = [source]
        retention.latest_completed = source.id

    def _unrecorded_under(self, directory: str) -> set[str]:
        """The files in ``directory`` on storage that no record here holds; none if it
        cannot be listed (then nothing unrecorded is taken: a leak, not a loss)."""
        try:
            return self.run.storage.files_under(directory) - set(self.run.catalog.files)
        except Exception as err:
            log.warning("listing %s failed: %r", directory, err)
            return set()

    def _attempts_files_under(self, directory: str) -> set[str]:
        """R72 with R64: the files in a claimed ``directory`` that no record here holds
        yet an attempt of this store wrote: a zombie in a process of its own, whose name
        mark (``fastimpl.ids.creator_of``) names an attempt these records know. Anything
        else there (unmarked, or marked by no attempt of ours) is not the store's: a
        claim never takes it, and the directory's delete leaves it (issue 14)."""
        return {
            p
            for p in self._unrecorded_under(directory)
            if (made := creator_of(p)) is not None and made in self.tm_book.tms
        }

    def state_to_restore(self, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        """What ``subtask`` starts from: its share of a restored checkpoint until the new
        job completes one, else its entries of the latest completed checkpoint."""
        if self.retention.restoring:
            return self.assignment.get(subtask, ())
        retained = self.retention.retained
        latest = retained[-1] if retained else None
        if latest is None:
            return ()
        return tuple(e for e in latest.entries if e.subtask == subtask)


class RestoreChecks:
    """A restore's guards on the coordinator's records (``spec/refusals.py``): the source
    is found and read back while they run, so that the restore starts from what they
    validated (``read``)."""

    def __init__(self, planner: RestorePlanner, cmd: c.Restore) -> None:
        self.planner = planner
        self.cmd = cmd
        self._found: tuple[Completed, Completed] | None = None

    def table(self) -> dict[str, Check]:
        return {
            "source_retained": self.source_retained,
            "parallelism_valid": self.parallelism_valid,
            "max_parallelism_same": self.max_parallelism_same,
        }

    def read(self) -> tuple[Completed, Completed]:
        """The source as its ``_metadata`` reads now, and as the store recorded it."""
        assert self._found is not None, "read only once source_retained held"
        return self._found

    def source_retained(self) -> str | None:
        """R70: a checkpoint the job retains, or a savepoint on storage. Finding it reads
        its ``_metadata`` back and validates it, a CLAIM's against what the store recorded
        (R72): damage raises ``MetadataError``, before any argument is checked and before
        any change."""
        planner, cmd = self.planner, self.cmd
        recorded = next((r for r in planner.retention.retained if r.id == cmd.checkpoint), None)
        if recorded is None:
            recorded = planner.stored_savepoint(cmd.checkpoint)
        if recorded is None:
            return f"checkpoint {cmd.checkpoint} is not retained nor a savepoint"
        source = planner.retention.load_completed(recorded.metadata, recorded.job)
        if not source.savepoint and cmd.mode is RestoreMode.CLAIM:  # R73: a savepoint's NO_CLAIM
            planner._check_claim(source, recorded)
        self._found = (source, recorded)
        return None

    def parallelism_valid(self) -> str | None:
        """R75, R78: known vertices at parallelisms up to the max, a TM count in range."""
        cmd, run = self.cmd, self.planner.run
        names = {v.name for v in run.vertices}
        new_par = dict(cmd.parallelism)
        if not set(new_par) <= names or any(
            p < 1 or p > run.cfg.max_parallelism for p in new_par.values()
        ):
            return f"bad parallelism {cmd.parallelism}"
        if cmd.num_tms is not None and not 1 <= cmd.num_tms <= MAX_TMS:
            return f"num_tms {cmd.num_tms} not in 1 .. {MAX_TMS}"
        return None

    def max_parallelism_same(self) -> str | None:
        """R77: the new job's max parallelism (the command's, else the configured one) is
        the one the checkpoint's metadata records."""
        source, _ = self.read()
        configured = self.planner.run.cfg.max_parallelism
        wanted = configured if self.cmd.max_parallelism is None else self.cmd.max_parallelism
        why = max_parallelism_refusal(source.max_parallelism, wanted, source.entries)
        if why is None and wanted != configured:
            why = f"the restore asks for max parallelism {wanted}, the job runs with {configured}"
        return None if why is None else f"checkpoint {source.id} ({source.metadata}): {why}"
