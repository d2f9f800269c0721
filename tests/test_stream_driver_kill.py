"""The driver of ``ckpt stream`` killed (SIGKILL, with its Spark JVM and workers) at the
two points R96 names, after a rescale from 2 to 3 subtasks, and started again on the same
run directory each time (``--resume``): every closed window
is counted once, window by window equal to the batch computation, and the storage audit
of every job base is clean. The driver runs in a subprocess with its own Spark (so the
test shares the ``spark`` xdist group: one JVM at a time).

The same kills run in the stream harness too (no Spark: the harness runs again the batch
the engine had not committed), with both state backends: with ``working`` the recovered
job clones the crashed job's SlateDB checkpoints and refers to their SSTs in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.location import Location
from pipeline.single import audit_single
from pipeline.stream.check import batch_counts, compare
from pipeline.stream.sink import read_all
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode, RestoreMode
from tests.stream_harness import DriverKilled, LocalJob

ROOT = Path(__file__).resolve().parent.parent
BATCHES = 6
ARGS = [
    "--master", "local[2]", "--parallelism", "2", "--batches", str(BATCHES),
    "--rows-per-batch", "200", "--vocabulary", "200", "--window-ms", "2000",
    "--write-buffer-size", "4096", "--merging", "across", "--num-retained", "1",
    "--rescale-at", "1:3",
]  # fmt: skip


def _run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt", "stream", "--run-dir", str(run_dir), *ARGS, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the driver's JVM and workers die with it
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the driver's death left running
        except ProcessLookupError:
            pass
        time.sleep(1)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.xdist_group("spark")
def test_r96_a_driver_killed_before_and_after_the_complete_counts_every_record_once(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    # Rescaled from 2 to 3 subtasks after batch 1 (a new job, job-1), then killed after
    # batch 2's checkpoint completed, before Spark committed batch 2.
    first = _run(run_dir, "--die-at", "2:completed", "--no-audit")
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:]
    assert "parallelism 2 -> 3" in first.stdout
    assert "batch    1  " in first.stdout and "batch    2  " not in first.stdout
    # Restarted: Spark runs batch 2 again, which the recovered state already holds.
    # Then killed after batch 4's output is in the sink, before its checkpoint completed.
    second = _run(run_dir, "--resume", "--die-at", "4:sunk", "--no-audit")
    assert second.returncode == -signal.SIGKILL, second.stdout[-3000:]
    assert "driver restarted: job job-1 recovered" in second.stdout
    assert "parallelism 2 -> 3" not in second.stdout  # the recovered job runs at 3 already
    assert "batch 2: already in the latest completed checkpoint" in second.stdout
    assert "batch    3  " in second.stdout and "batch    4  " not in second.stdout
    # Restarted again: batch 4 runs once more over the state of batch 3 and replaces its
    # output; then batch 5; the audit runs on every job base.
    third = _run(run_dir, "--resume")
    assert third.returncode == 0, third.stdout[-4000:]
    assert "already in the latest completed checkpoint" not in third.stdout
    assert "batch    4  " in third.stdout and "batch    5  " in third.stdout
    assert "NOT CLEAN" not in third.stdout and "VIOLATED" not in third.stdout
    assert third.stdout.count("clean") >= 1
    # Independently of what the CLI says: the sink against the batch computation.
    windowing = Windowing(2000)
    source = RateSource(200, vocabulary=200)
    out = read_all(run_dir / "out")
    assert sorted(out) == list(range(BATCHES))
    emitted = [w for rows in out.values() for w in rows]
    last_watermark = source.event_ms(BATCHES - 2)  # batch 5 ran with batch 4's events
    cmp = compare(batch_counts(source, BATCHES, windowing), emitted, windowing, last_watermark)
    assert cmp.windows >= 2 and cmp.equal, (cmp.mismatches[:10], cmp.duplicates[:10])
    # The rescale's job and two recoveries; the last one's audit among the clean ones.
    jobs = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert jobs[:4] == ["job-0", "job-1", "job-2", "job-3"]
    assert "storage audit of job-3" in third.stdout


@pytest.mark.parametrize("backend", ["rocksdb", "working"])
def test_r96_in_the_harness_a_driver_killed_twice_counts_every_record_once(
    tmp_path: Path, backend: str
) -> None:
    config = Config.for_mode(
        MergingMode.ACROSS_CHECKPOINT, num_retained=1, restore_mode=RestoreMode.NO_CLAIM
    )
    job = LocalJob(
        tmp_path, config, parallelism=2, source=RateSource(200, vocabulary=200),
        windowing=Windowing(2000), backend=backend,
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
    comparison = job.comparison()
    assert comparison.windows >= 2
    assert comparison.equal, (comparison.mismatches[:10], comparison.duplicates[:10])
    job.quiesce()
    assert job.coordinator.finish_attempts()
    assert job.coordinator.violations(quiet=True) == []
    job.coordinator.close()
    base = tmp_path / "base"
    assert sorted(p.name for p in base.iterdir() if p.is_dir())[:4] == [
        "job-0", "job-1", "job-2", "job-3"
    ]  # fmt: skip
    for name in ("job-0", "job-1", "job-2", "job-3"):
        if not any(p.is_file() for p in (base / name).rglob("*")):
            continue  # a claimed job whose files all went once subsumed
        s = audit_single(Location.parse(str(base / name)), grace=0.0).summary
        assert (name, s.orphans, s.dangling, s.corrupt_metadata) == (name, 0, 0, 0), s.verdict
