"""What the audit reads from storage, as plain tuples: the files under a directory and the
references of a ``_metadata`` file. The Spark job runs these functions on its executors;
the single-process audit (the benchmark's baseline and the tests' oracle) runs the same
functions in one loop, so the two differ only in how the work is spread.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from typing import Any

from fastimpl.parties import Metadata, MetadataError, check_metadata_place, decode_metadata
from pipeline.location import Location
from pipeline.names import is_utf8, shown
from pipeline.result import MISSING
from pipeline.safe_read import Refused, kind_of, open_error, read_regular
from spec.config import Scope, StateKind
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    PlaceholderHandle,
    SegmentHandle,
    extent_of,
)
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

Problem = tuple[str, str]
"""A path that could not be listed or examined (shown escaped, ``pipeline.names``) and why."""

NOT_UTF8 = "name is not UTF-8: not a checkpoint file (the layout escapes names); skipped"

INT64_MAX = 2**63 - 1
CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")
SAVEPOINT_DIR = re.compile(r"^savepoint-(\d+)$")
WORKING = "taskowned/working/"
STREAM_HANDLES = ("segment", "file", "in_place")
"""References that name bytes of a file: a segment, a whole file, and a working file a
checkpoint refers to in place (R103, listed apart in the ``_metadata``)."""


# --------------------------------------------------------------------------- listing


def list_dir(loc: Location, rel_dir: str) -> tuple[list[FileRow], list[Problem]]:
    """Every file under ``rel_dir`` (recursively), and what could not be listed. Symbolic
    links are reported, never followed: a link to a directory outside the base must not
    make its files look ours. A name that is not UTF-8 is never one of ours (the layout
    escapes names): it is reported and skipped, as a directory that cannot be listed."""
    problems: list[Problem] = []
    if loc.local:
        return list(_walk_local(loc.full(rel_dir), rel_dir + "/", problems)), problems
    fs = loc.fs()
    try:
        found = fs.find(loc.full(rel_dir), detail=True)
    except FileNotFoundError:
        return [], problems
    except Exception as err:
        problems.append((shown(rel_dir), _cannot("listed", err)))
        return [], problems
    rows: list[FileRow] = []
    below_metadata: dict[str, float] = {}
    for p, info in found.items():
        if info.get("type") != "file":
            continue
        rel = loc.rel(p)
        parts = rel.split("/")
        if METADATA in parts[:-1]:
            # A key below a "_metadata" makes it a directory, as on a local disk: listed as
            # the _metadata, so it is read and reported unreadable, its keys never listed.
            d = "/".join(parts[: parts.index(METADATA) + 1])
            below_metadata[d] = max(below_metadata.get(d, 0.0), _mtime(info))
            continue
        rows.append((rel, int(info.get("size") or 0), _mtime(info), False))
    listed = {r[0] for r in rows}
    rows += [(d, 0, m, False) for d, m in sorted(below_metadata.items()) if d not in listed]
    return rows, problems


def _cannot(what: str, err: BaseException) -> str:
    why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return f"cannot be {what}: {type(err).__name__}: {why}"


def _walk_local(full: str, rel: str, problems: list[Problem]) -> Iterator[FileRow]:
    stack = [(rel, full)]
    while stack:
        rel, full = stack.pop()
        try:
            entries = list(os.scandir(full))
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted while we listed
        except OSError as err:  # unreadable, name too long, too deep, ...
            problems.append((shown(rel.rstrip("/")), _cannot("listed", err)))
            continue
        for e in entries:
            name = rel + e.name
            if not is_utf8(e.name):
                problems.append((shown(name), NOT_UTF8))
                continue
            try:
                if e.name == METADATA and not e.is_file(follow_symlinks=False):
                    # Listed as a file so it is read, and reported, as the unreadable
                    # _metadata it is (a directory, a FIFO, a link), never descended.
                    st = e.stat(follow_symlinks=False)
                    yield (name, 0, st.st_mtime, e.is_symlink())
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append((name + "/", e.path))
                    continue
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as err:
                problems.append((shown(name), _cannot("examined", err)))
                continue
            why = _not_restorable(e.path, st.st_mode)
            if why is not None:
                problems.append((shown(name), why))
                continue
            yield (name, st.st_size, st.st_mtime, e.is_symlink())


def _not_restorable(full: str, mode: int) -> str | None:
    """Why a listed entry is no file a restore could read, or ``None``. Such an entry is
    an unreadable row, never a file of the listing: referenced, it dangles (a restore
    cannot read it); unreferenced, it is never deleted. A link stays in the listing
    (``symlink``, never followed, never deleted) and dangles where referenced."""
    if stat.S_ISLNK(mode):
        return None
    if not stat.S_ISREG(mode):
        return f"not a regular file (a {kind_of(mode)})"
    err = open_error(full)
    if err is None or isinstance(err, FileNotFoundError):
        return None
    return _cannot("read", err)


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
            except OSError:  # gone, or a name the OS refuses: missing for the audit
                continue
            # Only a readable regular file holds what a restore needs; anything else is
            # missing for the audit, and why_missing names what it is.
            if stat.S_ISREG(st.st_mode) and open_error(loc.full(p)) is None:
                out.append((p, st.st_size, st.st_mtime, False))
        return out
    fs = loc.fs()
    for p in paths:
        try:
            info = fs.info(loc.full(p))
        except (FileNotFoundError, OSError):
            continue
        if info.get("type") == "file":
            out.append((p, int(info.get("size") or 0), _mtime(info), False))
    return out


def why_missing(loc: Location, path: str) -> str:
    """What lies at a referenced path the audit found no readable regular file at: the
    reason of its dangling row (a link, a directory, a FIFO, a file that cannot be read
    dangle as surely as a missing file: a restore cannot read them)."""
    if not loc.local:
        return MISSING  # an object store has no links, directories or special objects
    full = loc.full(path)
    try:
        mode = os.lstat(full).st_mode
    except OSError:
        return MISSING
    if not stat.S_ISREG(mode):
        return f"not a regular file (a {kind_of(mode)})"
    err = open_error(full)
    return MISSING if err is None else _cannot("read", err)


def top_level(
    loc: Location, problems: list[Problem] | None = None
) -> tuple[list[str], list[FileRow]]:
    """The directories under the job base that executors list (each ``chk-*``, each
    ``shared/*`` and ``taskowned/*``, any other directory whole), and the files found on
    the way (strays at the top levels). What cannot be listed goes to ``problems``."""
    units: list[str] = []
    files: list[FileRow] = []
    base = loc.job_dir
    sink: list[Problem] = [] if problems is None else problems
    for name, is_dir, row in _entries(loc, base, problems):
        if not is_dir and CHECKPOINT_DIR.match(name):
            # A chk-N that is a link may hide a _metadata: unreadable, never a stray.
            if not _report_linked(loc, row, sink):
                files.append(row)
        elif not is_dir:
            files.append(row)
        elif name in ("shared", "taskowned"):
            for _sub, sub_dir, sub_row in _entries(loc, f"{base}/{name}", problems):
                if sub_dir:
                    units.append(sub_row[0])
                else:
                    files.append(sub_row)
        else:
            units.append(row[0])
    return sorted(units), files


def base_entries(loc: Location, rel_dir: str | None = None) -> set[str]:
    """The names directly under the job base (or ``rel_dir``)."""
    return {name for name, _d, _r in _entries(loc, loc.job_dir if rel_dir is None else rel_dir)}


def entries(loc: Location, rel_dir: str) -> Iterator[tuple[str, bool, FileRow]]:
    """(name, is a directory, row) of each entry directly under ``rel_dir``; what cannot
    be listed is left out (for looking around, not for auditing)."""
    return _entries(loc, rel_dir)


def _entries(
    loc: Location, rel_dir: str, problems: list[Problem] | None = None
) -> Iterator[tuple[str, bool, FileRow]]:
    sink: list[Problem] = [] if problems is None else problems
    if loc.local:
        try:
            entries = list(os.scandir(loc.full(rel_dir)))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as err:
            sink.append((shown(rel_dir), _cannot("listed", err)))
            return
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if not is_utf8(e.name):
                sink.append((shown(rel), NOT_UTF8))
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    yield e.name, True, (rel, 0, 0.0, False)
                else:
                    st = e.stat(follow_symlinks=False)
                    yield e.name, False, (rel, st.st_size, st.st_mtime, e.is_symlink())
            except FileNotFoundError:
                continue
            except OSError as err:
                sink.append((shown(rel), _cannot("examined", err)))
        return
    fs = loc.fs()
    try:
        listing = fs.ls(loc.full(rel_dir), detail=True)
    except FileNotFoundError:
        return
    except Exception as err:
        sink.append((shown(rel_dir), _cannot("listed", err)))
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


def other_metadata(loc: Location, problems: list[Problem] | None = None) -> list[str]:
    """``_metadata`` files beside the job base that may reference it: the checkpoints of
    the other jobs in the same container (a job restored from this one) and the
    savepoints. Read, never audited for orphans. A sibling that cannot be listed goes to
    ``problems``: it may hold a checkpoint that references this base."""
    out: list[str] = []
    sink: list[Problem] = [] if problems is None else problems
    for name, is_dir, row in _entries(loc, "", problems):
        if name == loc.job_dir:
            continue
        if not is_dir:
            # A sibling job, an application folder or savepoints/ replaced by a link (or
            # a FIFO, a socket...): its metadata may reference this base and cannot be
            # read without following it, so it is unreadable, never skipped. A regular
            # file is no place for a checkpoint and is left alone.
            _report_linked(loc, row, sink)
            continue
        pattern = SAVEPOINT_DIR if name == SAVEPOINTS else CHECKPOINT_DIR
        for sub, sub_dir, sub_row in _entries(loc, name, problems):
            if not pattern.match(sub):
                continue
            if sub_dir:
                out.append(f"{name}/{sub}/{METADATA}")
            else:
                _report_linked(loc, sub_row, sink)
    return sorted(out)


_LINKED = ("a {kind} where a directory that may hold a _metadata belongs: not followed, "
           "so what it holds is unknown")


def _not_plain(loc: Location, row: FileRow) -> str | None:
    """What a listed entry that is not a directory is, when it is not a regular file
    either (a link, a FIFO, a socket, a device): ``None`` for a regular file. Object
    stores hold neither links nor special files: always ``None`` there."""
    if not loc.local:
        return None
    if row[3]:
        return "symbolic link"
    try:
        mode = os.lstat(loc.full(row[0])).st_mode
    except OSError:
        return None  # gone since it was listed: nothing there to read
    return None if stat.S_ISREG(mode) else kind_of(mode)


def _report_linked(loc: Location, row: FileRow, sink: list[Problem]) -> bool:
    """Report ``row`` as unreadable if it is not a plain file; says whether it was."""
    kind = _not_plain(loc, row)
    if kind is not None:
        sink.append((shown(row[0]), _LINKED.format(kind=kind)))
    return kind is not None


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
        {r[8] for r in refs if r[7] in STREAM_HANDLES and r[8] is not None
         and not is_under(r[8], loc.job_dir)}
    )
    if row is not None and row[5] != loc.job_dir:
        outside = []  # another job's own files are not audited
    return row, refs, err, stat_files(loc, outside) if outside else []


def _read(
    loc: Location, path: str
) -> tuple[CheckpointRow | None, list[RefRow], ErrorRow | None]:
    try:
        data = read_regular(loc, path)
    except FileNotFoundError:
        return None, [], None  # a checkpoint subsumed while we listed: not an error
    except Refused as err:
        return None, [], (path, "file", str(err))
    except Exception as err:
        return None, [], (path, "file", _cannot("read", err))
    try:
        # decode_metadata validates every path (relative, normalised, under an allowed base);
        # they are relative to the container already, as the audit keeps them.
        meta = decode_metadata(data, source=path)
        check_metadata_place(meta, path)
        _check_job(meta, path)
    except MetadataError as err:
        return None, [], (path, err.field, err.problem)
    except RecursionError:
        return None, [], (path, "file", "cannot be decoded: nested too deeply")
    except Exception as err:  # hostile bytes must give a row, never stop the audit
        return None, [], (path, "file", f"cannot be decoded: {type(err).__name__}: {err}")
    if meta.checkpoint > INT64_MAX:
        # The audit's columns are 64-bit (Arrow, Spark): both engines refuse it alike.
        return None, [], (path, "payload.checkpoint",
                          f"checkpoint id {meta.checkpoint} is beyond 2**63 - 1")
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
            offset = extent_of(h).offset
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
    for sub, w in meta.working:  # R103: a working file of a live database, in place
        refs.append((key, meta.job, meta.checkpoint, meta.savepoint, sub.dir_name(),
                     StateKind.KEYED_SHARED.value, w.path.rsplit("/", 1)[1], "in_place",
                     w.path, 0, w.length, None, Scope.SHARED.value))
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
    """A file in a database's working directory (FLIP-427, R1)."""
    return path.startswith(f"{job_dir}/{WORKING}")


def in_live_database(path: str, job_dir: str, live: frozenset[str] | None) -> bool:
    """A working file a live database still uses (R100): the database's, not the
    audit's. ``live``: the files the writer published as its databases' (``None``: it
    published none, or its state cannot be read; then every working file may be in use,
    and none is an orphan)."""
    return is_working(path, job_dir) and (live is None or path in live)
