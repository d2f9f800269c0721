"""Where physical file names and logical ids come from (R2).

An id source hands out names that are never reused. ``CounterIds`` gives exactly the
names the reference model gives (``f{n:06d}`` per physical file, ``s{n:06d}`` per
segment, from two counters), so a lockstep test can compare the two file by file;
``RandomIds`` gives names unique across processes (a random prefix and a counter) for
production, where several processes share a root.
"""

from __future__ import annotations

import base64
import os
from typing import Protocol


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


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _base62(n: int) -> str:
    out = []
    while True:
        n, r = divmod(n, 62)
        out.append(_DIGITS[r])
        if n == 0:
            return "".join(reversed(out))


class RandomIds:
    """Ids unique without coordination between processes: a random 96-bit prefix per
    instance (drawn from ``os.urandom``) and a counter. Uniqueness does not need a fresh
    random draw per id, which costs a system call; the ids stay short (about 20
    characters), which keeps memory per tracked segment small."""

    __slots__ = ("_next", "_prefix")

    def __init__(self) -> None:
        self._prefix = base64.urlsafe_b64encode(os.urandom(12)).decode("ascii")
        self._next = 0

    def _token(self) -> str:
        self._next += 1
        return self._prefix + _base62(self._next)

    def file_name(self, directory: str) -> str:
        return "f" + self._token()

    def logical_id(self) -> str:
        return "s" + self._token()
