"""The coordinator's table of TM attempts, bounded by what is live (issue 16).

An attempt the coordinator gave up on and that is known stopped (R64), or that ended with
its job (R90), has nothing left that depends on its record: its files were taken or
deleted at the stop, no delete waits for it, it can no longer write. Its record goes;
its id stays known as retired, so that every guard answers as it did with the record
(a stopped attempt's late acknowledgement or decline is ignored, R56; a crash, a stop
or a write of it is refused as a stopped TM's, not as an unknown one's) and an id the
coordinator never heard of is still told apart from one it forgot.

Attempt ids are the engine's, never reused (R56 relies on it). Engines number them
(``tm-1``, ``tm-2``, ...): retired ids are kept as runs of consecutive numbers per prefix,
so the retired set takes room for the gaps between retired and live attempts, not for
every attempt ever started. An id of another shape is kept as it is.
"""

from __future__ import annotations

import bisect
import re

from fastimpl.records import Status, Tm
from spec.ids import TmId

_NUMBERED = re.compile(r"(.*?)([1-9]\d*|0)")
Span = tuple[str, int, int] | str
"""A run of retired ids (prefix, first and last number) or an id of another shape."""


class IdRuns:
    """A set of ids held as runs of consecutive numbers (``prefix`` + number)."""

    def __init__(self) -> None:
        self._runs: dict[str, list[list[int]]] = {}
        """Per prefix, disjoint ``[first, last]`` runs in order, none adjacent."""
        self._other: set[str] = set()

    def add(self, name: str) -> None:
        m = _NUMBERED.fullmatch(name)
        if m is None:
            self._other.add(name)
            return
        runs = self._runs.setdefault(m.group(1), [])
        n = int(m.group(2))
        i = bisect.bisect_right(runs, [n, n])
        if i > 0 and runs[i - 1][1] >= n:
            return  # already in
        if i > 0 and runs[i - 1][1] == n - 1:
            runs[i - 1][1] = n
            i -= 1
        elif i < len(runs) and runs[i][0] == n + 1:
            runs[i][0] = n
        else:
            runs.insert(i, [n, n])
        if i + 1 < len(runs) and runs[i][1] + 1 == runs[i + 1][0]:
            runs[i][1] = runs.pop(i + 1)[1]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        m = _NUMBERED.fullmatch(name)
        if m is None:
            return name in self._other
        runs = self._runs.get(m.group(1), [])
        n = int(m.group(2))
        i = bisect.bisect_right(runs, [n, n])
        return (i > 0 and runs[i - 1][0] <= n <= runs[i - 1][1]) or (
            i < len(runs) and runs[i][0] == n
        )

    def spans(self) -> tuple[Span, ...]:
        """The set as values: ``("tm-", 3, 7)`` for ``tm-3`` to ``tm-7``, an id of another
        shape as it is (what ``of_spans`` reads back)."""
        runs = [(p, a, b) for p, rs in sorted(self._runs.items()) for a, b in rs]
        return (*runs, *sorted(self._other))

    @classmethod
    def of_spans(cls, spans: tuple[Span, ...]) -> IdRuns:
        """The set ``spans`` describes."""
        ids = cls()
        for span in spans:
            if isinstance(span, str):
                ids._other.add(span)
                continue
            prefix, first, last = span
            ids._runs.setdefault(prefix, []).append([first, last])
        for prefix, runs in ids._runs.items():  # sorted, and touching runs joined
            joined: list[list[int]] = []
            for first, last in sorted(runs):
                if joined and first <= joined[-1][1] + 1:
                    joined[-1][1] = max(joined[-1][1], last)
                else:
                    joined.append([first, last])
            ids._runs[prefix] = joined
        return ids

    def size(self) -> int:
        """Runs and other ids held: the room the set takes."""
        return sum(len(r) for r in self._runs.values()) + len(self._other)


class TmTable(dict[TmId, Tm]):
    """The records of the attempts that are alive or lost (they may still run); a retired
    attempt reads as a fresh record with status ``STOPPED``, and is not listed."""

    def __init__(self) -> None:
        super().__init__()
        self.retired = IdRuns()

    def retire(self, tm: TmId) -> None:
        rec = dict.get(self, tm)
        assert rec is None or rec.status is Status.STOPPED, f"{tm} is {rec.status}"
        dict.pop(self, tm, None)
        self.retired.add(tm)

    def __missing__(self, tm: TmId) -> Tm:
        if tm in self.retired:
            return Tm(tm, Status.STOPPED)
        raise KeyError(tm)

    def get(self, tm: TmId, default: Tm | None = None) -> Tm | None:  # type: ignore[override]
        try:
            return self[tm]
        except KeyError:
            return default

    def __contains__(self, tm: object) -> bool:
        return dict.__contains__(self, tm) or tm in self.retired
