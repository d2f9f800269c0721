"""The native query's words (``bench.stream_scale``): each row's word as ``ckpt stream``'s
map side finds it (``words.ranks_of``), on Arrow batches. A module of its own so
that Spark's workers import it by name (a function of ``__main__`` is not importable)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from pipeline.stream.words import ranks_of, word_name


@functools.cache
def _names(vocabulary: int) -> Any:
    return np.array([word_name(r) for r in range(vocabulary)], dtype=object)


def words_of_rows(word_args: dict[str, Any], batches: Iterable[Any]) -> Iterator[Any]:
    """``mapInArrow``'s function: ``value``, ``ts`` to ``word``, ``ts``."""
    names = _names(int(word_args["vocabulary"]))
    for b in batches:
        values = b.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
        ranks = ranks_of(values, **word_args)
        yield pa.record_batch({"word": pa.array(names[ranks], pa.string()), "ts": b.column(1)})
