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
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import islice, starmap
from pathlib import Path
from typing import Any

import rocksdict
from attrs import frozen
from rocksdict import RdictIter

from pipeline.stream.checkpointing import StateSource, TaskManagerSide
from pipeline.stream.rocks import LAYOUT, WindowCounts, group_ranges, layout_of
from spec.config import StateKind
from spec.errors import CkptError
from spec.handles import StateEntry
from spec.ids import SubtaskId

SST = re.compile(r"[0-9]{6,}\.sst")
META = re.compile(r"(MANIFEST-[0-9]{6,}|OPTIONS-[0-9]{6,}|CURRENT)")
LINEAGE = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}")
OPERATOR_STATE = "operator/progress"
MARKER = "ckpt-marker.json"
"""In the DB's directory: the checkpoint the DB is at and its lineage (RocksDB ignores it)."""


class RestoreError(CkptError, ValueError):
    """A restore assignment that cannot be a snapshot of this job's RocksDB (a name that
    is not an SST or a RocksDB metadata file, a duplicate, a missing CURRENT, a DB whose
    keys are laid out otherwise)."""


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
    not one of ours (a hostile name must not become a path), and for a file of a DB whose
    keys are not laid out as this code reads them (``rocks.LAYOUT``, named in the
    lineage): read with this layout, its counts would land in the wrong windows."""
    parts = entry.name.split("/")
    if len(parts) == 3 and LINEAGE.fullmatch(parts[1]):
        if entry.kind is StateKind.KEYED_SHARED and parts[0] == "sst" and SST.fullmatch(parts[2]):
            _check_layout(entry, parts[1])
            return parts[2]
        if entry.kind is StateKind.KEYED_FULL and parts[0] == "meta" and META.fullmatch(parts[2]):
            _check_layout(entry, parts[1])
            return parts[2]
    raise RestoreError(f"{entry.name!r} ({entry.kind.value}) is not a RocksDB file of this job")


def _check_layout(entry: StateEntry, lineage: str) -> None:
    found = layout_of(lineage)
    if found != LAYOUT:
        was = f"key layout {found!r}" if found else "keys key group first (no layout named)"
        raise RestoreError(
            f"{entry.name!r}: its RocksDB was written with {was}; this job reads key layout "
            f"{LAYOUT!r} (window start, key group, word) and refuses it rather than misread "
            "its windows"
        )


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


SST_BYTES = 64 << 20
"""Where an SST of keys copied in a rescale's restore is cut (RocksDB's default
``target_file_size_base``): the writer keeps a file's index and bloom filter in memory
until it finishes the file, so this bounds them; the staging disk holds one old DB's
range at most."""
COPY_CHUNK = 4096
"""Keys read from an old DB and written to an SST per step: the memory of one step, and
one look at the file's size and one Python-level iteration per this many keys."""

KeyRanges = Sequence[tuple[bytes, bytes]]
"""Half-open key ranges ``[lo, hi)``, sorted and disjoint (``group_ranges``)."""


def restore_key_groups(
    party: StateSource,
    entries: Sequence[StateEntry],
    target: Path,
    groups: tuple[int, int],
    opt: rocksdict.Options,
) -> int:
    """Build a new DB at ``target`` (which must not exist) holding the keys of key groups
    ``groups`` (inclusive) of every old DB ``entries`` name: a rescale's restore, done as
    Flink's incremental restore after a rescale (``RocksDBIncrementalRestoreOperation``).

    The keys of a key-group range are one key range per window of a DB
    (``rocks.group_ranges``). The old DB whose key groups (the entries' ``key_groups``)
    overlap ``groups`` the most is the base: its files are downloaded into the new DB's
    directory, opened there, and what it holds outside those ranges is deleted by range
    (``clip``); none of its keys is read. Each other old DB (one lineage each) is
    downloaded on its own and its keys in the ranges are written in key order into SST
    files of about ``SST_BYTES`` at most (``copy_ranges``), which the new DB ingests: old
    subtasks hold disjoint key groups, so no copied key is one the base keeps (within a
    window the ranges interleave, and RocksDB places an ingested file at the level its
    range allows). The new
    DB is a new lineage, so its SST numbers may repeat the old ones' under other names.
    It appears at ``target`` whole or not at all.

    Returns the number of keys copied from the old DBs other than the base. The base's
    kept keys are not counted: counting them would read them all, which the base avoids.
    """
    by_lineage: dict[str, list[StateEntry]] = {}
    for e in entries:
        if e.kind in (StateKind.KEYED_SHARED, StateKind.KEYED_FULL):
            file_of(e)  # refuses what is not one of ours before anything is written
            by_lineage.setdefault(e.name.split("/")[1], []).append(e)
    lineages = sorted(by_lineage)
    # max keeps the first of equals: the smallest lineage among equal overlaps.
    base = max(lineages, key=lambda n: _overlap(by_lineage[n], groups), default=None)
    part = target.with_name(target.name + f".part-{uuid.uuid4().hex[:8]}")
    copied = 0
    try:
        if base is not None:
            restore(party, by_lineage[base], part)
        new = rocksdict.Rdict(str(part), opt)
        try:
            clip(new, group_ranges(new, groups))
            for lineage in lineages:
                if lineage != base:
                    copied += _copy_in(party, by_lineage[lineage], new, target, groups, opt)
            new.flush(True)
        finally:
            new.close()
        os.rename(part, target)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    return copied


def _overlap(entries: Sequence[StateEntry], groups: tuple[int, int]) -> int:
    """How many of ``groups`` the key groups of one old DB's entries cover (0 unknown)."""
    ranges = [e.key_groups for e in entries if e.key_groups is not None]
    if not ranges:
        return 0
    first, last = min(r[0] for r in ranges), max(r[1] for r in ranges)
    return max(0, min(last, groups[1]) - max(first, groups[0]) + 1)


def _copy_in(
    party: StateSource,
    entries: Sequence[StateEntry],
    new: rocksdict.Rdict,
    target: Path,
    groups: tuple[int, int],
    opt: rocksdict.Options,
) -> int:
    """Download one old DB beside ``target``, copy its keys of ``groups`` into SSTs,
    ingest them into ``new``; the number of keys. Both directories go in every case."""
    tag = f"{entries[0].name.split('/')[1]}-{uuid.uuid4().hex[:8]}"
    old_dir = target.with_name(f"{target.name}.old-{tag}")
    staging = target.with_name(f"{target.name}.sst-{tag}")
    try:
        restore(party, entries, old_dir)
        # Read-only: no WAL, no MANIFEST written, no compaction started while it is read.
        old = rocksdict.Rdict(str(old_dir), opt, access_type=rocksdict.AccessType.read_only())
        try:
            staging.mkdir()
            ranges = group_ranges(old, groups)
            n, files = copy_ranges(old, ranges, opt, staging, file_bytes=SST_BYTES)
        finally:
            old.close()
        shutil.rmtree(old_dir)
        if files:
            ingest = rocksdict.IngestExternalFileOptions()
            ingest.set_move_files(True)  # hard links: staging is beside the new DB
            new.ingest_external_file(files, ingest)
        return n
    finally:
        shutil.rmtree(old_dir, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)


def clip(db: rocksdict.Rdict, keep: KeyRanges) -> None:
    """Delete by range what ``db`` holds outside the ranges ``keep``: one tombstone per
    gap between them (and before the first, after the last) that holds a key, from its
    first key on; a gap without a key gets none. Decided by the keys themselves, so the
    result holds nothing else whatever the entries said of the DB's key groups."""
    gaps: list[tuple[bytes, bytes | None]] = []
    after = b""
    for lo, hi in keep:
        gaps.append((after, lo))
        after = hi
    gaps.append((after, None))  # to the end
    it: RdictIter = db.iter()  # the DB as it was before the first delete: gaps are disjoint
    for lo, end in gaps:
        it.seek(lo)
        it.status()  # a read error raises here; an invalid iterator is the end of the keys
        if not it.valid():
            return
        first = it.key()
        if end is None:
            it.seek_to_last()
            it.status()
            end = it.key() + b"\x00"  # the least key after the last one
        if first < end:
            db.delete_range(first, end)


def copy_ranges(
    src: rocksdict.Rdict,
    ranges: KeyRanges,
    opt: rocksdict.Options,
    into: Path,
    *,
    file_bytes: int = SST_BYTES,
) -> tuple[int, list[str]]:
    """Write the keys of ``src`` in ``ranges`` into new SST files under ``into`` (a file
    is cut once it reached ``file_bytes``): the number of keys and the files.

    No key passes one Python call: rocksdict's item iterator is native, a chunk of
    ``COPY_CHUNK`` items is taken with ``islice`` and written with ``starmap`` over the
    writer's ``__setitem__``, drained by a zero-length ``deque``, all in C. That iterator
    ends on a read error as on the end of the range without saying which (rocksdict
    does not check the status), so a fresh iterator looks again after the last key
    copied of each range: a read error is raised, keys left unread are refused."""
    n = 0
    files: list[str] = []
    writer: rocksdict.SstFileWriter | None = None
    for lo, hi in ranges:
        ro = rocksdict.ReadOptions()
        ro.set_iterate_upper_bound(hi)
        items = src.items(from_key=lo, read_opt=ro)
        last: bytes | None = None
        while chunk := list[tuple[Any, Any]](islice(items, COPY_CHUNK)):
            if writer is None:
                files.append(str(into / f"{len(files):06d}.sst"))
                writer = rocksdict.SstFileWriter(opt)
                writer.open(files[-1])
            deque(starmap(writer.__setitem__, chunk), maxlen=0)
            n += len(chunk)
            last = chunk[-1][0]
            if writer.file_size() >= file_bytes:
                writer.finish()
                writer = None
        check: RdictIter = src.iter(ro)
        check.seek(lo if last is None else last + b"\x00")
        check.status()
        if check.valid():
            raise RestoreError(f"reading the keys to copy stopped early, after {last!r}")
    if writer is not None:
        writer.finish()
    return n, files
