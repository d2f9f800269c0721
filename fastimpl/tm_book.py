"""The coordinator's bookkeeping of TM attempts: where each subtask of the running job
runs, which attempts are alive, lost or stopped (``fastimpl.attempts``), the job and first
checkpoint each attempt started for (where a stopped one's files may lie, R64), and the
directories live TMs work in (R42).

It knows TMs from what it is told: acknowledgements name their attempt, and the engine
says where subtasks run.
"""

from __future__ import annotations

from fastimpl.attempts import TmTable
from fastimpl.coordinated_job import CoordinatedJob
from fastimpl.records import Status, Tm
from spec.ids import SubtaskId, TmId
from spec.layout import SAVEPOINTS, job_base, shared_dir, taskowned_dir


class TmBook:
    """Where the running job's subtasks run and what the coordinator knows of each attempt."""

    def __init__(self, run: CoordinatedJob) -> None:
        self.run = run
        self.placement: dict[SubtaskId, TmId] = {}
        """Where the engine runs each subtask of the running job."""
        self.tms: TmTable = TmTable()
        """Live and lost attempts; stopped ones are retired (``fastimpl.attempts``)."""
        self.started: dict[TmId, tuple[str, int]] = {}
        """The job each TM attempt ran for and the first checkpoint it could write for:
        where a stopped attempt's files may lie (R64)."""
        self.hosted_before: dict[TmId, frozenset[SubtaskId]] = {}
        """What a lost attempt hosted in a job a restore ended (its shared directories
        are swept when it stops, R64); gone with the attempt."""
        self.assigned_from = 0
        """The first checkpoint of the last failover: a TM assigned there refuses to write
        or acknowledge for any earlier one (R60), which ``forget_savepoints`` relies on."""
        self._hot: tuple[object, frozenset[str]] | None = None

    def deploy(self, placement: dict[SubtaskId, TmId]) -> None:
        """The engine runs the job's subtasks on these TMs (all alive)."""
        self.placement = dict(placement)
        self.run.engine.placed(self.placement)
        for t in placement.values():
            if t not in self.tms:
                self.add_tm(t)

    def adopt(self, subtask: SubtaskId, tm: TmId, first_checkpoint: int) -> TmId:
        """``tm``, an attempt the engine started itself, runs ``subtask`` from now on and
        may have written from ``first_checkpoint`` on (R64); the attempt placed there
        before, which it returns, stays known until the engine gives it up."""
        old = self.placement[subtask]
        self.deploy({**self.placement, subtask: tm})
        self.started[tm] = (self.run.job, first_checkpoint)
        return old

    def add_tm(self, tm: TmId) -> None:
        self.tms[tm] = Tm(tm, Status.ALIVE)
        self.started[tm] = (self.run.job, self.run.next_checkpoint)

    def current_tms(self) -> list[TmId]:
        return sorted({t for t in self.placement.values() if self.tms[t].status is Status.ALIVE})

    def is_lost(self, tm: TmId) -> bool:
        """Whether attempt ``tm`` is lost and not known stopped: it may still run, and no
        one can ask it what it records (a live one answers ``Holdings``)."""
        rec = self.tms.get(tm)
        return rec is not None and rec.status is Status.LOST

    def hot_dirs(self) -> frozenset[str]:
        job = self.run.job
        key = (job, tuple(self.placement))
        if self._hot is None or self._hot[0] != key:
            hot = {shared_dir(job, s) for s in self.placement}
            hot |= {d.rsplit("/", 1)[0] for d in hot}
            hot |= {f"{job_base(job)}/taskowned", SAVEPOINTS}
            self._hot = (key, frozenset(hot))
        return self._hot[1]

    def managed_dirs(self, tms: set[TmId]) -> set[str]:
        """R42, R61: the directories the TMs ``tms`` manage in the running job, holding a
        file there yet or not: the shared directories of the subtasks they host and their
        own exclusive ones. A TM told that such a directory is the coordinator's (R61)
        writes into it without creating it again, so it must not go under it."""
        job = self.run.job
        hosted = {shared_dir(job, s) for s, t in self.placement.items() if t in tms}
        return hosted | {taskowned_dir(job, t) for t in tms}
