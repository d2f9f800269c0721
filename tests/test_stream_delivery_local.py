"""The end-of-run delivery (``pipeline.stream.subtask.deliver``) when it cannot reach a
subtask's TM, without Spark (``tests.stream_harness``).

On Spark with speculation the delivery job's tasks may be copied too: a copy finds the
subtask's local state taken by the first attempt (which renamed it, ``_take``) and
returns no report, Spark accepts the copy's empty result, and the first attempt is killed
before it applied the notices. Then the TM whose records hold the subsumed files never
deletes them, and the coordinator still sees it alive: I6 breaks (the loopback cluster
of ``test_stream_failures`` can reach this). So a TM the delivery cannot reach is given
up as a replaced attempt is (R66), and once no attempt may still run it is known
stopped (R64): its files are the coordinator's, which deletes what no retained checkpoint
refers to and keeps the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_tests.replay import replay
from pipeline.stream.checkpointing import VERTEX
from pipeline.stream.source import RateSource
from pipeline.stream.subtask import deliver, subtask_dir
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode
from spec.ids import SubtaskId
from tests.stream_harness import LocalJob

MODES = list(MergingMode)


@pytest.mark.parametrize("applied", [False, True], ids=["killed-first", "report-lost"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_delivery_that_cannot_reach_a_tm_gives_it_up_and_leaks_nothing(
    tmp_path: Path, mode: MergingMode, applied: bool
) -> None:
    """``applied``: the first attempt applied the mail (its deletes are done) before it
    was killed, so only its report was lost; else it was killed before it applied any.
    Either way the coordinator cannot tell, and giving the TM up is right for both: a
    record whose file the TM deleted unseen goes without a second delete (R64)."""
    trace = tmp_path / "trace.ndjson"
    job = LocalJob(
        tmp_path, Config.for_mode(mode, num_retained=1), parallelism=2,
        source=RateSource(300, vocabulary=200), windowing=Windowing(2000), trace=str(trace),
    )  # fmt: skip
    job.driver.sweep_local = False  # as under speculation
    for _ in range(5):
        job.batch()
    co = job.coordinator
    home = subtask_dir(job.work, SubtaskId(VERTEX, 0, 2))
    tm = co.co.placement[SubtaskId(VERTEX, 0, 2)]
    if applied:
        order = job.driver.delivery()
        reports = [deliver(order, i) for i in range(2)]
        assert reports[0]
        co.heard([b"", reports[1]])  # the copy's empty result was the one accepted
        co.settle()
    else:
        # The first delivery attempt of subtask 0 took its local state and was killed
        # before it applied anything; its copy found nothing there and reported nothing.
        (home / "db").rename(home / "db.deliver-killed")
        job.quiesce()
    assert tm in co.replaced  # given up: the delivery could not reach it
    assert co.finish_attempts()
    assert tm in co.retired
    assert co.violations(quiet=True) == []
    # Nothing a retained checkpoint needs went: the next batch restores subtask 0 from it
    # (with a new TM) and every window still counts right. (A delivery ends a run: no
    # task takes the given-up TM's saved state up again; here its local state goes.)
    if applied:
        job.lose_local_state(0)
    report = job.batch()
    assert report.restored == 1
    job.quiesce()
    assert co.finish_attempts()
    assert co.violations(quiet=True) == []
    cmp = job.comparison()
    assert cmp.windows >= 2 and cmp.equal, cmp.mismatches[:5]
    # The model agrees: the TM was replaced (R66) and stopped (R64), command by command.
    t = co.trace
    assert t is not None
    assert t.stopped is None, t.stopped
    t.close()
    replayed = replay(trace.read_text().splitlines())
    assert replayed.agrees, replayed.summary()
