"""The streaming job on Spark (issue 17): ``rate-micro-batch`` through ``foreachBatch`` on
``local[2]``, RocksDB state checkpointed incrementally, every closed window's count equal
to the batch computation's. Each test uses its pytest worker's SparkSession
(``tests/conftest.py``: ``spark``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_tests.replay import replay
from pipeline.stream.job import StreamSettings, run_stream
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode, RestoreMode


def test_the_stream_on_spark_counts_every_closed_window_like_a_batch_job(
    spark: Any, tmp_path: Path
) -> None:
    settings = StreamSettings(
        base=str(tmp_path / "base"),
        work_dir=str(tmp_path / "work"),
        out=str(tmp_path / "out"),
        config=Config.for_mode(MergingMode.ACROSS_CHECKPOINT, num_retained=2),
        parallelism=2,
        source=RateSource(400, vocabulary=300),
        windowing=Windowing(2000),
        batches=10,
        write_buffer_size=4096,
        trace=True,
    )
    run = run_stream(settings, spark=spark)
    assert [r.batch_id for r in run.reports] == list(range(10))
    assert [r.checkpoint for r in run.reports] == list(range(1, 11))
    assert sum(r.records for r in run.reports) == 4000
    assert all(r.late == 0 and r.restored == 0 for r in run.reports)
    # Incremental: after the first checkpoint most SSTs are reused, not uploaded again.
    assert run.reports[0].reused == 0 and sum(r.reused for r in run.reports[1:]) > 0
    assert run.comparison is not None
    assert run.comparison.windows >= 3, run.comparison
    assert run.comparison.equal, run.comparison.mismatches[:10]
    assert run.violations == []
    # What storage holds after each checkpoint covers what the checkpoint references.
    assert [x.checkpoint for x in run.storage] == list(range(1, 11))
    assert all(x.referenced_bytes > 0 and x.state_bytes >= x.referenced_bytes for x in run.storage)
    # The command trace of the whole run, the TMs' commands reported from the Python
    # workers, replays through the model: every outcome agrees, the model stays safe.
    assert run.trace is not None and run.trace_stopped is None
    replayed = replay(Path(run.trace).read_text().splitlines())
    assert replayed.agrees and replayed.stopped is None, replayed.summary()
    assert replayed.commands == run.trace_commands > 10 * 2 * 2
    print(f"\ncommand trace of {len(run.reports)} batches: {replayed.summary()}")


@pytest.mark.parametrize(
    ("mode", "merging", "before", "after"),
    [
        (RestoreMode.NO_CLAIM, MergingMode.ACROSS_CHECKPOINT, 2, 3),
        (RestoreMode.CLAIM, MergingMode.WITHIN_CHECKPOINT, 3, 2),
    ],
)
def test_a_rescale_cuts_the_state_by_key_groups_and_counts_every_window_once(
    spark: Any, tmp_path: Path, mode: RestoreMode, merging: MergingMode, before: int, after: int
) -> None:
    settings = StreamSettings(
        base=str(tmp_path / "base"),
        work_dir=str(tmp_path / "work"),
        out=str(tmp_path / "out"),
        config=Config.for_mode(merging, num_retained=1, restore_mode=mode),
        parallelism=before,
        source=RateSource(400, vocabulary=300),
        windowing=Windowing(2000),
        batches=8,
        write_buffer_size=4096,
        rescale_at=(3, after),
        trace=True,
    )
    run = run_stream(settings, spark=spark)
    assert run.rescaled == (3, after, mode.name) and run.jobs == ("job-0", "job-1")
    assert [r.batch_id for r in run.reports] == list(range(8))
    assert sum(r.records for r in run.reports) == 8 * 400
    # Batch 4 runs on the new subtasks, each restored from the key groups it now owns,
    # and uploads everything: nothing restored is reused (R71).
    first = run.reports[4]
    assert first.restored == after and first.reused == 0 and first.uploaded >= after
    assert all(r.restored == 0 for r in run.reports[:4] + run.reports[5:])
    # Its checkpoint references the new job's files only; the old job's checkpoint stays
    # (NO_CLAIM: the user's) or is deleted once subsumed (CLAIM: the new job's).
    assert run.storage[4].referenced_jobs == ("job-1",)
    assert run.storage[3].referenced_jobs == ("job-0",)
    old = tmp_path / "base" / "job-0"
    assert (old / "chk-4" / "_metadata").is_file() == (mode is RestoreMode.NO_CLAIM)
    assert run.comparison is not None and run.comparison.windows >= 3
    assert run.comparison.equal, run.comparison.mismatches[:10]
    assert run.violations == []
    assert [a.job for a in run.audits] == ["job-0", "job-1"]
    assert all(a.clean for a in run.audits), run.audits
    assert run.audits[1].checkpoints == 1
    # The trace runs through the rescale (a Restore onto the new parallelism, R66's
    # mapping) to the last batch, and the model agrees with every command of it.
    assert run.trace is not None and run.trace_stopped is None, run.trace_stopped
    replayed = replay(Path(run.trace).read_text().splitlines())
    assert replayed.agrees, replayed.summary()
    assert replayed.commands == run.trace_commands > 8 * min(before, after) * 2
