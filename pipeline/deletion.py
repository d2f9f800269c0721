"""Deleting orphans, opt-in and guarded (issue 6).

An orphan is a file under the job base that no readable ``_metadata`` references and that
is older than the grace period. Before anything goes, :func:`plan_deletion` applies
every guard, and re-checks each candidate against storage as it is *now* (a checkpoint
may have completed since the audit listed it):

* the grace period is at least an hour unless forced; the base looks like a job base and
  has at least one readable checkpoint unless forced; no ``_metadata`` is unreadable (its
  references are unknown) and no other job's checkpoint names this base as a restore
  source (under NO_CLAIM its files belong to the user);
* a candidate lies under the job base, is not a ``_metadata`` file, not a live database's
  working file, not a savepoint's, not a symbolic link, and on a local disk its real path
  is under the base's real path (a linked directory cannot lead outside);
* it still exists, is still older than the grace period, and no ``_metadata`` read again
  now references it.

:func:`execute` writes the whole list to a log (flushed and synced) before the first
delete, then deletes and appends each outcome to the same log.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

from attrs import frozen

from pipeline import scan
from pipeline.location import Location
from pipeline.result import Row, Summary
from spec.layout import METADATA, SAVEPOINTS, is_under

MIN_GRACE = 3600.0
"""Below one hour a half-written file of a live checkpoint could look orphaned."""


class DeletionRefused(Exception):
    """A guard refused the whole deletion; nothing was deleted."""


@frozen
class Candidate:
    path: str
    size: int
    mtime: float


@frozen
class Plan:
    base: str
    grace: float
    now: float
    delete: tuple[Candidate, ...]
    kept: tuple[tuple[str, str], ...]
    """Orphans of the audit that a per-file guard kept, with the reason."""

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.delete)


@frozen
class Outcome:
    deleted: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    log: str


def plan_deletion(
    loc: Location,
    summary: Summary,
    orphans: Iterable[Row],
    *,
    grace: float,
    force: bool = False,
    now: float | None = None,
) -> Plan:
    """The files to delete, after every guard; raises :class:`DeletionRefused` when a
    guard refuses the whole deletion."""
    now = time.time() if now is None else now
    if grace < MIN_GRACE and not force:
        raise DeletionRefused(
            f"grace period {grace:g} s is under one hour: a file a live writer is still "
            "writing could be taken for an orphan; pass --force to allow it"
        )
    if loc.job_dir == SAVEPOINTS:
        raise DeletionRefused("the base is the savepoint directory: savepoints belong to the user")
    if summary.corrupt_metadata:
        raise DeletionRefused(
            f"{summary.corrupt_metadata} _metadata file(s) cannot be read, so what they "
            "reference is unknown; repair or remove them first (see the audit's report)"
        )
    if summary.restore_source_of:
        raise DeletionRefused(
            "this base is a restore source of "
            + ", ".join(summary.restore_source_of)
            + ": its files belong to the user (NO_CLAIM) or to the restored job (CLAIM)"
        )
    names = scan.base_entries(loc)
    looks_like_base = any(scan.CHECKPOINT_DIR.match(n) for n in names) or bool(
        names & {"shared", "taskowned"}
    )
    if not looks_like_base and not force:
        raise DeletionRefused(
            f"{loc.uri()} has no chk-*, shared/ or taskowned/ directory: not a checkpoint "
            "base; pass --force if it is one"
        )
    if summary.checkpoints == 0 and not force:
        raise DeletionRefused(
            "the job has no readable checkpoint, so every file looks orphaned; if the job "
            "is gone for good pass --force"
        )

    referenced = _referenced_now(loc)
    root_real = os.path.realpath(loc.full(loc.job_dir)) if loc.local else ""
    delete: list[Candidate] = []
    kept: list[tuple[str, str]] = []
    for o in sorted(orphans, key=lambda r: str(r["path"])):
        path = str(o["path"])
        why = _refuse(loc, path, root_real)
        if why is None and path in referenced:
            why = "referenced by a _metadata read just now"
        current: tuple[int, float] | None = None
        if why is None:
            current = _stat(loc, path)
            if current is None:
                why = "gone already"
            elif current[1] > now - grace:
                why = "modified within the grace period since the audit"
        if why is not None:
            kept.append((path, why))
            continue
        assert current is not None
        delete.append(Candidate(path, current[0], current[1]))
    return Plan(loc.uri(), grace, now, tuple(delete), tuple(kept))


def _refuse(loc: Location, path: str, root_real: str) -> str | None:
    parts = path.split("/")
    if ".." in parts or "" in parts or "." in parts or path.startswith("/"):
        return "not a normalised relative path"
    if not is_under(path, loc.job_dir) or path == loc.job_dir:
        return "outside the job base"
    if parts[-1] == METADATA or parts[-1].startswith(METADATA + "."):
        return "a _metadata file"
    if scan.is_working(path, loc.job_dir):
        return "a live database's working file"
    if loc.local:
        full = loc.full(path)
        if os.path.islink(full):
            return "a symbolic link"
        real = os.path.realpath(full)
        if not is_under(real, root_real):
            return f"its real path {real} is outside the job base"
    return None


def _stat(loc: Location, path: str) -> tuple[int, float] | None:
    rows = scan.stat_files(loc, [path])
    return (rows[0][1], rows[0][2]) if rows else None


def _referenced_now(loc: Location) -> set[str]:
    """Every path a ``_metadata`` references, read again just before deleting."""
    units, _ = scan.top_level(loc)
    paths = [f"{u}/{METADATA}" for u in units if scan.CHECKPOINT_DIR.match(u.split("/")[-1])]
    out: set[str] = set()
    for p in [*paths, *scan.other_metadata(loc)]:
        _row, refs, err, _stats = scan.read_metadata(loc, p)
        if err is not None:
            raise DeletionRefused(f"{p} became unreadable: {err[1]}: {err[2]}")
        out.update(r[8] for r in refs if r[8] is not None)
    return out


def execute(loc: Location, plan: Plan, log_path: str) -> Outcome:
    """Log every path of the plan (synced), then delete, appending each outcome."""
    with open(log_path, "a", encoding="utf-8") as log:
        head = {"event": "plan", "base": plan.base, "grace_seconds": plan.grace,
                "time": plan.now, "files": len(plan.delete), "bytes": plan.bytes}
        log.write(json.dumps(head) + "\n")
        for c in plan.delete:
            log.write(json.dumps({"event": "will-delete", "path": c.path, "size": c.size,
                                  "mtime": c.mtime}) + "\n")
        log.flush()
        os.fsync(log.fileno())
        deleted, failed = _delete(loc, [c.path for c in plan.delete])
        for p in deleted:
            log.write(json.dumps({"event": "deleted", "path": p}) + "\n")
        for p, err in failed:
            log.write(json.dumps({"event": "failed", "path": p, "error": err}) + "\n")
        log.flush()
        os.fsync(log.fileno())
    return Outcome(tuple(deleted), tuple(failed), log_path)


def _delete(loc: Location, paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    deleted: list[str] = []
    failed: list[tuple[str, str]] = []
    if loc.local:
        for p in paths:
            try:
                os.remove(loc.full(p))
                deleted.append(p)
            except OSError as err:
                failed.append((p, f"{type(err).__name__}: {err}"))
        return deleted, failed
    fs: Any = loc.fs()
    for i in range(0, len(paths), 1000):  # S3's DeleteObjects takes 1000 keys a call
        batch = paths[i : i + 1000]
        try:
            fs.rm([loc.full(p) for p in batch])
            deleted.extend(batch)
        except Exception:
            for p in batch:  # find out which ones failed
                try:
                    fs.rm_file(loc.full(p))
                    deleted.append(p)
                except FileNotFoundError:
                    deleted.append(p)
                except Exception as err:
                    failed.append((p, f"{type(err).__name__}: {err}"))
    return deleted, failed
