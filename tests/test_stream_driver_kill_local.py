"""The driver of ``ckpt stream`` killed at the two points R96 names, without Spark: the
stream harness (``tests.stream_harness``: the job's own driver, tasks and coordinator, the
partitions of a batch one after another) runs the batch the engine had not committed
again, as Spark does (``tests/test_stream_driver_kill.py`` kills the real driver on a
cluster). After a rescale from 2 to 3 subtasks (NO_CLAIM), the driver dies after batch 2's
checkpoint completed and after batch 4's windows are in the sink; each restart recovers
the store into a new job that claims the latest completed checkpoint. Both state
backends: with ``working`` the recovered job's databases are clones of the crashed job's
SlateDB checkpoints (its manifests must survive the recovery). Every closed window equal
to the batch computation, I1-I7 quiet, the audit of every job base clean, and the command
trace of the whole run (each restarted driver writes on the crashed one's) replayed
through the model and agreeing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_tests.replay import ReplayReport, replay
from pipeline.location import Location
from pipeline.single import audit_single
from pipeline.stream.source import RateSource
from pipeline.stream.trace import StreamTrace
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode, RestoreMode
from tests.stream_harness import DriverKilled, LocalJob


def _end_and_replay(job: LocalJob, tmp_path: Path) -> tuple[StreamTrace, list[str], ReplayReport]:
    """Every window equal to the batch computation, the mail delivered, I1-I7 quiet; the
    run's command trace and its replay through the model."""
    comparison = job.comparison()
    assert comparison.windows >= 2
    assert comparison.equal, (comparison.mismatches[:10], comparison.duplicates[:10])
    job.quiesce()
    assert job.coordinator.finish_attempts()
    assert job.coordinator.violations(quiet=True) == []
    trace = job.coordinator.trace
    job.coordinator.close()
    assert trace is not None, job.coordinator.trace_stopped
    lines = (tmp_path / "trace.ndjson").read_text().splitlines()
    return trace, lines, replay(lines)


def _audits_clean(base: Path, names: tuple[str, ...]) -> None:
    for name in names:
        if not any(p.is_file() for p in (base / name).rglob("*")):
            continue  # a claimed job whose files all went once subsumed, an abandoned one
        s = audit_single(Location.parse(str(base / name)), grace=0.0).summary
        assert (name, s.orphans, s.dangling, s.corrupt_metadata) == (name, 0, 0, 0), s.verdict


@pytest.mark.parametrize("backend", ["rocksdb", "working"])
def test_r96_in_the_harness_a_driver_killed_twice_counts_every_record_once(
    tmp_path: Path, backend: str
) -> None:
    config = Config.for_mode(
        MergingMode.ACROSS_CHECKPOINT, num_retained=1, restore_mode=RestoreMode.NO_CLAIM
    )
    job = LocalJob(
        tmp_path, config, parallelism=2, source=RateSource(200, vocabulary=200),
        windowing=Windowing(2000), backend=backend, trace=str(tmp_path / "trace.ndjson"),
    )  # fmt: skip
    job.batch()
    job.batch()
    job.rescale(3)  # a new job, job-1, from job-0's checkpoint (NO_CLAIM: a copy)
    with pytest.raises(DriverKilled):
        job.batch(die="completed")  # batch 2's checkpoint completed, not committed
    job.restart_driver()  # job-1 recovered as job-2
    assert (job.coordinator.job_id, job.next_batch) == ("job-2", 3)  # batch 2 is in the state
    first = job.batch()
    if backend == "working":
        # R105: every subtask clones job-1's SlateDB checkpoint and uploads nothing
        assert first.restored == 3 and first.in_place > 0 and first.uploaded == 0
    with pytest.raises(DriverKilled):
        job.batch(die="sunk")  # batch 4's output is in the sink, its checkpoint pending
    job.restart_driver()  # job-2 recovered as job-3
    assert (job.coordinator.job_id, job.next_batch) == ("job-3", 4)  # batch 4 runs again
    job.batch()
    job.batch()
    trace, lines, replayed = _end_and_replay(job, tmp_path)
    # The command trace of the whole run, the restarted drivers writing on the first's:
    # each restart is the crash of the job's TMs, their stop and a CLAIM restore.
    assert trace.stopped is None, job.coordinator.trace_stopped
    assert replayed.agrees and replayed.stopped is None, replayed.summary()
    assert replayed.commands == len(lines) - 1 == trace.commands
    restores = [c for x in lines[1:] if (c := json.loads(x)["command"])["type"] == "Restore"]
    assert [(r["mode"], r["num_tms"]) for r in restores] == [
        ("no_claim", 3), ("claim", 3), ("claim", 3)
    ]  # fmt: skip
    base = tmp_path / "base"
    assert sorted(p.name for p in base.iterdir() if p.is_dir())[:4] == [
        "job-0", "job-1", "job-2", "job-3"
    ]  # fmt: skip
    _audits_clean(base, ("job-0", "job-1", "job-2", "job-3"))


@pytest.mark.parametrize("backend", ["rocksdb", "working"])
@pytest.mark.parametrize(
    "start", ["recovery", "rescale-claim", "rescale-no-claim"], ids=lambda s: s
)
def test_r96_a_new_job_killed_before_its_first_checkpoint_is_abandoned_not_recovered(
    tmp_path: Path, start: str, backend: str
) -> None:
    """A new job (a recovery's, or a rescale's) whose driver dies before its first
    checkpoint completes holds no state of its own: the restart recovers the job before
    it, from the checkpoint the dead one had restored, and deletes the dead one's base.
    Recovering the newest job instead starts from nothing: the state of every batch
    before is lost while the engine's offsets are past them."""
    mode = RestoreMode.NO_CLAIM if start == "rescale-no-claim" else RestoreMode.CLAIM
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1, restore_mode=mode)
    job = LocalJob(
        tmp_path, config, parallelism=2, source=RateSource(200, vocabulary=200),
        windowing=Windowing(2000), backend=backend, trace=str(tmp_path / "trace.ndjson"),
    )  # fmt: skip
    job.batch()
    job.batch()  # job-0's checkpoint 2 holds batches 0 and 1
    if start == "recovery":
        with pytest.raises(DriverKilled):
            job.batch(die="sunk")
        job.restart_driver()  # job-0 recovered as job-1
    else:
        job.rescale(3)  # job-1, restored from job-0's checkpoint 2
    assert (job.coordinator.job_id, job.next_batch) == ("job-1", 2)
    with pytest.raises(DriverKilled):
        job.batch(die="sunk")  # job-1 wrote batch 2's state; its first checkpoint pending
    base = tmp_path / "base"
    assert any(p.is_file() for p in (base / "job-1").rglob("*"))
    job.restart_driver()
    assert job.lineage[-1] == ("job-2", mode)
    assert (job.coordinator.job_id, job.next_batch) == ("job-2", 2)  # from checkpoint 2
    if backend == "rocksdb":
        assert not any(p.is_file() for p in (base / "job-1").rglob("*"))  # its garbage went
    for _ in range(4):
        job.batch()
    # working: its SlateDB databases went whole at the first collection (after a complete)
    assert not any(p.is_file() for p in (base / "job-1").rglob("*"))
    trace, lines, replayed = _end_and_replay(job, tmp_path)
    assert replayed.agrees, replayed.summary()
    if mode is RestoreMode.NO_CLAIM:
        # the model cannot restore a checkpoint its NO_CLAIM restore left to the user
        assert trace.stopped is not None and "NO_CLAIM" in trace.stopped
        # R73: job-0's checkpoint stays the user's, whole, through both restores
        assert (base / "job-0" / "chk-2" / "_metadata").is_file()
    else:
        assert trace.stopped is None, trace.stopped
        assert replayed.stopped is None and replayed.commands == len(lines) - 1
        restores = [c for x in lines[1:] if (c := json.loads(x)["command"])["type"] == "Restore"]
        assert [(r["checkpoint"], r["mode"]) for r in restores] == [(2, "claim"), (2, "claim")]
    _audits_clean(base, ("job-0", "job-2"))
