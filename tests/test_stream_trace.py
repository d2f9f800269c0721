"""The streaming job's command trace (``pipeline.stream.trace``) replayed through the
model in process (``tests.stream_harness``: the driver, subtask and snapshot code without
Spark), with the events that must not break it: tasks killed at every point and retried by
a new TM attempt within their checkpoint (R66's ``ReplaceTm``, then ``AttemptStopped``),
two attempts of one task where the driver accepts the second (a speculative copy), a
subtask whose local DB is lost, files of an attempt the coordinator never heard of (left
out, said so), and a rescale (``Restore`` with one TM per subtask). The trace must hold
the whole run, the model must accept every command with the coordinator's outcome, and
I1-I6 must hold on the real files once quiet."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from model_tests.replay import replay
from pipeline.stream.checkpointing import VERTEX
from pipeline.stream.kills import KILL_POINTS, Failures
from pipeline.stream.subtask import run_subtask, subtask_dir
from spec.config import Config, MergingMode
from spec.ids import SubtaskId
from tests.stream_harness import DriverKilled, LocalJob, _die

RUNS = [
    (MergingMode.WITHIN_CHECKPOINT, 1),
    (MergingMode.ACROSS_CHECKPOINT, 1),
    (MergingMode.NONE, 1),
    (MergingMode.WITHIN_CHECKPOINT, 2),
]
"""Merging mode and num-retained: with two retained checkpoints a replaced TM's files of
the older one outlive its stop, and a failover hands them to the live TM (R61)."""


def _commands(trace: Path) -> Counter[str]:
    lines = trace.read_text().splitlines()[1:]
    return Counter(json.loads(x)["command"]["type"] for x in lines if x.strip())


@pytest.mark.parametrize(("mode", "retained"), RUNS, ids=lambda x: getattr(x, "name", str(x)))
def test_kills_a_speculative_copy_a_lost_db_and_a_rescale_replay_whole(
    tmp_path: Path, mode: MergingMode, retained: int
) -> None:
    trace = tmp_path / "trace.ndjson"
    job = LocalJob(
        tmp_path,
        Config.for_mode(mode, num_retained=retained),
        parallelism=2,
        failures=Failures(0.08, seed=11),
        trace=str(trace),
    )
    for _ in range(4):
        job.batch()
    # Two attempts of subtask 0's task: the first leaves its DB where the second cannot
    # take it, so the second starts a new TM; the driver accepts the second.
    job.driver.sweep_local = False
    order = job.driver.order(job.next_batch)
    parts = job.partitions(order.batch_id)
    home = subtask_dir(job.work, SubtaskId(VERTEX, 0, 2))
    # (attempt_number 1: injected kills strike first attempts only)
    first = run_subtask(order, 0, "first", parts.get(0, []), attempt_number=1, die=_die)
    (home / "db").rename(home / "db.first")
    second = run_subtask(order, 0, "second", parts.get(0, []), attempt_number=1, die=_die)
    assert json.loads(second.report)["new"] and not json.loads(first.report)["new"]
    other = run_subtask(order, 1, "one", parts.get(1, []), attempt_number=1, die=_die)
    job.emitted[order.batch_id] = [w for r in (second, other) for w in r.closed]
    job.driver.finish(order, [second, other])
    job.next_batch += 1
    job.driver.sweep_local = True
    for _ in range(2):
        job.batch()
    job.lose_local_state(1)  # the next task of subtask 1 starts a new TM
    for _ in range(3):
        job.batch()
    job.rescale(3)
    for _ in range(5):
        job.batch()
    job.quiesce()
    assert job.coordinator.finish_attempts()
    assert job.coordinator.violations(quiet=True) == []
    assert job.comparison().equal
    assert job.kills and {p for _, _, _, p in job.kills} & set(KILL_POINTS)
    t = job.coordinator.trace
    assert t is not None
    job.coordinator.close()
    assert t.stopped is None, t.stopped
    replayed = replay(trace.read_text().splitlines())
    assert replayed.agrees, replayed.summary()
    assert replayed.stopped is None and replayed.commands == t.commands
    seen = _commands(trace)
    assert seen["ReplaceTm"] >= 3 and seen["AttemptStopped"] >= 3 and seen["Restore"] == 1
    assert seen["Complete"] >= 14
    assert seen["Failover"] >= 1 or retained == 1 or mode is MergingMode.NONE
    print(
        f"\n{mode.name}, num-retained {retained}: {replayed.commands} commands agree with the model"
        f" ({seen['ReplaceTm']} ReplaceTm, {seen['AttemptStopped']} AttemptStopped,"
        f" {seen['Failover']} Failover, {len(job.kills)} kills);"
        f" left out: {len(t.left_out)} sweep(s) of files no party records"
    )


def _within_retaining_two_after_three_batches(tmp_path: Path, trace: Path) -> LocalJob:
    """A traced job of two subtasks, WITHIN merging, two retained checkpoints, three
    batches done."""
    job = LocalJob(
        tmp_path,
        Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=2),
        parallelism=2,
        trace=str(trace),
    )
    for _ in range(3):
        job.batch()
    return job


def test_files_a_failover_handed_over_by_mail_not_yet_applied_are_not_swept_as_strays(
    tmp_path: Path,
) -> None:
    """R61: between a failover and the next batch the files it handed to a live TM are
    in its mail only (the coordinator gave up their records, the TM's last report does
    not hold them yet). The sweep for attempts the coordinator never heard of runs then
    (at the end of a run, before a rescale): it must count them as the TM's, not sweep
    them as a stray attempt's."""
    trace = tmp_path / "trace.ndjson"
    job = _within_retaining_two_after_three_batches(tmp_path, trace)
    job.lose_local_state(0)  # the next task of subtask 0 starts a new TM (R66)
    job.batch()  # its completion stops the replaced TM, and a failover hands its files over
    co = job.coordinator
    handed = {p for _, p in co.engine.in_transit()}
    assert handed, "the scenario needs a failover whose hand-over is still in the mail"
    assert co.finish_attempts()
    t = co.trace
    assert t is not None
    assert co.strays == 0 and t.left_out == []
    assert co.violations(quiet=False) == []
    job.quiesce()
    assert co.finish_attempts()
    assert co.violations(quiet=True) == []
    assert handed <= set(co.co.storage.list_files())
    job.coordinator.close()
    assert t.stopped is None, t.stopped
    replayed = replay(trace.read_text().splitlines())
    assert replayed.agrees, replayed.summary()


@pytest.mark.parametrize("die", ["sunk", "completed"])
def test_a_restarted_driver_writes_on_the_crashed_drivers_trace_and_it_replays_whole(
    tmp_path: Path, die: str
) -> None:
    """The driver dies with its application (``die``: after the sink, its checkpoint
    pending; after the complete) and a new one recovers the store into a new job that
    claims the latest completed checkpoint. The new driver reads the trace the dead one
    wrote (the model's TMs, its next TM) and writes on: each TM of the crashed job
    crashes, every attempt of it is known stopped, a ``Restore`` in CLAIM mode with one
    TM per subtask; then the new job's batches, with kills before and after the restart
    (``ReplaceTm`` names must follow the model's count). The whole trace replays and
    agrees. R50: the new job's first checkpoint is past the one the dead driver had
    triggered, though that one left nothing under ``chk-N/`` (its id is in the writer
    state the dead driver published)."""
    trace = tmp_path / "trace.ndjson"
    job = LocalJob(
        tmp_path,
        Config.for_mode(MergingMode.ACROSS_CHECKPOINT, num_retained=1),
        parallelism=2,
        failures=Failures(0.08, seed=11),
        trace=str(trace),
    )
    for _ in range(4):
        job.batch()
    first = job.coordinator.trace
    assert first is not None
    with pytest.raises(DriverKilled):
        job.batch(die=die)
    triggered = job.coordinator.co.next_checkpoint - 1
    before = first.commands
    job.restart_driver()
    t = job.coordinator.trace
    assert t is not None and t is not first and t.stopped is None, job.coordinator.trace_stopped
    assert job.batch().checkpoint == triggered + 1
    for _ in range(5):
        job.batch()
    job.quiesce()
    assert job.coordinator.finish_attempts()
    assert job.coordinator.violations(quiet=True) == []
    assert job.comparison().equal
    job.coordinator.close()
    assert t.stopped is None, t.stopped
    replayed = replay(trace.read_text().splitlines())
    assert replayed.agrees, replayed.summary()
    assert replayed.stopped is None and replayed.commands == t.commands > before
    lines = [json.loads(x)["command"] for x in trace.read_text().splitlines()[1:]]
    restore = next(i for i, x in enumerate(lines) if x["type"] == "Restore")
    crashed = Counter(x["type"] for x in lines[before:restore])
    assert crashed["CrashTm"] == 2 and crashed["AttemptStopped"] >= 2
    assert set(crashed) == {"CrashTm", "AttemptStopped"}
    assert lines[restore]["mode"] == "claim" and lines[restore]["num_tms"] == 2
    after = Counter(x["type"] for x in lines[restore:])
    assert Counter(x["type"] for x in lines[:before])["ReplaceTm"] >= 1 and after["ReplaceTm"] >= 1
    print(
        f"\ndriver killed ({die}): {replayed.commands} commands agree with the model,"
        f" {before} of the dead driver's; the restart: {dict(crashed)}, Restore CLAIM;"
        f" ReplaceTm after it {after['ReplaceTm']}"
    )


def test_a_restarted_driver_stops_the_trace_where_the_model_would_keep_other_files(
    tmp_path: Path,
) -> None:
    """With two retained checkpoints the recovery's new job retains both (its
    coordinator's, each deleted once subsumed) while the model's CLAIM restore retains
    the one it claims and leaves the older one to the user: the restarted driver stops
    the trace there, saying so, and what came before replays and agrees. A driver
    restarted after that does not write on a trace with a gap."""
    trace = tmp_path / "trace.ndjson"
    job = _within_retaining_two_after_three_batches(tmp_path, trace)
    with pytest.raises(DriverKilled):
        job.batch(die="completed")
    job.restart_driver()
    t = job.coordinator.trace
    assert t is not None and t.stopped is not None
    assert t.stopped.startswith("a driver restart keeping 2 checkpoints"), t.stopped
    job.batch()
    with pytest.raises(DriverKilled):
        job.batch(die="sunk")
    job.restart_driver()
    assert job.coordinator.trace is None
    assert (job.coordinator.trace_stopped or "").startswith(
        "a driver restart: the crashed driver's trace had stopped: a driver restart keeping"
    ), job.coordinator.trace_stopped
    job.batch()
    job.coordinator.close()
    replayed = replay(trace.read_text().splitlines())
    assert replayed.agrees and replayed.commands > 0, replayed.summary()
    assert "Restore" not in _commands(trace)
