"""Live mode on the Flink adapter: the model's random state machine, with every command
out of the profile's reach left out (never sent to either side), run on Flink and the model
side by side (``conformance.live.CandidateHarness``); Hypothesis shrinks a mismatch."""

from __future__ import annotations

from attrs import frozen
from hypothesis import event, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.adapter import Implementation
from conformance.harness import DEFAULT_JOB, Harness
from conformance.live import CandidateHarness, Mismatch
from conformance.machine import RefimplMachine
from conformance.flink.profile import out_of_reach
from spec.commands import Command
from spec.config import Config, JobSpec, MergingMode


@frozen
class LiveFound:
    mode: MergingMode
    examples: int
    config: Config | None
    job: JobSpec | None
    tape: tuple[Command, ...]
    """The minimal failing sequence; empty when nothing was found."""
    message: str | None


def live(impl: Implementation, mode: MergingMode, examples: int) -> LiveFound:
    class FlinkMachine(RefimplMachine):
        def make_harness(self, cfg: Config) -> Harness:
            return CandidateHarness(cfg, DEFAULT_JOB, impl)

        def do(self, cmd: Command) -> None:
            if out_of_reach(self.s.config, (cmd,)) is not None:
                event(f"left out {type(cmd).__name__}")
                return
            super().do(cmd)

        def teardown(self) -> None:
            try:
                super().teardown()
            finally:
                h = self.h
                if isinstance(h, CandidateHarness):
                    h.session.close()

    FlinkMachine.mode = mode
    try:
        run_state_machine_as_test(
            FlinkMachine,
            settings=settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=True,
                report_multiple_bugs=False,
                stateful_step_count=40,
            ),
        )
    except Mismatch as err:
        return LiveFound(mode, examples, err.config, err.job, err.tape, str(err)[:2000])
    return LiveFound(mode, examples, None, None, (), None)
