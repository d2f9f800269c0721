"""Storage effects: what an implementation performs on its file system, in order.

``actor`` is the party performing the call: ``coordinator``, ``tm:<id>``, or ``user``.
"""

from __future__ import annotations

from attrs import frozen

COORDINATOR = "coordinator"
USER = "user"


def tm_actor(tm: str) -> str:
    return f"tm:{tm}"


@frozen
class MakeDir:
    path: str
    actor: str


@frozen
class CreateFile:
    path: str
    actor: str


@frozen
class AppendBytes:
    path: str
    offset: int
    length: int
    actor: str


@frozen
class CloseFile:
    """Flush, sync and close: the bytes are durable and visible from here on (R12)."""

    path: str
    actor: str


@frozen
class DeleteFile:
    path: str
    actor: str


@frozen
class DeleteDir:
    """Delete a managed directory and everything in it."""

    path: str
    actor: str


@frozen
class WriteMetadata:
    """Write a completed checkpoint's ``_metadata`` atomically (``entries`` handles)."""

    path: str
    checkpoint: int
    entries: int
    actor: str


@frozen
class CallFailed:
    """A storage call that failed; recorded so that nothing is forgotten (R45)."""

    op: str
    path: str
    actor: str


Effect = (
    MakeDir
    | CreateFile
    | AppendBytes
    | CloseFile
    | DeleteFile
    | DeleteDir
    | WriteMetadata
    | CallFailed
)
