"""Identities: subtasks, task managers, checkpoints, and the escaping of names into paths."""

from __future__ import annotations

import functools

from attrs import field, frozen

from spec.errors import UsageError

SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")


def _escape(name: str) -> str:
    """Map any name to a path component built from ``[A-Za-z0-9._-]`` only (R3).

    Injective, so two different ids never share a directory (FLINK-35778): ``_`` is the
    escape character, written ``__`` itself; any other byte outside the set is ``_HH``.
    A leading ``.`` is escaped too, so no component is ``.`` or ``..`` or hidden.

    post: __return__ and not __return__.startswith(".")
    post: all(ch in SAFE or ch == "_" for ch in __return__)
    post: unescape_name(__return__) == name
    """
    out: list[str] = []
    for pos, ch in enumerate(name):
        if ch == "_":
            out.append("__")
        elif ch in SAFE and not (pos == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"_{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out) or "_"


escape_name = functools.lru_cache(maxsize=65536)(_escape)  # pure; paths are built per append
escape_name.__doc__ = _escape.__doc__


def unescape_name(text: str) -> str:
    """Inverse of :func:`escape_name`."""
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "_":
            raw.extend(ch.encode("ascii"))
            i += 1
        elif text[i + 1 : i + 2] == "_":
            raw.extend(b"_")
            i += 2
        elif i + 1 == len(text):
            i += 1  # the lone "_" that stands for the empty name
        else:
            raw.append(int(text[i + 1 : i + 3], 16))
            i += 3
    return raw.decode("utf-8")


def _non_negative(_inst: object, attribute: object, value: int) -> None:
    if value < 0:
        raise UsageError(f"{attribute} must be >= 0, got {value}")


@frozen(order=True, cache_hash=True)
class SubtaskId:
    """One parallel instance of a vertex: (vertex, index, parallelism)."""

    vertex: str
    index: int = field(validator=_non_negative)
    parallelism: int

    def __attrs_post_init__(self) -> None:
        if not self.vertex:
            raise UsageError("vertex name must not be empty")
        if self.parallelism < 1 or self.index >= self.parallelism:
            raise UsageError(f"index {self.index} out of range for parallelism {self.parallelism}")

    def dir_name(self) -> str:
        """The subtask's directory name under ``shared/`` (BRIEF §2)."""
        return f"{escape_name(self.vertex)}-{self.index}-{self.parallelism}"

    def __str__(self) -> str:
        return f"{self.vertex}[{self.index}/{self.parallelism}]"


TmId = str
"""A task manager attempt. A TM that restarts comes back under a new id."""

CheckpointId = int
"""Checkpoint ids are strictly increasing within a lineage of jobs (R20)."""

LogicalId = str
"""A unique handle id: the registry key of a segment or file (R31, FLINK-29913)."""
