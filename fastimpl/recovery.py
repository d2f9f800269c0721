"""Recovery after the whole process died (issue 3): rebuild a store from storage alone.

Nothing in memory survives a crash; what storage holds is the truth. ``recover`` reads
every ``<job>/chk-N/_metadata`` of the crashed job and every savepoint's ``_metadata``,
validates them (a corrupt, truncated or foreign file raises ``MetadataError`` and nothing
is deleted), keeps the latest ``num_retained`` completed checkpoints, checks that every
byte they refer to is on storage (``RecoveryError`` otherwise, again deleting nothing),
and starts a new incarnation of the job (a new job id under the same root, new TM ids)
that restores from the latest of them in CLAIM mode (R72): the new coordinator owns the
crashed job's retained checkpoints and deletes them once they are subsumed.

Checkpoint ids go on past every one used under the root (R50): those storage shows, and
the pending ones of the crashed job's last published writer state (``fastimpl.
writer_state``; with merging, a pending checkpoint leaves nothing under ``chk-N/``).

The coordinator is rebuilt by ``fastimpl.resume.rebuild``, the one restart from storage
(a coordinator resumed while its TMs run on uses it too), with the HA state derived
from storage (no HA service survived) and no TM running; then the restore.

Everything else the crashed job left under its base is garbage of a process that can no
longer write (half-written files of pending checkpoints, segments of aborted ones, a
``_metadata.inprogress`` of an interrupted metadata write, files a subsume had not yet
deleted): it is deleted at once by the new coordinator, so nothing is kept forever.
Savepoints are the user's and are never touched; a savepoint directory without
``_metadata`` (an interrupted savepoint) is left to the user and listed in the report.

Only the crashed job's own base is the new coordinator's (I5): that is all the caller's
``crashed_job`` proves. Every other base under the root (a predecessor the crashed job
claimed, an incarnation an earlier recovery started, an unrelated job, a sibling
application's folder) is the user's whatever a ``_metadata`` says about it: its files are
read where a kept checkpoint refers to them, never deleted, and listed in
``report.left_alone``. Inside the own base, a file that a ``_metadata`` elsewhere names
(a newer incarnation's checkpoint that claimed it) is the user's too; if one of those
cannot be read, no file of the own base is garbage. Leaking what another base holds is
the price of never deleting what is not provably ours (a persisted lineage record would
let recovery take a predecessor's leftovers back: see ISSUE 14 and the xfail test of
``test_recovery``).

Anything wrong with what storage holds is a ``MetadataError`` or ``RecoveryError`` naming
the file and the problem (an unreadable or unlistable directory, a path past PATH_MAX,
one logical id naming two extents in two kept checkpoints), raised before anything is
deleted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from fastimpl.catalog import DeletionLog
from fastimpl.coordinator import CheckpointCoordinator, CoordinatorEngine, subtasks_of
from fastimpl.engine import InProcessEngine
from fastimpl.ids import IdSource, RandomIds, creator_of
from fastimpl.metadata import MetadataError, base_of, check_job
from fastimpl.records import Completed, StoredFile
from fastimpl.resume import HaState, rebuild
from fastimpl.storage import Storage
from fastimpl.working import is_working_path
from fastimpl.writer_state import WRITER_STATE
from spec import commands as c
from spec.config import Config, JobSpec, RestoreMode, VertexSpec, check_parallelism
from spec.effects import COORDINATOR
from spec.errors import CkptError
from spec.handles import Extent, extent_of, stream_of
from spec.keygroups import max_parallelism_refusal
from spec.layout import METADATA, SAVEPOINTS, is_under, job_base

_JOB = re.compile(r"^(.*?)-(\d+)$")
_META = f"/{METADATA}"


class RecoveryError(CkptError, RuntimeError):
    """Storage does not hold what a completed checkpoint refers to; nothing was deleted."""


@frozen
class RecoveryReport:
    """What ``recover`` found and did."""

    crashed_job: str
    new_job: str
    checkpoints: tuple[int, ...]
    """The completed checkpoints kept (retained by the new job), oldest first."""
    savepoints: tuple[int, ...]
    garbage: tuple[str, ...]
    """Paths of the crashed job deleted as garbage (files and directories)."""
    left_to_user: tuple[str, ...]
    """Interrupted savepoint directories, not deleted."""
    left_alone: tuple[str, ...] = ()
    """Other bases under the root (not ``savepoints``): never the new coordinator's, never
    deleted; a kept checkpoint may read files there."""


def _numbered(pattern: str, paths: dict[str, int]) -> dict[int, str]:
    rx = re.compile(pattern)
    out: dict[int, str] = {}
    for p in paths:
        m = rx.fullmatch(p)
        if m:
            out[int(m.group(1))] = p
    return out


def _check_bytes(done: Completed, files: dict[str, int]) -> None:
    if done.metadata not in files:
        raise RecoveryError(f"checkpoint {done.id}: {done.metadata} is missing")
    for sub, w in done.working:  # R103: the working files it refers to in place
        size = files.get(w.path)
        if size is None or size < w.length:
            held = "is missing" if size is None else f"holds {size} bytes"
            raise RecoveryError(
                f"checkpoint {done.id} ({done.metadata}): {w.path} {held}, the working "
                f"file {sub} refers to in place needs {w.length}"
            )
    for e in done.entries:
        s = stream_of(e.handle)
        if s is None:
            continue
        end = extent_of(s).offset + s.length
        size = files.get(s.path)
        if size is None:
            raise RecoveryError(
                f"checkpoint {done.id} ({done.metadata}): {s.path} is missing "
                f"(state {e.name!r} of {e.subtask})"
            )
        if size < end:
            raise RecoveryError(
                f"checkpoint {done.id} ({done.metadata}): {s.path} holds {size} bytes, "
                f"state {e.name!r} of {e.subtask} needs {end}"
            )


@frozen
class _Crashed:
    """What storage holds of the crashed job, read and validated before anything is built
    or deleted: the one input of the recovery, whichever engine hosts the new job."""

    job: str
    gone: tuple[str, ...]
    """The abandoned incarnations' bases."""
    files: dict[str, int]
    keep: list[Completed]
    """The kept checkpoints, oldest first (the latest ``num_retained``)."""
    savepoints: tuple[int, ...]
    dropped: set[str]
    """The abandoned incarnations' files: garbage, checked (``_abandoned_files``)."""
    interrupted: tuple[str, ...]
    tops: frozenset[str]
    user_held: set[str]
    ha: HaState
    vertices: tuple[VertexSpec, ...]
    """The crashed job's parallelism (the latest kept checkpoint's subtasks say which)."""
    next_tm: int
    """A TM number past every one the crashed job's TMs may have used."""


def _read_crashed(
    config: Config, job_spec: JobSpec, reader: Storage, job: str, abandoned: Sequence[str]
) -> _Crashed:
    """Everything the recovery needs of storage, read and validated; raises
    ``MetadataError`` or ``RecoveryError`` before anything changes."""
    check_parallelism(config, job_spec.vertices)  # R78: before anything is read
    try:
        check_job(job, "<recover>", "crashed_job")
    except MetadataError as err:
        raise RecoveryError(f"crashed_job {job!r}: {err.problem}") from None
    own = job_base(job)
    gone = _check_abandoned(job, abandoned)
    try:
        files = reader.list_files()
    except Exception as err:  # an unreadable directory, a path past PATH_MAX, ...
        where = getattr(err, "filename", None) or reader.root
        raise RecoveryError(
            f"cannot list the checkpoints under {reader.root!r}: {where}: "
            f"{type(err).__name__}: {err}"
        ) from err
    metas = _numbered(rf"{re.escape(own)}/chk-(\d+)/{METADATA}", files)
    completed: list[Completed] = []
    for cid, path in sorted(metas.items()):
        meta = reader.read_metadata(path, expected_job=job)  # chk-N's names N (check_named)
        # with its working list (R103): what ``_check_bytes`` checks, ``leave_working``
        # takes and ``_user_held`` leaves to the restore
        completed.append(
            Completed(
                cid,
                job,
                False,
                meta.entries,
                meta.directories,
                path,
                meta.max_parallelism,
                meta.working,
            )
        )
    keep = completed[-config.num_retained :] if completed else []
    for done in keep:
        _check_bytes(done, files)
        why = max_parallelism_refusal(done.max_parallelism, config.max_parallelism, done.entries)
        if why is not None:  # R77, before anything changes
            raise RecoveryError(f"{done.metadata}: {why}; nothing was deleted")
    _check_ids(keep)
    sp_metas = _numbered(rf"{SAVEPOINTS}/savepoint-(\d+)/{METADATA}", files)
    savepoints: dict[int, Completed] = {}
    for sid, path in sorted(sp_metas.items()):
        meta = reader.read_metadata(path)
        savepoints[sid] = Completed(
            sid,
            meta.job,
            True,
            meta.entries,
            meta.directories,
            path,
            meta.max_parallelism,
            meta.working,
        )
    dropped = _abandoned_files(gone, files, keep, savepoints)
    sp_dirs = {m.group(1) for p in files if (m := re.match(rf"({SAVEPOINTS}/savepoint-\d+)/", p))}
    interrupted = tuple(sorted(d for d in sp_dirs if f"{d}/{METADATA}" not in files))

    # Numbers already used under the root: new ids must not collide with any of them.
    tops = frozenset(p.split("/", 1)[0] for p in files)
    seqs = [
        int(m.group(2))
        for t in tops | {job, *abandoned}
        if (m := _JOB.match(t)) and t != SAVEPOINTS
    ]
    # the crashed job's first TMs were numbered from 1 up (the engine's, R64), whether or
    # not storage shows a file of theirs
    tm_nums = [job_spec.num_tms]
    tm_nums += [int(m.group(1)) for p in files if (m := re.match(r"[^/]+/taskowned/tm-(\d+)/", p))]
    # a TM in a process of its own marks its files' names (R64), also where it owns no
    # directory (NONE mode): a new attempt by that id would be taken for their creator
    tm_nums += [
        int(m.group(1))
        for p in files
        if (made := creator_of(p)) is not None and (m := re.fullmatch(r"tm-(\d+)", made))
    ]
    cids = [int(m.group(1)) for p in files if (m := re.match(r"[^/]+/chk-(\d+)/", p))] + [
        int(m.group(1)) for p in files if (m := re.match(rf"{SAVEPOINTS}/savepoint-(\d+)/", p))
    ]
    for base in (own, *gone):  # an abandoned incarnation's triggers used ids too (R50)
        cids += _published_pending(reader, base, files)

    vertices = job_spec.vertices
    if keep:
        # The crashed job may have run at other parallelisms than ``job_spec`` asks for
        # (an earlier rescale): the checkpoint's own subtasks say which, so that the
        # restore rescales (R75, R76) exactly when it must.
        was = {e.subtask.vertex: e.subtask.parallelism for e in keep[-1].entries}
        vertices = tuple(VertexSpec(v.name, was.get(v.name, v.parallelism)) for v in vertices)
    # What the HA services would have kept, derived from storage: ids past every one
    # used under the root (R50), the kept checkpoints as the checkpoint store.
    ha = HaState(
        job, max(seqs, default=0), max(cids, default=0) + 1, 0, 0, tuple(d.metadata for d in keep)
    )
    return _Crashed(
        job,
        gone,
        files,
        keep,
        tuple(sorted(savepoints)),
        dropped,
        interrupted,
        tops,
        _user_held(reader, own, files),
        ha,
        vertices,
        max(tm_nums) + 1,
    )


def recover(
    config: Config,
    job_spec: JobSpec,
    fs: Any,
    root: str,
    *,
    job: str = "job-0",
    ids: IdSource | None = None,
    background_deletes: bool = True,
    lease: bytes | None = None,
    leave_working: bool = False,
    abandoned: Sequence[str] = (),
    mode: RestoreMode = RestoreMode.CLAIM,
) -> tuple[InProcessEngine, RecoveryReport]:
    """``recover_coordinator`` hosted in process: an ``InProcessEngine`` that starts no TM
    of its own, whose coordinator is the recovered one and whose TMs are those the
    recovery's restore starts (named past every TM number the crashed job may have used).
    The arguments are ``recover_coordinator``'s."""
    crashed = _read_crashed(
        config, job_spec, Storage(fs, root, background_deletes=False), job, abandoned
    )
    cl = InProcessEngine(
        config,
        job_spec,
        fs,
        root,
        ids,
        job_id=job,
        background_deletes=background_deletes,
        start_tms=False,
    )
    cl.next_tm = crashed.next_tm
    co, report = _recover(
        crashed,
        config,
        job_spec,
        cl.storage,
        cl.ids,
        cl,
        lease=lease,
        leave_working=leave_working,
        mode=mode,
        log=cl.log,
    )
    cl.host(co)
    return cl, report


def recover_coordinator(
    config: Config,
    job_spec: JobSpec,
    fs: Any,
    root: str,
    engine: CoordinatorEngine,
    *,
    job: str = "job-0",
    ids: IdSource | None = None,
    background_deletes: bool = True,
    lease: bytes | None = None,
    leave_working: bool = False,
    abandoned: Sequence[str] = (),
    mode: RestoreMode = RestoreMode.CLAIM,
    deletion_log: bool = False,
) -> tuple[CheckpointCoordinator, Storage, RecoveryReport]:
    """A coordinator that continues the crashed ``job`` from what storage holds (R95,
    R96; see the module docstring), built on ``engine`` from the start: the engine names
    the new job's attempts (``start_tm``), is told where its subtasks run (``placed``) and
    is handed the restore's duties. Returns the coordinator, its storage and the report.

    ``abandoned``: incarnations the caller started after ``job`` (a recovery's, a
    rescale's new job) whose process died before they completed a checkpoint; the job
    goes on from ``job``'s latest, as it would have had they never started (R96). The
    caller vouches that they are its own and dead, as it does for ``job``; the recovery
    checks that none holds a ``chk-N/_metadata`` (then it, not ``job``, is the one to
    recover) and that no kept checkpoint or savepoint names a file of theirs, refuses
    otherwise before anything changes, and deletes their bases as garbage.
    ``mode``: how the new job restores the latest kept checkpoint: CLAIM (R72), or
    NO_CLAIM when the first abandoned incarnation was a NO_CLAIM restore of it (R73:
    that checkpoint is the user's since, and stays so).

    ``lease``: take the base over with this token (issue 14) once everything is read and
    validated and before the first delete, so that a writer still running there is fenced
    before its files are claimed or collected, and a refused recovery changes nothing.

    ``leave_working``: the databases in the working directories (§11) are a store's of
    their own that keeps bookkeeping no checkpoint refers to (SlateDB's manifests, which a
    clone from the kept checkpoint reads): of those directories the recovery takes only
    the files a kept checkpoint refers to in place (the coordinator's, R105 CLAIM),
    neither records nor deletes the rest, and opens no database of the model there; the
    caller's collector (the streaming job's ``slate_collect``) decides.

    ``deletion_log``: the coordinator keeps its whole deletion log, as
    ``CheckpointCoordinator(..., deletion_log=True)`` does."""
    crashed = _read_crashed(
        config, job_spec, Storage(fs, root, background_deletes=False), job, abandoned
    )
    storage = Storage(fs, root, background_deletes=background_deletes)
    co, report = _recover(
        crashed,
        config,
        job_spec,
        storage,
        ids if ids is not None else RandomIds(),
        engine,
        lease=lease,
        leave_working=leave_working,
        mode=mode,
        log=DeletionLog(deletion_log),
    )
    return co, storage, report


def _recover(
    crashed: _Crashed,
    config: Config,
    job_spec: JobSpec,
    storage: Storage,
    ids: IdSource,
    engine: CoordinatorEngine,
    *,
    lease: bytes | None,
    leave_working: bool,
    mode: RestoreMode,
    log: DeletionLog,
) -> tuple[CheckpointCoordinator, RecoveryReport]:
    """The recovery proper, on what ``_read_crashed`` found: take the lease, rebuild the
    coordinator from storage as a resumed one is (``fastimpl.resume.rebuild``, the one
    restart from storage) with no TM running, delete the garbage, then restore the latest
    kept checkpoint into a new job (or start one afresh)."""
    job, own, keep, files, dropped = (
        crashed.job,
        job_base(crashed.job),
        crashed.keep,
        crashed.files,
        crashed.dropped,
    )
    if lease is not None:  # before the rebuild's first delete
        storage.take_lease(lease, exclusive=False)
    listing = {p: n for p, n in files.items() if p not in dropped}
    if leave_working:
        in_place = {w.path for d in keep for _, w in d.working}
        listing = {p: n for p, n in listing.items() if not is_working_path(p) or p in in_place}
    co, garbage = rebuild(
        config,
        crashed.vertices,
        job_spec.num_tms,
        storage,
        ids,
        engine,
        crashed.ha,
        {},
        files=listing,
        user_held=crashed.user_held,
        log=log,
    )
    co.bases |= set(crashed.gone)  # the caller's own, as the crashed job's base is (I5)
    # the caller's collector decides about their databases, as for the crashed job's own
    left = {p for p in dropped if leave_working and is_working_path(p)}
    databases = {base_of(p) for p in left}
    for path in sorted(dropped - left):
        co.catalog.files[path] = StoredFile(files[path], False, COORDINATOR, None)
        co.catalog.delete_file(path, COORDINATOR)
        garbage.append(path)
    co.working.opens = not leave_working
    co.running = False  # the crashed job's end: nothing of it runs to be ended
    if keep:
        latest = keep[-1]
        want = tuple((v.name, v.parallelism) for v in job_spec.vertices)
        if mode is RestoreMode.NO_CLAIM:
            # R73 with R91: the kept checkpoints are the user's since the first abandoned
            # incarnation's NO_CLAIM restore; the rebuilt job ends retaining them (no TM
            # of it runs) before the same restore, which claims nothing
            co.end_job(retain=True)
        co.restore(c.Restore(latest.id, want, mode))
        if mode is RestoreMode.CLAIM:
            # The restore claimed the latest; the older retained ones stay retained too.
            for done in keep[:-1]:
                co._register(done)
            co.retained = list(keep)
            co.latest_completed = latest.id
    else:
        co.job_seq += 1
        co.job = f"job-{co.job_seq}"
        co.bases.add(job_base(co.job))
        co.lineage = {job_base(co.job)}
        tms = [engine.start_tm(co.job, co.next_checkpoint, None) for _ in range(job_spec.num_tms)]
        co.running = True
        co.deploy(engine.place(subtasks_of(co.vertices), tms))
    # Their databases are the caller's collector's to drop, which works in the lineage's
    # bases (``leave_working``): no checkpoint names them, so it deletes them whole.
    co.lineage |= databases
    co.collect_dirs()
    others = (own, SAVEPOINTS, *crashed.gone)
    report = RecoveryReport(
        crashed_job=job,
        new_job=co.job,
        checkpoints=tuple(d.id for d in keep),
        savepoints=crashed.savepoints,
        garbage=tuple(garbage),
        left_to_user=crashed.interrupted,
        left_alone=tuple(sorted(t for t in crashed.tops if t not in others)),
    )
    return co, report


def incarnation_to_recover(fs: Any, root: str, jobs: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Of ``jobs``, one application's incarnations oldest first (each a recovery or a
    restore of the one before), the one to ``recover`` and those to pass as
    ``abandoned``: the newest that completed a checkpoint (a ``chk-N/_metadata`` in its
    base) and every one after it. A new job whose process died before its first complete
    holds no state of its own; its predecessor's latest checkpoint is the job's state
    still (R96). None completed one: the first, and all the others abandoned."""
    if not jobs:
        raise RecoveryError("no job to recover")
    listed = Storage(fs, root, background_deletes=False).list_files()
    done = {
        m.group(1)
        for p in listed
        if (m := re.fullmatch(r"([^/]+)/chk-\d+/" + re.escape(METADATA), p)) is not None
    }
    at = max((i for i, j in enumerate(jobs) if job_base(j) in done), default=0)
    return jobs[at], tuple(jobs[at + 1 :])


def _check_abandoned(job: str, abandoned: Sequence[str]) -> tuple[str, ...]:
    """The bases of ``abandoned``, each a job id other than ``job`` and named once."""
    out: list[str] = []
    for a in abandoned:
        try:
            check_job(a, "<recover>", "abandoned")
        except MetadataError as err:
            raise RecoveryError(f"abandoned job {a!r}: {err.problem}") from None
        if a == job or job_base(a) in out:
            raise RecoveryError(f"abandoned job {a!r}: named twice, or as the crashed job")
        out.append(job_base(a))
    return tuple(out)


def _abandoned_files(
    bases: tuple[str, ...],
    files: dict[str, int],
    keep: list[Completed],
    savepoints: dict[int, Completed],
) -> set[str]:
    """The files of the abandoned ``bases``, once it is certain that they are garbage: no
    completed checkpoint there, and nothing a kept checkpoint or a savepoint names."""
    if not bases:
        return set()
    ours = {p for p in files if base_of(p) in bases}
    for path in sorted(ours):
        m = re.fullmatch(r"[^/]+/chk-(\d+)/" + re.escape(METADATA), path)
        if m is not None:
            raise RecoveryError(
                f"abandoned job {base_of(path)!r} completed checkpoint {m.group(1)} ({path}):"
                " it, not the crashed job, is the one to recover; nothing was deleted"
            )
    for done in [*keep, *savepoints.values()]:
        named = {s.path for e in done.entries if (s := stream_of(e.handle)) is not None}
        named |= {w.path for _, w in done.working}
        named |= {d for d in done.directories}
        hit = sorted(p for p in named if base_of(p) in bases)
        if hit:
            raise RecoveryError(
                f"{done.metadata} refers to {hit[0]!r} in an abandoned job's base: not"
                " garbage; nothing was deleted"
            )
    return ours


def _published_pending(reader: Storage, own: str, files: dict[str, int]) -> list[int]:
    """R50: the checkpoints the crashed job had triggered when it last published its
    state (``fastimpl.writer_state``, the streaming job's coordinator publishes at every
    trigger). Such a checkpoint may have left nothing under ``chk-N/`` (with merging its
    files lie in ``shared/`` and ``taskowned/``), so only the publication says its id was
    used; the new job's ids go past it. No publication: the ids storage shows."""
    path = f"{own}/{WRITER_STATE}"
    if path not in files:
        return []
    try:
        doc = json.loads(reader.read_range(path, 0, files[path]))
        return [int(p["checkpoint"]) for p in doc["pending"]]
    except (ValueError, KeyError, TypeError) as err:
        raise RecoveryError(
            f"{path}: not a writer state ({type(err).__name__}: {err}); nothing was deleted"
        ) from None


def _check_ids(keep: list[Completed]) -> None:
    """R54: one logical id names one extent in every kept checkpoint; otherwise their
    registration would conflict. Checked before anything changes (``decode`` checks one
    file on its own)."""
    seen: dict[str, tuple[Extent, str]] = {}
    for done in keep:
        for e in done.entries:
            s = stream_of(e.handle)
            if s is None:
                continue
            extent = extent_of(s)
            prev = seen.setdefault(s.logical_id, (extent, done.metadata))
            if prev[0] != extent:
                raise MetadataError(
                    done.metadata,
                    "payload.entries",
                    f"logical id {s.logical_id!r} names {extent}, but {prev[0]} in "
                    f"{prev[1]} (conflicting registration)",
                )


def _user_held(reader: Storage, own: str, files: dict[str, int]) -> set[str]:
    """The files of the crashed job's ``own`` base that a ``_metadata`` outside it names
    (a newer incarnation's checkpoint that claimed them, R72): never garbage. If one
    cannot be read, every file of ``own`` is kept. A kept checkpoint's ``_metadata`` and
    the files it refers to are claimed (R72) all the same: ``rebuild`` takes them out."""
    held: set[str] = set()
    mine = {p for p in files if base_of(p) == own}
    for path in sorted(p for p in files if base_of(p) != own and p.endswith(_META)):
        try:
            meta = reader.read_metadata(path)
        except MetadataError:
            held = set(mine)
            break
        held |= {s.path for e in meta.entries if (s := stream_of(e.handle)) is not None}
        held |= {w.path for _, w in meta.working}
        held |= {p for d in meta.directories for p in mine if is_under(p, d)}
    return held & mine
