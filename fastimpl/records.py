"""The store's mutable records: plain ``__slots__`` classes, no attrs in hot paths."""

from __future__ import annotations

import enum

from spec.config import Scope
from spec.handles import InPlaceFile, StateEntry
from spec.ids import SubtaskId, TmId


class Status(enum.Enum):
    ALIVE = "alive"
    LOST = "lost"
    STOPPED = "stopped"


class Tm:
    """What the coordinator knows of one TM attempt: whether it is alive, lost (it may
    still run) or stopped, and what a lost one hosted. What the TM itself heard is the
    TM's (``fastimpl.taskmanager.TaskManager``)."""

    __slots__ = ("hosted", "id", "status")

    def __init__(self, tm: TmId, status: Status) -> None:
        self.id = tm
        self.status = status
        self.hosted: frozenset[SubtaskId] = frozenset()


class Seg:
    """A live logical file in one TM's segment table."""

    __slots__ = (
        "confirmed",
        "created_for",
        "last_used",
        "length",
        "logical_id",
        "offset",
        "path",
    )

    def __init__(
        self,
        logical_id: str,
        path: str,
        offset: int,
        length: int,
        created_for: int,
        last_used: int,
        confirmed: bool,
    ) -> None:
        self.logical_id = logical_id
        self.path = path
        self.offset = offset
        self.length = length
        self.created_for = created_for
        self.last_used = last_used
        self.confirmed = confirmed


PoolKey = tuple[str, str, str, str]


class PFile:
    """A physical file tracked by one TM's file-merging manager."""

    __slots__ = (
        "checkpoint",
        "live_bytes",
        "open",
        "path",
        "pool_key",
        "ref_count",
        "reusable",
        "scope",
        "size",
    )

    def __init__(
        self,
        path: str,
        scope: Scope,
        pool_key: PoolKey | None,
        checkpoint: int | None,
        open_: bool,
        size: int,
    ) -> None:
        self.path = path
        self.scope = scope
        self.pool_key = pool_key
        self.checkpoint = checkpoint
        self.open = open_
        self.size = size
        self.ref_count = 0
        self.live_bytes = 0
        self.reusable = True


class BackendRef:
    """What a subtask's backend remembers having uploaded under a local name."""

    __slots__ = ("checkpoint", "confirmed", "entry")

    def __init__(self, entry: StateEntry, checkpoint: int, confirmed: bool) -> None:
        self.entry = entry
        self.checkpoint = checkpoint
        self.confirmed = confirmed


FOUND: TmId = ""
"""The creator of a directory a party with records of its own found on storage when it
came to write there: another party made it (R40), so it is not this party's to own or
delete (R41); the model's first creator owns it."""


class ManagedDir:
    __slots__ = ("creator", "handed_over", "path", "used_by")

    def __init__(self, path: str, creator: TmId) -> None:
        self.path = path
        self.creator = creator
        self.used_by: set[int] = set()
        self.handed_over = False


class Pending:
    __slots__ = ("acks", "id", "received", "savepoint", "working")

    def __init__(self, cid: int, savepoint: bool) -> None:
        self.id = cid
        self.savepoint = savepoint
        self.acks: dict[SubtaskId, tuple[StateEntry, ...]] = {}
        self.received: set[str] = set()
        self.working: dict[SubtaskId, tuple[InPlaceFile, ...]] = {}
        """R103: the working files each acknowledgement referred to in place."""


class Completed:
    __slots__ = (
        "directories",
        "entries",
        "id",
        "job",
        "max_parallelism",
        "metadata",
        "savepoint",
        "working",
    )

    def __init__(
        self,
        cid: int,
        job: str,
        savepoint: bool,
        entries: tuple[StateEntry, ...],
        directories: tuple[str, ...],
        metadata: str,
        max_parallelism: int | None = None,
        working: tuple[tuple[SubtaskId, InPlaceFile], ...] = (),
    ) -> None:
        self.id = cid
        self.job = job
        self.savepoint = savepoint
        self.entries = entries
        self.directories = directories
        self.metadata = metadata
        self.max_parallelism = max_parallelism
        """R77: the max parallelism it was taken with (``None``: a version-1 file)."""
        self.working = working
        """R103: the working files it refers to in place, with the subtask that referred."""


class StoredFile:
    """The catalog's record of a file on storage: who owns it, who wrote it."""

    __slots__ = ("creator", "open", "owner", "size")

    def __init__(self, size: int, open_: bool, owner: str, creator: TmId | None) -> None:
        self.size = size
        self.open = open_
        self.owner = owner
        self.creator = creator


class Deferred:
    """A delete that waits: for a lost attempt to stop, or for a retry after a failure."""

    __slots__ = ("actor", "is_dir", "path", "waits_for")

    def __init__(self, actor: str, path: str, is_dir: bool, waits_for: TmId | None) -> None:
        self.actor = actor
        self.path = path
        self.is_dir = is_dir
        self.waits_for = waits_for
