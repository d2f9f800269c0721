"""A subtask's RocksDB to a checkpoint, incrementally, and back (Flink's incremental
RocksDB snapshot, seed ``002``).

The snapshot of checkpoint ``c`` by attempt ``a``: flush the memtable, take a RocksDB
checkpoint (hard links, same file system) into ``chk-<c>-<a>``, then for every SST in it
either reuse the upload a completed checkpoint holds (the restore assignment names it,
and the subtask's TM remembers uploading it) or upload it as SHARED state; MANIFEST,
OPTIONS and CURRENT change under the same name, so they are EXCLUSIVE state, written at
every checkpoint; the operator state (source progress, watermark) is EXCLUSIVE too. The
local checkpoint directory goes afterwards.

An SST is registered under a unique name, ``sst/<lineage>/<file>``: RocksDB numbers files
from the same start in every new DB (two subtasks, or a DB restored after a rescale, both
have a ``000009.sst``), so the bare file name is not an identity (FLINK-29913). A lineage
is one DB from its creation or restore on; its file numbers never repeat.

Which uploads may be reused comes from the restore assignment of every batch (the latest
completed checkpoint's entries), never from a cache kept across tasks: a cache survives a
retried batch and names what an aborted checkpoint wrote (SPARK-55820).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import rocksdict
from attrs import frozen

from pipeline.stream.checkpointing import StateSource, TaskManagerSide
from pipeline.stream.rocks import WindowCounts
from spec.config import StateKind
from spec.errors import CkptError
from spec.handles import StateEntry
from spec.ids import SubtaskId

SST = re.compile(r"[0-9]{6,}\.sst")
META = re.compile(r"(MANIFEST-[0-9]{6,}|OPTIONS-[0-9]{6,}|CURRENT)")
LINEAGE = re.compile(r"[0-9A-Za-z]{1,64}")
OPERATOR_STATE = "operator/progress"
GROUP_KEY = struct.Struct(">H")
"""A key's first bytes: its key group (``rocks.encode_key``)."""
MARKER = "ckpt-marker.json"
"""In the DB's directory: the checkpoint the DB is at and its lineage (RocksDB ignores it)."""


class RestoreError(CkptError, ValueError):
    """A restore assignment that cannot be a snapshot of this job's RocksDB (a name that
    is not an SST or a RocksDB metadata file, a duplicate, a missing CURRENT)."""


@frozen
class SnapshotStats:
    uploaded: int
    uploaded_bytes: int
    reused: int
    exclusive: int
    exclusive_bytes: int
    local_files: tuple[str, ...]
    in_place: int = 0
    """``--state-backend working``: files the snapshot refers to in place."""
    in_place_bytes: int = 0
    """``--state-backend working``: bytes of the files the snapshot refers to in place."""
    db_written_bytes: int = 0
    """``--state-backend working``: bytes of the SSTs the database wrote to the checkpoint
    storage since the previous snapshot (its flush and compactions, R101)."""


def sst_name(lineage: str, file: str) -> str:
    return f"sst/{lineage}/{file}"


def meta_name(lineage: str, file: str) -> str:
    """MANIFEST, OPTIONS and CURRENT carry the lineage of the DB they describe: a task
    reuses its local DB only if it is the one the completed checkpoint was taken of."""
    return f"meta/{lineage}/{file}"


def lineage_of(entries: Sequence[StateEntry]) -> str | None:
    """The lineage of the DB a subtask's checkpoint was taken of (``None``: none, or the
    metadata disagrees, which no snapshot of ours writes)."""
    found = {
        e.name.split("/")[1]
        for e in entries
        if e.kind is StateKind.KEYED_FULL and e.name.count("/") == 2
    }
    return found.pop() if len(found) == 1 else None


def file_of(entry: StateEntry) -> str:
    """The local file name an entry restores to; ``RestoreError`` for anything that is
    not one of ours (a hostile name must not become a path)."""
    if entry.kind is StateKind.KEYED_SHARED:
        parts = entry.name.split("/")
        if (
            len(parts) == 3
            and parts[0] == "sst"
            and LINEAGE.fullmatch(parts[1])
            and SST.fullmatch(parts[2])
        ):
            return parts[2]
    elif entry.kind is StateKind.KEYED_FULL:
        parts = entry.name.split("/")
        if (
            len(parts) == 3
            and parts[0] == "meta"
            and LINEAGE.fullmatch(parts[1])
            and META.fullmatch(parts[2])
        ):
            return parts[2]
    raise RestoreError(f"{entry.name!r} ({entry.kind.value}) is not a RocksDB file of this job")


def reusable(entries: Sequence[StateEntry]) -> dict[str, StateEntry]:
    """The shared uploads of a completed checkpoint by their local file name."""
    out: dict[str, StateEntry] = {}
    for e in entries:
        if e.kind is StateKind.KEYED_SHARED:
            f = file_of(e)
            if f in out:
                raise RestoreError(f"two entries restore to {f}: {out[f].name!r}, {e.name!r}")
            out[f] = e
    return out


def take_snapshot(
    db: WindowCounts,
    party: TaskManagerSide,
    checkpoint: int,
    subtask: SubtaskId,
    *,
    lineage: str,
    base: Mapping[str, StateEntry],
    scratch: Path,
    operator_state: bytes,
    hook: Callable[[str], None] | None = None,
) -> SnapshotStats:
    """Snapshot ``db`` for ``checkpoint`` through ``party`` (see the module docstring).

    ``base`` maps local SST names to the uploads of the completed checkpoint the DB was at
    when this task opened it; ``scratch`` is a directory on the DB's file system (hard
    links do not cross file systems) that the local checkpoint is made in and removed from.
    ``hook`` is called at ``"mid-upload"`` (after the first file) and ``"uploaded"`` (after
    the last): where injected failures strike.
    """
    at = hook or (lambda _point: None)
    db.db.flush(True)
    local = scratch / f"chk-{checkpoint}-{uuid.uuid4().hex[:8]}"
    rocksdict.Checkpoint(db.db).create_checkpoint(str(local))
    uploaded = uploaded_bytes = reused = exclusive = exclusive_bytes = 0
    try:
        files = tuple(sorted(os.listdir(local)))
        for f in files:
            path = local / f
            if SST.fullmatch(f):
                old = base.get(f)
                if old is not None and party.reuse(checkpoint, subtask, old) is not None:
                    reused += 1
                else:  # new, or the TM may not reuse the old upload (R20): uploaded
                    data = path.read_bytes()
                    party.write(
                        checkpoint, subtask, StateKind.KEYED_SHARED, sst_name(lineage, f), data
                    )
                    uploaded += 1
                    uploaded_bytes += len(data)
            elif META.fullmatch(f):
                data = path.read_bytes()
                party.write(checkpoint, subtask, StateKind.KEYED_FULL, meta_name(lineage, f), data)
                exclusive += 1
                exclusive_bytes += len(data)
            # The rest (the WAL, empty with it off; rocksdict's config) a restore does not need.
            if uploaded + reused + exclusive == 1:
                at("mid-upload")
        party.write(checkpoint, subtask, StateKind.OPERATOR_LIST, OPERATOR_STATE, operator_state)
        exclusive += 1
        exclusive_bytes += len(operator_state)
        at("uploaded")
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return SnapshotStats(uploaded, uploaded_bytes, reused, exclusive, exclusive_bytes, files)


def restore(party: StateSource, entries: Sequence[StateEntry], target: Path) -> bytes | None:
    """Download the RocksDB files of ``entries`` into the new directory ``target`` (which
    must not exist) and return the operator state (``None`` if there is none). The caller
    opens the DB there; a missing SST fails that open loudly."""
    files: dict[str, StateEntry] = {}
    operator: bytes | None = None
    for e in entries:
        if e.kind is StateKind.OPERATOR_LIST and e.name == OPERATOR_STATE:
            operator = party.read(e)
            continue
        f = file_of(e)
        if f in files:
            raise RestoreError(f"two entries restore to {f}: {files[f].name!r}, {e.name!r}")
        files[f] = e
    if files and "CURRENT" not in files:
        raise RestoreError(f"no CURRENT among the {len(files)} RocksDB files to restore")
    part = target.with_name(target.name + f".part-{uuid.uuid4().hex[:8]}")
    part.mkdir(parents=True)
    try:
        for f, e in sorted(files.items()):
            (part / f).write_bytes(party.read(e))
        os.rename(part, target)  # whole or not at all: a half download is never opened
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    return operator


def read_marker(db_dir: Path) -> tuple[int, str] | None:
    """The checkpoint a local DB is at and its lineage; ``None`` when unknown."""
    try:
        m = json.loads((db_dir / MARKER).read_text())
        return int(m["checkpoint"]), str(m["lineage"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(db_dir: Path, checkpoint: int, lineage: str) -> None:
    tmp = db_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"checkpoint": checkpoint, "lineage": lineage}))
    os.replace(tmp, db_dir / MARKER)


def restore_key_groups(
    party: StateSource,
    entries: Sequence[StateEntry],
    target: Path,
    groups: tuple[int, int],
    opt: rocksdict.Options,
) -> int:
    """Build a new DB at ``target`` (which must not exist) holding the keys of key groups
    ``groups`` (inclusive) of every old DB ``entries`` name: a rescale's restore. Each old
    subtask's files (one lineage each) are downloaded on their own, opened, and the
    range is copied out (keys start with their key group, ``rocks.encode_key``); the new
    DB is a new lineage, so its SST numbers may repeat the old ones' under other names.
    Returns the number of keys copied."""
    by_lineage: dict[str, list[StateEntry]] = {}
    for e in entries:
        if e.kind in (StateKind.KEYED_SHARED, StateKind.KEYED_FULL):
            file_of(e)  # refuses what is not one of ours before anything is written
            by_lineage.setdefault(e.name.split("/")[1], []).append(e)
    lo, hi = GROUP_KEY.pack(groups[0]), GROUP_KEY.pack(groups[1] + 1)
    part = target.with_name(target.name + f".part-{uuid.uuid4().hex[:8]}")
    copied = 0
    try:
        new = rocksdict.Rdict(str(part), opt)
        try:
            for lineage, old_entries in sorted(by_lineage.items()):
                old_dir = target.with_name(f"{target.name}.old-{lineage}-{uuid.uuid4().hex[:8]}")
                restore(party, old_entries, old_dir)
                try:
                    old = rocksdict.Rdict(str(old_dir), opt)
                    try:
                        batch = rocksdict.WriteBatch(raw_mode=True)
                        it = old.iter()
                        it.seek(lo)
                        while it.valid() and it.key() < hi:
                            batch.put(it.key(), it.value())
                            copied += 1
                            it.next()
                        new.write(batch)
                    finally:
                        old.close()
                finally:
                    shutil.rmtree(old_dir, ignore_errors=True)
            new.flush(True)
        finally:
            new.close()
        os.rename(part, target)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    return copied
