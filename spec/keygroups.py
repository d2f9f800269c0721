"""Key-group arithmetic (Flink's KeyGroupRangeAssignment), definitional for rescaling."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from spec.errors import UsageError

UPPER_BOUND_MAX_PARALLELISM = 1 << 15
"""Flink's inclusive upper bound on the max parallelism (the number of key groups) and so
on any parallelism: ``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``, which is
``Transformation.UPPER_BOUND_MAX_PARALLELISM = 1 << 15`` (R78)."""


class _Keyed(Protocol):
    """What R77 reads of a state entry (``spec.handles.StateEntry``)."""

    @property
    def key_groups(self) -> tuple[int, int] | None: ...

    @property
    def subtask(self) -> _Subtask: ...


class _Subtask(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def parallelism(self) -> int: ...


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> tuple[int, int]:
    """The inclusive key-group range ``(start, end)`` of subtask ``index``.

    Key group ``g`` belongs to subtask ``g * parallelism // max_parallelism`` (BRIEF §4).
    The contract (PEP 316, checked by CrossHair in ``make verify``): the range is never
    empty, and its first and last key groups belong to ``index``.

    pre: 0 <= index < parallelism <= max_parallelism <= 32768
    post: __return__[0] <= __return__[1]
    post: operator_for_key_group(max_parallelism, parallelism, __return__[0]) == index
    post: operator_for_key_group(max_parallelism, parallelism, __return__[1]) == index
    """
    if not 0 <= index < parallelism <= max_parallelism:
        raise UsageError(f"bad subtask {index}/{parallelism} for max parallelism {max_parallelism}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return start, end


def operator_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask index that owns ``key_group``."""
    return key_group * parallelism // max_parallelism


def ranges_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def even_split(total: int, parts: int) -> list[tuple[int, int]]:
    """Split ``total`` items into ``parts`` contiguous half-open ranges, the first ones
    one larger (Flink's round-robin operator state repartitioner, FLIP-8).

    pre: 0 <= total and 1 <= parts <= 64
    post: len(__return__) == parts
    post: __return__[0][0] == 0 and __return__[-1][1] == total
    post: all(__return__[i][1] == __return__[i + 1][0] for i in range(parts - 1))
    post: all(0 <= (b - a) - (d - c) <= 1 for (a, b), (c, d) in zip(__return__, __return__[1:]))
    """
    base, extra = divmod(total, parts)
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((start, start + n))
        start += n
    return out


def max_parallelism_refusal(
    recorded: int | None, wanted: int, entries: Iterable[_Keyed]
) -> str | None:
    """R77: why a checkpoint taken with max parallelism ``recorded`` cannot be restored
    with ``wanted`` (``None``: it can). Key group ``g`` of keyed state goes to subtask
    ``g * p // max_parallelism``: another max parallelism hands key groups to the wrong
    subtasks or to none, so it is refused (as Flink does).

    ``recorded`` is ``None`` for a checkpoint whose metadata does not say (a version-1
    ``_metadata``): then its keyed entries' key-group ranges must be the ones ``wanted``
    cuts for their subtasks. That catches a change whenever one range differs, but not
    always (a checkpoint with no keyed state has no range to compare).
    """
    if recorded is not None:
        if recorded != wanted:
            return (
                f"the checkpoint was taken with max parallelism {recorded}, the restore asks"
                f" for {wanted}: key groups would go to the wrong subtasks (R77)"
            )
        return None
    for e in entries:
        kg = e.key_groups
        if kg is None:
            continue
        s = e.subtask
        cut = key_group_range(wanted, s.parallelism, s.index) if s.parallelism <= wanted else None
        if kg != cut:
            return (
                f"key groups {list(kg)} of subtask {s.index}/{s.parallelism} were cut for"
                f" another max parallelism than {wanted} (the checkpoint's metadata does not"
                " record its own): key groups would go to the wrong subtasks (R77)"
            )
    return None
