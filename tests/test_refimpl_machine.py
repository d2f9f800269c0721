"""Random command sequences against the reference model alone (issue 2): the random state
machine (``conformance/machine.py``) with every invariant after every step and no leak once
quiet. A failure prints the minimal command sequence that breaks an invariant.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.harness import Harness
from conformance.machine import RefimplMachine
from spec import commands as c
from spec.config import Config, MergingMode
from spec.errors import CommandError, Reason
from tests.profile import PROFILE

EXAMPLES = 7000
"""Per merging mode (three modes)."""


@pytest.mark.skipif(
    PROFILE != "long",
    reason="the model alone soaks in the long profile; the lockstep runs this machine's "
    "rules on the model, with its invariants, beside fastimpl in every profile",
)
@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_random_sequences(mode: MergingMode) -> None:
    """EXAMPLES random sequences per merging mode, every invariant after every step."""
    machine = type(f"RefimplMachine{mode.name}", (RefimplMachine,), {"mode": mode})
    run_state_machine_as_test(machine, settings=settings(max_examples=EXAMPLES))


def test_refusal_leaves_state_unchanged() -> None:
    h = Harness(Config())
    before = h.state
    err = h.try_run(c.Complete(99))
    assert isinstance(err, CommandError) and err.reason is Reason.UNKNOWN_CHECKPOINT
    assert h.state is before
