"""Run conformance cases against an implementation and say where it first differs."""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs
from attrs import frozen

from conformance.adapter import Implementation, Model, Session
from conformance.case import Case, Step
from conformance.compare import differences, normalized
from spec.commands import Command
from spec.config import Config, JobSpec


@frozen
class CaseResult:
    case: str
    passed: bool
    steps_run: int
    mismatch: str | None
    """The first difference: the step, the command, and a minimal diff; None if passed."""
    seconds: float


def _outcome(reason: object) -> str:
    return "accepted" if reason is None else f"refused ({getattr(reason, 'value', reason)})"


def _context(steps: list[Command]) -> str:
    return "\n".join(f"    {cmd!r}," for cmd in steps)


def run_case(case: Case, impl: Implementation) -> CaseResult:
    """Run every step of ``case`` on a fresh session of ``impl``; stop at the first step
    whose outcome or observation differs from the expectation."""
    t0 = time.perf_counter()
    try:
        session = impl.start(case.config, case.job)
    except Exception as err:  # the candidate could not start: the case fails
        text = f"{case.name}: starting the implementation raised {type(err).__name__}: {err}"
        return CaseResult(case.name, False, 0, text, time.perf_counter() - t0)
    result = _steps(case, session, t0)
    try:
        session.close()
    except Exception as err:
        if result.passed:  # a failure to end the session after a failure adds nothing
            text = f"{case.name}: ending the session raised {type(err).__name__}: {err}"
            return CaseResult(case.name, False, len(case.steps), text, time.perf_counter() - t0)
    return result


def _steps(case: Case, session: Session, t0: float) -> CaseResult:
    listed = case.config.open_files_readable
    done: list[Command] = []
    for i, s in enumerate(case.steps):
        done.append(s.command)
        try:
            reason = session.run(s.command)
        except Exception as err:  # the candidate crashed: a mismatch, not our crash
            return _fail(case, i, done, s, f"raised {type(err).__name__}: {err}", t0)
        if reason != s.refused:
            problem = f"expected {_outcome(s.refused)}, got {_outcome(reason)}"
            return _fail(case, i, done, s, problem, t0)
        try:
            actual = normalized(session.observe(), open_files_listed=listed)
        except Exception as err:
            return _fail(case, i, done, s, f"observe raised {type(err).__name__}: {err}", t0)
        diff = differences(normalized(s.observation, open_files_listed=listed), actual)
        if diff:
            return _fail(case, i, done, s, "observation differs:\n" + "\n".join(diff), t0)
    return CaseResult(case.name, True, len(case.steps), None, time.perf_counter() - t0)


def _fail(case: Case, i: int, done: list[Command], s: Step, problem: str, t0: float) -> CaseResult:
    text = (
        f"{case.name}: step {i + 1} of {len(case.steps)} {s.command!r}: {problem}\n"
        f"commands up to it:\n{_context(done)}"
    )
    return CaseResult(case.name, False, i + 1, text, time.perf_counter() - t0)


def run_all(cases: Iterable[Case], impl: Implementation) -> list[CaseResult]:
    return [run_case(c, impl) for c in cases]


def expected_steps(config: Config, job: JobSpec, commands: Iterable[Command]) -> tuple[Step, ...]:
    """The steps of running ``commands``, with the model's outcomes and observations."""
    session = Model().start(config, job)
    listed = config.open_files_readable
    out = []
    for cmd in commands:
        reason = session.run(cmd)
        out.append(Step(cmd, reason, normalized(session.observe(), open_files_listed=listed)))
    return tuple(out)


def recomputed(case: Case) -> Case:
    """``case`` with every expectation recomputed by the model."""
    steps = expected_steps(case.config, case.job, [s.command for s in case.steps])
    return attrs.evolve(case, steps=steps)
