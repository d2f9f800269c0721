"""State handles a subtask reports to the coordinator, and the state entries built on them."""

from __future__ import annotations

from attrs import frozen

from spec.config import Scope, StateKind
from spec.ids import SubtaskId


@frozen
class SegmentHandle:
    """A logical file: ``length`` bytes at ``offset`` of a (merged) physical file."""

    path: str
    offset: int
    length: int
    logical_id: str
    scope: Scope


@frozen
class FileHandle:
    """A whole physical file (no merging, or a savepoint)."""

    path: str
    length: int
    logical_id: str
    scope: Scope


@frozen
class PlaceholderHandle:
    """Reuse of an already registered shared handle, by its unique id (NONE mode)."""

    logical_id: str


@frozen
class DirectoryHandle:
    """A managed directory (FLIP-306 §4.3): a subtask's shared or a TM's exclusive dir."""

    path: str


StreamHandle = SegmentHandle | FileHandle
Handle = SegmentHandle | FileHandle | PlaceholderHandle | DirectoryHandle


@frozen
class StateEntry:
    """One named piece of a subtask's snapshot, with what rescaling needs to split it.

    ``key_groups`` is the inclusive key-group range of keyed state (None otherwise);
    ``entries`` the number of list elements of operator or channel state; ``entry_range``
    the half-open slice of those elements a restored subtask holds (None means all).
    """

    subtask: SubtaskId
    kind: StateKind
    name: str
    handle: Handle
    entries: int = 1
    key_groups: tuple[int, int] | None = None
    entry_range: tuple[int, int] | None = None


def stream_of(handle: Handle) -> StreamHandle | None:
    return handle if isinstance(handle, SegmentHandle | FileHandle) else None
