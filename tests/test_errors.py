"""Every documented refusal (spec/errors.py): the right reason, and nothing changed."""

from __future__ import annotations

import pytest

from conformance.harness import KS, Harness
from spec import commands as c
from spec.config import Config, MergingMode, RestoreMode
from spec.errors import Reason
from spec.ids import SubtaskId

GHOST = SubtaskId("nope", 0, 1)


def refused(h: Harness, cmd: c.Command) -> Reason:
    before, effects = h.state, h.last_effects
    err = h.try_run(cmd)
    assert err is not None, f"{cmd!r} was accepted"
    assert h.state is before and h.last_effects == effects
    assert err.reason.value in str(err)
    return err.reason


@pytest.fixture(params=list(MergingMode), ids=lambda m: m.name)
def h(request: pytest.FixtureRequest) -> Harness:
    harness = Harness(Config.for_mode(request.param))
    harness.checkpoint()
    return harness


def test_every_reason_is_exercised(h: Harness) -> None:
    s0 = h.subtasks[0]
    tm0 = h.tm_of(s0)
    seen = {
        refused(h, c.WriteState(99, s0, KS, "x", 1)),  # UNKNOWN_CHECKPOINT
        refused(h, c.Abort(1)),  # CHECKPOINT_NOT_PENDING
        refused(h, c.WriteState(1, s0, KS, "x", 1)),  # CHECKPOINT_FINISHED_FOR_TM
        refused(h, c.Restore(42, (), RestoreMode.CLAIM)),  # NOT_RETAINED
        refused(h, c.Restore(1, (("agg", 0),), RestoreMode.CLAIM)),  # BAD_ARGUMENT
        refused(h, c.Restore(1, (), RestoreMode.CLAIM, 256)),  # MAX_PARALLELISM_CHANGED
        refused(h, c.DeliverNotification(0)),  # NO_SUCH_NOTIFICATION
        refused(h, c.CrashTm("tm-99")),  # UNKNOWN_TM
        refused(h, c.AttemptStopped(tm0)),  # TM_NOT_LOST
    }
    h.run(c.Trigger())
    cp = h.last_checkpoint
    seen.add(refused(h, c.WriteState(cp, GHOST, KS, "x", 1)))  # UNKNOWN_SUBTASK
    seen.add(refused(h, c.ReuseShared(cp, s0, "never-written")))  # NO_SUCH_STATE
    seen.add(refused(h, c.Complete(cp)))  # NOT_ALL_ACKNOWLEDGED
    seen.add(refused(h, c.CrashDuringWrite(cp, s0, KS, "x", 10, 10)))  # BAD_ARGUMENT
    h.run(c.Acknowledge(cp, s0))
    seen.add(refused(h, c.Acknowledge(cp, s0)))  # ALREADY_ACKNOWLEDGED
    h.run(c.CrashTm(tm0))
    seen.add(refused(h, c.CrashTm(tm0)))  # TM_NOT_ALIVE
    seen.add(refused(h, c.WriteState(cp, s0, KS, "x", 1)))  # TM_NOT_ALIVE (its host is lost)
    seen.add(refused(h, c.RestartCoordinator()))  # ATTEMPT_MAY_RUN (tm0 is lost)
    other = next(s for s in h.subtasks if h.tm_of(s) != tm0)
    h.run(c.Trigger())
    seen.add(
        refused(h, c.WriteState(h.last_checkpoint, other, KS, "x", 1, attempt=tm0))
    )  # NOT_HOSTED
    h.run(c.Cancel(retain=False))
    seen.add(refused(h, c.Trigger()))  # JOB_NOT_RUNNING
    assert seen == set(Reason), sorted(r.value for r in set(Reason) - seen)
