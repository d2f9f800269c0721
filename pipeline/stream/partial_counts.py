"""A micro-batch's records as partial counts, computed on Arrow batches: no record crosses
into Python one by one.

The map side of the keyed stage (``job._segment``) names each row's word in Spark's JVM
(``words.with_ranks``: its rank in the vocabulary), then runs ``partial_counts`` in
``DataFrame.mapInArrow`` over the ranks: each rank's key group and subtask by table
lookups in numpy, then one count per ``(word, event time)`` by Arrow's hash aggregation.
What crosses the shuffle is one Arrow IPC stream per source partition and subtask, a few
kilobytes, not a pickled tuple per record; the subtask adds the counts of its streams up
on Arrow too (``tally``) and updates its RocksDB once per distinct key.

The counts are exact: a record's window, lateness and event time follow from its event
time, which the counts keep, so the subtask computes the same windows, late drops, record
count and largest event time as from the records themselves.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from attrs import frozen

from pipeline.stream.windows import Windowing
from pipeline.stream.words import MAX_PARALLELISM, key_group, subtask_of, word_name
from spec.errors import UsageError

Count = tuple[int, str, int, int]
"""``(key group, word, event time ms, records)``: what a subtask counts."""

SHUFFLED = "subtask int, counts binary"
"""The map side's rows: the subtask a stream of counts is for, and the stream."""

_COUNTS = pa.schema(
    [("group", pa.int32()), ("rank", pa.int64()), ("ts", pa.int64()), ("n", pa.int64())]
)


@functools.cache
def _groups_of_ranks(vocabulary: int) -> npt.NDArray[np.int32]:
    """Every rank's key group (``words.key_group`` of its word), once per process."""
    return np.array([key_group(word_name(r)) for r in range(vocabulary)], dtype=np.int32)


@functools.cache
def _subtasks_of_groups(parallelism: int) -> npt.NDArray[np.int32]:
    return np.array([subtask_of(g, parallelism) for g in range(MAX_PARALLELISM)], dtype=np.int32)


def partial_counts(
    vocabulary: int,
    parallelism: int,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function over the ranks of the source's words and their event
    times (``words.with_ranks``'s ``rank`` and ``ts``): one row per subtask that has
    records here, ``(subtask, Arrow IPC stream of its counts)``."""
    groups_of = _groups_of_ranks(vocabulary)
    owner_of = _subtasks_of_groups(parallelism)
    parts: list[pa.Table] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        ranks = batch.column(0).cast(pa.int64())
        if ranks.null_count or not 0 <= pc.min(ranks).as_py() <= pc.max(ranks).as_py() < vocabulary:
            raise UsageError(f"a rank missing or outside the vocabulary of {vocabulary} words")
        parts.append(pa.table({"rank": ranks, "ts": batch.column(1)}))
    if not parts:
        return
    counts = pa.concat_tables(parts).group_by(["rank", "ts"]).aggregate([("rank", "count")])
    ranks = counts.column("rank").to_numpy()
    groups = groups_of[ranks]
    table = pa.table(
        {
            "group": pa.array(groups, pa.int32()),
            "rank": counts.column("rank"),
            "ts": counts.column("ts").cast(pa.int64()),
            "n": counts.column("rank_count").cast(pa.int64()),
        },
        schema=_COUNTS,
    )
    owners = owner_of[groups]
    subtasks: list[int] = []
    streams: list[bytes] = []
    for s in np.unique(owners).tolist():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, _COUNTS) as writer:
            writer.write_table(table.filter(pa.array(owners == s)))
        subtasks.append(int(s))
        streams.append(sink.getvalue().to_pybytes())
    yield pa.RecordBatch.from_pydict(
        {"subtask": pa.array(subtasks, pa.int32()), "counts": pa.array(streams, pa.binary())}
    )


def _read_stream(data: bytes) -> pa.Table:
    try:
        table = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise UsageError(f"a stream of partial counts is not Arrow IPC: {err}") from None
    if not table.schema.equals(_COUNTS):
        raise UsageError(f"a stream of partial counts has the schema {table.schema}")
    return table


def _rows(table: pa.Table, *names: str) -> Iterator[tuple[Any, ...]]:
    """The table's columns ``names``, row by row, as Python values."""
    return zip(*(table.column(c).to_pylist() for c in names), strict=True)


def read_counts(streams: Iterable[bytes]) -> Iterator[Count]:
    """The counts of one subtask's streams (``partial_counts``), each ``(key group, word,
    event time, records)``; a key may come from several streams (one per source
    partition), and the subtask adds them. Record by record: the reading ``tally`` is
    tested against (the job runs ``tally``)."""
    for data in streams:
        table = _read_stream(data)
        for g, r, ts, n in _rows(table, "group", "rank", "ts", "n"):
            yield g, word_name(r), ts, n


@frozen
class Tallied:
    """One subtask's batch, added up: what its state takes and what its report says."""

    counts: Counter[tuple[int, int, str]]
    """``{(key group, window start, word): records}`` of the windows still open."""
    records: int
    late: int
    """Records whose window the watermark had closed: dropped, as Spark drops them."""
    max_event: int | None


def tally(streams: Iterable[bytes], windowing: Windowing, watermark: int) -> Tallied:
    """One subtask's streams of partial counts added up on Arrow, as ``add_up`` adds up
    ``read_counts`` of them record by record: the window of each count from its event
    time, the late ones (their window closed at ``watermark``) dropped and counted, the
    rest summed per ``(key group, window start, word)`` by Arrow's hash aggregation, so
    that Python touches each distinct key once, not each count of each stream."""
    tables = [t for t in map(_read_stream, streams) if t.num_rows]
    if not tables:
        return Tallied(Counter(), 0, 0, None)
    table = pa.concat_tables(tables)
    ts = table.column("ts").to_numpy()
    n = table.column("n").to_numpy()
    start = ts - ts % windowing.size_ms  # ``Windowing.start_of``, on the array
    closed = start + windowing.size_ms <= watermark  # ``Windowing.closed``
    kept = pa.array(~closed)
    windows = {"group": table.column("group"), "start": start, "rank": table.column("rank")}
    open_counts = (
        pa.table({**windows, "n": n})
        .filter(kept)
        .group_by(["group", "start", "rank"])
        .aggregate([("n", "sum")])
    )
    counts: Counter[tuple[int, int, str]] = Counter(
        {
            (g, w, word_name(r)): c
            for g, w, r, c in _rows(open_counts, "group", "start", "rank", "n_sum")
        }
    )
    return Tallied(counts, int(n.sum()), int(n[closed].sum()), int(ts.max()))


def add_up(records: Iterable[Count], windowing: Windowing, watermark: int) -> Tallied:
    counts: Counter[tuple[int, int, str]] = Counter()
    n = late = 0
    max_event: int | None = None
    for group, word, event, k in records:
        n += k
        start = windowing.start_of(event)
        max_event = event if max_event is None else max(max_event, event)
        if windowing.closed(start, watermark):
            late += k
            continue
        counts[(group, start, word)] += k
    return Tallied(counts, n, late, max_event)
