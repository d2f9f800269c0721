"""Where physical file names and logical ids come from (R2).

An id source hands out names that are never reused. ``CounterIds`` gives exactly the
names the reference model gives (``f{n:06d}`` per physical file, ``s{n:06d}`` per
segment, from two counters), so a lockstep test can compare the two file by file;
``RandomIds`` gives names unique across processes (a random prefix and a counter) for
production, where several processes share a root.

A TM in a process of its own (``TaskManager.alone``) marks every file name it draws with
its attempt id (``marked``): ``<name>.<escaped attempt>``. The mark is the one record of
who created a file that outlives the attempt's process and that every party can read from
a listing, local or on an object store: the coordinator reads it (``creator_of``) when it
sweeps what a stopped attempt left in a directory other attempts write in too (R64).
"""

from __future__ import annotations

import base64
import itertools
import os
import weakref
from typing import Protocol

from spec.ids import TmId, escape_name, unescape_name


class IdSource(Protocol):
    def file_name(self, directory: str) -> str:
        """A new file name (the last path component) for a file in ``directory``."""
        ...

    def logical_id(self) -> str:
        """A new unique handle id (the registry key of a segment or file)."""
        ...


class CounterIds:
    """Deterministic ids: the reference model's counters."""

    __slots__ = ("next_file", "next_segment")

    def __init__(self, next_file: int = 1, next_segment: int = 1) -> None:
        self.next_file = next_file
        self.next_segment = next_segment

    def file_name(self, directory: str) -> str:
        name = f"f{self.next_file:06d}"
        self.next_file += 1
        return name

    def logical_id(self) -> str:
        lid = f"s{self.next_segment:06d}"
        self.next_segment += 1
        return lid


MARK = "."
"""Between a drawn file name and its creator's escaped attempt id: never in a drawn name
(``f`` and lower-case letters and digits), and ``escape_name`` never starts with it."""


def marked(name: str, creator: TmId) -> str:
    """``name`` (a file name drawn from an id source) marked as ``creator``'s."""
    return f"{name}{MARK}{escape_name(creator)}"


def creator_of(path: str) -> TmId | None:
    """The attempt a marked file name (the last component of ``path``) names as its
    creator; None for a name without a mark or with one that is not an escaped id."""
    name = path.rsplit("/", 1)[-1]
    drawn, sep, mark = name.partition(MARK)
    if not sep or not drawn or not mark:
        return None
    try:
        creator = unescape_name(mark)
    except (ValueError, UnicodeDecodeError):
        return None
    return creator if creator and escape_name(creator) == mark else None


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
"""Lower case only: two names must never differ by case alone (on a case-insensitive file
system, macOS's or Windows's default, they would be one file)."""


_PAIRS = [a + b for a in _DIGITS for b in _DIGITS]
"""Every two-digit base-36 string, by value (1,296 of them): a counter is written two
digits per lookup, not one ``divmod`` per digit (an id per segment written)."""


def _base36(n: int) -> str:
    if n < 1296:
        return _PAIRS[n].lstrip("0") or "0"
    high, low = divmod(n, 1296)
    return _base36(high) + _PAIRS[low]


def _random_prefix() -> str:
    return base64.b32encode(os.urandom(10)).decode("ascii").lower()  # 80 bits, 16 chars


_LIVE: weakref.WeakSet[RandomIds] = weakref.WeakSet()
"""Every RandomIds of this process: a forked child draws new prefixes for them."""


class RandomIds:
    """Ids unique without coordination between processes: a random 80-bit prefix per
    instance (drawn from ``os.urandom``, redrawn in a child after ``fork``) and a counter.
    Uniqueness does not need a fresh random draw per id, which costs a system call; the
    ids stay short (about 20 characters, lower case letters and digits), which keeps
    memory per tracked segment small. Safe to share between threads: the counter is an
    ``itertools.count``, whose ``next`` is atomic."""

    __slots__ = ("__weakref__", "_counter", "_prefix")

    def __init__(self) -> None:
        self._prefix = _random_prefix()
        self._counter = itertools.count(1)
        _LIVE.add(self)

    def _redraw(self) -> None:
        self._prefix = _random_prefix()

    def _token(self) -> str:
        return self._prefix + _base36(next(self._counter))

    def file_name(self, directory: str) -> str:
        return "f" + self._token()

    def logical_id(self) -> str:
        return "s" + self._token()


def _after_fork_in_child() -> None:
    for ids in list(_LIVE):
        ids._redraw()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
