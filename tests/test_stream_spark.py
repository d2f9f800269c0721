"""The streaming job on Spark (issue 17): ``rate-micro-batch`` through ``foreachBatch`` on
``local[2]``, RocksDB state checkpointed incrementally, every closed window's count equal
to the batch computation's. One test: it shares the run's SparkSession
(``xdist_group("spark")``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.stream.job import StreamSettings, run_stream
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from spec.config import Config, MergingMode

pytestmark = pytest.mark.xdist_group("spark")


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
