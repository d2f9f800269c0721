"""What a TM attempt hands to the next process that runs it: its records, as data.

A TM whose subtask moves between processes (the Spark job: a partition has no fixed
Python worker, ``pipeline.stream.worker_tm``) leaves its records behind at the end of a
task and takes them up again in the next. What it leaves is a ``TmState``: plain values
of this vocabulary, never an object graph of the implementation, so that a refactor of
the implementation's private fields cannot misread a saved state, and reading one cannot
run code. It travels as bytes: ``encode_tm_state`` / ``decode_tm_state``, JSON through
``spec.codec`` (as ``spec.messages`` does) in an envelope carrying ``TM_STATE_FORMAT``
and ``TM_STATE_VERSION``.

Decoding refuses, with a ``TmStateError`` naming the field
(``$.state.records.files[3].size``), anything that is not exactly a state of this
format and version: bytes that are not UTF-8 JSON, another format or version, a missing
or unknown field, a value of the wrong type, and values no TM could have recorded: a
negative size or count, a path that is not a relative path inside the store's root
(absolute, with ``..`` or an empty part: a forged state must not name a file outside the
base for the TM to delete), two records of one key, a segment or pool in no physical
file, a database file of no known size. Decoding builds a new value and touches
nothing else.

Dictionaries of the implementation are lists of records here, in their order (the order
of a dictionary can show, e.g. in the order of a report's lists); sets are sorted
tuples. An open pooled file is a record of ``files`` with ``open`` true: the next process
reopens it (local disks only, R16).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from attrs import frozen

from spec import codec
from spec.config import Config, Scope
from spec.errors import WrongTypeError
from spec.handles import InPlaceFile, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.messages import TmEnded
from spec.observation import DeletionRecord

TM_STATE_FORMAT = "ckpt-tm-state"
"""The envelope's ``format``: what the bytes are, whatever their version."""
TM_STATE_VERSION = 1
"""Bumped on any change a reader of the previous version would misread."""

PoolKey = tuple[str, str, str, str]
"""A pool's key (R13): (TM, scope, subtask or TM, checkpoint or ``*``)."""


class TmStateError(codec.CodecError):
    """Bytes that are not a TM state of this format and version; ``where`` names the field."""


# ---------------------------------------------------------------------------- the catalog


@frozen
class FileRecord:
    """A file the TM records: its size, whether its handle is open (a pooled file still
    appended to), who owns it (an actor) and which attempt created it."""

    path: str
    size: int
    open: bool
    owner: str
    creator: str | None


@frozen
class DirectoryRecord:
    """A managed directory the TM made or was given (R40-R42): its creator, the
    checkpoints that reported it, whether it was handed over to the coordinator. The
    creator is empty for one the TM found made by another party and only writes in."""

    path: str
    creator: str
    used_by: tuple[int, ...]
    handed_over: bool


@frozen
class DirectoryOwner:
    path: str
    owner: str


@frozen
class DeferredDelete:
    """A delete that waits: for a lost attempt to stop (R64), or for a retry (R45)."""

    actor: str
    path: str
    is_dir: bool
    waits_for: str | None


@frozen
class RefusedDelete:
    """A delete the guard refused (I5): nothing was deleted."""

    path: str
    actor: str
    is_dir: bool
    reason: str


@frozen
class DeletedBy:
    path: str
    actor: str


@frozen
class FailedDelete:
    """A background delete that kept failing (R45): retried by the next ``RetryDeletes``;
    ``error`` is the last failure as text, ``deleted_by`` who decided each file's delete."""

    path: str
    is_dir: bool
    error: str
    attempts: int
    deleted_by: tuple[DeletedBy, ...]


# ---------------------------------------------------------------------------- the manager


@frozen
class SegmentRecord:
    """A live segment of the TM's table (R13, R31)."""

    logical_id: str
    path: str
    offset: int
    length: int
    created_for: int
    last_used: int
    confirmed: bool


@frozen
class PhysicalFile:
    """A physical file of the TM's file-merging manager (R12-R15, R80, R81)."""

    path: str
    scope: Scope
    pool_key: PoolKey | None
    checkpoint: int | None
    open: bool
    size: int
    ref_count: int
    live_bytes: int
    reusable: bool


@frozen
class Pool:
    """A pool's open file (R13)."""

    key: PoolKey
    path: str


# ---------------------------------------------------------------------------- the subtasks


@frozen
class Written:
    """What ``subtask`` wrote for ``checkpoint`` and has not acknowledged yet, or what it
    acknowledged, until the TM hears how the checkpoint ended (R23)."""

    subtask: SubtaskId
    checkpoint: int
    entries: tuple[StateEntry, ...]


@frozen
class BackendRecord:
    """What ``subtask``'s backend remembers uploading under ``name`` (R20-R23)."""

    subtask: SubtaskId
    name: str
    entry: StateEntry
    checkpoint: int
    confirmed: bool


@frozen
class SubtaskPool:
    """The SHARED pool ``subtask`` last appended to, with that checkpoint (a subtask the
    TM ever wrote for: R13's pool key, kept as the TM keeps it)."""

    subtask: SubtaskId
    pool_checkpoint: int
    pool_key: PoolKey | None


# ---------------------------------------------------------------------------- working state


@frozen
class DatabaseUse:
    """The files ``subtask``'s database uses (R101)."""

    subtask: SubtaskId
    files: tuple[str, ...]


@frozen
class Pin:
    """R103: the files an unacknowledged snapshot refers to in place."""

    subtask: SubtaskId
    checkpoint: int
    files: tuple[str, ...]


@frozen
class Opened:
    """An ``OpenDatabase`` duty applied (R105): each once."""

    epoch: int
    subtask: SubtaskId


@frozen
class WorkingRecords:
    """The attempt's live databases (SPEC §11)."""

    uses: tuple[DatabaseUse, ...]
    pins: tuple[Pin, ...]
    known: tuple[InPlaceFile, ...]
    """Size and key groups of every file a database uses or pins."""
    written: tuple[str, ...]
    """Files the attempt wrote and may still own (what R102 may delete)."""
    opened: tuple[Opened, ...]
    users: tuple[str, ...]
    """Files opened as the user's (NO_CLAIM, R105)."""


# ---------------------------------------------------------------------------- the whole


@frozen
class TaskManagerState:
    """One TM attempt's records: what it knows of the job, its catalog of files and
    directories, its file-merging tables, its subtasks' outputs and backends, its
    databases."""

    job: str
    tm: str
    config: Config
    first_checkpoint: int
    hosted: tuple[SubtaskId, ...]
    # what it heard from the coordinator (R30-R35, R60-R66, R90)
    savepoints: tuple[int, ...]
    known_completed: int
    finished_mark: int
    known_aborted: tuple[int, ...]
    known_watermark: int
    finished_savepoints: tuple[int, ...]
    reset_epoch: int
    assigned_epoch: int
    lost: tuple[str, ...]
    ended: TmEnded | None
    # its catalog (R40-R45, R64, I5)
    files: tuple[FileRecord, ...]
    directories: tuple[DirectoryRecord, ...]
    directory_owners: tuple[DirectoryOwner, ...]
    failed_uploads: tuple[str, ...]
    deferred_deletes: tuple[DeferredDelete, ...]
    refused_deletes: tuple[RefusedDelete, ...]
    failed_deletes: tuple[FailedDelete, ...]
    bad_deletions: tuple[DeletionRecord, ...]
    deletions: tuple[DeletionRecord, ...] | None
    """Every delete, when the TM keeps the log (tests and traces); else None."""
    # its file-merging manager (R10-R17)
    segments: tuple[SegmentRecord, ...]
    physical_files: tuple[PhysicalFile, ...]
    pools: tuple[Pool, ...]
    # its subtasks (R20-R23)
    outputs: tuple[Written, ...]
    acked: tuple[Written, ...]
    backend: tuple[BackendRecord, ...]
    subtask_pools: tuple[SubtaskPool, ...]
    working: WorkingRecords


@frozen
class TmState:
    """What a worker hands to its subtask's next task: the TM's records, the sequence
    number of the last mail item it applied, and the directory of the subtask's working
    database (``--state-backend working``), if any."""

    records: TaskManagerState
    applied: int
    lineage: str | None


# ---------------------------------------------------------------------------- codec


def encode_tm_state(state: TmState) -> bytes:
    """``state`` as bytes: ``{"format": ..., "version": ..., "state": {...}}`` in UTF-8.
    A state no TM could have recorded (see ``decode_tm_state``) is refused here too:
    what is written can be read back."""
    if not isinstance(state, TmState):
        raise WrongTypeError(f"not a TmState: {type(state).__name__}")
    for where, problem in _problems(state, "$.state"):
        raise TmStateError(where, problem)
    envelope = {
        "format": TM_STATE_FORMAT,
        "version": TM_STATE_VERSION,
        "state": codec.encode(state),
    }
    text = json.dumps(envelope, sort_keys=True, separators=(",", ":"), check_circular=False)
    return text.encode()


def decode_tm_state(data: bytes) -> TmState:
    """The state ``encode_tm_state`` turned into ``data``; ``TmStateError`` naming the
    field for anything else."""
    body = codec.open_envelope(
        data, TmStateError, body="state", version=TM_STATE_VERSION, fmt=TM_STATE_FORMAT
    )
    try:
        state: TmState = codec.decode(TmState, body, "$.state")
    except codec.CodecError as err:
        cause = err.__cause__
        name = getattr(cause, "field", None)  # a validator of the vocabulary names its field
        if isinstance(name, str):
            problem = str(getattr(cause, "problem", cause))
            raise TmStateError(f"{err.where}.{name}", problem) from None
        raise TmStateError(err.where, err.problem) from None
    for where, problem in _problems(state, "$.state"):
        raise TmStateError(where, problem)
    return state


# ---------------------------------------------------------------------------- checks


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a path relative to the store's root that stays inside it, or
    None: no leading ``/``, no empty, ``.`` or ``..`` part, no backslash or NUL."""
    if not path:
        return "an empty path"
    if path.startswith("/") or "\\" in path or "\x00" in path:
        return f"{path!r} is not a relative path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return f"{path!r} has an empty, '.' or '..' part"
    return None


def _paths(items: Any, where: str, attr: str | None = None) -> Iterator[tuple[str, str]]:
    for i, item in enumerate(items):
        path = item if attr is None else getattr(item, attr)
        at = f"{where}[{i}]" if attr is None else f"{where}[{i}].{attr}"
        problem = path_problem(path)
        if problem is not None:
            yield at, problem


def _not_negative(value: int | None, where: str) -> Iterator[tuple[str, str]]:
    if value is not None and value < 0:
        yield where, f"must be >= 0, got {value}"


def _unique(keys: list[Any], where: str, what: str) -> Iterator[tuple[str, str]]:
    seen: set[Any] = set()
    for i, k in enumerate(keys):
        if k in seen:
            yield f"{where}[{i}]", f"a second record of {what} {k!r}"
        seen.add(k)


def _entries(entries: tuple[StateEntry, ...], where: str) -> Iterator[tuple[str, str]]:
    for i, e in enumerate(entries):
        s = stream_of(e.handle)
        if s is not None:
            problem = path_problem(s.path)
            if problem is not None:
                yield f"{where}[{i}].handle.path", problem


def _problems(state: TmState, where: str) -> Iterator[tuple[str, str]]:
    """What makes ``state`` one no TM could have recorded: the field and why."""
    yield from _not_negative(state.applied, f"{where}.applied")
    r = state.records
    at = f"{where}.records"
    for name in ("first_checkpoint", "known_completed", "finished_mark", "known_watermark",
                 "reset_epoch", "assigned_epoch"):  # fmt: skip
        yield from _not_negative(getattr(r, name), f"{at}.{name}")
    for name in ("savepoints", "known_aborted", "finished_savepoints"):
        for i, v in enumerate(getattr(r, name)):
            yield from _not_negative(v, f"{at}.{name}[{i}]")
    for i, f in enumerate(r.files):
        yield from _not_negative(f.size, f"{at}.files[{i}].size")
    yield from _paths(r.files, f"{at}.files", "path")
    yield from _unique([f.path for f in r.files], f"{at}.files", "file")
    yield from _paths(r.directories, f"{at}.directories", "path")
    yield from _unique([d.path for d in r.directories], f"{at}.directories", "directory")
    yield from _paths(r.directory_owners, f"{at}.directory_owners", "path")
    yield from _unique([d.path for d in r.directory_owners], f"{at}.directory_owners", "owner of")
    yield from _paths(r.failed_uploads, f"{at}.failed_uploads")
    yield from _paths(r.deferred_deletes, f"{at}.deferred_deletes", "path")
    yield from _paths(r.failed_deletes, f"{at}.failed_deletes", "path")
    yield from _unique([d.path for d in r.failed_deletes], f"{at}.failed_deletes", "failed delete")
    for i, fd in enumerate(r.failed_deletes):
        yield from _paths(fd.deleted_by, f"{at}.failed_deletes[{i}].deleted_by", "path")
    for i, s in enumerate(r.segments):
        for name in ("offset", "length", "created_for", "last_used"):
            yield from _not_negative(getattr(s, name), f"{at}.segments[{i}].{name}")
    yield from _paths(r.segments, f"{at}.segments", "path")
    yield from _unique([s.logical_id for s in r.segments], f"{at}.segments", "segment")
    for i, p in enumerate(r.physical_files):
        for name in ("checkpoint", "size", "ref_count", "live_bytes"):
            yield from _not_negative(getattr(p, name), f"{at}.physical_files[{i}].{name}")
    yield from _paths(r.physical_files, f"{at}.physical_files", "path")
    pfiles = {p.path for p in r.physical_files}
    yield from _unique([p.path for p in r.physical_files], f"{at}.physical_files", "file")
    for i, s in enumerate(r.segments):
        if s.path not in pfiles:
            yield f"{at}.segments[{i}].path", f"{s.path!r} is no physical file of the TM"
    yield from _unique([p.key for p in r.pools], f"{at}.pools", "pool")
    for i, pool in enumerate(r.pools):
        if pool.path not in pfiles:
            yield f"{at}.pools[{i}].path", f"{pool.path!r} is no physical file of the TM"
    for name in ("outputs", "acked"):
        outs: tuple[Written, ...] = getattr(r, name)
        yield from _unique([(o.subtask, o.checkpoint) for o in outs], f"{at}.{name}", "output")
        for i, o in enumerate(outs):
            yield from _entries(o.entries, f"{at}.{name}[{i}].entries")
    yield from _unique([(b.subtask, b.name) for b in r.backend], f"{at}.backend", "state")
    for i, b in enumerate(r.backend):
        yield from _entries((b.entry,), f"{at}.backend[{i}].entry")
    yield from _unique([s.subtask for s in r.subtask_pools], f"{at}.subtask_pools", "subtask")
    if r.ended is not None:
        yield from _paths(r.ended.files, f"{at}.ended.files", "path")
        yield from _paths(r.ended.directories, f"{at}.ended.directories")
    w = r.working
    wat = f"{at}.working"
    yield from _paths(w.known, f"{wat}.known", "path")
    yield from _unique([k.path for k in w.known], f"{wat}.known", "file")
    known = {k.path for k in w.known}
    yield from _unique([u.subtask for u in w.uses], f"{wat}.uses", "database")
    yield from _unique([(p.subtask, p.checkpoint) for p in w.pins], f"{wat}.pins", "snapshot")
    for name in ("uses", "pins"):
        for i, u in enumerate(getattr(w, name)):
            for j, path in enumerate(u.files):
                if path not in known:
                    yield f"{wat}.{name}[{i}].files[{j}]", f"{path!r} is of no known size"
    yield from _paths(w.written, f"{wat}.written")
    yield from _paths(w.users, f"{wat}.users")
