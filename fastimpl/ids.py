"""Where physical file names and logical ids come from (R2).

An id source hands out names that are never reused. ``CounterIds`` gives exactly the
names the reference model gives (``f{n:06d}`` per physical file, ``s{n:06d}`` per
segment, from two counters), so a lockstep test can compare the two file by file;
``RandomIds`` gives uuid4 names for production, where several processes share a root.
"""

from __future__ import annotations

import uuid
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


class RandomIds:
    """uuid4 ids: unique without coordination between processes."""

    __slots__ = ()

    def file_name(self, directory: str) -> str:
        return f"f{uuid.uuid4().hex}"

    def logical_id(self) -> str:
        return f"s{uuid.uuid4().hex}"
