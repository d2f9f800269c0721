"""A small driver around the reference model: run commands, check every safety
invariant after each one, and bring the system to a quiet state (R60 of SPEC.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from refimpl import ModelState, initial_state, observe, observe_working, step
from refimpl.state import TmStatus
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.effects import CreateFile, DeleteFile, Effect
from spec.errors import CkptError, CommandError
from spec.ids import SubtaskId
from spec.invariants import Violation, check_safety, check_working, working_files_kept
from spec.observation import Observation, WorkingObservation

DEFAULT_JOB = JobSpec((VertexSpec("src", 2), VertexSpec("agg", 2)), num_tms=2)
ONE = JobSpec((VertexSpec("v", 1),), num_tms=1)
"""A job of one subtask, ``S``, on one TM."""
S = SubtaskId("v", 0, 1)
JOB = "job-0"
"""The job id of ``initial_state``: the first component of every checkpoint path."""

ALL_MODES = list(MergingMode)
MERGING = [MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT]
KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST

T = TypeVar("T")


class InvariantBroken(CkptError, AssertionError):
    pass


class Harness:
    """Drives one model; every command is checked against the safety invariants.
    ``effects`` keeps every effect of every command that succeeded, in order."""

    def __init__(
        self,
        config: Config | None = None,
        job: JobSpec = DEFAULT_JOB,
        *,
        state: ModelState | None = None,
    ) -> None:
        self.state = state if state is not None else initial_state(config or Config(), job)
        self.history: list[c.Command] = []
        self.last_effects: tuple[Effect, ...] = ()
        self.effects: list[Effect] = []
        self.previous: ModelState | None = None

    # ---------------------------------------------------------------- running commands

    def run(self, cmd: c.Command) -> tuple[Effect, ...]:
        out = step(self.state, cmd)
        self.previous = self.state
        self.state = out.state
        self.history.append(cmd)
        self.last_effects = out.effects
        obs = observe(self.state)
        broken = check_safety(obs)
        if self.state.wfiles or self.state.dbs:  # §11: I7 once a database wrote
            broken += working_files_kept(obs, observe_working(self.state))
        if broken:
            raise InvariantBroken(self._report(broken))
        self.effects.extend(out.effects)
        return out.effects

    def try_run(self, cmd: c.Command) -> CommandError | None:
        """Run a command that may be refused; a refusal must leave the state unchanged."""
        before = self.state
        try:
            self.run(cmd)
        except CommandError as err:
            assert self.state is before
            return err
        return None

    def observe(self) -> Observation:
        return observe(self.state)

    def working(self) -> WorkingObservation:
        """The model's working files (§11): states, users and in-place references."""
        return observe_working(self.state)

    def _report(self, broken: list[Violation]) -> str:
        lines = [str(v) for v in broken]
        lines.append("after commands:")
        lines += [f"    {cmd!r}," for cmd in self.history]
        return "\n".join(lines)

    # ---------------------------------------------------------------- views of the state

    @property
    def subtasks(self) -> list[SubtaskId]:
        return sorted(self.state.placement)

    @property
    def last_checkpoint(self) -> int:
        return self.state.next_checkpoint - 1

    def tm_of(self, subtask: SubtaskId) -> str:
        return self.state.placement[subtask]

    def live_tms(self) -> list[str]:
        return sorted(
            {t for t in self.state.placement.values() if self.state.tms[t].status is TmStatus.ALIVE}
        )

    def lost_tms(self) -> list[str]:
        return sorted(t for t, r in self.state.tms.items() if r.status is TmStatus.LOST)

    # ---------------------------------------------------------------- composite steps

    def deliver_all(self) -> None:
        while self.state.channel:
            self.run(c.DeliverNotification(0))

    def checkpoint(
        self,
        *,
        shared: Iterable[str] = ("sst-1",),
        reuse: Iterable[str] = (),
        size: int = 100,
        operator_entries: int = 2,
        complete: bool = True,
        deliver: bool = True,
        savepoint: bool = False,
    ) -> int:
        """Trigger one checkpoint in which every subtask writes or reuses shared state and
        writes operator state, acknowledges, and (by default) completes and is notified."""
        self.run(c.Trigger(savepoint=savepoint))
        cp = self.last_checkpoint
        for s in self.subtasks:
            for name in reuse:
                self.run(c.ReuseShared(cp, s, name))
            for name in shared:
                self.run(c.WriteState(cp, s, StateKind.KEYED_SHARED, name, size))
            self.run(
                c.WriteState(
                    cp,
                    s,
                    StateKind.OPERATOR_LIST,
                    "offsets",
                    size // 4 + 1,
                    entries=operator_entries,
                )
            )
            self.run(c.Acknowledge(cp, s))
        if complete:
            self.run(c.Complete(cp))
            if deliver:
                self.deliver_all()
        return cp

    def quiesce(self, *, fresh: int | None = None) -> list[Violation]:
        """Bring the system to a quiet state and return what "no leak once quiet" finds
        (R60): lost attempts stopped, failed deletes retried until they succeed, every
        notification delivered, then ``num_retained + 1`` checkpoints completed without
        faults while the job runs, and then the coordinator's collection of working files
        (R104). Every invariant is checked, I7 and the working files' I6 too."""
        for tm in self.lost_tms():
            self.run(c.AttemptStopped(tm))
        self._drain_deletes()
        self.deliver_all()
        if self.state.running:
            if any(
                self.state.tms[t].status is not TmStatus.ALIVE
                for t in self.state.placement.values()
            ):
                self.run(c.Failover())
            for cp in sorted(self.state.pending):
                self.run(c.Abort(cp))
            need = fresh if fresh is not None else self.state.config.num_retained + 1
            done, attempts = 0, 0
            while done < need:
                attempts += 1
                assert attempts < 50, "could not complete checkpoints while quiescing"
                before = len(self.state.retained) and self.state.retained[-1].id
                self._fault_free_checkpoint()
                if self.state.retained and self.state.retained[-1].id != before:
                    done += 1
                self._drain_deletes()
                self.deliver_all()
            self.run(c.CollectWorking())
        self._drain_deletes()
        return check_working(self.observe(), self.working(), quiet=True)

    def _drain_deletes(self) -> None:
        for _ in range(len(self.state.armed) + 2):
            if not any(d.waits_for is None for d in self.state.deferred):
                return
            self.run(c.RetryDeletes())

    def _fault_free_checkpoint(self) -> None:
        self.run(c.Trigger())
        cp = self.last_checkpoint
        for s in self.subtasks:
            if cp not in self.state.pending:
                return  # an armed fault aborted it: the caller tries again
            self.run(c.WriteState(cp, s, StateKind.KEYED_SHARED, "quiet", 50))
            if cp not in self.state.pending:
                return
            self.run(c.Acknowledge(cp, s))
        if cp in self.state.pending:
            self.run(c.Complete(cp))
        self.deliver_all()


def merging(mode: MergingMode, **kwargs: object) -> Config:
    return Config.for_mode(mode, **kwargs)


# -------------------------------------------------------------------- reading effects


def of_type(effects: Iterable[object], kind: type[T]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def created(effects: Iterable[Effect], actor: str | None = None) -> list[str]:
    """Paths of the files created (by ``actor``, if given), in order."""
    return [e.path for e in effects if isinstance(e, CreateFile) and actor in (None, e.actor)]


def deleted(effects: Iterable[Effect], actor: str | None = None) -> list[str]:
    """Paths of the files deleted (by ``actor``, if given), in order."""
    return [e.path for e in effects if isinstance(e, DeleteFile) and actor in (None, e.actor)]
