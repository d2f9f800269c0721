"""Live mode: random command sequences (the model's own random state machine) run on the
candidate and on the model side by side, compared after every step. Hypothesis shrinks a
mismatch to a minimal sequence, which is written out as a new JSON case (expectations
from the model) that the candidate fails: add it to the corpus once the bug is fixed.
"""

from __future__ import annotations

from pathlib import Path

from attrs import frozen
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.adapter import Implementation, Session
from conformance.case import Case, write_case
from conformance.compare import differences, normalized
from conformance.harness import DEFAULT_JOB, Harness
from conformance.machine import RefimplMachine
from conformance.runner import expected_steps
from spec.commands import Command
from spec.config import Config, JobSpec, MergingMode
from spec.errors import CkptError, CommandError, Reason


class Mismatch(CkptError, AssertionError):
    """A step where the candidate and the model disagree, with the commands up to it."""

    def __init__(self, message: str, harness: CandidateHarness) -> None:
        super().__init__(message)
        self.config = harness.state.config
        self.job = harness.job
        self.tape = tuple(harness.tape)


class CandidateHarness(Harness):
    """Every command runs on the model and on a session of the candidate, compared."""

    def __init__(self, config: Config, job: JobSpec, impl: Implementation) -> None:
        super().__init__(config, job)
        self.session: Session = impl.start(config, job)
        self.tape: list[Command] = []
        self.job = job

    def run(self, cmd: Command) -> tuple[object, ...]:  # type: ignore[override]
        self.tape.append(cmd)
        model_reason: Reason | None = None
        try:
            effects = super().run(cmd)
        except CommandError as err:
            model_reason, effects = err.reason, ()
        try:
            got = self.session.run(cmd)
        except Exception as err:
            msg = f"{cmd!r}: the candidate raised {type(err).__name__}: {err}"
            raise Mismatch(msg, self) from err
        if got != model_reason:
            raise Mismatch(f"{cmd!r}: model {model_reason}, candidate {got}", self)
        listed = self.state.config.open_files_readable
        diff = differences(
            normalized(self.observe(), open_files_listed=listed),
            normalized(self.session.observe(), open_files_listed=listed),
        )
        if diff:
            raise Mismatch(f"{cmd!r}: observations differ:\n" + "\n".join(diff), self)
        if model_reason is not None:
            raise CommandError(model_reason, "refused by both")
        return effects


@frozen
class LiveResult:
    mode: MergingMode
    examples: int
    mismatch: str | None
    case: Path | None


def live(
    impl: Implementation,
    mode: MergingMode,
    examples: int,
    out: Path,
    *,
    derandomize: bool = False,
) -> LiveResult:
    """Run ``examples`` random sequences in ``mode``; on a mismatch, write the minimal
    failing sequence to ``out`` as a case and say where."""

    class Live(RefimplMachine):
        def make_harness(self, cfg: Config) -> Harness:
            return CandidateHarness(cfg, DEFAULT_JOB, impl)

        def teardown(self) -> None:
            try:
                super().teardown()
            finally:
                h = self.h
                if isinstance(h, CandidateHarness):
                    h.session.close()

    Live.mode = mode
    try:
        run_state_machine_as_test(
            Live,
            settings=settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=derandomize,
                report_multiple_bugs=False,
            ),
        )
    except Mismatch as err:  # the minimal example, replayed last by Hypothesis
        n = len(list(out.glob("live-*"))) + 1
        name = f"live-{mode.name.lower().replace('_', '-')}-{n:03d}"
        steps = expected_steps(err.config, err.job, err.tape)
        summary = f"Found by live mode: {str(err).splitlines()[0][:300]}"
        case = Case(name, (), summary, "live", err.config, err.job, steps)
        out.mkdir(parents=True, exist_ok=True)
        return LiveResult(mode, examples, str(err), write_case(case, out))
    return LiveResult(mode, examples, None, None)
