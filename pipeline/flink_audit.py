"""A Flink checkpoint directory as the audit's rows (issue 33).

What the user configured as ``execution.checkpointing.dir`` holds one ``<job-id>/`` folder
per job, each with ``chk-N/`` (a completed checkpoint has ``chk-N/_metadata``), ``shared/``
and ``taskowned/`` (``/work/shared/FORMATS.md``). Either that directory or one job's
folder may be audited. Every ``_metadata`` present is a retained checkpoint (Flink deletes
a subsumed one's directory); each is read with the pure-Python reader
(``pipeline.flink_metadata``, no JVM), and every handle that names bytes of a file becomes
a reference row: a whole file (``FileStateHandle``, ``RelativeFileStateHandle`` resolved
against the ``_metadata``'s directory, as Flink's loader does) or a segment of a merged
file (FLIP-306). Inline bytes and empty segments name no file. The directory handles of
file merging mean "managed by the JobManager", not "every file in it referenced": they are
listed as references of kind ``directory``, so a leaked file inside a managed directory is
still found.

Flink publishes no writer state. A live job is protected by age (the grace period) and by
its checkpoint in flight: a ``chk-N`` without ``_metadata`` above the job's latest
completed checkpoint and active within the grace period holds back its own files and
every file of the job written since it started (``result.IN_FLIGHT``). An older one was
abandoned (a killed job): its files are what Flink leaks.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Sequence

from pipeline import scan
from pipeline.flink_metadata import FlinkHandle, FlinkMetadataError, read_flink_metadata
from pipeline.foreign import (
    Foreign,
    ForeignError,
    ForeignRead,
    PathMap,
    on_store,
    relative,
    split_uri,
)
from pipeline.location import Location
from pipeline.names import shown
from pipeline.result import IN_FLIGHT
from pipeline.safe_read import Refused, open_error, read_regular

MAGIC = 0x4960672D
METADATA = "_metadata"
LAYOUT = frozenset({"shared", "taskowned"})
_WHOLE = {"FileStateHandle": "file", "RelativeFileStateHandle": "file",
          "SegmentFileStateHandle": "segment"}
_BYTES = ("file", "segment")
_NO_FILE = {"ByteStreamStateHandle": "inline", "EmptySegmentFileStateHandle": "empty",
            "MasterState": "master"}
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_JOB_TAIL = re.compile(r"^(.*?)/([0-9a-fA-F]{32})/(chk-\d+|shared|taskowned)(/.*)?$")

NO_WRITER_STATE = (
    "Flink publishes no writer state: a live job's files are protected only by age (the "
    "grace period) and by its checkpoint in flight (a chk-N without _metadata above the "
    "job's latest completed one, active within the grace period, holds back its files and "
    "every file of the job written since it started)"
)


ONE_JOB = (
    "one job's folder was audited: a job restored from its checkpoints (NO_CLAIM) and "
    "checkpointing elsewhere may reference its files; audit the configured "
    "execution.checkpointing.dir, which holds every job's folder, before deleting"
)


def is_job_folder(loc: Location, rel: str) -> bool:
    names = {n for n, is_dir, _r in scan.entries(loc, rel) if is_dir}
    return bool(names & LAYOUT) or any(scan.CHECKPOINT_DIR.match(n) for n in names)


def job_folders(loc: Location) -> list[str]:
    """The job folders audited: the directory itself when it is one job's folder, else
    each folder under it that holds ``chk-*``, ``shared/`` or ``taskowned/``."""
    top = loc.job_dir
    if is_job_folder(loc, top):
        return [top]
    return sorted(row[0] for _n, is_dir, row in scan.entries(loc, top)
                  if is_dir and is_job_folder(loc, row[0]))


def owner(path: str, jobs: Sequence[str]) -> str:
    """The owner directory of a file in Flink's layout: ``<job>/shared/<merged dir>``,
    ``<job>/taskowned/<tm dir>``, ``<job>/chk-N``, ``<job>/shared`` (RocksDB's flat shared
    files without merging)."""
    for job in jobs:
        if path.startswith(job + "/"):
            rest = path[len(job) + 1:].split("/")
            if rest[0] in LAYOUT and len(rest) > 2:
                return f"{job}/{rest[0]}/{rest[1]}"
            return f"{job}/{rest[0]}" if len(rest) > 1 else job
    return path.rsplit("/", 1)[0] if "/" in path else ""


def read_flink(
    loc: Location,
    *,
    path_map: PathMap | None = None,
    savepoints: Sequence[str] = (),
    grace: float,
    now: float,
) -> ForeignRead:
    path_map = path_map or PathMap()
    jobs = job_folders(loc)
    files, problems = scan.list_dir(loc, loc.job_dir)
    by_dir: dict[str, list[scan.FileRow]] = {}
    for f in files:
        by_dir.setdefault(f[0].rsplit("/", 1)[0], []).append(f)
    present = {f[0] for f in files}

    ckpts: list[scan.CheckpointRow] = []
    refs: list[scan.RefRow] = []
    corrupt: list[scan.ErrorRow] = []
    metadata: set[str] = set()
    held: dict[str, str] = {}
    notes = [NO_WRITER_STATE]
    if jobs == [loc.job_dir]:
        notes.append(ONE_JOB)
    for job in jobs:
        job_id = job.rsplit("/", 1)[-1]
        chk = sorted(
            (int(m.group(1)), row[0])
            for name, is_dir, row in scan.entries(loc, job)
            if is_dir and (m := scan.CHECKPOINT_DIR.match(name))
        )
        completed = -1
        for cid, rel in chk:
            meta = f"{rel}/{METADATA}"
            if meta not in present:
                continue
            metadata.add(meta)
            completed = max(completed, cid)
            try:
                row, rows = _read_one(loc, meta, rel, job_id, path_map, loc.job_dir)
            except _Unreadable as bad:
                corrupt.append(bad.row)
                continue
            ckpts.append(row)
            refs.extend(rows)
        for cid, rel in chk:
            if cid <= completed or f"{rel}/{METADATA}" in present:
                continue
            start, active = _activity(loc, rel, by_dir)
            if active <= now - grace:
                continue  # abandoned: its files are leaks, not a checkpoint to come
            notes.append(f"{shown(rel)} is in flight (active within the grace period): "
                         "its files and the job's files written since it started are held")
            for p, _s, mtime, _l in files:
                if p.startswith(job + "/") and (p.startswith(rel + "/") or mtime >= start):
                    held.setdefault(p, IN_FLIGHT)

    for sp in savepoints:
        try:
            row, rows = _read_savepoint(loc, sp, path_map)
        except _Unreadable as bad:
            corrupt.append(bad.row)
            continue
        ckpts.append(row)
        refs.extend(rows)

    _refuse_moved(loc, refs, jobs)
    outside = _stat_outside(loc, refs, present)
    for r in refs:  # a referenced file on another store cannot be checked: said so
        if r[8] is not None and r[7] in _BYTES and is_uri(r[8]) and not on_store(loc, r[8]):
            problems.append((shown(r[8]), "referenced on another store: not examined"))
    foreign = Foreign(
        "flink", held=held, metadata=frozenset(metadata),
        owner=lambda p: owner(p, jobs), notes=tuple(notes),
    )
    return ForeignRead(foreign, files, ckpts, refs, corrupt, outside, sorted(set(problems)))


class _Unreadable(Exception):
    def __init__(self, row: scan.ErrorRow) -> None:
        super().__init__(row[2])
        self.row = row


def _read_one(
    loc: Location, meta: str, chk_dir: str, job_id: str, path_map: PathMap, base: str,
    *, savepoint: bool = False,
) -> tuple[scan.CheckpointRow, list[scan.RefRow]]:
    try:
        data = read_regular(loc, meta)
    except FileNotFoundError:
        raise _Unreadable((meta, "file", "gone while the audit read it")) from None
    except Refused as err:
        raise _Unreadable((meta, "file", str(err))) from None
    except OSError as err:
        raise _Unreadable((meta, "file", f"cannot be read: {err.strerror or err}")) from None
    if len(data) < 4 or struct.unpack(">I", data[:4])[0] != MAGIC:
        raise _Unreadable(
            (meta, "magic", f"not a Flink _metadata (does not start with 0x{MAGIC:08X})"))
    try:
        parsed = read_flink_metadata(data, source=meta)
    except FlinkMetadataError as err:
        raise _Unreadable((meta, f"offset {err.offset}", err.what)) from None
    sp = savepoint or bool(parsed.savepoint)
    rows = [_ref(loc, chk_dir, job_id, parsed.checkpoint_id, sp, h, chk_dir, path_map)
            for h in parsed.handles]
    row: scan.CheckpointRow = (chk_dir, job_id, parsed.checkpoint_id, sp, meta, base,
                               len(parsed.handles), [])
    return row, rows


def _read_savepoint(
    loc: Location, uri: str, path_map: PathMap
) -> tuple[scan.CheckpointRow, list[scan.RefRow]]:
    """A savepoint given with ``--savepoints``: its directory (holding ``_metadata``) on the
    audited store. Its references count; its own files are not audited."""
    rel = relative(loc, path_map.apply(uri.rstrip("/")))
    if rel is None:
        raise ForeignError(f"--savepoints {shown(uri)}: not on the audited store under "
                           f"{shown(loc.container)}: it cannot be read with this audit")
    meta = rel if rel.endswith("/" + METADATA) else f"{rel}/{METADATA}"
    sp_dir = meta.rsplit("/", 1)[0]
    return _read_one(loc, meta, sp_dir, "", path_map, sp_dir, savepoint=True)


def _ref(
    loc: Location, key: str, job: str, cid: int, savepoint: bool, h: FlinkHandle,
    chk_dir: str, path_map: PathMap,
) -> scan.RefRow:
    head = (key, job, cid, savepoint, f"{h.operator or 'master'}/{h.subtask}", h.slot, h.role)
    kind = _WHOLE.get(h.type)
    if h.role.startswith("dir:") and h.path is not None:
        return (*head, "directory", _place(loc, h.path, chk_dir, path_map, h.type),
                None, None, None, h.scope)
    if kind is None or h.path is None:
        handle = _NO_FILE.get(h.type, h.type)
        return (*head, handle, None, None, h.length, h.logical_id, h.scope)
    path = _place(loc, h.path, chk_dir, path_map, h.type)
    return (*head, kind, path, h.offset, h.length, h.logical_id, h.scope)


def _place(loc: Location, raw: str, chk_dir: str, path_map: PathMap, type_: str) -> str:
    """The audit's path of a handle's file: container-relative when it lies under the
    audited store's container, else its (mapped) URI as written."""
    if type_ == "RelativeFileStateHandle" and "://" not in raw and not raw.startswith("/") \
            and ":" not in raw.split("/", 1)[0]:
        parts = [p for p in f"{chk_dir}/{raw}".split("/") if p not in ("", ".")]
        if ".." in parts:
            return raw  # never under the base: reported as elsewhere, never trusted
        return "/".join(parts)
    mapped = path_map.apply(raw)
    rel = relative(loc, mapped)
    return mapped if rel is None else rel


def _activity(
    loc: Location, chk_dir: str, by_dir: dict[str, list[scan.FileRow]]
) -> tuple[float, float]:
    """(started, last active) of a checkpoint directory without ``_metadata``: the
    earliest and latest modification among it and its files."""
    times = [m for d, rows in by_dir.items() if d == chk_dir or d.startswith(chk_dir + "/")
             for _p, _s, m, _l in rows]
    if loc.local:
        try:
            times.append(os.lstat(loc.full(chk_dir)).st_mtime)
        except OSError:
            pass
    if not times:
        return 0.0, 0.0
    return min(times), max(times)


def _refuse_moved(loc: Location, refs: list[scan.RefRow], jobs: Sequence[str]) -> None:
    """A checkpoint copied or moved from where Flink wrote it names the old place in
    every absolute path: each of its files would look unreferenced. Refuse, naming the
    ``--path-map`` that reads it."""
    ids = {j.rsplit("/", 1)[-1]: j for j in jobs}
    for r in refs:
        p = r[8]
        if p is None or r[7] not in ("file", "segment", "directory") or "/" not in p:
            continue
        if not is_uri(p):
            continue
        m = _JOB_TAIL.match(p)
        if m is None or m.group(2) not in ids:
            continue
        job_rel = ids[m.group(2)]
        here = loc.uri(job_rel.rsplit("/", 1)[0]) if "/" in job_rel else loc.uri(
            "").rsplit("/", 1)[0]
        raise ForeignError(
            f"{shown(r[0])}: the checkpoints name their files under {shown(m.group(1))}, "
            f"but job {m.group(2)} lies in {shown(here)} (copied or moved): pass "
            f"--path-map {shown(m.group(1))}={shown(here)}"
        )


def is_uri(path: str) -> bool:
    """A path kept as the engine wrote it (elsewhere than the audited container), not a
    container-relative one."""
    return path.startswith("/") or _URI.match(path) is not None


def _stat_outside(
    loc: Location, refs: list[scan.RefRow], present: set[str]
) -> list[scan.FileRow]:
    """Referenced files the listing did not cover, on the audited store: stat-ed, so a
    savepoint's or a sibling directory's file is checked, never called missing wrongly.
    A file on another store is not examined (``read_flink`` names it)."""
    want = sorted({r[8] for r in refs if r[7] in _BYTES and r[8] is not None
                   and r[8] not in present})
    rows = scan.stat_files(loc, [p for p in want if not is_uri(p)])
    for uri in (p for p in want if is_uri(p) and on_store(loc, p)):
        full = split_uri(uri)[1]
        if loc.local:
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and open_error(full) is None:
                rows.append((uri, st.st_size, st.st_mtime, False))
            continue
        try:
            info = loc.fs().info(full)
        except OSError:
            continue
        if info.get("type") == "file":
            rows.append((uri, int(info.get("size") or 0), 0.0, False))
    return rows
