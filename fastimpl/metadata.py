"""The ``_metadata`` file of a completed checkpoint or savepoint (R51, R55; issue 3).

Written atomically by ``Storage.write_metadata``; read back, and validated, by
``Storage.read_metadata``. The file is canonical JSON (sorted keys, no spaces, UTF-8)::

    {"format": "ckpt-ownership/metadata", "version": 2,
     "sha256": "<hex digest of the canonical JSON of payload>",
     "payload": {"job": "j", "checkpoint": 3, "savepoint": false,
                 "directories": ["j/taskowned/tm1"],
                 "entries": [{"subtask": ["v", 0, 2], "kind": "keyed_shared", "name": "s",
                              "entries": 1, "key_groups": [0, 63], "entry_range": null,
                              "handle": {"type": "segment", "path": "j/shared/v-0-2/f",
                                         "offset": 0, "length": 10, "id": "u1",
                                         "scope": "shared"}}],
                 "shared_bases": ["j0"], "max_parallelism": 128}}

Version 2 added ``max_parallelism`` (R77: a checkpoint is restored only with the max
parallelism it was taken with); a version-1 file, which lacks it, is still read.
Version 3 adds ``working``: the working files the checkpoint refers to in place (R103),
each ``{"subtask": [...], "path": ..., "length": n, "key_groups": [lo, hi]}``, listed
beside the entries. It is written only by a checkpoint that has some, so a reader of
version 2 refuses such a file instead of restoring without them (and a checkpoint
without working files keeps writing version 2).
Version 4 adds the handle type ``inline`` (R107): ``{"type": "inline", "length": n,
"id": ..., "data": "<base64 of the n bytes>"}``, private state carried in the file
instead of a file of its own; written only by a checkpoint that has some (with
``working``, possibly empty), so a reader of an older version refuses it.

Every path is relative to the base directory that contains the job (the storage root, as
in ``spec.layout``), never absolute and never with ``.``/``..`` components, and lies under
the job's base (``job_base(job)``), for a savepoint under its savepoint directory, or
under a base listed in ``shared_bases`` (``encode`` lists there every other job base or
savepoint directory the checkpoint references, e.g. a restored predecessor's). So
a job directory moved to another root still resolves (:func:`resolve`). Anything wrong on
read raises :class:`MetadataError`, naming the file, the field and the problem; reading
never deletes anything.

The byte size differs from the reference model's (which counts entries); the lockstep
test compares metadata files by existence only, and every data file by exact size.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from attrs import evolve, frozen

from spec.config import UPPER_BOUND_MAX_PARALLELISM, Scope, StateKind
from spec.errors import CkptError, UsageError
from spec.handles import (
    DirectoryHandle,
    Extent,
    FileHandle,
    Handle,
    InlineHandle,
    InPlaceFile,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
    extent_of,
    stream_of,
)
from spec.ids import SubtaskId, escape_name
from spec.layout import (
    METADATA,
    SAVEPOINTS,
    WORKING,
    is_under,
    job_base,
    savepoint_dir,
    working_operator,
)

MAGIC = "ckpt-ownership/metadata"
VERSION = 2
"""Version 2 records the max parallelism the checkpoint was taken with (R77)."""
WORKING_VERSION = 3
"""Version 3 also lists the working files referred to in place (R103)."""
INLINE_VERSION = 4
"""Version 4 also carries inline handles (R107): state whose bytes are in the file."""
SUPPORTED_VERSIONS = frozenset({1, VERSION, WORKING_VERSION, INLINE_VERSION})
"""Version 1 (no max parallelism) is still read: R77 then checks key-group ranges."""
MAX_PARALLELISM_LIMIT = UPPER_BOUND_MAX_PARALLELISM
"""Flink's upper bound on the max parallelism (``KeyGroupRangeAssignment``, R78)."""


class MetadataError(CkptError, ValueError):
    """A ``_metadata`` file is corrupt, truncated, foreign or names a path out of bounds."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        super().__init__(f"{source}: {field}: {problem}")
        self.source = source
        self.field = field
        self.problem = problem


@frozen
class Metadata:
    """A decoded ``_metadata`` file. Paths are as stored: relative to the job's container."""

    job: str
    checkpoint: int
    savepoint: bool
    entries: tuple[StateEntry, ...]
    directories: tuple[str, ...]
    shared_bases: tuple[str, ...] = ()
    """Other bases this checkpoint references (a restored job's predecessor, R95)."""
    version: int = VERSION
    max_parallelism: int | None = None
    """R77: the max parallelism the checkpoint was taken with (``None``: version 1)."""
    working: tuple[tuple[SubtaskId, InPlaceFile], ...] = ()
    """R103: the working files it refers to in place, with the subtask that referred."""


# --------------------------------------------------------------------------- paths


MAX_PATH = 4096
"""Longest path (in UTF-8 bytes) a file may name: Linux's PATH_MAX. A longer one could
only fail later, as a raw ``OSError`` of the file system, instead of here."""
MAX_COMPONENT = 255
"""Longest path component (in UTF-8 bytes): NAME_MAX of every common file system."""
MAX_INT = 2**63 - 1
"""Largest integer a field may hold: a 64-bit file offset; larger ones are nonsense."""
MANAGED = ("shared", "taskowned")
"""The folders of a job base that hold managed directories (R40): a directory a file
names lies in one of them, never above (a base, or ``<base>/shared`` itself)."""


def allowed_bases(
    job: str, checkpoint: int, savepoint: bool, shared_bases: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The directories (relative to the job's container) a metadata path may lie under:
    the job base, the savepoint dir of a savepoint, and the declared shared bases."""
    bases = [job_base(job)]
    if savepoint:
        bases.append(savepoint_dir(checkpoint))
    return (*bases, *shared_bases)


def base_of(path: str) -> str:
    """The base a root-relative path lies under: a job base or a savepoint directory."""
    parts = path.split("/")
    if parts[0] == SAVEPOINTS and len(parts) > 1:
        return "/".join(parts[:2])
    return parts[0]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""The characters ``path_parts`` refuses in a name: the C0 controls and DEL."""


def path_parts(path: object, source: str, field: str) -> tuple[str, ...]:
    """The components of a relative, normalised path, or ``MetadataError``.

    The one place that decides whether a path a file names (a handle's path, a
    directory, a shared base, a base a job moved to) is acceptable: a non-empty string,
    relative (no leading ``/`` or ``\\``, no drive, no protocol), ``/``-separated
    components none of which is empty, ``.`` or ``..`` (leading, inner or trailing),
    with no backslash, NUL, control character or unpaired surrogate (a name that is
    not UTF-8), within ``MAX_COMPONENT`` and ``MAX_PATH``. Nothing is normalised
    silently: ``a//b`` or ``a/./b`` is refused, not read as ``a/b``, so a checked path
    compares equal to exactly the paths the store itself builds.
    """
    if not isinstance(path, str) or not path:
        raise MetadataError(source, field, f"path must be a non-empty string, got {path!r}")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise MetadataError(source, field, f"path {path!r} is not valid UTF-8") from None
    if path.startswith("/") or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        raise MetadataError(source, field, f"absolute path {path!r} is not allowed")
    if "://" in path or "::" in path:
        raise MetadataError(source, field, f"path {path!r} names a protocol (absolute)")
    if size > MAX_PATH:
        raise MetadataError(source, field, f"path of {size} bytes is longer than {MAX_PATH}")
    parts = tuple(path.split("/"))
    if ".." in parts:
        raise MetadataError(source, field, f"path {path!r} contains a '..' component")
    if "" in parts or "." in parts or "\\" in path:
        raise MetadataError(source, field, f"path {path!r} is not normalised")
    if _CONTROL.search(path):
        raise MetadataError(source, field, f"path {path!r} holds a control character")
    if any(len(p.encode("utf-8")) > MAX_COMPONENT for p in parts):
        raise MetadataError(source, field, f"a component of {path!r} is over {MAX_COMPONENT} bytes")
    return parts


def check_path(path: object, bases: tuple[str, ...] | None, source: str, field: str) -> str:
    """Return ``path`` if it is a relative, normalised path under one of ``bases``."""
    path_parts(path, source, field)
    assert isinstance(path, str)
    if bases is not None and not any(is_under(path, b) for b in bases):
        raise MetadataError(
            source,
            field,
            f"path {path!r} is outside the job base {' or '.join(repr(b) for b in bases)}",
        )
    return path


def check_job(job: object, source: str, field: str) -> str:
    """A job id whose base is a job base: any string escapes to one safe component
    (R3), but it must not escape to ``savepoints`` (the user's) or exceed a component."""
    if not isinstance(job, str):
        raise MetadataError(source, field, f"expected a string, got {job!r}")
    try:
        base = job_base(job)
    except UnicodeEncodeError:
        raise MetadataError(source, field, f"job id {job!r} is not valid UTF-8") from None
    path_parts(base, source, field)
    if base == SAVEPOINTS:
        raise MetadataError(source, field, f"job id {job!r} names the savepoints directory")
    return job


def check_directory(path: str, bases: tuple[str, ...], source: str, field: str) -> str:
    """A managed directory (R40): ``<job base>/shared/<name>...`` or
    ``<job base>/taskowned/<name>...`` of an allowed base that is not a savepoint's."""
    check_path(path, bases, source, field)
    base = base_of(path)
    rest = path[len(base) + 1 :].split("/") if path != base else []
    if base.startswith(SAVEPOINTS + "/") or len(rest) < 2 or rest[0] not in MANAGED:
        raise MetadataError(
            source,
            field,
            f"{path!r} is not a managed directory (<base>/shared/... or taskowned/...)",
        )
    return path


def _handle_paths(h: Handle) -> list[str]:
    return [] if isinstance(h, PlaceholderHandle | InlineHandle) else [h.path]


def check_ids(meta: Metadata, source: str) -> None:
    """R54: a logical id names one extent; two different extents under one id would
    make the registry's entries conflict (FLINK-29913)."""
    seen: dict[str, tuple[int, Extent]] = {}
    for i, e in enumerate(meta.entries):
        h = stream_of(e.handle)
        if h is None:
            continue
        extent = extent_of(h)
        prev = seen.setdefault(h.logical_id, (i, extent))
        if prev[1] != extent:
            raise MetadataError(
                source,
                f"entries[{i}].handle.id",
                f"logical id {h.logical_id!r} names {extent.path!r} here and "
                f"{prev[1].path!r} in entries[{prev[0]}] (duplicate id)",
            )


def validate_paths(meta: Metadata, source: str = "<metadata>") -> None:
    check_job(meta.job, source, "job")
    for i, b in enumerate(meta.shared_bases):
        check_path(b, None, source, f"shared_bases[{i}]")
        if base_of(b) != b:
            raise MetadataError(source, f"shared_bases[{i}]", f"{b!r} is not a base directory")
        if is_under(b, SAVEPOINTS):
            # A savepoint is the user's and self-contained (R55); a restore from one never
            # claims it (R73), so no checkpoint or other savepoint refers to its files.
            raise MetadataError(source, f"shared_bases[{i}]", f"{b!r} is a savepoint's directory")
    bases = allowed_bases(meta.job, meta.checkpoint, meta.savepoint, meta.shared_bases)
    checked: set[str] = set()  # a merged file is named by every segment in it: once
    for i, e in enumerate(meta.entries):
        for p in _handle_paths(e.handle):
            if not (isinstance(p, str) and p in checked):
                check_path(p, bases, source, f"entries[{i}].handle.path")
                checked.add(p)
    for i, d in enumerate(meta.directories):
        check_directory(d, bases, source, f"directories[{i}]")
    for i, (subtask, w) in enumerate(meta.working):
        check_working_path(w.path, bases, source, f"working[{i}].path")
        if working_operator(w.path) != escape_name(subtask.vertex):
            # R105: a restore opens it for the subtasks of the operator that referred to
            # it, so a file of another operator's database would feed that one's data
            # into this one and keep it alive (I7)
            raise MetadataError(
                source,
                f"working[{i}].path",
                f"{w.path!r} is not in a working directory of operator {subtask.vertex!r},"
                f" whose subtask {subtask} refers to it",
            )
    check_ids(meta, source)


def check_working_path(path: str, bases: tuple[str, ...], source: str, field: str) -> str:
    """A working file (R1, R100): under ``<job base>/taskowned/working/<subtask>/db/``
    (at any depth: a store may keep folders there) of an allowed base that is not a
    savepoint's (a savepoint refers to nothing in place, R103)."""
    check_path(path, bases, source, field)
    base = base_of(path)
    rest = path[len(base) + 1 :].split("/")
    if base.startswith(SAVEPOINTS + "/") or len(rest) < 5 or rest[:2] != ["taskowned", WORKING]:
        raise MetadataError(
            source,
            field,
            f"{path!r} is not a working file (<base>/taskowned/{WORKING}/<subtask>/db/<name>)",
        )
    if rest[3] != "db":
        raise MetadataError(source, field, f"{path!r} is not in a database directory")
    return path


def resolve(meta: Metadata, base: str = "", *, source: str = "<metadata>") -> Metadata:
    """Turn the stored paths into paths relative to the storage root.

    ``base`` is where the directory that contains the job now lives, relative to the
    storage root (``""``: the root itself). Refuses (``MetadataError``) any path that is
    absolute, has ``..`` components or lies outside the job base (or savepoint dir).
    """
    validate_paths(meta, source)
    if base:
        # the same check as every path a file names (``path_parts``), for the same reasons
        try:
            path_parts(base.rstrip("/"), source, "base")
        except MetadataError as err:
            raise MetadataError(
                source, "base", f"base {base!r} must be relative, without '..': {err.problem}"
            ) from None
        prefix = base.rstrip("/") + "/"
    else:
        prefix = ""

    def fix(h: Handle) -> Handle:
        if isinstance(h, PlaceholderHandle | InlineHandle):
            return h
        return evolve(h, path=prefix + h.path)

    return evolve(
        meta,
        entries=tuple(evolve(e, handle=fix(e.handle)) for e in meta.entries),
        directories=tuple(prefix + d for d in meta.directories),
        working=tuple((s, evolve(w, path=prefix + w.path)) for s, w in meta.working),
    )


NAMED = re.compile(rf"(?:^|/)(?:chk|({SAVEPOINTS})/savepoint)-(\d+)/{METADATA}$")


def check_named(meta: Metadata, path: str) -> None:
    """A ``chk-N/_metadata`` must describe checkpoint N, a ``savepoint-N/_metadata``
    savepoint N: a file copied or renamed to another checkpoint's place is refused."""
    m = NAMED.search(path)
    if m is None:
        return
    savepoint, number = m.group(1) is not None, int(m.group(2))
    what = "savepoint" if savepoint else "checkpoint"
    if meta.checkpoint != number:
        raise MetadataError(
            path, "payload.checkpoint", f"names checkpoint {meta.checkpoint}, not {what} {number}"
        )
    if meta.savepoint != savepoint:
        raise MetadataError(
            path, "payload.savepoint", f"is {str(meta.savepoint).lower()} in a {what}'s file"
        )


# --------------------------------------------------------------------------- encode


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _handle_doc(h: Handle) -> dict[str, object]:
    if isinstance(h, SegmentHandle):
        return {
            "type": "segment",
            "path": h.path,
            "offset": h.offset,
            "length": h.length,
            "id": h.logical_id,
            "scope": h.scope.value,
        }
    if isinstance(h, FileHandle):
        return {
            "type": "file",
            "path": h.path,
            "length": h.length,
            "id": h.logical_id,
            "scope": h.scope.value,
        }
    if isinstance(h, DirectoryHandle):
        return {"type": "directory", "path": h.path}
    if isinstance(h, InlineHandle):  # R107: the bytes themselves, in base64
        return {"type": "inline", "length": h.length, "id": h.logical_id, "data": h.data}
    return {"type": "placeholder", "id": h.logical_id}


def _pair(v: tuple[int, int] | None) -> list[int] | None:
    return None if v is None else [v[0], v[1]]


def encode(
    checkpoint: int,
    job: str,
    savepoint: bool,
    entries: tuple[StateEntry, ...],
    directories: tuple[str, ...],
    *,
    max_parallelism: int | None = None,
    working: tuple[tuple[SubtaskId, InPlaceFile], ...] = (),
) -> bytes:
    """The bytes of a completed checkpoint's ``_metadata``.

    ``max_parallelism`` (R77) makes a version-2 file that records it; without it the file
    is version 1, as written before the record existed (tests build those).

    Paths are relative to the job's container (the storage root); one that is absolute,
    has ``..`` or lies outside the job base (or savepoint dir) raises ``MetadataError``.
    """
    paths = [p for e in entries for p in _handle_paths(e.handle)] + list(directories)
    paths += [w.path for _, w in working]
    checked: set[str] = set()  # a merged file is named by every segment in it: once
    for i, p in enumerate(paths):
        if not (isinstance(p, str) and p in checked):
            check_path(p, None, "<encode>", f"paths[{i}]")
            checked.add(p)
    own = allowed_bases(job, checkpoint, savepoint)
    shared = tuple(sorted({base_of(p) for p in checked if not any(is_under(p, b) for b in own)}))
    meta = Metadata(
        job, checkpoint, savepoint, tuple(entries), tuple(directories), shared, working=working
    )
    validate_paths(meta, "<encode>")
    payload: dict[str, Any] = {
        "job": job,
        "checkpoint": checkpoint,
        "savepoint": savepoint,
        "directories": list(directories),
        "shared_bases": list(shared),
        "entries": [
            {
                "subtask": [e.subtask.vertex, e.subtask.index, e.subtask.parallelism],
                "kind": e.kind.value,
                "name": e.name,
                "handle": _handle_doc(e.handle),
                "entries": e.entries,
                "key_groups": _pair(e.key_groups),
                "entry_range": _pair(e.entry_range),
            }
            for e in entries
        ],
    }
    if max_parallelism is not None:
        payload["max_parallelism"] = max_parallelism
    version = 1 if max_parallelism is None else VERSION
    inline = any(isinstance(e.handle, InlineHandle) for e in entries)
    if working or inline:
        if max_parallelism is None:
            raise UsageError(
                "a checkpoint with working files or inline state records its max parallelism"
            )
        payload["working"] = [
            {
                "subtask": [s.vertex, s.index, s.parallelism],
                "path": w.path,
                "length": w.length,
                "key_groups": [w.key_groups[0], w.key_groups[1]],
            }
            for s, w in working
        ]
        version = INLINE_VERSION if inline else WORKING_VERSION
    body = _canonical(payload)
    # The canonical document, keys in sorted order, with the payload encoded only once.
    return b"".join(
        (
            b'{"format":',
            _canonical(MAGIC),
            b',"payload":',
            body,
            b',"sha256":"',
            hashlib.sha256(body).hexdigest().encode("ascii"),
            b'","version":',
            _canonical(version),
            b"}\n",
        )
    )


metadata_bytes = encode
"""The name the coordinator (``fastimpl.coordinator``) calls."""


# --------------------------------------------------------------------------- decode


class _Reader:
    def __init__(self, source: str) -> None:
        self.version = 0
        """The file's version: which handle types it may hold."""
        self.source = source

    def fail(self, field: str, problem: str) -> MetadataError:
        return MetadataError(self.source, field, problem)

    def get(self, doc: dict[str, Any], key: str, where: str) -> Any:
        if key not in doc:
            raise self.fail(f"{where}{key}", "missing field")
        return doc[key]

    def obj(self, v: object, field: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(field, f"expected an object, got {type(v).__name__}")
        return v

    def array(self, v: object, field: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(field, f"expected a list, got {type(v).__name__}")
        return v

    def integer(self, v: object, field: str, minimum: int | None = 0) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(field, f"expected an integer, got {v!r}")
        if minimum is not None and v < minimum:
            raise self.fail(field, f"expected an integer >= {minimum}, got {v}")
        if abs(v) > MAX_INT:
            raise self.fail(field, f"integer of {v.bit_length()} bits is out of range")
        return v

    def string(self, v: object, field: str) -> str:
        if not isinstance(v, str):
            raise self.fail(field, f"expected a string, got {v!r}")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail(field, f"{v!r} is not valid UTF-8 (an unpaired surrogate)") from None
        return v

    def boolean(self, v: object, field: str) -> bool:
        if not isinstance(v, bool):
            raise self.fail(field, f"expected a boolean, got {v!r}")
        return v

    def pair(self, v: object, field: str) -> tuple[int, int] | None:
        if v is None:
            return None
        items = self.array(v, field)
        if len(items) != 2:
            raise self.fail(field, f"expected a pair of integers, got {v!r}")
        return (self.integer(items[0], field, None), self.integer(items[1], field, None))

    def scope(self, v: object, field: str) -> Scope:
        try:
            return Scope(v)
        except ValueError:
            raise self.fail(field, f"unknown scope {v!r}") from None

    def handle(self, d: dict[str, Any], field: str) -> Handle:
        w = field + "."
        kind = self.string(self.get(d, "type", w), w + "type")
        if kind == "segment":
            return SegmentHandle(
                self.string(self.get(d, "path", w), w + "path"),
                self.integer(self.get(d, "offset", w), w + "offset"),
                self.integer(self.get(d, "length", w), w + "length"),
                self.string(self.get(d, "id", w), w + "id"),
                self.scope(self.get(d, "scope", w), w + "scope"),
            )
        if kind == "file":
            return FileHandle(
                self.string(self.get(d, "path", w), w + "path"),
                self.integer(self.get(d, "length", w), w + "length"),
                self.string(self.get(d, "id", w), w + "id"),
                self.scope(self.get(d, "scope", w), w + "scope"),
            )
        if kind == "inline" and self.version >= INLINE_VERSION:
            length = self.integer(self.get(d, "length", w), w + "length", minimum=1)
            logical_id = self.string(self.get(d, "id", w), w + "id")
            data = self.string(self.get(d, "data", w), w + "data")
            try:
                return InlineHandle(length, logical_id, data)
            except UsageError as err:
                raise self.fail(w + "data", str(err)) from None
        if kind == "inline":
            raise self.fail(
                w + "type", f"an inline handle needs version {INLINE_VERSION}, not {self.version}"
            )
        if kind in ("directory", "placeholder"):
            # What a subtask acknowledges, never what a completed checkpoint holds: the
            # coordinator resolves placeholders (R22) and lists directories apart before
            # it writes the file. Accepted, one would restore as state nobody can read.
            raise self.fail(
                w + "type",
                f"a {kind} handle is no state of a completed checkpoint"
                " (a 'segment' or 'file' is expected)",
            )
        raise self.fail(w + "type", f"unknown handle type {kind!r}")

    def subtask(self, d: dict[str, Any], field: str) -> SubtaskId:
        w = field + "."
        sub = self.array(self.get(d, "subtask", w), w + "subtask")
        if len(sub) != 3:
            raise self.fail(w + "subtask", f"expected [vertex, index, parallelism], got {sub!r}")
        try:
            subtask = SubtaskId(
                self.string(sub[0], w + "subtask"),
                self.integer(sub[1], w + "subtask"),
                self.integer(sub[2], w + "subtask", 1),
            )
        except ValueError as exc:
            if isinstance(exc, MetadataError):
                raise
            raise self.fail(w + "subtask", str(exc)) from None
        return subtask

    def in_place(self, d: dict[str, Any], field: str) -> tuple[SubtaskId, InPlaceFile]:
        w = field + "."
        subtask = self.subtask(d, field)
        unknown = sorted(set(d) - {"subtask", "path", "length", "key_groups"})
        if unknown:
            raise self.fail(field, f"unknown field(s) {', '.join(unknown)}")
        path = self.string(self.get(d, "path", w), w + "path")
        length = self.integer(self.get(d, "length", w), w + "length", 1)
        kg = self.pair(self.get(d, "key_groups", w), w + "key_groups")
        if kg is None or not 0 <= kg[0] <= kg[1]:
            got = None if kg is None else list(kg)
            raise self.fail(w + "key_groups", f"expected [first, last] key groups, got {got}")
        return subtask, InPlaceFile(path, length, kg)

    def entry(self, d: dict[str, Any], field: str) -> StateEntry:
        w = field + "."
        subtask = self.subtask(d, field)
        kind_v = self.get(d, "kind", w)
        try:
            kind = StateKind(kind_v)
        except ValueError:
            raise self.fail(w + "kind", f"unknown state kind {kind_v!r}") from None
        name = self.string(self.get(d, "name", w), w + "name")
        handle = self.handle(self.obj(self.get(d, "handle", w), w + "handle"), w + "handle")
        entries = self.integer(self.get(d, "entries", w), w + "entries")
        key_groups = self.pair(self.get(d, "key_groups", w), w + "key_groups")
        entry_range = self.pair(self.get(d, "entry_range", w), w + "entry_range")
        try:
            return StateEntry(subtask, kind, name, handle, entries, key_groups, entry_range)
        except UsageError as err:  # inline SHARED state (R107)
            raise self.fail(w + "handle", str(err)) from None


MAX_BYTES = 256 << 20
"""Largest ``_metadata`` read: far above any real one (a million handles), small enough
that a hostile file cannot exhaust memory before it is refused."""


def decode(data: bytes, *, expected_job: str | None = None, source: str = "<metadata>") -> Metadata:
    """Parse and validate a ``_metadata`` file; ``source`` names it in error messages.

    Raises ``MetadataError`` on truncated or invalid JSON, a bad magic, an unsupported
    version, a checksum mismatch, a missing or ill-typed field, a job id other than
    ``expected_job`` (a foreign file), a path that ``path_parts`` refuses or that lies
    outside the job base (or the savepoint dir), a directory that is not a managed one,
    a logical id naming two extents, an entry whose handle is a placeholder or a
    directory (never in a completed checkpoint), nesting too deep to parse and a file over
    ``MAX_BYTES``: never another exception, whatever the bytes.
    """
    if len(data) > MAX_BYTES:
        raise MetadataError(source, "file", f"{len(data)} bytes, more than {MAX_BYTES}")
    try:
        return _decode(data, expected_job, source)
    except RecursionError:
        raise MetadataError(source, "file", "nested too deeply (not a metadata file)") from None


def _decode(data: bytes, expected_job: str | None, source: str) -> Metadata:
    r = _Reader(source)
    if not data:
        raise r.fail("file", "empty (truncated) metadata")
    try:
        doc_v = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise r.fail("file", f"not UTF-8 (corrupt): {exc}") from None
    except json.JSONDecodeError as exc:
        raise r.fail("file", f"truncated or invalid JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise r.fail("file", f"invalid JSON: {exc}") from None
    doc = r.obj(doc_v, "file")
    magic = r.get(doc, "format", "")
    if magic != MAGIC:
        raise r.fail("format", f"bad magic {magic!r}, expected {MAGIC!r} (not a metadata file)")
    version = r.get(doc, "version", "")
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or version not in SUPPORTED_VERSIONS
    ):
        raise r.fail(
            "version",
            f"unsupported version {version!r}, supported: {sorted(SUPPORTED_VERSIONS)}",
        )
    r.version = version
    digest = r.string(r.get(doc, "sha256", ""), "sha256")
    payload = r.obj(r.get(doc, "payload", ""), "payload")
    try:
        actual = hashlib.sha256(_canonical(payload)).hexdigest()
    except (UnicodeEncodeError, ValueError) as exc:  # a lone surrogate, a huge number
        raise r.fail("payload", f"cannot be encoded canonically: {exc}") from None
    if actual != digest:
        raise r.fail("sha256", f"checksum mismatch: stored {digest}, computed {actual}")
    w = "payload."
    job = check_job(r.string(r.get(payload, "job", w), w + "job"), source, w + "job")
    if expected_job is not None and job != expected_job:
        raise r.fail(w + "job", f"foreign job id {job!r}, expected {expected_job!r}")
    # Checkpoint ids start at 1 (the coordinator's, Flink's and a message's): the
    # registry's bookkeeping (a registered entry's ``last_used``) takes 0 for "none".
    checkpoint = r.integer(r.get(payload, "checkpoint", w), w + "checkpoint", minimum=1)
    savepoint = r.boolean(r.get(payload, "savepoint", w), w + "savepoint")
    entries = tuple(
        r.entry(r.obj(e, f"{w}entries[{i}]"), f"{w}entries[{i}]")
        for i, e in enumerate(r.array(r.get(payload, "entries", w), w + "entries"))
    )
    directories = tuple(
        r.string(d, f"{w}directories[{i}]")
        for i, d in enumerate(r.array(r.get(payload, "directories", w), w + "directories"))
    )
    shared = tuple(
        r.string(b, f"{w}shared_bases[{i}]")
        for i, b in enumerate(r.array(r.get(payload, "shared_bases", w), w + "shared_bases"))
    )
    max_par: int | None = None
    if version >= 2:
        max_par = r.integer(r.get(payload, "max_parallelism", w), w + "max_parallelism", 1)
        if max_par > MAX_PARALLELISM_LIMIT:
            raise r.fail(w + "max_parallelism", f"{max_par} exceeds {MAX_PARALLELISM_LIMIT}")
        for i, e in enumerate(entries):
            if e.key_groups is not None and not 0 <= e.key_groups[0] <= e.key_groups[1] < max_par:
                raise r.fail(
                    f"{w}entries[{i}].key_groups",
                    f"{list(e.key_groups)} lies outside the key groups of max parallelism"
                    f" {max_par}",
                )
    working: tuple[tuple[SubtaskId, InPlaceFile], ...] = ()
    if version >= WORKING_VERSION:
        working = tuple(
            r.in_place(r.obj(x, f"{w}working[{i}]"), f"{w}working[{i}]")
            for i, x in enumerate(r.array(r.get(payload, "working", w), w + "working"))
        )
        assert max_par is not None
        for i, (_, f) in enumerate(working):
            if f.key_groups[1] >= max_par:
                raise r.fail(
                    f"{w}working[{i}].key_groups",
                    f"{list(f.key_groups)} lies outside the key groups of max parallelism"
                    f" {max_par}",
                )
    meta = Metadata(
        job, checkpoint, savepoint, entries, directories, shared, version, max_par, working
    )
    validate_paths(meta, source)
    return meta
