"""Live mode on the Flink adapter: random sequences from the model's own random state machine
(``conformance.machine.RefimplMachine``, derandomized), with every command out of the
profile's reach left out (never sent to either side; inline state, R107, never drawn) and
the machine's quiescing at the end, each then run on Flink and judged step by step
(``judge.run``).

Unlike ``conformance.live``, which stops at the first mismatch and lets Hypothesis shrink
it, every sequence is run, so that the report can say how many pass and sort the rest by
kind; a kind the corpus does not show is shrunk by ``judge.shrink``. (Hypothesis's own
shrinking over a JVM takes many minutes per mismatch.)"""

from __future__ import annotations

import attrs
from hypothesis import Phase, event, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.flink.profile import out_of_reach
from conformance.harness import DEFAULT_JOB, Harness
from conformance.machine import RefimplMachine
from spec.commands import Command
from spec.config import Config, JobSpec, MergingMode

Sequence = tuple[Config, JobSpec, tuple[Command, ...]]


def sequences(mode: MergingMode, examples: int, steps: int = 40) -> list[Sequence]:
    """``examples`` random sequences in ``mode``, each with the commands the model
    accepted, quiescing included."""
    tapes: list[Sequence] = []

    class Recorder(RefimplMachine):
        def make_harness(self, cfg: Config) -> Harness:
            # inline state (R107) is out of the profile's reach in every sequence: the
            # machine's draw of it would leave the whole sequence unreplayed
            return super().make_harness(attrs.evolve(cfg, inline_threshold=0))

        def do(self, cmd: Command) -> None:
            if out_of_reach(self.s.config, (cmd,)) is not None:
                event(f"left out {type(cmd).__name__}")
                return
            super().do(cmd)

        def teardown(self) -> None:
            super().teardown()
            tapes.append((self.h.state.config, DEFAULT_JOB, tuple(self.h.history)))

    Recorder.mode = mode
    run_state_machine_as_test(
        Recorder,
        settings=settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            stateful_step_count=steps,
            phases=[Phase.generate],
        ),
    )
    return tapes
