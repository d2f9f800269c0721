"""The sink: each micro-batch's closed windows as one Parquet file under
``<out>/batch=<id>/``, replaced whole by a re-run of the same batch (exactly once:
idempotent by batch id, never appended to)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

SCHEMA = pa.schema([("window_start", pa.int64()), ("word", pa.string()), ("count", pa.int64())])


def batch_dir(out: Path, batch_id: int) -> Path:
    return out / f"batch={batch_id}"


def write_batch(out: Path, batch_id: int, windows: Iterable[tuple[int, str, int]]) -> Path:
    """Write the batch's windows (``(start, word, count)``), replacing any earlier output of
    the same batch. The file is complete before it is visible: written under a hidden
    name (readers skip names starting with ``.``), then renamed into place."""
    rows = sorted(windows)
    table = pa.table(
        {
            "window_start": [r[0] for r in rows],
            "word": [r[1] for r in rows],
            "count": [r[2] for r in rows],
        },
        schema=SCHEMA,
    )
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".batch={batch_id}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    pq.write_table(table, tmp / "part-0.parquet")
    final = batch_dir(out, batch_id)
    if final.exists():
        shutil.rmtree(final)  # a re-run of the batch: its output replaces the old
    tmp.rename(final)
    return final


def read_all(out: Path) -> dict[int, list[tuple[int, str, int]]]:
    """Every batch's windows, by batch id."""
    found: dict[int, list[tuple[int, str, int]]] = {}
    for d in sorted(out.glob("batch=*")):
        batch = int(d.name.split("=", 1)[1])
        t = pq.read_table(d / "part-0.parquet")
        found[batch] = list(
            zip(
                t.column("window_start").to_pylist(),
                t.column("word").to_pylist(),
                t.column("count").to_pylist(),
                strict=True,
            )
        )
    return found
