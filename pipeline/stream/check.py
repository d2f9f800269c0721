"""The correctness check: the windows' counts by a plain batch computation over the same
input, compared window by window with what the sink holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
from attrs import frozen

from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from pipeline.stream.words import ranks_of, word_name


def batch_counts(
    source: RateSource, batches: int, windowing: Windowing
) -> Counter[tuple[int, str]]:
    """``{(window start, word): count}`` over the first ``batches`` micro-batches, each
    value's word by ``words.ranks_of`` (which the JVM's ``with_ranks`` equals)."""
    counts: Counter[tuple[int, str]] = Counter()
    for b in range(batches):
        start = windowing.start_of(source.event_ms(b))
        values = source.values(b)
        ranks = ranks_of(np.arange(values.start, values.stop, dtype=np.int64), **source.word_args())
        found = np.bincount(ranks, minlength=source.vocabulary)
        for rank in np.flatnonzero(found).tolist():
            counts[(start, word_name(rank))] += int(found[rank])
    return counts


@frozen
class Comparison:
    windows: int
    """Closed windows compared (distinct window starts)."""
    counts: int
    """(window, word) counts compared."""
    mismatches: tuple[tuple[int, str, int | None, int | None], ...]
    """``(start, word, expected, got)`` for every difference (``None``: absent)."""
    duplicates: tuple[tuple[int, str], ...]
    """(window, word) pairs the sink holds more than once."""

    @property
    def equal(self) -> bool:
        return not self.mismatches and not self.duplicates


def compare(
    expected: Mapping[tuple[int, str], int],
    emitted: Iterable[tuple[int, str, int]],
    windowing: Windowing,
    watermark: int,
) -> Comparison:
    """Every window closed at ``watermark`` must be in the sink once with the batch
    computation's counts, and nothing else may be there."""
    got: dict[tuple[int, str], int] = {}
    dup: list[tuple[int, str]] = []
    for start, word, n in emitted:
        if (start, word) in got:
            dup.append((start, word))
        got[(start, word)] = got.get((start, word), 0) + n
    want = {k: v for k, v in expected.items() if windowing.closed(k[0], watermark)}
    bad = [
        (k[0], k[1], want.get(k), got.get(k))
        for k in sorted(set(want) | set(got))
        if want.get(k) != got.get(k)
    ]
    return Comparison(len({k[0] for k in want}), len(want), tuple(bad), tuple(sorted(dup)))
