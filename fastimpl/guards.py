"""The coordinator's predicates for the guards of ``spec/refusals.py``, read off its own
records: the running job (``CoordinatedJob``), where subtasks run and what it knows of
each attempt (``TmBook``), and the pending checkpoints (``CheckpointLifecycle``'s, asked
through a call: that module imports this one).

Each predicate is named after its guard and answers as ``spec.refusals.Check`` does:
``None`` while the guard holds, else the refusal's detail. ``spec.refusals.check`` walks
them in the table's order, so a predicate may rely on every guard before it (a TM's
record exists once ``tm_known`` held). The guards on what a TM itself recorded (a
checkpoint over for it, its acknowledgements, its backend and databases) are the
engine's, which asks the TM's party (``fastimpl.engine``); a restore's read its source
(``fastimpl.restore_planning.RestoreChecks``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastimpl.coordinated_job import CoordinatedJob
from fastimpl.records import Pending, Status
from fastimpl.tm_book import TmBook
from spec.ids import SubtaskId, TmId
from spec.refusals import Check


class CoordinatorGuards:
    """The guards the coordinator's records decide, and the coordinator's commands'
    predicate tables (``spec.refusals.Checks``)."""

    def __init__(
        self,
        run: CoordinatedJob,
        book: TmBook,
        pending: Callable[[], Mapping[int, Pending]],
    ) -> None:
        self.run = run
        self.book = book
        self.pending = pending
        """The pending checkpoints (``CheckpointLifecycle.pending``), asked each time: a
        restore or a failover replaces the table."""

    # ------------------------------------------------------------------ one guard each

    def running(self) -> str | None:
        """R90: an ended job takes no command."""
        return None if self.run.running else f"job {self.run.job} has ended"

    def subtask_known(self, subtask: SubtaskId) -> str | None:
        if subtask in self.book.placement:
            return None
        return f"{subtask} is not a subtask of {self.run.job}"

    def checkpoint_triggered(self, checkpoint: int) -> str | None:
        """R10: ids run from 1 to the last one triggered (R50)."""
        if 1 <= checkpoint < self.run.next_checkpoint:
            return None
        return f"checkpoint {checkpoint} unknown"

    def checkpoint_pending(self, checkpoint: int) -> str | None:
        """R51: only a pending checkpoint completes or aborts."""
        if checkpoint in self.pending():
            return None
        return f"checkpoint {checkpoint} is not pending"

    def all_acknowledged(self, checkpoint: int) -> str | None:
        """R51: every subtask of the running job acknowledged."""
        p = self.pending()[checkpoint]
        missing = [s for s in self.book.placement if s not in p.acks]
        if not missing:
            return None
        return f"checkpoint {checkpoint} lacks acks from {[str(s) for s in missing]}"

    def tm_known(self, tm: TmId) -> str | None:
        """An attempt this coordinator started or heard of (a retired one included,
        ``fastimpl.attempts``)."""
        return None if self.book.tms.get(tm) is not None else f"no TM {tm}"

    def tm_alive_in_job(self, tm: TmId) -> str | None:
        """R57, R66: a live TM of the running job, named by a command."""
        rec = self.book.tms[tm]
        if rec.status is Status.ALIVE and tm in self.book.placement.values():
            return None
        return f"{tm} is not a live TM of {self.run.job}"

    def tm_lost(self, tm: TmId) -> str | None:
        """R64: only an attempt given up on can be known to have stopped."""
        status = self.book.tms[tm].status
        return None if status is Status.LOST else f"{tm} is {status.value}, not lost"

    def none_lost(self) -> str | None:
        """R64, R95: a coordinator restarts only once no attempt it gave up on may still
        run (the rebuild from storage asks the running TMs what they hold; a zombie's
        files would be taken for the dead coordinator's garbage)."""
        lost = sorted(t for t, rec in self.book.tms.items() if rec.status is Status.LOST)
        return None if not lost else f"lost attempts not known stopped: {', '.join(lost)}"

    def acting_tm(self, subtask: SubtaskId, attempt: TmId | None) -> TmId:
        """The attempt that acts for ``subtask``: its TM, or the ``attempt`` named (a
        zombie, R64); whether it may is for the guards (``acting_checks``)."""
        return self.book.placement[subtask] if attempt is None else attempt

    def acting_checks(
        self, subtask: SubtaskId, attempt: TmId | None, *, zombie: bool
    ) -> dict[str, Check]:
        """R57, R64: the subtask's TM acts while alive; a command that may come from a
        zombie (``zombie``) may name a lost ``attempt`` that hosted the subtask. Run once
        the subtask is known."""

        def host_alive() -> str | None:
            if attempt is not None:
                return None
            tm = self.book.placement[subtask]
            rec = self.book.tms.get(tm)  # a host is always known (a stopped one retired)
            if rec is not None and rec.status is Status.ALIVE:
                return None
            return f"{tm} hosting {subtask} is not alive"

        checks: dict[str, Check] = {"host_alive": host_alive}
        if not zombie:
            return checks

        def writer_known() -> str | None:
            return self.tm_known(self.acting_tm(subtask, attempt))

        def attempt_lost() -> str | None:
            if attempt is None or self.book.tms[attempt].status is Status.LOST:
                return None
            return f"attempt {attempt} is not a lost TM"

        def attempt_hosted() -> str | None:
            if attempt is None or subtask in self.book.tms[attempt].hosted:
                return None
            return f"{attempt} never hosted {subtask}"

        return checks | {
            "writer_known": writer_known,
            "attempt_lost": attempt_lost,
            "attempt_hosted": attempt_hosted,
        }

    # ------------------------------------------------------------------ each command's table

    def running_checks(self) -> dict[str, Check]:
        """Trigger, Failover, Cancel, CollectWorking."""
        return {"running": self.running}

    def restart_checks(self) -> dict[str, Check]:
        """RestartCoordinator: a running job none of whose attempts is lost (R64, R95)."""
        return {"running": self.running, "none_lost": self.none_lost}

    def database_checks(
        self, subtask: SubtaskId, attempt: TmId | None, *, zombie: bool = True
    ) -> dict[str, Check]:
        """The attempt whose database acts (R100, R106), as a writer is checked before
        its checkpoint (R57, R64)."""
        return {
            "running": self.running,
            "subtask_known": lambda: self.subtask_known(subtask),
            **self.acting_checks(subtask, attempt, zombie=zombie),
        }

    def abort_checks(self, checkpoint: int) -> dict[str, Check]:
        """Abort: a checkpoint triggered and still pending (R51)."""
        return {
            "running": self.running,
            "checkpoint_triggered": lambda: self.checkpoint_triggered(checkpoint),
            "checkpoint_pending": lambda: self.checkpoint_pending(checkpoint),
        }

    def complete_checks(self, checkpoint: int) -> dict[str, Check]:
        """Complete: as Abort, and every subtask of the running job acknowledged (R51)."""
        return self.abort_checks(checkpoint) | {
            "all_acknowledged": lambda: self.all_acknowledged(checkpoint)
        }

    def live_tm_checks(self, tm: TmId) -> dict[str, Check]:
        """CrashTm, ReplaceTm."""
        return {
            "running": self.running,
            "tm_known": lambda: self.tm_known(tm),
            "tm_alive_in_job": lambda: self.tm_alive_in_job(tm),
        }

    def stopped_checks(self, tm: TmId) -> dict[str, Check]:
        """AttemptStopped."""
        return {"tm_known": lambda: self.tm_known(tm), "tm_lost": lambda: self.tm_lost(tm)}
