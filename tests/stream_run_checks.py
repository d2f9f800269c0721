"""Checks of a finished ``ckpt stream`` run directory, independent of what the run
printed: the sink against a batch computation over the same input, and the storage audit
of every job base under the checkpoints."""

from __future__ import annotations

from pathlib import Path

from pipeline.location import Location
from pipeline.result import Summary
from pipeline.single import audit_single
from pipeline.stream.check import Comparison, batch_counts, compare
from pipeline.stream.sink import read_all
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing


def sink_against_batch(
    run_dir: Path, source: RateSource, windowing: Windowing, batches: int
) -> Comparison:
    """Every window the sink (``<run>/out``) holds against the batch computation of the
    first ``batches`` batches; the sink must hold exactly those batches."""
    out = read_all(run_dir / "out")
    assert sorted(out) == list(range(batches)), sorted(out)
    emitted = [w for rows in out.values() for w in rows]
    last_watermark = source.event_ms(batches - 2)  # the last batch ran with the one before's
    return compare(batch_counts(source, batches, windowing), emitted, windowing, last_watermark)


def audit_bases(base: Path) -> dict[str, Summary]:
    """The storage audit (the single-process engine, no grace: the run is over) of every
    job base under ``base`` that holds a file: job -> its summary. A job base a CLAIM
    restore took over is empty once its checkpoint was subsumed: nothing to audit."""
    out = {}
    for job in sorted(p.name for p in base.iterdir() if p.is_dir() and p.name.startswith("job-")):
        if any(p.is_file() for p in (base / job).rglob("*")):
            out[job] = audit_single(Location.parse(str(base / job)), grace=0.0).summary
    return out
