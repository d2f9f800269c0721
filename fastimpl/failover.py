"""What the coordinator does when TMs fail (R57, R60-R66): a lost TM aborts every pending
checkpoint (R57); a task-level failover replaces one attempt (R66); a failover resets
every TM and assigns each its subtasks and what it starts from (R60-R62); an attempt
known stopped hands everything it still owned to the coordinator, which sweeps what it
left (R64, R65). A coordinator's restart (R95) is a new one rebuilt from storage
(``fastimpl.resume``), which then fails over.

A lost attempt is a zombie until it stops: what a failover handed over of its files and
the deletes of the TMs told of it wait for its stop (R61, R64).
"""

from __future__ import annotations

import logging

from fastimpl.checkpoint_lifecycle import CheckpointLifecycle
from fastimpl.coordinated_job import CoordinatedJob
from fastimpl.ids import creator_of
from fastimpl.records import ManagedDir, Status, StoredFile, Tm
from fastimpl.retention import Retention
from fastimpl.tm_book import TmBook
from fastimpl.working import SharedWorking, is_working_path
from spec import commands as c
from spec.config import MergingMode
from spec.effects import COORDINATOR, tm_actor
from spec.handles import FileHandle, PlaceholderHandle, SegmentHandle
from spec.ids import SubtaskId, TmId
from spec.layout import (
    checkpoint_dir,
    is_under,
    job_base,
    savepoint_dir,
    shared_dir,
    taskowned_dir,
    working_dir,
)
from spec.messages import (
    AttemptStopped,
    Held,
    Holdings,
    KeptFile,
    LostAttemptStopped,
    ResetTm,
    RetainedCheckpoint,
    TmAssignment,
)
from spec.refusals import check

log = logging.getLogger("fastimpl.coordinator")


class Failover:
    """Lost, replaced and stopped attempts and failovers, with what the TMs were told of
    the lost attempts that may still run."""

    def __init__(
        self,
        run: CoordinatedJob,
        tm_book: TmBook,
        lifecycle: CheckpointLifecycle,
        retention: Retention,
        working: SharedWorking,
    ) -> None:
        self.run = run
        self.tm_book = tm_book
        self.lifecycle = lifecycle
        self.retention = retention
        self.working = working
        self.epoch = 0
        """Failovers so far: each TM applies a failover's duties once (``spec.messages``)."""
        self.handed_to: dict[str, TmId] = {}
        """R61, R64: files of retained checkpoints a failover handed to an attempt, each
        with the last one it went to, whose records hold it from then on (a lost one
        cannot be asked): that attempt's, not its creator's, when the creator stops;
        gone once that attempt has stopped."""
        self.told_lost: dict[TmId, frozenset[TmId]] = {}
        """The lost attempts each TM was told of at its last failover (``TmAssignment``)
        and not yet told stopped: its deletes of their files wait (R64)."""

    def _abort_pending(self) -> None:
        for cid in sorted(self.lifecycle.pending):
            self.lifecycle.abort(cid)

    def lose(self, tm: TmId) -> None:
        """R57: every pending checkpoint aborts when a TM is lost."""
        rec = self.tm_book.tms[tm]
        rec.status = Status.LOST
        rec.hosted = frozenset(s for s, t in self.tm_book.placement.items() if t == tm)
        self._abort_pending()

    def replace(self, tm: TmId, new: TmId | None = None) -> TmId:
        """R66: task-level failover. ``tm`` is lost (a zombie until it stops, R64) and its
        acknowledgements of pending checkpoints are withdrawn; a new attempt runs its
        subtasks, may write for every pending checkpoint and later ones, and starts them
        as a restarting TM does (R61, R62, R105). Nothing is aborted, no other TM is reset
        or told. The new attempt's id.

        ``new``: an attempt the engine started on its own, which the coordinator first
        hears of now (Spark: the TM of a retried or speculative task, by its
        acknowledgement). It started from what the engine gave it and is sent nothing:
        it holds nothing of ``tm``'s, whose files stay ``tm``'s until it stops (R64).
        Without ``new`` the engine starts the attempt here, and it is told what it starts
        from (``TmAssignment``)."""
        run, book, pending = self.run, self.tm_book, self.lifecycle.pending
        rec = book.tms[tm]
        hosted = sorted(s for s, t in book.placement.items() if t == tm)
        rec.status = Status.LOST
        rec.hosted = frozenset(hosted)
        self.withdraw_acks(hosted)
        first = min(pending, default=run.next_checkpoint)
        lowest = min(
            (k for k, p in pending.items() if not p.savepoint), default=run.next_checkpoint
        )
        starting = new is None
        if new is None:
            new = run.engine.start_tm(run.job, first, lowest - 1)
        book.tms[new] = Tm(new, Status.ALIVE)
        book.started[new] = (run.job, first)
        book.placement = {s: new if t == tm else t for s, t in book.placement.items()}
        run.engine.placed(book.placement)
        # R63, R64: its exclusive directory stays its own while it may still run: it
        # deletes the directory once empty (R41) without knowing it was replaced; the
        # coordinator takes it at its stop (``attempt_stopped``, ``_take_stopped``)
        if starting:
            # R10, R66: every checkpoint from ``first`` on that is no longer pending is
            # over for it: aborted (above the lowest pending one, completing it would have
            # aborted that, R53), or a finished savepoint
            over = [k for k in range(first, run.next_checkpoint) if k not in pending]
            self.epoch += 1  # its assignment is applied once; a later failover's after it
            is_savepoint = self.lifecycle.is_savepoint
            self._assign(
                new,
                hosted,
                first,
                lowest - 1,
                frozenset(k for k in over if k > lowest and not is_savepoint(k)),
                frozenset(k for k in over if is_savepoint(k)),
            )
            # working state (§11): R105 opens the checkpointed working files in place
            retained = self.retention.retained
            latest = retained[-1] if retained else None
            self.working.open_databases(latest, self.epoch, only=new)
        self.retention.collect_dirs()
        return new

    def withdraw_acks(self, subtasks: list[SubtaskId]) -> None:
        """R66, R56: the acknowledgements a replaced attempt sent for pending checkpoints
        are withdrawn with what they handed over: the pins of their placeholders (R22),
        their in-place references (R103), and their whole files (R43), which the
        coordinator deletes once the attempt stopped (R64)."""
        pending = self.lifecycle.pending
        retention = self.retention
        catalog = self.run.catalog
        for cid in sorted(pending):
            p = pending[cid]
            gone = [s for s in subtasks if s in p.acks]
            if not gone:
                continue
            entries = [e for s in gone for e in p.acks.pop(s)]
            for s in gone:
                p.working.pop(s, None)
            handed = {e.handle.path for e in entries if isinstance(e.handle, FileHandle)}
            handed &= p.received
            p.received -= handed
            still = {
                e.handle.logical_id
                for v in p.acks.values()
                for e in v
                if isinstance(e.handle, PlaceholderHandle)
            }
            pinned = {
                e.handle.logical_id
                for e in entries
                if isinstance(e.handle, PlaceholderHandle) and e.handle.logical_id not in still
            }
            retention.delete_unused(
                retention.registry.unpin_keys(pinned, cid, retention.lowest_retained())
            )
            for path in sorted(handed):
                f = catalog.files.get(path)
                if f is not None and f.owner == COORDINATOR and not retention.referenced(path):
                    catalog.delete_file(path, COORDINATOR)

    def receive_stopped(self, msg: AttemptStopped) -> None:
        """R64, as the engine's message says it (an attempt the coordinator gave up on
        has stopped): the same as ``attempt_stopped``. The message's job is the one the
        attempt ran for, which may be an earlier job of this coordinator (a zombie)."""
        self.attempt_stopped(msg.tm)

    def attempt_ended(self, tm: TmId, hosted: frozenset[SubtaskId], first_checkpoint: int) -> None:
        """R64, R65: ``attempt_stopped`` for an attempt the engine reports with the
        subtasks it ran; one never heard of is first taken as a lost attempt of the
        running job that could write from ``first_checkpoint`` on (R66)."""
        book = self.tm_book
        if tm not in book.tms:
            book.tms[tm] = Tm(tm, Status.LOST)
            book.started[tm] = (self.run.job, first_checkpoint)
        rec = book.tms[tm]
        if rec.status is Status.LOST:
            rec.hosted = rec.hosted | hosted
        self.attempt_stopped(tm)

    def attempt_stopped(self, tm: TmId) -> None:
        """R64: what waited for a stopped attempt runs; the coordinator takes the rest."""
        check(c.AttemptStopped, self.lifecycle.guards.stopped_checks(tm))
        rec = self.tm_book.tms[tm]
        rec.status = Status.STOPPED
        hosted = rec.hosted
        rec.hosted = frozenset()
        run = self.run
        catalog = run.catalog
        for path in sorted(catalog.files):
            f = catalog.files[path]
            if f.creator == tm and f.open:
                if run.cfg.open_files_readable:
                    run.storage.abandon(path)  # its process is gone
                    f.open = False
                else:
                    # R65: an object store writes an object when its file is closed (R12);
                    # its writer is gone, so it never will be, whoever owns it by now
                    run.storage.discard(path)
                    del catalog.files[path]
        run.forget_tm(tm)
        actor = tm_actor(tm)
        formerly = sorted(p for p, f in catalog.files.items() if f.owner == actor)
        for path in formerly:
            catalog.files[path].owner = COORDINATOR
        its_dirs = {p for p, o in catalog.dir_owner.items() if o == actor}
        for path in its_dirs:
            catalog.dir_owner[path] = COORDINATOR
        # what it left unrecorded is taken before the deletes that waited for it run: a
        # directory delete among them must see those files as the coordinator's (R64)
        before = set(catalog.dir_owner)
        taken = self._take_stopped(tm, hosted)
        its_dirs |= set(catalog.dir_owner) - before
        catalog.release_waits(tm)
        for path in [*formerly, *taken]:
            if path in catalog.files and not self.retention.referenced(path):
                catalog.delete_file(path, COORDINATOR)  # waits while its creator runs
        self._drop_empty_dirs(sorted(its_dirs))
        self._tell_stopped(tm)
        self.retention.collect_dirs()
        self.retire(tm)

    def _drop_empty_dirs(self, taken: list[str]) -> None:
        """R64: a directory the stopped attempt owned that a live attempt works in (its
        subtask's shared one, R66) and that holds nothing goes. The stopped attempt may have
        deleted it (R41) unseen, its acknowledgements ignored (R56); the live attempt makes
        it again at its next write (R40). Nothing lies in it: storage is listed (a live
        attempt's files are in its records, not here); a failing listing keeps it."""
        run = self.run
        if not run.running:
            return
        catalog = run.catalog
        live = self.tm_book.managed_dirs(set(self.tm_book.current_tms()))
        for path in taken:
            if (
                catalog.dir_owner.get(path) != COORDINATOR
                or path not in live
                or self.retention.dir_referenced(path)
                or any(is_under(p, path) for p in catalog.files)
            ):
                continue
            try:
                if run.storage.files_under(path):
                    continue
            except Exception as err:
                log.warning("listing %s of a stopped attempt failed: %r", path, err)
                continue
            catalog.delete_dir(path, COORDINATOR)

    def _tell_stopped(self, tm: TmId) -> None:
        """R64: the attempts told that ``tm`` may still run, live or lost and not known
        stopped, learn that it stopped, and their deletes that waited for it run."""
        book = self.tm_book
        for other in sorted(self.told_lost):
            rec = book.tms.get(other)
            told = self.told_lost[other]
            if tm in told and rec is not None and rec.status is not Status.STOPPED:
                # a lost attempt that still runs waits too (R64): it is told as well
                job = book.started.get(other, (self.run.job, 1))[0]  # the job it runs for
                self.run.engine.duty(other, LostAttemptStopped(job, other, tm))
                self.told_lost[other] = told - {tm}

    def retire(self, tm: TmId) -> None:
        """A stopped attempt's record goes (``fastimpl.attempts``): nothing depends on it
        any more, and its id stays known as a stopped one's."""
        book = self.tm_book
        book.tms.retire(tm)
        book.started.pop(tm, None)
        book.hosted_before.pop(tm, None)
        self.told_lost.pop(tm, None)
        for path in [p for p, t in self.handed_to.items() if t == tm]:
            del self.handed_to[path]
        self.lifecycle.forget_savepoints()

    def _take_stopped(self, tm: TmId, hosted: frozenset[SubtaskId]) -> list[str]:
        """R64, R65: what a stopped attempt still owned is the coordinator's; the paths
        taken here, which the caller deletes unless a retained checkpoint refers to them.
        Its records may have died with its process (a TM killed with SIGKILL): then the
        files it wrote and never handed over are those in the directories it could write
        in (its exclusive one, its subtasks' shared ones and their databases' working
        directories, §11) that no live party records. They are listed, each live TM of
        the job says which it records (``Holdings``), and the rest are taken.

        A subtask's shared directory and a checkpoint's directory are written by every
        attempt that ran the subtask or wrote for the checkpoint, a zombie included,
        whose records the coordinator cannot ask for and whose deletes it cannot see. A
        file another lost attempt created (its name says whose, ``fastimpl.ids.creator_of``)
        is that attempt's to delete, not the stopped one's (R64): it is left to it, and
        swept when it stops; unless a failover handed it to the stopped attempt (R61,
        ``handed_to``), whose it then was. What a live attempt records it says
        (``Holdings``); what it does not, it will never delete, and is taken."""
        run, book = self.run, self.tm_book
        catalog, storage = run.catalog, run.storage
        job, first = book.started.pop(tm, (run.job, 1))
        hosted |= book.hosted_before.pop(tm, frozenset())
        dirs = [taskowned_dir(job, tm)] + [shared_dir(job, s) for s in sorted(hosted)]
        last = run.next_checkpoint
        dirs += [checkpoint_dir(job, n) for n in range(first, last)]
        sps = [
            savepoint_dir(n)
            for n in sorted(self.lifecycle.triggered_savepoints)
            if first <= n < last
        ]
        known = catalog.owners()
        found: set[str] = set()
        try:
            for top in [job_base(job), *sps]:
                found |= {p for p in storage.files_under(top) if p not in known}
        except Exception as err:  # cannot tell: nothing is taken (a leak, not a loss)
            log.warning("listing what %s left after it stopped failed: %r", tm, err)
            return []
        where = set(dirs) | set(sps)
        # its databases' working files (§11), at any depth below their directory: only
        # those its name says it made, since a database that keeps its own files there
        # (SlateDB's manifests and WAL) is reopened by the next attempt of the subtask
        dbs = [working_dir(job, s) for s in sorted(hosted)]
        found = {
            p
            for p in found
            if p.rsplit("/", 1)[0] in where
            or (creator_of(p) == tm and any(is_under(p, d) for d in dbs))
        }
        # the directories it could own (R40): its exclusive one and its subtasks' shared
        # ones, if on storage and in nobody's record here
        own_dirs = [d for d in dirs[: 1 + len(hosted)] if d not in catalog.dir_owner]
        left_dirs = (
            [] if run.mode is MergingMode.NONE else [d for d in own_dirs if self._left_dir(d)]
        )
        if not found and not left_dirs:
            return []
        held: set[str] = set()
        taken: list[str] = []
        asked = sorted({p.rsplit("/", 1)[0] for p in found} | set(left_dirs))
        if run.running:
            for live in book.current_tms():
                answer = run.engine.duty(live, Holdings(run.job, live, tuple(asked)))
                if isinstance(answer, Held):
                    held |= set(answer.paths)
            if any(is_working_path(p) for p in found):
                held |= self.working.in_use()  # R104: what a live database uses stays
        for d in left_dirs:
            if d not in held:  # R64: the stopped attempt's, as no live attempt owns it
                catalog.dir_owner[d] = COORDINATOR
                catalog.dirs[d] = ManagedDir(d, tm)
        for path in sorted(found - held):
            if path in catalog.files or not self.lifecycle.may_sweep(path, job):
                continue
            made = creator_of(path)
            holder = self.handed_to.get(path)
            if holder is not None and holder != tm and book.is_lost(holder):
                continue  # R61: a failover handed it to a lost attempt, whose records say so
            if made is not None and made != tm and book.is_lost(made):
                if holder != tm:
                    continue  # R64: a zombie's, left to it
            creator = tm if made is None else made
            catalog.files[path] = StoredFile(storage.size(path), False, COORDINATOR, creator)
            taken.append(path)
        return taken

    def failover(self) -> None:
        run, book = self.run, self.tm_book
        self._abort_pending()
        replaced: dict[TmId, TmId] = {}
        for tm in sorted(set(book.placement.values())):
            if book.tms[tm].status is not Status.ALIVE:
                new = run.engine.start_tm(run.job, run.next_checkpoint, None)
                replaced[tm] = new
                book.add_tm(new)
        book.placement = {s: replaced.get(t, t) for s, t in book.placement.items()}
        run.engine.placed(book.placement)
        survivors = sorted(set(book.placement.values()) - set(replaced.values()))
        self.epoch += 1
        for tm in survivors:  # R60: no stale manager survives (FLINK-35400)
            run.duty(tm, ResetTm(run.job, tm, self.epoch))
        for tm in sorted(set(book.placement.values())):
            hosted = sorted(s for s, t in book.placement.items() if t == tm)
            self._assign(tm, hosted, run.next_checkpoint, run.next_checkpoint - 1)
        book.assigned_from = run.next_checkpoint
        self.lifecycle.forget_savepoints()
        # working state (§11): R105 opens the checkpointed working files in place
        retained = self.retention.retained
        self.working.open_databases(retained[-1] if retained else None, self.epoch)
        self.retention.collect_dirs()

    def _lost_maker(self, path: str) -> TmId | None:
        """The lost attempt, still able to run, that made the subtask directory ``path``
        if no acknowledgement reported it: an attempt takes its subtasks' directories at
        its start (R61) unless a lost one owns them, so the newest lost attempt that
        hosted the subtask made it."""
        job = self.run.job
        makers = [
            t
            for t, r in self.tm_book.tms.items()
            if self.tm_book.is_lost(t) and any(shared_dir(job, s) == path for s in r.hosted)
        ]
        return makers[-1] if makers else None

    def _dir_seen(self, path: str) -> bool | None:
        """Whether directory ``path`` is on storage; None when the check fails."""
        try:
            return self.run.storage.exists_dir(path)
        except Exception as err:
            log.warning("checking for %s failed: %r", path, err)
            return None

    def _left_dir(self, path: str) -> bool:
        """Whether a lost attempt's directory ``path`` is on storage; a failing check
        says no: what it holds is swept when its attempt stops (R64)."""
        return self._dir_seen(path) is True

    def _gone(self, path: str) -> bool:
        """Whether directory ``path`` is known not to be on storage; a failing check says
        no, and the lost attempt's record stays as it was."""
        return self._dir_seen(path) is False

    def _assign(
        self,
        tm: TmId,
        hosted: list[SubtaskId],
        first: int,
        mark: int,
        aborted: frozenset[int] = frozenset(),
        savepoints: frozenset[int] = frozenset(),
    ) -> None:
        """R60-R62, R66: ``tm`` restarts ``hosted`` from the retained checkpoints, and
        writes for ``first`` and later checkpoints that are not over (``mark``,
        ``aborted``, ``savepoints``)."""
        run, retention = self.run, self.retention
        retained = retention.retained
        latest = retained[-1] if retained and retained[-1].job == run.job else None
        lost = frozenset(t for t, r in self.tm_book.tms.items() if r.status is Status.LOST)
        self.told_lost[tm] = lost
        for path in self._kept_paths(tm, hosted):
            self.handed_to[path] = tm  # R61: tm records it as its own from now on
        run.engine.duty(
            tm,
            TmAssignment(
                run.job,
                tm,
                self.epoch,
                tuple(hosted),
                tuple(RetainedCheckpoint(r.id, r.entries) for r in retained),
                None if latest is None else RetainedCheckpoint(latest.id, latest.entries),
                lost,
                *self._hand_dirs(tm, hosted),
                self._hand_files(tm, hosted),
                first,
                retention.latest_completed,
                mark,
                retention.watermark,
                aborted,
                savepoints,
            ),
        )

    def _hand_files(self, tm: TmId, hosted: list[SubtaskId]) -> tuple[KeptFile, ...]:
        """R61: files of retained checkpoints' segments in the directories ``tm`` manages
        now that the coordinator holds (taken from a stopped attempt, R64) go to ``tm``
        with their records."""
        catalog = self.run.catalog
        out: list[KeptFile] = []
        for path in self._kept_paths(tm, hosted):
            f = catalog.files.get(path)
            if f is not None and f.owner == COORDINATOR:
                del catalog.files[path]
                out.append(KeptFile(path, f.size, f.creator))
        return tuple(out)

    def _kept_paths(self, tm: TmId, hosted: list[SubtaskId]) -> list[str]:
        """R61: the files of retained checkpoints' segments in the directories ``tm``
        manages now (its subtasks' shared ones, its own exclusive one): ``tm`` takes them
        over. Merging modes only (NONE restarts nothing from files)."""
        if self.run.mode is MergingMode.NONE:
            return []
        job = self.run.job
        managed = [shared_dir(job, s) for s in hosted] + [taskowned_dir(job, tm)]
        return sorted(
            {
                h.path
                for r in self.retention.retained
                for e in r.entries
                if isinstance(h := e.handle, SegmentHandle)
                and any(is_under(h.path, d) for d in managed)
            }
        )

    def _hand_dirs(
        self, tm: TmId, hosted: list[SubtaskId]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """R61: the directories ``tm`` manages now (its subtasks' shared ones, its own
        exclusive one) that a TM owns become its own, as it records them; those the
        coordinator owns stay the coordinator's (R42), and the TM is told so. Merging
        modes only (NONE restarts nothing from files, R61)."""
        if self.run.mode is MergingMode.NONE:
            return (), ()
        job = self.run.job
        catalog = self.run.catalog
        managed = [shared_dir(job, s) for s in hosted] + [taskowned_dir(job, tm)]
        taken: list[str] = []
        coordinators: list[str] = []
        book = self.tm_book
        for d in managed:
            owner = catalog.dir_owner.get(d)
            if owner is not None and owner.startswith("tm:") and book.is_lost(owner[3:]):
                if self._gone(d):
                    # R64: the lost attempt deleted it (R41) where nobody saw (R56); the
                    # live attempt makes it again at its next write, its own (R40)
                    del catalog.dir_owner[d]
                    catalog.dirs.pop(d, None)
                continue  # R64: a lost attempt's until it is known stopped (R41, R63)
            maker = self._lost_maker(d) if owner is None else None
            if maker is not None and self._left_dir(d):
                # R64: made by a lost attempt that may still run and never reported it:
                # its own until it stops (R41, R63), as its records say
                catalog.dir_owner[d] = tm_actor(maker)
                catalog.dirs[d] = ManagedDir(d, maker)
                continue
            if owner is None and self._left_dir(d):
                # made by an attempt that is gone, and no acknowledgement reported it
                # (each attempt's records are its own): found on storage, it is tm's
                catalog.dir_owner[d] = tm_actor(tm)
                catalog.dirs[d] = ManagedDir(d, tm)
                taken.append(d)
                continue
            if owner == COORDINATOR:
                coordinators.append(d)
            if owner is None or owner == COORDINATOR:
                continue
            catalog.dir_owner[d] = tm_actor(tm)
            md = catalog.dirs.get(d)
            if md is not None:
                md.creator = tm
                md.used_by = set()
            taken.append(d)
        return tuple(taken), tuple(coordinators)
