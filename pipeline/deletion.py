"""Deleting orphans, opt-in, guarded, fail-closed (issues 6 and 15).

Each danger has its own explicit opt-in, and some guards have none:

* never lifted: the path must be a checkpoint base (it holds ``chk-*``, ``shared/`` or
  ``taskowned/``) and not inside one (``BASE/shared``, ``BASE/chk-34``,
  ``BASE/taskowned/tm-1``: :func:`check_base`), nor the savepoint directory; every
  ``_metadata`` (of the job, of the jobs beside it and of the savepoints) and every
  directory must read (else what they reference is unknown); the reference set read just
  before deleting must be neither empty nor smaller than the audit's (Paimon #7710: an
  empty or shrunken list of used files is never "nothing is referenced"); no other job
  may name the base as a restore source; no file younger than :data:`HARD_FLOOR` goes; a
  published writer state must read; nothing the writer's fence protects goes (below);
* ``--allow-short-grace``: a grace period under :data:`MIN_GRACE`;
* ``--no-live-writer``: a grace period under :data:`MIN_GRACE` on a base whose writer
  publishes no state (the operator says none is running; without it only age protects).

Each file the audit found unreferenced gets one outcome (:data:`OUTCOMES`):

* ``delete``: collected;
* ``keep-active``: referenced by a ``_metadata`` read just now, open in the writer's pool,
  or a live database's working file;
* ``defer``: younger than the grace period or the hard floor, modified at or after the
  writer's fence, or the collection stopped because a checkpoint a pending one may reuse
  from is gone;
* ``skip-unknown``: not something the audit may delete (not a regular file, a link, a
  ``_metadata`` or the writer state, outside the base, a path that is not normalised, gone).

Order, so that a live writer loses nothing: the writer state is read before the audit
lists and again here; the candidates are stat-ed again, then every ``_metadata`` is listed
and read again (list before reading the references), then the state once more.

:func:`execute` holds the base's deletion lock (one run per base at a time), writes the
plan, every outcome and every file it will delete to an append-only JSON-lines log (exact
names: ``pipeline.names``), synced, before the first delete; then deletes one file at a
time (never recursively), at most ``rate`` a second, each preceded by its intent, synced,
and followed by its result (``pipeline.deletion_log``: a killed run's deletes are known
exactly). On a local disk each delete walks from the base down by descriptors through the
directories the plan saw (``pipeline.dirwalk``); one that changed since refuses its files.

Issue 32 adds two whole-run guards: a dangling reference refuses the deletion (the orphans
may be the very bytes a repair needs), and the writer state must agree with the base
(``fence.check_against``).
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable, Iterable
from typing import Any

from attrs import frozen

from fastimpl.parties import WRITER_STATE
from pipeline import dirwalk, fence, scan
from pipeline.deletion_log import BaseLock, LockHeld, Log, new_run_id, unfinished
from pipeline.location import Location
from pipeline.names import exact_fields, shown
from pipeline.result import Row, Summary
from spec.errors import CkptError
from spec.layout import METADATA, SAVEPOINTS, is_under

MIN_GRACE = 3600.0
"""Below one hour only an explicit ``--allow-short-grace`` collects."""
HARD_FLOOR = 60.0
"""Seconds: a file modified more recently is never deleted, whatever the flags."""
DEFAULT_RATE = 100.0
"""Deletes a second at most (``--max-deletes-per-second``)."""

DELETE = "delete"
KEEP_ACTIVE = "keep-active"
DEFER = "defer"
SKIP_UNKNOWN = "skip-unknown"
OUTCOMES = (DELETE, KEEP_ACTIVE, DEFER, SKIP_UNKNOWN)

_LAYOUT_DIRS = ("shared", "taskowned")


class DeletionRefused(CkptError):
    """A guard refused the whole deletion; nothing was deleted."""


class NotABase(DeletionRefused):
    """The path is not a checkpoint base, or lies inside one. No flag lifts this."""


@frozen
class Candidate:
    path: str
    size: int
    mtime: float
    file: dirwalk.Ident | None = None
    """Local disks: the file's device and inode as the plan's walk saw it."""


@frozen
class Plan:
    base: str
    grace: float
    now: float
    delete: tuple[Candidate, ...]
    kept: tuple[tuple[str, str], ...]
    """Orphans of the audit that a per-file guard kept, with the reason."""
    outcomes: tuple[tuple[str, str, str], ...] = ()
    """(path, outcome, why) of every orphan of the audit, deleted ones too."""
    dirs: tuple[tuple[str, dirwalk.Ident], ...] = ()
    """Local disks: each directory on the way to a file to delete, with its device and
    inode as the plan's walk saw it (``pipeline.dirwalk``)."""

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.delete)

    def count(self, outcome: str) -> int:
        return sum(1 for _p, o, _w in self.outcomes if o == outcome)


@frozen
class Outcome:
    deleted: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    log: str
    run: str = ""
    gone: tuple[str, ...] = ()
    """Planned, but nothing by that name when its delete came."""
    skipped: tuple[tuple[str, str], ...] = ()
    """Refused at delete time (``skip-unknown``): a directory on the way changed since
    the plan, or another file took the name."""
    previous: tuple[tuple[str, str, bool], ...] = ()
    """(run, path, exists now) of each earlier run's intent without a result."""


# --------------------------------------------------------------------------- the base


def _is_layout(name: str) -> bool:
    return name in _LAYOUT_DIRS or bool(scan.CHECKPOINT_DIR.match(name))


def _looks_like_base(names: set[str]) -> bool:
    return any(scan.CHECKPOINT_DIR.match(n) for n in names) or bool(
        names & {*_LAYOUT_DIRS, WRITER_STATE}
    )


def check_base(loc: Location, *, layout: bool = True) -> None:
    """Refuse a path that lies inside a checkpoint base or (``layout``) is not one (no
    flag lifts it): a base given one level too deep makes every live file look
    unreferenced."""
    if loc.job_dir == SAVEPOINTS or (
        scan.SAVEPOINT_DIR.match(loc.job_dir) and loc.container.rstrip("/").endswith(SAVEPOINTS)
    ):
        raise NotABase(f"{loc.uri()} is a savepoint directory: savepoints belong to the user")
    # Walk up: an ancestor that is a base, entered through one of its layout entries
    # (shared, taskowned, chk-N), holds this path inside it.
    parts = [p for p in loc.container.split("/") if p] + [loc.job_dir]
    prefix = "/" if loc.local and loc.container.startswith("/") else ""
    for depth in range(len(parts) - 1, max(0, len(parts) - 6), -1):
        below = parts[depth]
        anc = prefix + "/".join(parts[:depth])
        if below == SAVEPOINTS and scan.SAVEPOINT_DIR.match(parts[depth + 1]):
            raise NotABase(f"{loc.uri()} lies inside the savepoint directory {anc}/{below}")
        if not _is_layout(below) or not anc:
            continue
        names = _names(loc, anc)
        if _looks_like_base(names - {below}):
            raise NotABase(
                f"{loc.uri()} lies inside the checkpoint base {anc} (through {below}/): "
                f"audit {anc} itself; no flag allows this"
            )
    if layout and not _looks_like_base(scan.base_entries(loc)):
        raise NotABase(
            f"{loc.uri()} has no chk-*, shared/ or taskowned/ directory: not a checkpoint "
            "base; no flag allows deleting in it"
        )


def _names(loc: Location, full_dir: str) -> set[str]:
    try:
        if loc.local:
            return set(os.listdir(full_dir))
        fs: Any = loc.fs()
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(full_dir, detail=False)}
    except (OSError, ValueError):
        return set()


# --------------------------------------------------------------------------- the plan


def plan_deletion(
    loc: Location,
    summary: Summary,
    orphans: Iterable[Row],
    *,
    grace: float,
    allow_short_grace: bool = False,
    no_live_writer: bool = False,
    now: float | None = None,
    state_before: fence.WriterState | None = None,
    dangling: Iterable[Row] = (),
) -> Plan:
    """The outcome of every orphan of the audit; raises :class:`DeletionRefused` when a
    guard refuses the whole deletion. ``state_before``: the writer state read before the
    audit listed the base (the CLI passes it); ``dangling``: the audit's dangling
    references (some or all of ``summary.dangling``), named in the refusal."""
    now = time.time() if now is None else now
    if grace < MIN_GRACE and not allow_short_grace:
        raise DeletionRefused(
            f"grace period {grace:g} s is under one hour: a file a live writer is still "
            "writing could be taken for an orphan; pass --allow-short-grace to allow it"
        )
    check_base(loc)
    if summary.corrupt_metadata:
        raise DeletionRefused(
            f"{summary.corrupt_metadata} _metadata file(s) cannot be read, so what they "
            "reference is unknown; repair or remove them first (see the audit's report)"
        )
    refuse_dangling(summary, dangling)
    if summary.restore_source_of:
        raise DeletionRefused(
            "this base is a restore source of "
            + ", ".join(summary.restore_source_of)
            + ": its files belong to the user (NO_CLAIM) or to the restored job (CLAIM)"
        )
    states = [state_before, _state(loc)]
    candidates = sorted({str(o["path"]) for o in orphans})
    current = {p: stat_now(loc, p) for p in candidates}  # listed before the references
    referenced, own, lineage = _referenced_now(loc)
    states.append(_state(loc))
    refuse_shrunk(len(own), bool(referenced), summary.checkpoints)
    known = [s for s in states if s is not None]
    if known:
        try:
            fence.check_against(known, loc.job_dir, set(own.values()), lineage)
        except fence.StateMismatch as err:
            raise DeletionRefused(f"the writer state disagrees with the base: {err}; "
                                  "it fences nothing, so nothing is deleted") from None
    if not known and grace < MIN_GRACE and not no_live_writer:
        raise DeletionRefused(
            "the base has no published writer state (fastimpl.writer_state), so only age "
            "protects a live writer's files and the grace period is under one hour; pass "
            "--no-live-writer if no writer is running"
        )
    wall = min((s.fence for s in known), default=None)
    cut = None if wall is None else wall - fence.margin(loc)
    open_files = frozenset().union(*(s.open_files for s in known)) if known else frozenset()
    # §11: the live databases' files if every state read (the caller's, if given, and
    # both read here) lists them; else None, and no working file is ever deleted
    given = [] if state_before is None else [state_before]
    working = fence.live_working([*given, *states[1:]])
    pins = frozenset().union(*(s.pins for s in known)) if known else frozenset()
    lost_pins = sorted(p for p in pins if p not in set(own.values()))
    stop = (
        f"checkpoint(s) {lost_pins} that a pending checkpoint may reuse from are gone: "
        "their references are unknown, collection stopped"
        if lost_pins else None
    )

    root_real = os.path.realpath(loc.full(loc.job_dir)) if loc.local else ""

    def judge(path: str, st: tuple[int, float, bool] | None) -> tuple[str, str]:
        return _judge(loc, path, root_real, st, referenced, open_files, now=now, grace=grace,
                      cut=cut, stop=stop, working=working)

    return plan_of(loc, candidates, current, judge, grace=grace, now=now)


Judge = Callable[[str, "tuple[int, float, bool] | None"], tuple[str, str]]
"""The outcome of one candidate (path, its stat just before the re-read) and why."""


def plan_of(
    loc: Location, candidates: list[str], current: dict[str, tuple[int, float, bool] | None],
    judge: Judge, *, grace: float, now: float,
) -> Plan:
    """Every candidate judged; on a local disk, each to delete walked to by descriptors
    (its identity and the directories on its way bound into the plan): a link or a
    changed directory on the way makes it ``skip-unknown``."""
    delete: list[Candidate] = []
    kept: list[tuple[str, str]] = []
    outcomes: list[tuple[str, str, str]] = []
    dirs: dict[str, dirwalk.Ident] = {}
    for path in candidates:
        outcome, why = judge(path, current[path])
        file: dirwalk.Ident | None = None
        if outcome == DELETE and loc.local:
            file, changed = _identify(loc, path, dirs)
            if changed is not None:
                outcome, why = SKIP_UNKNOWN, changed
        outcomes.append((path, outcome, why))
        if outcome == DELETE:
            st = current[path]
            assert st is not None
            delete.append(Candidate(path, st[0], st[1], file))
        else:
            kept.append((path, why))
    return Plan(loc.uri(), grace, now, tuple(delete), tuple(kept), tuple(outcomes),
                tuple(sorted(dirs.items())))


def refuse_shrunk(checkpoints_now: int, any_reference: bool, audited: int) -> None:
    """Paimon #7710: a reference set read just before deleting that is empty, or smaller
    than the audit's, never means "nothing is referenced"; the whole run is refused."""
    if not checkpoints_now or not any_reference:
        raise DeletionRefused(
            "the reference set read just now is empty (no readable checkpoint or no "
            "reference): that never means nothing is referenced; nothing deleted"
        )
    if checkpoints_now < audited:
        raise DeletionRefused(
            f"the job had {audited} readable checkpoint(s) when audited and "
            f"{checkpoints_now} now: the reference set shrank; audit again"
        )


def _identify(
    loc: Location, path: str, dirs: dict[str, dirwalk.Ident]
) -> tuple[dirwalk.Ident | None, str | None]:
    """The plan's descriptor walk to a file it would delete: the identity its delete will
    be bound to, or why it cannot be deleted (a link on the way, another directory than an
    earlier file of the plan met there)."""
    try:
        return dirwalk.identify(loc.full(loc.job_dir), loc.job_dir, path, dirs), None
    except dirwalk.Changed as err:
        return None, f"{err.directory} is {err.why}"
    except OSError as err:
        return None, f"cannot be examined: {err.strerror or err}"


def refuse_dangling(summary: Summary, dangling: Iterable[Row]) -> None:
    """Issue 32, finding 7: a base with a dangling reference deletes nothing. A file the
    audit calls an orphan there may be the referenced one renamed (``x.bak``) or copied
    aside: the bytes a repair needs."""
    if not summary.dangling:
        return
    rows = list(dangling)[:3]
    named = "; ".join(f"{r['checkpoint']} -> {shown(str(r['path']))} ({r['reason']})"
                      for r in rows)
    more = summary.dangling - len(rows)
    raise DeletionRefused(
        f"{summary.dangling} dangling reference(s)"
        + (f": {named}" if named else "") + (f" and {more} more" if rows and more > 0 else "")
        + ": the orphans may be what a repair needs; repair first (see the report)"
    )


def _judge(
    loc: Location, path: str, root_real: str, st: tuple[int, float, bool] | None,
    referenced: set[str], open_files: frozenset[str], *, now: float, grace: float,
    cut: float | None, stop: str | None, working: frozenset[str] | None = None,
) -> tuple[str, str]:
    unknown = not_ours(loc, path, root_real, st)
    if unknown is not None:
        return unknown
    if path in referenced:
        return KEEP_ACTIVE, "referenced by a _metadata read just now"
    if path in open_files:
        return KEEP_ACTIVE, "open in the live writer's pool"
    if scan.in_live_database(path, loc.job_dir, working):
        return KEEP_ACTIVE, "a live database's working file (or the writer did not say)"
    assert st is not None
    mtime = st[1]
    if cut is not None and mtime >= cut:
        return DEFER, "modified at or after the live writer's fence (a pending checkpoint)"
    young = too_young(mtime, now=now, grace=grace)
    if young is not None:
        return young
    if stop is not None:
        return DEFER, stop
    return DELETE, "unreferenced, older than the grace period and the writer's fence"


def not_ours(
    loc: Location, path: str, root_real: str, st: tuple[int, float, bool] | None
) -> tuple[str, str] | None:
    """``skip-unknown`` for what the audit may never delete (``refuse_path``) or what is
    gone or not a regular file now; else None."""
    why = refuse_path(loc, path, root_real)
    if why is not None:
        return SKIP_UNKNOWN, why
    if st is None:
        return SKIP_UNKNOWN, "gone already, or not a regular file"
    return None


def too_young(mtime: float, *, now: float, grace: float) -> tuple[str, str] | None:
    """``defer`` for a file modified within the hard floor or the grace period; else None."""
    if mtime > now - HARD_FLOOR:
        return DEFER, f"modified within the hard floor ({HARD_FLOOR:g} s)"
    if mtime > now - grace:
        return DEFER, "modified within the grace period"
    return None


def _state(loc: Location) -> fence.WriterState | None:
    try:
        return fence.read_state(loc)
    except fence.StateError as err:
        raise DeletionRefused(f"the writer state is unreadable ({err}): nothing deleted") from None


def refuse_path(loc: Location, path: str, root_real: str) -> str | None:
    parts = path.split("/")
    if ".." in parts or "" in parts or "." in parts or path.startswith("/"):
        return "not a normalised relative path"
    if not is_under(path, loc.job_dir) or path == loc.job_dir:
        return "outside the job base"
    if any(p == METADATA or p.startswith(METADATA + ".") for p in parts[1:]):
        return "a _metadata file, or inside one"
    if path == f"{loc.job_dir}/{WRITER_STATE}":
        return "the writer's published state"
    if loc.local:
        full = loc.full(path)
        try:
            mode = os.lstat(full).st_mode
        except OSError:
            return None  # stat_now reports it gone
        if stat.S_ISLNK(mode):
            return "a symbolic link"
        if not stat.S_ISREG(mode):
            return "not a regular file"
        real = os.path.realpath(full)
        if not is_under(real, root_real):
            return f"its real path {real} is outside the job base"
    return None


def stat_now(loc: Location, path: str) -> tuple[int, float, bool] | None:
    rows = scan.stat_files(loc, [path])
    return (rows[0][1], rows[0][2], rows[0][3]) if rows else None


def _referenced_now(loc: Location) -> tuple[set[str], dict[str, int], set[int]]:
    """Every path a ``_metadata`` references, the job's checkpoints read (key: id) and the
    ids of every job's checkpoints read (this one's and the jobs beside it: what the
    writer state's lists are checked against), listed and read again just before
    deleting. Anything unreadable refuses the deletion."""
    problems: list[scan.Problem] = []
    units, _ = scan.top_level(loc, problems)
    paths = [f"{u}/{METADATA}" for u in units if scan.CHECKPOINT_DIR.match(u.split("/")[-1])]
    others = scan.other_metadata(loc, problems)
    unlisted = [p for p in problems if p[1] != scan.NOT_UTF8]
    if unlisted:
        raise DeletionRefused(
            f"{len(unlisted)} path(s) cannot be listed, and may hold a checkpoint that "
            f"references this base: {unlisted[0][0]}: {unlisted[0][1]}"
        )
    out: set[str] = set()
    own: dict[str, int] = {}
    lineage: set[int] = set()
    for p in [*paths, *others]:
        row, refs, err, _stats = scan.read_metadata(loc, p)
        if err is not None:
            raise DeletionRefused(f"{p} became unreadable: {err[1]}: {err[2]}")
        if row is not None and row[5] == loc.job_dir:
            own[row[0]] = row[2]
        if row is not None and not row[3]:
            lineage.add(row[2])
        out.update(r[8] for r in refs if r[8] is not None)
    return out, own, lineage


# --------------------------------------------------------------------------- execute


def execute(
    loc: Location, plan: Plan, log_path: str, *, rate: float = DEFAULT_RATE,
    lock: BaseLock | None = None,
) -> Outcome:
    """Under the base's deletion lock (``lock``, held by the caller since before the
    plan, or taken here): log the plan, every outcome and every file to delete (synced),
    then delete one file at a time, at most ``rate`` a second, each between its intent
    (synced) and its result. The log is opened for appending only: earlier runs'
    records stay, and an earlier run's intent without a result is resolved first."""
    if os.path.lexists(log_path) and not os.path.isfile(log_path):
        raise DeletionRefused(f"the deletion log {log_path} is not a regular file")
    run = lock.run if lock is not None else new_run_id()
    held = lock if lock is not None else take_lock(loc, log_path, run)
    try:
        previous = unfinished(log_path, plan.base)
        log = Log(log_path, run)
        try:
            return _run(loc, plan, log, rate, previous)
        finally:
            log.close()
    finally:
        if lock is None:
            held.release()


def take_lock(loc: Location, log_path: str, run: str | None = None) -> BaseLock:
    """The base's deletion lock, or :class:`DeletionRefused` naming the run holding it."""
    try:
        return BaseLock(loc, log_path, run or new_run_id())
    except LockHeld as err:
        raise DeletionRefused(str(err)) from None


def _run(
    loc: Location, plan: Plan, log: Log, rate: float, previous: list[tuple[str, str]]
) -> Outcome:
    log.write({"event": "plan", "base": plan.base, "grace_seconds": plan.grace,
               "time": plan.now, "files": len(plan.delete), "bytes": plan.bytes,
               "rate_per_second": rate, "host": socket.gethostname(), "pid": os.getpid(),
               "outcomes": {o: plan.count(o) for o in OUTCOMES}})
    found = []
    for run, path in previous:
        exists = _exists(loc, path)
        found.append((run, path, exists))
        log.write({"event": "previous-intent", "of_run": run, "exists": exists,
                   **exact_fields(path)})
    for p, outcome, why in plan.outcomes:
        if outcome != DELETE:
            log.write({"event": "outcome", "outcome": outcome, "why": why, **exact_fields(p)})
    for c in plan.delete:
        log.write({"event": "will-delete", "outcome": DELETE, "size": c.size,
                   "mtime": c.mtime, **exact_fields(c.path)})
    log.sync()
    results = _delete(loc, plan, log, rate)
    done = {k: tuple(p for p, r, _w in results if r == k) for k in ("deleted", "gone")}
    log.write({"event": "end", "deleted": len(done["deleted"]), "gone": len(done["gone"]),
               "failed": sum(1 for _p, r, _w in results if r == "failed"),
               "skip_unknown": sum(1 for _p, r, _w in results if r == SKIP_UNKNOWN)})
    log.sync()
    return Outcome(
        done["deleted"],
        tuple((p, w) for p, r, w in results if r == "failed"),
        log.path,
        log.run,
        done["gone"],
        tuple((p, w) for p, r, w in results if r == SKIP_UNKNOWN),
        tuple(found),
    )


def _exists(loc: Location, path: str) -> bool:
    """Whether an earlier run's last intended file is there now (a report: by path)."""
    if loc.local:
        return os.path.lexists(loc.full(path))
    return bool(loc.fs().exists(loc.full(path)))


def _delete(
    loc: Location, plan: Plan, log: Log, rate: float = DEFAULT_RATE
) -> list[tuple[str, str, str]]:
    """One file at a time (never a directory, never recursive), paced to ``rate`` deletes
    a second; (path, result, why) of each. On a local disk through the directories the
    plan saw (``pipeline.dirwalk``): once one has changed, every planned file below it is
    refused (``skip-unknown``) unopened."""
    out: list[tuple[str, str, str]] = []
    changed: dict[str, str] = {}
    dirs = dict(plan.dirs)
    start = time.monotonic()
    for i, c in enumerate(plan.delete):
        below = next((d for d in changed if c.path.startswith(d + "/")), None)
        if below is not None:
            why = f"{below} is {changed[below]}: refused with the rest of its directory"
            log.write({"event": SKIP_UNKNOWN, "why": why, **exact_fields(c.path)})
            out.append((c.path, SKIP_UNKNOWN, why))
            continue
        if rate > 0:
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        log.write({"event": "intent", **exact_fields(c.path)})
        log.sync()  # the write-ahead: the intent is durable before the delete
        try:
            result, why = _delete_one(loc, c, dirs)
        except dirwalk.Changed as err:
            changed[err.directory] = err.why
            result, why = SKIP_UNKNOWN, f"{err.directory} is {err.why}: not what the plan saw"
        doc: dict[str, Any] = {"event": result, **exact_fields(c.path)}
        if why:
            doc["error" if result == "failed" else "why"] = why
        log.write(doc)  # synced with the next intent, or at the end
        out.append((c.path, result, why))
    return out


def _delete_one(loc: Location, c: Candidate, dirs: dict[str, dirwalk.Ident]) -> tuple[str, str]:
    """(result, why) of one delete; :class:`dirwalk.Changed` when a directory on the way
    is not the plan's."""
    try:
        if not loc.local:
            # Object stores have no links and no directories: the key names the object
            # the plan saw listed, and no component on the way can be swapped to send
            # the delete elsewhere. (A new object under the key is the one window, as a
            # new file under the name is on a disk.) S3's DELETE succeeds on a missing key.
            loc.fs().rm_file(loc.full(c.path))
            return "deleted", ""
        if c.file is None:
            return SKIP_UNKNOWN, "the plan did not walk to it (no identity to bind to)"
        got = dirwalk.unlink_planned(loc.full(loc.job_dir), loc.job_dir, c.path, dirs, c.file)
    except dirwalk.Changed:
        raise
    except Exception as err:
        return "failed", f"{type(err).__name__}: {err}"
    if got == dirwalk.OTHER_FILE:
        return SKIP_UNKNOWN, "another file has its name now: not the one the plan saw"
    return got, ""
