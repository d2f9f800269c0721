"""State handles a subtask reports to the coordinator, and the state entries built on them."""

from __future__ import annotations

import base64
import binascii
from typing import NamedTuple

from attrs import field, frozen

from spec.config import Scope, StateKind
from spec.errors import UsageError
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


def _inline_length(_inst: object, attribute: object, value: int) -> None:
    if value < 1:
        raise UsageError(f"length: inline state has at least one byte, got {value} (R10)")


def _base64_of_length(inst: InlineHandle, attribute: object, value: str) -> None:
    try:
        n = len(base64.b64decode(value.encode("ascii"), validate=True))
    except (UnicodeEncodeError, binascii.Error) as err:
        raise UsageError(f"data: inline state is not base64: {err}") from None
    if n != inst.length:
        raise UsageError(f"data: {n} bytes where the handle says {inst.length}")


@frozen
class InlineHandle:
    """R107: private state smaller than ``Config.inline_threshold`` bytes, carried in the
    handle itself (Flink's ``ByteStreamStateHandle`` below
    ``state.storage.fs.memory-threshold``): it travels in the acknowledgement and is kept
    in the ``_metadata``, and names no file, so nothing owns, counts or deletes it.
    ``data`` is the bytes in base64, as the JSON codecs carry them."""

    length: int = field(validator=_inline_length)
    logical_id: str
    data: str = field(validator=_base64_of_length, repr=False)

    @classmethod
    def of(cls, data: bytes, logical_id: str) -> InlineHandle:
        return cls(len(data), logical_id, base64.b64encode(data).decode("ascii"))

    def content(self) -> bytes:
        """The state's bytes."""
        return base64.b64decode(self.data.encode("ascii"))


@frozen
class DirectoryHandle:
    """A managed directory (FLIP-306 §4.3): a subtask's shared or a TM's exclusive dir."""

    path: str


def _in_place_length(_inst: object, attribute: object, value: int) -> None:
    if value < 1:
        raise UsageError(f"length: a working file has at least one byte, got {value}")


def _key_group_range(_inst: object, attribute: object, value: tuple[int, int]) -> None:
    if len(value) != 2 or not 0 <= value[0] <= value[1]:
        raise UsageError(f"key_groups: expected (first, last) with 0 <= first <= last, got {value}")


@frozen
class InPlaceFile:
    """R103: a working file of a subtask's live database that an acknowledgement refers
    to where it is, instead of uploading a copy (§11). ``key_groups`` are those of the
    subtask whose database wrote it: a rescale gives it to every new subtask whose range
    overlaps them (R105). Not a ``Handle``: it names no bytes the checkpoint wrote, so it
    travels beside the entries (``Acknowledgement.in_place``) and is listed apart in the
    ``_metadata``."""

    path: str
    length: int = field(validator=_in_place_length)
    key_groups: tuple[int, int] = field(validator=_key_group_range)


StreamHandle = SegmentHandle | FileHandle
Handle = SegmentHandle | FileHandle | PlaceholderHandle | DirectoryHandle | InlineHandle


def _inline_is_private(inst: StateEntry, attribute: object, value: Handle) -> None:
    if isinstance(value, InlineHandle) and inst.kind.scope is not Scope.EXCLUSIVE:
        raise UsageError(
            f"handle: inline state is EXCLUSIVE state only (R107), not {inst.kind.value}"
        )


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
    handle: Handle = field(validator=_inline_is_private)
    entries: int = 1
    key_groups: tuple[int, int] | None = None
    entry_range: tuple[int, int] | None = None


def stream_of(handle: Handle) -> StreamHandle | None:
    return handle if isinstance(handle, SegmentHandle | FileHandle) else None


class Extent(NamedTuple):
    """The bytes a stream handle names. R54 compares these: one logical id, one extent."""

    path: str
    offset: int
    length: int


def extent_of(stream: StreamHandle) -> Extent:
    """A whole file's bytes start at 0; a segment's at its offset in the merged file."""
    at = stream.offset if isinstance(stream, SegmentHandle) else 0
    return Extent(stream.path, at, stream.length)
