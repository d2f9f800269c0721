"""The source: Spark's ``rate-micro-batch``, and the same rows as a closed formula.

``rate-micro-batch`` is deterministic: batch ``b`` holds the values
``[b * rows, (b + 1) * rows)``, all with event time ``start + b * advance`` ms, whatever
the wall clock did (``rate`` sizes batches by elapsed seconds, so two runs, or a run and
its replay after a restart, cut different batches). So a re-run batch yields the same
rows, and the batch computation of the check needs no record of the input.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen


@frozen
class RateSource:
    rows_per_batch: int
    advance_ms: int = 1000
    start_ms: int = 0
    partitions: int = 2
    vocabulary: int = 1000
    exponent: float = 1.1
    seed: int = 17

    def values(self, batch: int) -> range:
        return range(batch * self.rows_per_batch, (batch + 1) * self.rows_per_batch)

    def event_ms(self, batch: int) -> int:
        return self.start_ms + batch * self.advance_ms

    def word_args(self) -> dict[str, Any]:
        return {"vocabulary": self.vocabulary, "exponent": self.exponent, "seed": self.seed}

    def read_stream(self, spark: Any) -> Any:
        """The streaming DataFrame: ``value`` and ``ts`` (event time, epoch ms)."""
        df = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", self.rows_per_batch)
            .option("numPartitions", self.partitions)
            .option("startTimestamp", self.start_ms)
            .option("advanceMillisPerBatch", self.advance_ms)
            .load()
        )
        return df.selectExpr("value", "unix_millis(timestamp) AS ts")
