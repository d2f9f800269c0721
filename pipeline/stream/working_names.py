"""Names of ``--state-backend working`` (SPEC §11) that the driver and the workers both
read, without SlateDB itself: a database directory (``<job>/taskowned/working/<subtask>/
db/<lineage>``: one SlateDB from its creation or restore on) and a checkpoint's pointer to
its SlateDB checkpoint (the ``db:`` entry that copies the checkpoint's manifest, R103)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

from attrs import frozen

from spec.config import StateKind
from spec.errors import CkptError
from spec.handles import StateEntry
from spec.ids import SubtaskId, escape_name
from spec.layout import working_dir, working_operator

POINTER = re.compile(
    r"db:(?P<lineage>[^#]+/db/[0-9a-f]{12})/manifest/(?P<manifest>[0-9]{20})\.manifest"
    r"#(?P<checkpoint>[0-9a-f-]{36})"
)
BOOKKEEPING = re.compile(
    r"(?:manifest/(?P<manifest>[0-9]{20})\.manifest"
    r"|compactions/(?P<compactions>[0-9]{20})\.compactions"
    r"|wal/[0-9]{20}\.sst|gc/[a-z_]+\.boundary)"
)
"""SlateDB's own objects in a database directory (``docs/slatedb.md``): its manifests,
compactor state, WAL fences and GC boundaries. Its SSTs, ``compacted/<ULID>.sst``, are
the working files of §11."""
SST = re.compile(r"compacted/(?P<ulid>[0-9A-HJKMNP-TV-Z]{26})\.sst")
"""An SST of a database (named by a ULID: time first, so names sort by creation)."""
STAGED = re.compile(r"(?P<object>[^#]+)#[0-9]+")
"""An upload SlateDB's object store had under way in a database directory on a local
disk: ``object_store`` writes ``<object>#<n>`` and renames it to ``<object>`` once whole.
A writer killed mid-upload (a SIGKILLed Python worker whose compactor or flush was
writing an SST) leaves it behind, and SlateDB never sees it: its listings skip such
names, so neither its GC nor ``delete_db`` removes it (``slate_collect`` does). On S3 a
PUT is whole or absent: no such object exists there."""
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid_ms(ulid: str) -> int:
    """The time a ULID was made (its first ten characters), in ms since the epoch."""
    t = 0
    for ch in ulid[:10]:
        t = t * 32 + _CROCKFORD.index(ch)
    return t


CHECKPOINT_PREFIX = "chk-"
"""The name of every SlateDB checkpoint a snapshot creates (``chk-<checkpoint>``): the
coordinator deletes those no retained or pending checkpoint names, and no others."""


class PointerError(CkptError, ValueError):
    """A ``db:`` entry that names no SlateDB checkpoint of ours."""


@frozen
class Pointer:
    """A checkpoint's SlateDB checkpoint, from its ``db:`` entry."""

    lineage: str
    manifest_id: int
    checkpoint_id: str
    key_groups: tuple[int, int]
    entry: StateEntry

    @property
    def manifest_path(self) -> str:
        return f"{self.lineage}/manifest/{self.manifest_id:020d}.manifest"


def pointer_name(lineage: str, manifest_id: int, checkpoint_id: str) -> str:
    return f"db:{lineage}/manifest/{manifest_id:020d}.manifest#{checkpoint_id}"


def pointers(entries: Iterable[StateEntry]) -> list[Pointer]:
    """The SlateDB checkpoints ``entries`` name (``PointerError`` for a ``db:`` name that
    is not one of ours: a hostile name must not become a path)."""
    out: list[Pointer] = []
    for e in entries:
        if not e.name.startswith("db:"):
            continue
        m = POINTER.fullmatch(e.name)
        if m is None or e.kind is not StateKind.KEYED_SHARED or e.key_groups is None:
            raise PointerError(f"{e.name!r} ({e.kind.value}) names no SlateDB checkpoint")
        lineage = m["lineage"]
        if db_dir_of(f"{lineage}/x") != lineage or ".." in lineage.split("/"):
            raise PointerError(f"{e.name!r}: {lineage} is not a database directory")
        if working_operator(f"{lineage}/x") != escape_name(e.subtask.vertex):
            # R105: a clone reads only its own operator's databases
            raise PointerError(
                f"{e.name!r}: {lineage} is a database of another operator than"
                f" {e.subtask.vertex!r}"
            )
        out.append(Pointer(lineage, int(m["manifest"]), m["checkpoint"], e.key_groups, e))
    return out


def new_db_dir(job: str, subtask: SubtaskId) -> str:
    """A new database directory of ``subtask`` (its lineage: 12 hex digits)."""
    return f"{working_dir(job, subtask)}/{uuid.uuid4().hex[:12]}"


def is_staged(path: str) -> bool:
    """Whether ``path`` is an unfinished upload of a database's object (``STAGED``): the
    part before ``#`` is an SST or one of SlateDB's own objects of a database directory."""
    d = db_dir_of(path)
    m = STAGED.fullmatch(path[len(d) + 1 :]) if d is not None else None
    return m is not None and (
        SST.fullmatch(m["object"]) is not None or BOOKKEEPING.fullmatch(m["object"]) is not None
    )


def db_dir_of(path: str) -> str | None:
    """The database directory a path under ``<job>/taskowned/working/`` lies in."""
    parts = path.split("/")
    if len(parts) < 7 or parts[1:3] != ["taskowned", "working"] or parts[4] != "db":
        return None
    return "/".join(parts[:6])
