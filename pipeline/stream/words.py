"""The source's rows as words: a skewed (Zipf) vocabulary, each row's word a pure
function of its value, so that a replayed micro-batch yields the same words and a batch
computation over the same values yields the same counts."""

from __future__ import annotations

import bisect
import functools
import zlib

import numpy as np
import numpy.typing as npt

from spec.errors import UsageError
from spec.keygroups import operator_for_key_group

MAX_PARALLELISM = 128
"""Key groups of the keyed stage (Flink's max parallelism): fixed for the job's life."""

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """SplitMix64's finalizer: consecutive row values to unrelated 64-bit numbers."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@functools.cache
def _cdf(vocabulary: int, exponent: float) -> tuple[float, ...]:
    weights = [1.0 / (rank**exponent) for rank in range(1, vocabulary + 1)]
    total = sum(weights)
    out: list[float] = []
    acc = 0.0
    for w in weights:
        acc += w
        out.append(acc / total)
    return tuple(out)


def word_of(value: int, *, vocabulary: int = 1000, exponent: float = 1.1, seed: int = 17) -> str:
    """The word of the row with this value: rank r of the vocabulary with probability
    proportional to ``1 / r**exponent``, drawn from a hash of (seed, value)."""
    if vocabulary < 1:
        raise UsageError(f"vocabulary must be >= 1, got {vocabulary}")
    u = (_mix(_mix(seed) ^ value) >> 11) / float(1 << 53)
    cdf = _cdf(vocabulary, exponent)
    rank = min(bisect.bisect_right(cdf, u), vocabulary - 1)
    return word_name(rank)


def word_name(rank: int) -> str:
    return f"w{rank:05d}"


_U64 = np.uint64


def _mix_array(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``_mix`` on uint64 arrays (their arithmetic wraps modulo 2**64, as the
    scalar version's masks do)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


@functools.cache
def _cdf_array(vocabulary: int, exponent: float) -> npt.NDArray[np.float64]:
    return np.asarray(_cdf(vocabulary, exponent), dtype=np.float64)


def ranks_of(
    values: npt.NDArray[np.int64], *, vocabulary: int = 1000, exponent: float = 1.1, seed: int = 17
) -> npt.NDArray[np.int64]:
    """``word_of`` on an array of values, as ranks:
    ``word_of(v) == word_name(ranks_of([v])[0])``."""
    if vocabulary < 1:
        raise UsageError(f"vocabulary must be >= 1, got {vocabulary}")
    if values.size and int(values.min()) < 0:
        raise UsageError("the source's values are never negative")
    with np.errstate(over="ignore"):
        mixed = _mix_array(values.astype(np.uint64) ^ _U64(_mix(seed)))
    u = (mixed >> _U64(11)).astype(np.float64) / float(1 << 53)
    ranks = np.searchsorted(_cdf_array(vocabulary, exponent), u, side="right")
    return np.minimum(ranks, vocabulary - 1).astype(np.int64)


def key_group(word: str, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The word's key group: a stable hash (CRC-32), the same in every process. Python's
    ``hash()`` of a string is salted per process, so two workers would disagree."""
    return zlib.crc32(word.encode()) % max_parallelism


def subtask_of(group: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The subtask (= Spark partition) that owns key group ``group``: ``g * p // max_p``."""
    return operator_for_key_group(max_parallelism, parallelism, group)
