"""A coordinator rebuilt from storage: the one restart of the product (R95, issue 16).

When the coordinator's process dies, nothing of it is left but what storage holds and what
the engine's HA services keep (Flink keeps the job id, the checkpoint id counter and the
pointers to the completed checkpoints' metadata in ZooKeeper or Kubernetes; here
``HaState``, which ``ha_state`` reads from a running coordinator and the engine persists).
``rebuild`` makes a new coordinator from those alone; every restart goes through it:

- ``resume``: the coordinator's process died while its TMs run on. The engine hands the
  HA state and the list of running TMs; after the rebuild every subtask restarts as in a
  failover (R60-R62), with the epoch after the HA one, so each TM applies the new
  coordinator's duties. The in-process engine's ``restart`` is this, with the engine's
  storage (whose failed deletes stay its own to retry, R45).
- ``fastimpl.recovery.recover_coordinator`` (``CheckpointStore.recover`` hosts it in
  process): the whole process died, no HA state survived and no TM runs. Recovery
  derives the HA state from storage (the job's latest ``num_retained`` ``_metadata``
  files, the highest ids used), rebuilds with no TM running, then restores the latest
  checkpoint into a new incarnation in CLAIM mode.

What the rebuild decides, file by file:

- the checkpoint store is the HA state's list of ``_metadata`` paths (``checkpoints``),
  or, without one, the latest ``num_retained`` ``chk-N/_metadata`` of the job's base. Each
  is read and validated (a ``MetadataError`` naming the file, before anything changes);
  they are retained and registered. What of them lies in a base of the job's lineage
  (its own, and those a CLAIM restore gave it, R72, I5) is the coordinator's: their
  ``_metadata``, the files they refer to and the files in their directories (R42, R43),
  so a claimed source is still owned and goes once subsumed;
- a ``_metadata`` under the job's base that the HA state does not list is an in-flight
  checkpoint's (its write was torn, or it completed after the HA state was taken and
  the coordinator died before telling anyone): never read, it is garbage like any other
  unknown file of the job's base. Without HA pointers (recovery) every ``_metadata`` of
  the base is read, and one that cannot be is refused: a damaged completed checkpoint
  cannot be told from a torn one, and deleting it could lose the job's state;
- the checkpoint the job restored from (``restored``, until it completes one of its own)
  is read again: each subtask's share of it is what the subtask starts from (R75, R76);
  after a NO_CLAIM restore it stays the user's (R73), never deleted;
- savepoints are the user's (R55): never deleted, never recorded as a checkpoint; the
  coordinator reads one back from storage when a job restores from it. Every file in the
  savepoints directory is the user's, except in the directory of a savepoint the HA
  state lists as not completed (in flight or aborted: the store's own, as the job's base
  is): what no running TM holds there goes. Without HA state (recovery) none is listed:
  what an interrupted savepoint left cannot be told from the user's, a leak, never a
  loss;
- working files (§11) the new coordinator holds as its own were handed over in place by
  acknowledgements (R100): shared, so its collection deletes each once no checkpoint
  refers to it and no live database uses it (R104), as the dead coordinator's would have;
- every file outside the lineage's bases, and those ``user_held`` names, are the user's;
- every other file of the job's own base that no running TM records (``Holdings``) was
  the dead coordinator's (taken from a stopped attempt, R64, or handed over for a pending
  checkpoint, R43): it is the new one's, and goes unless a kept checkpoint or the restore
  refers to it (R95: nothing retained is deleted, nothing unreferenced is kept). Files of
  a claimed base the dead coordinator did not hold by a kept checkpoint, or as a working
  file the HA state names (R105), are the user's (R91 gave them to the user when the
  claimed job ended).

A TM that is lost and may still run (R64) is not known to the new coordinator: a restart
waits until every attempt given up on is known stopped (R95's guard, ``none_lost``), and
the HA state names the stopped ones (``retired``) so that a late command of one is still
refused as a stopped attempt's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from attrs import frozen

from fastimpl.attempts import IdRuns, Span
from fastimpl.catalog import DeletionLog
from fastimpl.coordinator import CheckpointCoordinator, CoordinatorEngine
from fastimpl.ids import IdSource
from fastimpl.metadata import MetadataError, base_of
from fastimpl.records import Completed, ManagedDir, StoredFile
from fastimpl.redistribute import assign
from fastimpl.storage import Storage
from fastimpl.working import is_working_path
from spec.config import Config, VertexSpec
from spec.effects import COORDINATOR, USER
from spec.handles import FileHandle, stream_of
from spec.ids import SubtaskId, TmId
from spec.layout import METADATA, SAVEPOINTS, is_under, job_base, savepoint_dir
from spec.messages import Held, Holdings

log = logging.getLogger("fastimpl.coordinator")


@frozen
class HaState:
    """What the engine's HA services keep of a running coordinator (Flink's job id,
    checkpoint id counter and completed checkpoint store): enough for ids to keep
    increasing (R50), for TMs to tell the new coordinator's duties from the old one's, and
    for the new coordinator to know which ``_metadata`` files are completed checkpoints."""

    job: str
    job_seq: int
    next_checkpoint: int
    epoch: int
    watermark: int
    checkpoints: tuple[str, ...] | None = None
    """The retained checkpoints' ``_metadata`` paths, oldest first (Flink's completed
    checkpoint store keeps these pointers in ZooKeeper); None: the latest
    ``num_retained`` under the job's base."""
    lineage: tuple[str, ...] = ()
    """Bases besides the job's own whose files a CLAIM restore gave it (R72, I5)."""
    restored: str | None = None
    """The ``_metadata`` the running job restored from, until it completes its own."""
    savepoints: tuple[int, ...] = ()
    """Savepoints the store triggered that did not complete, in flight or aborted while
    files of its own may remain: their directories hold only the store's files (being
    written, handed over by acknowledgements, R43, or left by an abort)."""
    claimed_working: tuple[str, ...] = ()
    """The working files the coordinator holds in a claimed base (R105: a CLAIM restore
    opened them in place): its own, shared, until its collection finds no checkpoint
    and no live database using one (R104); no kept checkpoint need name them."""
    ended: tuple[str, ...] = ()
    """Bases of this store's earlier jobs outside the lineage (a NO_CLAIM restore ended
    them, R73, R91): what their retained checkpoints hold, files and directories, is the
    user's, read and never deleted."""
    retired: tuple[Span, ...] = ()
    """The attempts known stopped or ended with their job (the engine named them): a
    command of one is refused as a stopped attempt's (R56, R64), and one the placement
    still names is replaced at the failover that follows the rebuild."""


def ha_state(co: CheckpointCoordinator) -> HaState:
    """What the engine persists of ``co`` after each call (its HA services)."""
    own = job_base(co.job)
    restored = co.restored_from if co.restoring else None
    return HaState(
        co.job,
        co.job_seq,
        co.next_checkpoint,
        co.epoch,
        co.watermark,
        tuple(r.metadata for r in co.retained),
        tuple(sorted(b for b in co.lineage if b != own)),
        restored,
        tuple(
            sorted(
                n
                for n in co.triggered_savepoints
                if f"{savepoint_dir(n)}/{METADATA}" not in co.catalog.files  # not completed
            )
        ),
        tuple(
            sorted(
                p
                for p, f in co.catalog.files.items()
                if f.owner == COORDINATOR
                and is_working_path(p)
                and base_of(p) in co.lineage - {own}
            )
        ),
        tuple(sorted(co.bases - co.lineage - {own, SAVEPOINTS})),
        co.tm_book.tms.retired.spans(),
    )


def rebuild(
    config: Config,
    vertices: tuple[VertexSpec, ...],
    num_tms: int,
    storage: Storage,
    ids: IdSource,
    engine: CoordinatorEngine,
    ha: HaState,
    placement: dict[SubtaskId, TmId],
    *,
    files: dict[str, int] | None = None,
    user_held: Iterable[str] = (),
    deletion_log: bool = False,
    log: DeletionLog | None = None,
) -> tuple[CheckpointCoordinator, list[str]]:
    """A coordinator for job ``ha.job`` whose subtasks run where ``placement`` says (those
    TMs alive; none after a crash of the whole process), and the paths it deleted as
    garbage; see the module docstring. ``files``: storage's listing, if the caller has
    it. Everything is read and validated before the first delete. ``log``: a deletion log
    shared with the host's TMs (``CheckpointCoordinator``'s)."""
    co = CheckpointCoordinator(
        config, vertices, num_tms, storage, ids, engine, ha.job, deletion_log=deletion_log, log=log
    )
    storage.forget_decided()  # a dead coordinator's deletes its host never performed
    if files is None:
        storage.drain()  # the deletes decided before run first: the listing is what stays
        files = storage.list_files()
    files = _not_being_deleted(files, storage)
    own = job_base(ha.job)
    lineage = {own, *ha.lineage}
    if ha.checkpoints is None:
        pattern = re.compile(rf"{re.escape(own)}/chk-(\d+)/{METADATA}")
        found = sorted((int(m.group(1)), p) for p in files if (m := pattern.fullmatch(p)))
        loaded = [co.load_completed(path, ha.job) for _, path in found]  # validated first
        keep = [d for d in loaded if not d.savepoint][-config.num_retained :]
    else:
        keep = [_load(co, path) for path in ha.checkpoints]
    restored = None if ha.restored is None else _load(co, ha.restored)
    user = set(user_held) - {p for d in keep for p in _paths_of(d)}

    co.job_seq = ha.job_seq
    co.next_checkpoint = ha.next_checkpoint
    co.epoch = ha.epoch
    co.watermark = ha.watermark
    co.lineage = set(lineage)
    co.bases |= lineage | set(ha.ended)
    co.placement = dict(placement)
    co.savepoint_ids |= set(ha.savepoints)
    co.triggered_savepoints |= set(ha.savepoints)
    in_flight = {savepoint_dir(n) for n in ha.savepoints}
    co.tm_book.tms.retired = IdRuns.of_spans(ha.retired)
    for t in sorted(set(placement.values())):
        if t not in co.tm_book.tms:  # a stopped one stays retired, and the failover replaces it
            co._add_tm(t)

    claimed: set[str] = set()
    for done in keep:
        if base_of(done.metadata) not in lineage:
            continue  # the user's checkpoint (R72 outside the lineage): read, never deleted
        claimed |= {p for p in _taken(done, own) if p in files and base_of(p) in lineage}
        for d in done.directories:
            if base_of(d) not in lineage:
                co.catalog.dir_owner.setdefault(d, USER)  # read, never deleted (I5)
                continue
            if base_of(d) != own:  # a claimed job's directory goes whole (R42, R72)
                claimed |= {p for p in files if is_under(p, d)}
            co.catalog.dir_owner[d] = COORDINATOR  # R42
            md = co.catalog.dirs.setdefault(d, ManagedDir(d, ""))  # its creator is not known
            md.handed_over = True
    claimed |= {p for p in ha.claimed_working if p in files and base_of(p) in lineage}
    claimed -= user
    for d in _users_directories(co, files, ha.ended):
        co.catalog.dir_owner.setdefault(d, USER)  # R91: read, never deleted (I5)
    for path, size in files.items():
        ours = base_of(path) == own or base_of(path) in in_flight
        mine = path in claimed or (ours and path not in user)
        if path in claimed or not mine:
            co.catalog.files[path] = StoredFile(size, False, COORDINATOR if mine else USER, None)
    for done in keep:
        co._register(done)
        co.retained.append(done)
    co.latest_completed = keep[-1].id if keep else 0
    if restored is not None:
        share = assign(restored.entries, co.vertices, config.max_parallelism)
        co.restoring = tuple(e for s in sorted(share) for e in share[s])
        co.assignment = {s: tuple(v) for s, v in share.items()}

    unknown = {p for p in files if p not in co.catalog.files}
    held: set[str] = set()
    if unknown:
        asked = tuple(sorted({p.rsplit("/", 1)[0] for p in unknown}))
        for t in co.current_tms():
            answer = engine.duty(t, Holdings(ha.job, t, asked))
            if isinstance(answer, Held):
                held |= set(answer.paths)
    garbage: list[str] = []
    for path in sorted(unknown - held):  # what no running TM holds is the coordinator's
        co.catalog.files[path] = StoredFile(files[path], False, COORDINATOR, None)
        if placement and is_working_path(path):
            # R104: handed over in place, and a live database may use it: its collection
            # asks them (below); with no TM running (a recovery) nothing uses it
            continue
        if not co.referenced(path):  # R95: what the dead coordinator held for nothing goes
            co.catalog.delete_file(path, COORDINATOR)
            garbage.append(path)
    # R100, R104: a working file is the coordinator's only once an acknowledgement handed
    # it over (a stopped attempt's others went at its stop, R64): shared for good, so its
    # collection deletes it once no checkpoint refers to it and no live database uses it
    co.working.shared |= {
        p for p, f in co.catalog.files.items() if f.owner == COORDINATOR and is_working_path(p)
    }
    return co, garbage


def resume(
    config: Config,
    vertices: tuple[VertexSpec, ...],
    storage: Storage,
    ids: IdSource,
    engine: CoordinatorEngine,
    ha: HaState,
    placement: dict[SubtaskId, TmId],
    *,
    deletion_log: bool = False,
) -> CheckpointCoordinator:
    """A new coordinator for the running job ``ha.job`` whose subtasks run where
    ``placement`` says (all those TMs alive); see the module docstring."""
    num_tms = len(set(placement.values()))
    co, _ = rebuild(
        config, vertices, num_tms, storage, ids, engine, ha, placement, deletion_log=deletion_log
    )
    co.failover()
    return co


def _users_directories(
    co: CheckpointCoordinator, files: dict[str, int], ended: tuple[str, ...]
) -> list[str]:
    """R91: the directories the retained checkpoints of this store's ended jobs name (the
    ``_metadata`` left in their bases); one that cannot be read is the user's file all the
    same, and names nothing here."""
    out: list[str] = []
    for path in sorted(files):
        if base_of(path) in ended and path.endswith(f"/{METADATA}"):
            try:
                out += _load(co, path).directories
            except MetadataError as err:
                log.warning("the user's %s is not read: %s", path, err)
    return out


def _not_being_deleted(files: dict[str, int], storage: Storage) -> dict[str, int]:
    """The listing without what the storage keeps failing to delete (R45): those deletes
    were decided and are the storage's to retry (``RetryDeletes``), not garbage to find
    again (a storage that survives the coordinator: the in-process engine's)."""
    failed = storage.failed_deletes
    if not failed:
        return files
    dirs = [d for d, f in failed.items() if f.is_dir]
    return {
        p: n for p, n in files.items() if p not in failed and not any(is_under(p, d) for d in dirs)
    }


def _load(co: CheckpointCoordinator, path: str) -> Completed:
    """A checkpoint the HA state names, validated; its job is the one its base names."""
    return co.load_completed(path, base_of(path) if not path.startswith(SAVEPOINTS) else None)


def _paths_of(done: Completed) -> set[str]:
    """What a kept checkpoint refers to: never the user's, whatever a ``_metadata``
    elsewhere names (an older kept one is not re-claimed by the restore of the latest,
    and a user's file would stay on storage after it is subsumed)."""
    return (
        {done.metadata}
        | {s.path for e in done.entries if (s := stream_of(e.handle))}
        | {w.path for _, w in done.working}  # working state (§11): R105, in place
    )


def _taken(done: Completed, own: str) -> set[str]:
    """What of ``done`` is the coordinator's for certain: its ``_metadata``, the whole
    files its acknowledgements handed over (R43), the working files they handed over in
    place (R100, R105), and everything it names in a claimed job's base (R72). A
    segment's file in the job's own base may still be a running TM's (it appends to it,
    R30): whose it is, the TMs say (``Holdings``)."""
    return (
        {done.metadata}
        | {
            s.path
            for e in done.entries
            if (s := stream_of(e.handle)) is not None
            and (isinstance(e.handle, FileHandle) or base_of(s.path) != own)
        }
        | {w.path for _, w in done.working}
    )
