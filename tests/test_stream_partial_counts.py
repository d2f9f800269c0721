"""The map side's partial counts (``pipeline.stream.partial_counts``) against the plain
reading of the records they stand for: each value's word by ``words.word_of``, its key
group by ``words.key_group``, its subtask by ``words.subtask_of``, one record each; and
the words Spark's JVM names (``words.with_ranks``) against that reading."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.stream.partial_counts import _COUNTS, add_up, partial_counts, read_counts, tally
from pipeline.stream.windows import Windowing
from pipeline.stream.words import key_group, ranks_of, subtask_of, with_ranks, word_name, word_of
from spec.errors import UsageError

_VALUES = st.integers(0, 2**63 - 1)
_WORDS = st.fixed_dictionaries(
    {
        "vocabulary": st.sampled_from([1, 2, 7, 1000, 100_000]),
        "exponent": st.sampled_from([0.5, 1.1, 2.0]),
        "seed": st.integers(0, 2**32),
    }
)


@given(st.lists(_VALUES, max_size=50), _WORDS)
def test_the_vectorized_word_of_each_value_is_word_of(
    values: list[int], args: dict[str, Any]
) -> None:
    ranks = ranks_of(np.array(values, dtype=np.int64), **args)
    assert [word_name(r) for r in ranks.tolist()] == [word_of(v, **args) for v in values]


def test_a_negative_value_or_an_empty_vocabulary_is_refused() -> None:
    with pytest.raises(UsageError, match="never negative"):
        ranks_of(np.array([3, -1], dtype=np.int64))
    with pytest.raises(UsageError, match="never negative"):
        word_of(-1)
    with pytest.raises(UsageError, match="vocabulary"):
        ranks_of(np.array([3], dtype=np.int64), vocabulary=0)


@pytest.mark.parametrize("exponent", [1.0, 0.3, 0.99, 1.01, float("nan"), float("inf")])
def test_an_exponent_the_words_cannot_be_drawn_exactly_with_is_refused(exponent: float) -> None:
    """Only ``1 - 1/k`` for a whole ``k``, ``|k| <= 64``: the power law's inverse is then
    multiplications alone, which the JVM and numpy round alike."""
    with pytest.raises(UsageError, match="exponent must be 1 - 1/k"):
        word_of(3, exponent=exponent)
    with pytest.raises(UsageError, match="exponent must be 1 - 1/k"):
        ranks_of(np.array([3], dtype=np.int64), exponent=exponent)


def test_a_seed_outside_a_long_is_refused() -> None:
    with pytest.raises(UsageError, match="seed must fit a long"):
        word_of(3, seed=1 << 63)
    assert word_of(3, seed=-1) == word_name(int(ranks_of(np.array([3]), seed=-1)[0]))


def test_the_ranks_follow_the_power_law() -> None:
    """The skew the vocabulary claims: over 200,000 values, each of the first ranks is
    drawn as often as the law's mass on its interval says, within 5%."""
    n, vocabulary, exponent = 200_000, 1000, 1.1
    found = np.bincount(ranks_of(np.arange(n), vocabulary=vocabulary), minlength=vocabulary)

    def mass(lo: float, hi: float) -> float:
        return float((lo ** (1 - exponent) - hi ** (1 - exponent)) / (exponent - 1))

    total = mass(0.5, vocabulary + 0.5)
    for rank in range(5):
        expected = n * mass(rank + 0.5, rank + 1.5) / total
        assert abs(found[rank] - expected) < 0.05 * expected, (rank, found[rank], expected)
    assert found.sum() == n and found[-1] > 0


def test_a_rank_outside_the_vocabulary_is_refused() -> None:
    for ranks in ([0, 10], [-1, 3], [None, 3]):
        rows = pa.record_batch({"rank": pa.array(ranks, pa.int64()), "ts": pa.array([0, 0])})
        with pytest.raises(UsageError, match="outside the vocabulary of 10 words"):
            list(partial_counts(10, 2, [rows]))


@pytest.mark.parametrize(
    ("vocabulary", "exponent", "seed"),
    [(1000, 1.1, 17), (1_000_000, 0.0, 17), (1_000_000, 1.1, 3), (7, 2.0, 2**40),
     (100_000, 0.5, -5), (1, 1.5, 0)],
)  # fmt: skip
def test_the_jvm_names_each_value_as_numpy_does(
    spark: Any, vocabulary: int, exponent: float, seed: int
) -> None:
    """``with_ranks`` (Spark SQL's ``xxhash64`` and arithmetic, in the JVM) equals
    ``ranks_of`` (numpy) bit for bit over 200,000 values, the large ones included: the
    batch check and the Spark-less harness name words as the job does."""
    n = 200_000
    df = spark.range(0, n).selectExpr("id * 46116860184273 AS value", "id AS ts")
    got = with_ranks(df, vocabulary=vocabulary, exponent=exponent, seed=seed).toArrow()
    values = np.arange(n, dtype=np.int64) * 46116860184273
    want = ranks_of(values, vocabulary=vocabulary, exponent=exponent, seed=seed)
    assert got.column("ts").to_pylist() == list(range(n))
    mismatched = np.flatnonzero(got.column("rank").to_numpy() != want)
    assert mismatched.size == 0, [int(values[i]) for i in mismatched[:10]]


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 30_000)), max_size=40), max_size=4
    ),
    st.integers(1, 9),
    _WORDS,
)
def test_partial_counts_add_up_to_the_records_on_their_subtasks(
    batches: list[list[tuple[int, int]]], parallelism: int, args: dict[str, Any]
) -> None:
    rows = [
        pa.record_batch(
            {
                "rank": ranks_of(np.array([v for v, _ in b], dtype=np.int64), **args),
                "ts": pa.array([t for _, t in b], pa.int64()),
            }
        )
        for b in batches
    ]
    got: dict[int, Counter[tuple[int, str, int]]] = {}
    for out in partial_counts(args["vocabulary"], parallelism, rows):
        for s, stream in zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True):
            assert s not in got, "one stream per subtask"
            got[s] = Counter()
            for g, w, ts, n in read_counts([stream]):
                assert n >= 1 and (g, w, ts) not in got[s]
                got[s][(g, w, ts)] = n
    expected: dict[int, Counter[tuple[int, str, int]]] = {}
    for value, ts in (r for b in batches for r in b):
        w = word_of(value, **args)
        g = key_group(w)
        expected.setdefault(subtask_of(g, parallelism), Counter())[(g, w, ts)] += 1
    assert got == expected


@given(st.lists(st.tuples(st.integers(0, 127), st.sampled_from("abc"), st.integers(0, 40_000))))
def test_counts_add_up_as_the_records_they_stand_for(records: list[tuple[int, str, int]]) -> None:
    windowing = Windowing(5000, 0)
    counted = Counter(records)
    merged = add_up(((g, w, t, n) for (g, w, t), n in counted.items()), windowing, 15_000)
    assert merged == add_up(((g, w, t, 1) for g, w, t in records), windowing, 15_000)
    assert merged.records == len(records)
    assert merged.late == sum(1 for _, _, t in records if t < 15_000)
    assert merged.max_event == max((t for _, _, t in records), default=None)


def _stream(rows: list[tuple[int, int, int, int]]) -> bytes:
    sink = pa.BufferOutputStream()
    cols: list[tuple[int, ...]] = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    with pa.ipc.new_stream(sink, _COUNTS) as w:
        w.write_table(pa.table(dict(zip(_COUNTS.names, cols, strict=True)), schema=_COUNTS))
    return bytes(sink.getvalue().to_pybytes())


_COUNT_ROWS = st.tuples(
    st.integers(0, 127), st.integers(0, 999), st.integers(0, 60_000), st.integers(1, 5)
)


@given(
    st.lists(st.lists(_COUNT_ROWS, max_size=30), max_size=4),
    st.sampled_from([1, 1000, 5000]),
    st.integers(-1, 70_000),
)
def test_the_subtask_tallies_its_streams_on_arrow_as_record_by_record(
    streams: list[list[tuple[int, int, int, int]]], size: int, watermark: int
) -> None:
    """``tally`` (the job's path) against ``add_up`` of ``read_counts`` (one count at a
    time): the same windows and counts, records, late records and largest event time,
    with keys repeated across the streams of several source partitions."""
    data = [_stream(rows) for rows in streams]
    windowing = Windowing(size, 0)
    assert tally(data, windowing, watermark) == add_up(read_counts(data), windowing, watermark)


def test_a_stream_that_is_not_partial_counts_is_refused() -> None:
    with pytest.raises(UsageError, match="not Arrow IPC"):
        list(read_counts([b"\x00garbage"]))
    sink = pa.BufferOutputStream()
    other = pa.schema([("x", pa.int64())])
    with pa.ipc.new_stream(sink, other) as w:
        w.write_table(pa.table({"x": [1]}, schema=other))
    with pytest.raises(UsageError, match="schema"):
        list(read_counts([sink.getvalue().to_pybytes()]))
    with pytest.raises(UsageError, match="schema"):
        tally([sink.getvalue().to_pybytes()], Windowing(5000), 0)
    with pytest.raises(UsageError, match="not Arrow IPC"):
        tally([b"\x00garbage"], Windowing(5000), 0)
