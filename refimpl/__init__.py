"""The reference model: a pure, in-memory state machine of checkpoint file ownership.

No file system, no clock, no randomness, no global state. ``step(state, command)``
returns the next state and the ordered storage effects; ``observe(state)`` says what the
model shows. ``guard_checks(state, command)`` gives the model's predicate for each
guard ``spec.refusals`` lists for the command, which ``step`` checks first. Everything
here follows spec/SPEC.md rule by rule.
"""

from refimpl.machine import Outcome, guard_checks, step
from refimpl.observe import observe, observe_working
from refimpl.state import ModelState, initial_state

__all__ = [
    "ModelState",
    "Outcome",
    "guard_checks",
    "initial_state",
    "observe",
    "observe_working",
    "step",
]
