"""What the audit reads from storage, as plain tuples: the files under a directory and the
references of a ``_metadata`` file. The Spark job runs these functions on its executors;
the single-process audit (the benchmark's baseline and the tests' oracle) runs the same
functions in one loop, so the two differ only in how the work is spread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from fastimpl.metadata import Metadata, MetadataError, check_named, decode
from pipeline.location import Location
from spec.handles import DirectoryHandle, FileHandle, PlaceholderHandle, SegmentHandle
from spec.layout import METADATA, SAVEPOINTS, is_under, job_base

FileRow = tuple[str, int, float, bool]
"""path (container-relative), size in bytes, modification time (epoch seconds), symlink."""

RefRow = tuple[
    str, str, int, bool, str, str, str, str, str | None, int | None, int | None, str | None,
    str | None,
]
"""checkpoint key, job, checkpoint, savepoint, subtask, state kind, state name, handle
type, path, offset, length, logical id, scope. One per handle of a ``_metadata`` file."""

CheckpointRow = tuple[str, str, int, bool, str, str, int, list[str]]
"""checkpoint key, job, checkpoint, savepoint, metadata path, base (the job base or the
savepoint directory), entries, shared bases (other bases it references)."""

ErrorRow = tuple[str, str, str]
"""metadata path, field, problem."""

INT64_MAX = 2**63 - 1
CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")
SAVEPOINT_DIR = re.compile(r"^savepoint-(\d+)$")
WORKING = "taskowned/working/"


# --------------------------------------------------------------------------- listing


def list_dir(loc: Location, rel_dir: str) -> list[FileRow]:
    """Every file under ``rel_dir`` (recursively). Symbolic links are reported, never
    followed: a link to a directory outside the base must not make its files look ours."""
    if loc.local:
        return list(_walk_local(loc.full(rel_dir), rel_dir + "/"))
    fs = loc.fs()
    try:
        found = fs.find(loc.full(rel_dir), detail=True)
    except FileNotFoundError:
        return []
    return [
        (loc.rel(p), int(info.get("size") or 0), _mtime(info), False)
        for p, info in found.items()
        if info.get("type") == "file"
    ]


def _walk_local(full: str, rel: str) -> Iterator[FileRow]:
    stack = [(rel, full)]
    while stack:
        rel, full = stack.pop()
        try:
            entries = list(os.scandir(full))
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted while we listed
        for e in entries:
            name = rel + e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append((name + "/", e.path))
                    continue
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield (name, st.st_size, st.st_mtime, e.is_symlink())


def _mtime(info: dict[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "created"):
        v = info.get(key)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return 0.0


def stat_files(loc: Location, paths: list[str]) -> list[FileRow]:
    """The files among ``paths`` that exist (references outside the audited base)."""
    out: list[FileRow] = []
    if loc.local:
        for p in paths:
            try:
                st = os.lstat(loc.full(p))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not os.path.isdir(loc.full(p)):
                out.append((p, st.st_size, st.st_mtime, os.path.islink(loc.full(p))))
        return out
    fs = loc.fs()
    for p in paths:
        try:
            info = fs.info(loc.full(p))
        except FileNotFoundError:
            continue
        if info.get("type") == "file":
            out.append((p, int(info.get("size") or 0), _mtime(info), False))
    return out


def top_level(loc: Location) -> tuple[list[str], list[FileRow]]:
    """The directories under the job base that executors list (each ``chk-*``, each
    ``shared/*`` and ``taskowned/*``, any other directory whole), and the files found on
    the way (strays at the top levels)."""
    units: list[str] = []
    files: list[FileRow] = []
    base = loc.job_dir
    for name, is_dir, row in _entries(loc, base):
        if not is_dir:
            files.append(row)
        elif name in ("shared", "taskowned"):
            for _sub, sub_dir, sub_row in _entries(loc, f"{base}/{name}"):
                if sub_dir:
                    units.append(sub_row[0])
                else:
                    files.append(sub_row)
        else:
            units.append(row[0])
    return sorted(units), files


def base_entries(loc: Location) -> set[str]:
    """The names directly under the job base."""
    return {name for name, _d, _r in _entries(loc, loc.job_dir)}


def _entries(loc: Location, rel_dir: str) -> Iterator[tuple[str, bool, FileRow]]:
    if loc.local:
        try:
            entries = list(os.scandir(loc.full(rel_dir)))
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            rel = f"{rel_dir}/{e.name}"
            if e.is_dir(follow_symlinks=False):
                yield e.name, True, (rel, 0, 0.0, False)
            else:
                st = e.stat(follow_symlinks=False)
                yield e.name, False, (rel, st.st_size, st.st_mtime, e.is_symlink())
        return
    fs = loc.fs()
    try:
        listing = fs.ls(loc.full(rel_dir), detail=True)
    except FileNotFoundError:
        return
    for info in listing:
        rel = loc.rel(info["name"])
        name = rel.rsplit("/", 1)[-1]
        if rel == rel_dir:
            continue
        if info.get("type") == "directory":
            yield name, True, (rel, 0, 0.0, False)
        else:
            yield name, False, (rel, int(info.get("size") or 0), _mtime(info), False)


def metadata_paths(files: list[FileRow] | Iterator[FileRow], job_dir: str) -> list[str]:
    """The ``<job>/chk-N/_metadata`` files among a listing."""
    out = []
    for path, *_ in files:
        parts = path.split("/")
        if (
            len(parts) == 3
            and parts[0] == job_dir
            and parts[2] == METADATA
            and CHECKPOINT_DIR.match(parts[1])
        ):
            out.append(path)
    return out


def other_metadata(loc: Location) -> list[str]:
    """``_metadata`` files beside the job base that may reference it: the checkpoints of
    the other jobs in the same container (a job restored from this one) and the
    savepoints. Read, never audited for orphans."""
    out: list[str] = []
    for name, is_dir, _row in _entries(loc, ""):
        if not is_dir or name == loc.job_dir:
            continue
        if name == SAVEPOINTS:
            for sp, sp_dir, _ in _entries(loc, SAVEPOINTS):
                if sp_dir and SAVEPOINT_DIR.match(sp):
                    out.append(f"{SAVEPOINTS}/{sp}/{METADATA}")
            continue
        for chk, chk_dir, _ in _entries(loc, name):
            if chk_dir and CHECKPOINT_DIR.match(chk):
                out.append(f"{name}/{chk}/{METADATA}")
    return sorted(out)


# --------------------------------------------------------------------------- metadata


Read = tuple[CheckpointRow | None, list[RefRow], ErrorRow | None, list[FileRow]]
"""What reading one ``_metadata`` gives: its checkpoint, its references, the error that
made it unreadable, and the files outside the audited base it references (stat-ed)."""


def read_metadata(loc: Location, path: str) -> Read:
    """Decode one ``_metadata`` into its references; a bad file gives an error row, never
    an exception, so one corrupt file does not stop the audit. Referenced files outside
    the job base are stat-ed here (the base's own files are in the listing)."""
    row, refs, err = _read(loc, path)
    outside = sorted(
        {r[8] for r in refs if r[7] in ("segment", "file") and r[8] is not None
         and not is_under(r[8], loc.job_dir)}
    )
    if row is not None and row[5] != loc.job_dir:
        outside = []  # another job's own files are not audited
    return row, refs, err, stat_files(loc, outside) if outside else []


def _read(
    loc: Location, path: str
) -> tuple[CheckpointRow | None, list[RefRow], ErrorRow | None]:
    fs = loc.fs()
    try:
        data = bytes(fs.cat_file(loc.full(path)))
    except FileNotFoundError:
        return None, [], None  # a checkpoint subsumed while we listed: not an error
    except Exception as err:
        return None, [], (path, "file", f"cannot be read: {type(err).__name__}: {err}")
    try:
        # decode validates every path (relative, normalised, under an allowed base);
        # they are relative to the container already, as the audit keeps them.
        meta = decode(data, source=path)
        check_named(meta, path)
        _check_job(meta, path)
    except MetadataError as err:
        return None, [], (path, err.field, err.problem)
    return _rows(meta, path)


def _check_job(meta: Metadata, path: str) -> None:
    parts = path.split("/")
    if parts[0] != SAVEPOINTS and job_base(meta.job) != parts[0]:
        raise MetadataError(
            path,
            "payload.job",
            f"foreign job id {meta.job!r}: the file lies in job directory {parts[0]!r}",
        )


def _rows(
    meta: Metadata, path: str
) -> tuple[CheckpointRow | None, list[RefRow], ErrorRow | None]:
    key = path.rsplit("/", 1)[0]
    base = "/".join(key.split("/")[:2]) if meta.savepoint else key.split("/")[0]
    refs: list[RefRow] = []
    for e in meta.entries:
        h = e.handle
        head = (key, meta.job, meta.checkpoint, meta.savepoint, e.subtask.dir_name(),
                e.kind.value, e.name)
        if isinstance(h, SegmentHandle | FileHandle):
            offset = h.offset if isinstance(h, SegmentHandle) else 0
            if offset + h.length > INT64_MAX:
                # The audit's columns are 64-bit (Arrow, Spark): such a range would stop the
                # Spark job (overflow) instead of being reported; no file is that large.
                return None, [], (path, "payload.entries",
                                  f"handle of {e.name!r} ({h.path}) ends at byte "
                                  f"{offset + h.length}, beyond 2**63 - 1")
            kind = "segment" if isinstance(h, SegmentHandle) else "file"
            refs.append((*head, kind, h.path, offset, h.length, h.logical_id, h.scope.value))
        elif isinstance(h, DirectoryHandle):
            refs.append((*head, "directory", h.path, None, None, None, None))
        elif isinstance(h, PlaceholderHandle):
            refs.append((*head, "placeholder", None, None, None, h.logical_id, None))
    for d in meta.directories:
        refs.append((key, meta.job, meta.checkpoint, meta.savepoint, "", "", "",
                     "directory", d, None, None, None, None))
    row: CheckpointRow = (key, meta.job, meta.checkpoint, meta.savepoint, path, base,
                          len(meta.entries), list(meta.shared_bases))
    return row, refs, None


# --------------------------------------------------------------------------- places


def owner_dir(path: str) -> str:
    """The directory that owns a file, by the layout (R1): ``<job>/shared/<subtask>``,
    ``<job>/taskowned/<tm>``, ``<job>/taskowned/working/<subtask>``, ``<job>/chk-N``,
    ``savepoints/savepoint-N``; a stray at the top of a base is its own owner."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] in ("shared", "taskowned"):
        if parts[1] == "taskowned" and parts[2] == "working" and len(parts) >= 5:
            return "/".join(parts[:4])
        return "/".join(parts[:3]) if len(parts) > 3 else "/".join(parts[:2])
    if len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) == 2 else ""


def is_working(path: str, job_dir: str) -> bool:
    """A live database's working file (FLIP-427): the database owns it, not the audit."""
    return path.startswith(f"{job_dir}/{WORKING}")
