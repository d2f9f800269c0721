"""The source's rows as words: a skewed (power-law, Zipf-like) vocabulary, each row's
word a pure function of its value, so that a replayed micro-batch yields the same words
and a batch computation over the same values yields the same counts.

The function runs in Spark's JVM (``with_ranks``: the source's rows never reach Python
to be named) and in numpy (``ranks_of``: the batch check, the Spark-less harness), and
the two agree bit for bit, because every step is one both compute exactly alike:

- the row's draw ``u`` in [0, 1) is the top 53 bits of Spark's ``xxhash64(seed, value)``
  (XXH64 of a long, as ``org.apache.spark.unsafe.hash.XXH64.hashLong`` computes it, seeded
  by Spark's 42), over 2**53: integer arithmetic and an exact division;
- its rank inverts the continuous power law ``t**-exponent`` on [0.5, vocabulary + 0.5)
  (the midpoint rule of the discrete Zipf law, whose low ranks it rounds): the inverse
  CDF is ``(b * u + a) ** k`` with ``k = 1 / (1 - exponent)``, and ``a``, ``b`` computed
  once here and sent to the JVM as literals. ``k`` must be a whole number (exponent 0 is
  uniform, 0.5, 1.1, 1.5, 2 ...), so the power is a fixed sequence of multiplications,
  and a division when ``k`` is negative: IEEE 754 rounds each the same in Java as in
  numpy. A transcendental ``pow`` would not do: Spark's is ``StrictMath.pow`` (fdlibm),
  numpy's the C library's, and the two may differ in the last bit, which ``floor`` turns
  into another word once in billions of rows.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from spec.errors import UsageError
from spec.keygroups import operator_for_key_group

MAX_PARALLELISM = 128
"""Key groups of the keyed stage (Flink's max parallelism): fixed for the job's life."""

MAX_POWER = 64
"""The largest ``|k|`` (``k = 1 / (1 - exponent)``) a vocabulary takes: 64 multiplications
at most per row."""

_MASK = (1 << 64) - 1
_SPARK_SEED = 42
"""The seed of Spark SQL's ``xxhash64``."""
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
_TWO_53 = float(1 << 53)

T = TypeVar("T")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _hash_long(value: int, seed: int) -> int:
    """XXH64 of one long, as Spark's ``XXH64.hashLong(value, seed)``: unsigned 64-bit."""
    h = (seed + _P5 + 8) & _MASK
    h ^= (_rotl((value * _P2) & _MASK, 31) * _P1) & _MASK
    h = (_rotl(h, 27) * _P1 + _P4) & _MASK
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    return h ^ (h >> 32)


def _check_seed(seed: int) -> int:
    """The seed as the unsigned 64 bits Spark's long literal carries."""
    if not -(1 << 63) <= seed < (1 << 63):
        raise UsageError(f"the seed must fit a long, got {seed}")
    return seed & _MASK


@functools.cache
def law(vocabulary: int, exponent: float) -> tuple[float, float, int]:
    """``(a, b, k)``: a draw ``u`` has rank ``floor((b * u + a) ** k - 0.5)``, clipped to
    the vocabulary."""
    if vocabulary < 1:
        raise UsageError(f"vocabulary must be >= 1, got {vocabulary}")
    k_real = math.inf if exponent == 1.0 else 1.0 / (1.0 - exponent)
    k = round(k_real) if math.isfinite(k_real) else 0
    if k == 0 or abs(k_real - k) > 1e-9 or abs(k) > MAX_POWER:
        raise UsageError(
            f"the exponent must be 1 - 1/k for a whole k, 1 <= |k| <= {MAX_POWER}"
            f" (0, 0.5, 1.1, 1.5, 2 ...), got {exponent}: the words are drawn by"
            " multiplications alone, so that Spark and numpy agree bit for bit"
        )
    a = 0.5 ** (1.0 / k)
    return a, (vocabulary + 0.5) ** (1.0 / k) - a, k


def _power(y: T, n: int, mul: Callable[[T, T], T]) -> T:
    """``y ** n`` (``n >= 1``) by squaring, in one fixed order of multiplications."""
    result: T | None = None
    base = y
    while True:
        if n & 1:
            result = base if result is None else mul(result, base)
        n >>= 1
        if not n:
            assert result is not None
            return result
        base = mul(base, base)


def word_of(value: int, *, vocabulary: int = 1000, exponent: float = 1.1, seed: int = 17) -> str:
    """The word of the row with this value, one row at a time: the reading ``ranks_of``
    and ``with_ranks`` are tested against."""
    a, b, k = law(vocabulary, exponent)
    if value < 0:
        raise UsageError("the source's values are never negative")
    h = _hash_long(value, _hash_long(_check_seed(seed), _SPARK_SEED))
    u = (h >> 11) / _TWO_53
    p = _power(b * u + a, abs(k), lambda s, t: s * t)
    x = 1.0 / p if k < 0 else p
    return word_name(min(max(math.floor(x - 0.5), 0), vocabulary - 1))


def word_name(rank: int) -> str:
    return f"w{rank:05d}"


WORD_FORMAT = "w%05d"
"""``word_name`` as Spark SQL's ``format_string`` pattern."""

_U64 = np.uint64


def _rotl_array(x: npt.NDArray[np.uint64], r: int) -> npt.NDArray[np.uint64]:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def _hash_longs(values: npt.NDArray[np.uint64], seed: int) -> npt.NDArray[np.uint64]:
    """``_hash_long`` on a uint64 array (whose arithmetic wraps modulo 2**64)."""
    h = np.full(values.shape, (seed + _P5 + 8) & _MASK, dtype=np.uint64)
    h ^= _rotl_array(values * _U64(_P2), 31) * _U64(_P1)
    h = _rotl_array(h, 27) * _U64(_P1) + _U64(_P4)
    h ^= h >> _U64(33)
    h *= _U64(_P2)
    h ^= h >> _U64(29)
    h *= _U64(_P3)
    return h ^ (h >> _U64(32))


def ranks_of(
    values: npt.NDArray[np.int64], *, vocabulary: int = 1000, exponent: float = 1.1, seed: int = 17
) -> npt.NDArray[np.int64]:
    """``word_of`` on an array of values, as ranks, in numpy:
    ``word_of(v) == word_name(ranks_of([v])[0])``, and equal to ``with_ranks``."""
    a, b, k = law(vocabulary, exponent)
    if values.size and int(values.min()) < 0:
        raise UsageError("the source's values are never negative")
    h = _hash_longs(values.astype(np.uint64), _hash_long(_check_seed(seed), _SPARK_SEED))
    u = (h >> _U64(11)).astype(np.float64) / _TWO_53
    p = _power(b * u + a, abs(k), lambda s, t: s * t)
    x = 1.0 / p if k < 0 else p
    return np.clip(np.floor(x - 0.5), 0, vocabulary - 1).astype(np.int64)


def _double(x: float) -> str:
    """A double as Spark SQL reads it back exactly: the shortest repr, suffix ``D`` (a
    literal with a point and no suffix would be a decimal)."""
    if not math.isfinite(x):
        raise UsageError(f"the power law's constant is not finite: {x}")
    return f"{x!r}D"


@functools.cache
def rank_sql(vocabulary: int, exponent: float, seed: int) -> tuple[str, str]:
    """Spark SQL for ``with_ranks``'s two projections: the draw ``y`` from ``value``,
    then the rank from ``y``. Built here as text, once per law, so that a micro-batch
    costs the driver two calls into the JVM rather than one per operator."""
    a, b, k = law(vocabulary, exponent)
    _check_seed(seed)
    h = f"shiftrightunsigned(xxhash64(CAST({seed} AS BIGINT), value), 11)"
    u = f"(CAST({h} AS DOUBLE) / {_double(_TWO_53)})"
    y = f"{_double(b)} * {u} + {_double(a)} AS y"
    p = _power("y", abs(k), lambda s, t: f"({s} * {t})")
    x = f"(1.0D / {p})" if k < 0 else p
    rank = f"least(greatest(floor({x} - 0.5D), 0L), {vocabulary - 1}L) AS rank"
    return y, rank


def with_ranks(df: Any, *, vocabulary: int = 1000, exponent: float = 1.1, seed: int = 17) -> Any:
    """The DataFrame of the source's ``value`` and ``ts`` as ``rank`` and ``ts``, computed
    by Spark SQL's own functions in the JVM: ``ranks_of`` of the values. The draw's
    ``y = b * u + a`` is a column of its own first, so that the multiplications of the
    power read it rather than repeat the hash (Spark keeps a costly expression used
    twice from being inlined into the next projection)."""
    y, rank = rank_sql(vocabulary, exponent, seed)
    return df.selectExpr(y, "ts").selectExpr(rank, "ts")


def key_group(word: str, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The word's key group: a stable hash (CRC-32), the same in every process. Python's
    ``hash()`` of a string is salted per process, so two workers would disagree."""
    return zlib.crc32(word.encode()) % max_parallelism


def subtask_of(group: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The subtask (= Spark partition) that owns key group ``group``: ``g * p // max_p``."""
    return operator_for_key_group(max_parallelism, parallelism, group)
