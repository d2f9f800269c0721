"""The invariants (I1-I6 of SPEC.md) as pure predicates over an observation.

Each returns the list of violations it found; an empty list means it holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable

from attrs import frozen

from spec.handles import (
    DirectoryHandle,
    Extent,
    FileHandle,
    InlineHandle,
    SegmentHandle,
    StateEntry,
    extent_of,
    stream_of,
)
from spec.ids import escape_name
from spec.layout import working_operator
from spec.observation import Observation, WorkingObservation

USER = "user"


@frozen
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


def _stream_extent(entry: StateEntry) -> Extent | None:
    s = stream_of(entry.handle)
    return None if s is None else extent_of(s)


def no_dangling_reference(obs: Observation) -> list[Violation]:
    """I1: every handle of every retained checkpoint, and of the state being restored,
    points at an existing file and lies within its size; metadata and directories exist."""
    out: list[Violation] = []

    def check(entries: Iterable[StateEntry], where: str) -> None:
        for e in entries:
            if isinstance(e.handle, DirectoryHandle):
                if e.handle.path not in obs.directories:
                    out.append(Violation("I1", f"{where}: directory {e.handle.path} missing"))
                continue
            if isinstance(e.handle, InlineHandle):
                continue  # R107: its bytes are in the handle, no file to point at
            ext = _stream_extent(e)
            if ext is None:
                out.append(Violation("I1", f"{where}: unresolved handle {e.handle!r}"))
                continue
            path, end = ext.path, ext.offset + ext.length
            size = obs.files.get(path)
            if size is None:
                out.append(Violation("I1", f"{where}: {e.name} -> missing file {path}"))
            elif end > size:
                out.append(
                    Violation("I1", f"{where}: {e.name} ends at {end} > size {size} of {path}")
                )

    for r in obs.retained:
        if r.metadata not in obs.files:
            out.append(Violation("I1", f"chk {r.checkpoint}: metadata {r.metadata} missing"))
        check(r.entries, f"chk {r.checkpoint}")
        for d in r.directories:
            if d not in obs.directories:
                out.append(Violation("I1", f"chk {r.checkpoint}: directory {d} missing"))
    check(obs.restoring, "restoring")
    return out


def no_double_delete(obs: Observation) -> list[Violation]:
    """I2: no path is deleted twice, and nothing is deleted that did not exist."""
    out = [
        Violation("I2", f"{d.actor} deleted {d.path}, which did not exist")
        for d in obs.deletions
        if not d.existed
    ]
    counts = Counter(d.path for d in obs.deletions if d.existed)
    out += [Violation("I2", f"{p} deleted {n} times") for p, n in counts.items() if n > 1]
    return out


def one_owner(obs: Observation) -> list[Violation]:
    """I3: every existing file has exactly one owner, and no live party's bookkeeping
    claims a file that someone else owns."""
    out: list[Violation] = []
    for path in obs.files:
        owner = obs.owners.get(path)
        if owner is None:
            out.append(Violation("I3", f"{path} has no owner"))
            continue
        others = obs.claims.get(path, frozenset()) - {owner}
        if others:
            out.append(Violation("I3", f"{path} owned by {owner} but claimed by {sorted(others)}"))
    return out


def sound_counts(obs: Observation) -> list[Violation]:
    """I4: a physical file's ref count equals its live segments, and every registry entry's
    references are exactly the retained checkpoints that use it."""
    out: list[Violation] = []
    for path, count in obs.ref_counts.items():
        live = len(obs.live_segments.get(path, ()))
        if count != live:
            out.append(Violation("I4", f"{path}: ref count {count} != {live} live segments"))
    for path in obs.live_segments:
        if path not in obs.ref_counts:
            out.append(Violation("I4", f"{path}: live segments in an untracked file"))
    expected: dict[str, set[int]] = {}
    for r in obs.retained:
        for e in r.entries:
            h = e.handle
            if isinstance(h, SegmentHandle | FileHandle) and h.scope.value == "shared":
                expected.setdefault(h.logical_id, set()).add(r.checkpoint)
        for d in r.directories:
            expected.setdefault(f"dir:{d}", set()).add(r.checkpoint)
    for key in sorted(set(expected) | set(obs.registry)):
        have = obs.registry[key].refs if key in obs.registry else frozenset()
        want = frozenset(expected.get(key, set()))
        if have != want:
            out.append(Violation("I4", f"registry {key}: refs {sorted(have)} != {sorted(want)}"))
    return out


def no_foreign_delete(obs: Observation) -> list[Violation]:
    """I5: only the owner deletes, never outside the bases it may delete in, never what
    belongs to the user (a NO_CLAIM source, a savepoint), whatever metadata says."""
    out: list[Violation] = []
    for d in obs.deletions:
        if d.protected:
            out.append(Violation("I5", f"{d.actor} deleted protected {d.path}"))
        elif d.existed and d.owner != d.actor:
            out.append(Violation("I5", f"{d.actor} deleted {d.path} owned by {d.owner}"))
    return out


def referenced_paths(obs: Observation) -> set[str]:
    refs: set[str] = set()
    for r in obs.retained:
        refs.add(r.metadata)
        for e in r.entries:
            ext = _stream_extent(e)
            if ext is not None:
                refs.add(ext.path)
    for e in obs.restoring:
        ext = _stream_extent(e)
        if ext is not None:
            refs.add(ext.path)
    return refs


def no_leak_once_quiet(obs: Observation, exempt: Collection[str] = ()) -> list[Violation]:
    """I6 (checked only in a quiet state, R60): every existing file is referenced by a
    retained checkpoint, open in a live pool, or the user's; every managed directory is
    referenced by a retained checkpoint or held by a live TM; no delete is pending.
    ``exempt``: files another predicate judges (working files, ``no_working_leak_once_quiet``)."""
    out: list[Violation] = []
    refs = referenced_paths(obs)
    for path in obs.files:
        if path in refs or path in obs.pool_files or obs.owners.get(path) == USER or path in exempt:
            continue
        out.append(Violation("I6", f"leaked {path} (owner {obs.owners.get(path)})"))
    ref_dirs = {d for r in obs.retained for d in r.directories}
    for d, owner in obs.directories.items():
        if d in ref_dirs or owner == USER or owner in obs.live_parties:
            continue
        out.append(Violation("I6", f"leaked directory {d} (owner {owner})"))
    out += [Violation("I6", f"delete still pending: {p}") for p in obs.pending_deletes]
    return out


SAFETY: tuple[Callable[[Observation], list[Violation]], ...] = (
    no_dangling_reference,
    no_double_delete,
    one_owner,
    sound_counts,
    no_foreign_delete,
)
"""The invariants that hold after every command."""


def check_safety(obs: Observation) -> list[Violation]:
    return [v for check in SAFETY for v in check(obs)]


def check_all(obs: Observation, *, quiet: bool) -> list[Violation]:
    return check_safety(obs) + (no_leak_once_quiet(obs) if quiet else [])


COORDINATOR = "coordinator"


def working_files_kept(obs: Observation, w: WorkingObservation) -> list[Violation]:
    """I7: every file a live database uses exists, and so does every working file a
    retained checkpoint refers to in place; a working file a checkpoint's acknowledgement
    referred to is the coordinator's (or the user's), so no database can delete it (I5);
    a file a live database uses is its own attempt's, the coordinator's or the user's,
    never another attempt's (a zombie's writes are never used), and lies in a working
    directory of the database's own operator (R105)."""
    out: list[Violation] = []
    for db, paths in w.uses.items():
        operator = w.operators.get(db)
        for path in sorted(paths):
            if path not in obs.files:
                out.append(Violation("I7", f"database {db} uses missing {path}"))
            elif obs.owners.get(path) not in (db.split("@", 1)[1], COORDINATOR, USER):
                out.append(Violation("I7", f"database {db} uses {path} of {obs.owners.get(path)}"))
            if operator is None or working_operator(path) != escape_name(operator):
                out.append(
                    Violation("I7", f"database {db} of operator {operator!r} uses {path}, "
                                    "a file of another operator's working directory")
                )  # fmt: skip
    for cid, paths in sorted(w.retained.items()):
        for path in sorted(paths):
            if path not in obs.files:
                out.append(Violation("I7", f"chk {cid}: working file {path} missing"))
    for path, view in w.files.items():
        if view.refs and view.owner not in (COORDINATOR, USER):
            out.append(
                Violation("I7", f"{path} referred to by {sorted(view.refs)} but {view.owner}'s")
            )
    return out


def no_working_leak_once_quiet(obs: Observation, w: WorkingObservation) -> list[Violation]:
    """I6 for working files (checked only in a quiet state, after the coordinator's
    collection): every working file is referred to by a retained checkpoint, used by a
    live database, or the user's."""
    used = {p for paths in w.uses.values() for p in paths}
    kept = {p for paths in w.retained.values() for p in paths}
    return [
        Violation("I6", f"leaked working file {path} (owner {view.owner})")
        for path, view in w.files.items()
        if path not in used and path not in kept and view.owner != USER
    ]


def check_working(obs: Observation, w: WorkingObservation, *, quiet: bool) -> list[Violation]:
    """Every invariant over a model with working state (§11)."""
    out = check_safety(obs) + working_files_kept(obs, w)
    if quiet:
        out += no_leak_once_quiet(obs, exempt=frozenset(w.files))
        out += no_working_leak_once_quiet(obs, w)
    return out
