"""What one subtask does with one micro-batch under ``--state-backend working``: its keyed
state is a SlateDB on the checkpoint storage (``slate``), and a checkpoint refers to that
database's files where they are (SPEC §11, R100-R106) instead of uploading a copy.

Per task: take the subtask's TM from the local home (``<work>/<subtask>/db``, which now
holds only the TM's records and a marker: the database itself is remote, so any worker
opens it), open the database where it is if it is at the latest completed checkpoint,
else restore (R105: a clone from the checkpoint's SlateDB checkpoint into a new database
directory, projected on the subtask's key groups after a rescale; under NO_CLAIM a copy,
since the user's files are never referred to); count the batch, emit the closed windows,
and snapshot (R103):

1. flush the memtable (one whole SST, R101) and create a SlateDB checkpoint
   ``chk-<c>``, which pins its manifest and every SST the manifest names;
2. the TM records the manifest's SSTs as what the database uses (new ones are its
   private files, ``Databases.track``) and refers to each in place (pinned until the
   acknowledgement hands it to the coordinator);
3. the manifest itself, a small file, is copied into the checkpoint as a merged segment
   named ``db:<manifest path>#<SlateDB checkpoint id>`` (R103's small file): the
   restore's pointer, checked against the manifest in place before a clone;
4. the operator state (progress) as in the RocksDB backend.

After the acknowledgement the database shuts down and the TM records its latest manifest
(a compaction may have replaced files meanwhile: R102 deletes the private ones at once).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import fsspec  # type: ignore[import-untyped]

from pipeline.stream import slate
from pipeline.stream.batch_order import BatchOrder, SubtaskResult
from pipeline.stream.checkpointing import VERTEX, decode_assignment
from pipeline.stream.kills import sigkill
from pipeline.stream.local_db import put_back, sweep_leftovers
from pipeline.stream.partial_counts import tally
from pipeline.stream.snapshot import OPERATOR_STATE, SnapshotStats, read_marker, write_marker
from pipeline.stream.words import MAX_PARALLELISM
from pipeline.stream.worker_tm import WorkerTaskManager
from pipeline.stream.working_names import Pointer, new_db_dir, pointer_name, pointers
from spec.config import StateKind
from spec.errors import CkptError, UsageError
from spec.handles import InPlaceFile
from spec.ids import SubtaskId
from spec.keygroups import key_group_range


class RestoreError(CkptError, ValueError):
    """A checkpoint's manifest in place differs from the checkpoint's copy of it: the
    database there is not the one the checkpoint was taken of (nothing is cloned)."""


class Sizes:
    """The sizes of objects on the checkpoint storage, one listing per directory. An SST
    is written whole and never changed (R101), so a size once known stays right: only
    the directories of the others are listed."""

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        self.fs, root = fsspec.core.url_to_fs(url, **dict(storage_options))
        self.root = str(root).rstrip("/")

    def __call__(
        self, paths: Iterable[str], known: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        by_dir: dict[str, list[str]] = {}
        out: dict[str, int] = {}
        for p in paths:
            if known is not None and p in known:
                out[p] = known[p]
            else:
                by_dir.setdefault(p.rsplit("/", 1)[0], []).append(p)
        for d, ps in by_dir.items():
            self.fs.invalidate_cache(f"{self.root}/{d}")  # s3fs caches listings
            listing = {
                str(i["name"]).rstrip("/")[len(self.root) + 1 :]: int(i.get("size") or 0)
                for i in self.fs.ls(f"{self.root}/{d}", detail=True)
            }
            for p in ps:
                if p not in listing:
                    raise FileNotFoundError(f"{p}: a manifest names it, storage has none")
                out[p] = listing[p]
        return out

    def read(self, path: str) -> bytes:
        self.fs.invalidate_cache()  # SlateDB wrote it after our last listing
        return bytes(self.fs.cat_file(f"{self.root}/{path}"))


def take_working_snapshot(
    db: slate.SlateCounts,
    party: WorkerTaskManager,
    checkpoint: int,
    subtask: SubtaskId,
    sizes: Sizes,
    operator_state: bytes,
    hook: Callable[[str], None],
) -> SnapshotStats:
    """Steps 1-4 of the module docstring; the stats count what the snapshot wrote (the
    manifest's copy and the operator state) and what it refers to in place."""
    before = set(party.tm.database_files())
    db.flush()
    checkpoint_id, manifest_id = db.checkpoint(checkpoint)
    files = db.files(manifest_id)
    found = sizes(files.all, party.known_sizes())
    party.track(subtask, found, db.lineage)
    flushed = sum(n for p, n in found.items() if p not in before)
    in_place = party.snapshot_working(checkpoint, subtask)
    hook("mid-upload")
    manifest = sizes.read(f"{db.lineage}/manifest/{manifest_id:020d}.manifest")
    name = pointer_name(db.lineage, manifest_id, checkpoint_id)
    party.write(checkpoint, subtask, StateKind.KEYED_SHARED, name, manifest)
    party.write(checkpoint, subtask, StateKind.OPERATOR_LIST, OPERATOR_STATE, operator_state)
    hook("uploaded")
    return SnapshotStats(
        uploaded=0,
        uploaded_bytes=0,
        reused=0,
        exclusive=2,
        exclusive_bytes=len(manifest) + len(operator_state),
        local_files=(),
        in_place=len(in_place),
        in_place_bytes=sum(f.length for f in in_place),
        db_written_bytes=flushed,
    )


_OPEN: list[slate.SlateCounts] = []
"""The databases this process has open (``halt_all``)."""


def halt_all() -> None:
    """Stop every database of this process as its death would (tests: a simulated kill
    runs no cleanup, but a dead process's database stops writing)."""
    while _OPEN:
        db = _OPEN.pop()
        try:
            db.close()
        except Exception:
            pass


def _open(
    loop: slate.Loop, place: slate.Place, lineage: str, store: Any, *, compactor: bool = True
) -> slate.SlateCounts:
    db = slate.SlateCounts(loop, place, lineage, store=store, compactor=compactor)
    _OPEN.append(db)
    return db


def _restore(
    loop: slate.Loop,
    place: slate.Place,
    store: Any,
    party: WorkerTaskManager,
    subtask: SubtaskId,
    epoch: int,
    sources: Sequence[Pointer],
    sizes: Sizes,
    known: Mapping[str, int],
    *,
    project: bool,
    copy: bool,
) -> tuple[slate.SlateCounts, dict[str, int] | None]:
    """R105: a new database for ``subtask`` from ``sources`` (each checked against the
    manifest in place first). A clone refers to the sources' SSTs in place, and the TM
    opens them as restored files; a copy (NO_CLAIM) reads the rows and writes its own.
    With the database, the files its manifest names and their sizes (``None`` for a
    copy): those the restored checkpoint refers to in place are as large as its
    ``_metadata`` says (``known``), so only others are listed. A clone of one database
    whose L0 is small opens without its compactor (``slate.QUIET_L0``): then the manifest
    read before the open is the database's, and none is read after it. A rescale's clone
    opens with it: its L0 unites the L0 SSTs of every source, and compacting them early
    lets the old databases go (with its first compaction put off, the bench's space
    amplification after a rescale 4 -> 3 rose from about 1.9 to 2.1, above the bound)."""
    groups = key_group_range(MAX_PARALLELISM, subtask.parallelism, subtask.index)
    for s in sources:
        if sizes.read(s.manifest_path) != party.read(s.entry):
            raise RestoreError(f"{s.manifest_path} differs from the checkpoint's copy of it")
    target = new_db_dir(party.tm.job, subtask)
    if copy:
        db = _open(loop, place, target, store)
        for s in sources:
            db.put_all(slate.read_checkpoint(loop, place, s.lineage, s.checkpoint_id, groups))
        return db, None
    slate.clone(
        loop, place, target, [(s.lineage, s.checkpoint_id, groups if project else None)
                              for s in sources], store,
    )  # fmt: skip
    quiet = False
    if not project and len(sources) == 1:
        files = slate.files_of(loop, place, target, store)
        quiet = files.l0 <= slate.QUIET_L0
    db = _open(loop, place, target, store, compactor=not quiet)
    if not quiet:
        files = db.files()  # a compaction may have begun at the open
    found = sizes(files.all, known)
    party.open_restored(
        subtask,
        epoch,
        [InPlaceFile(p, found[p], writer_groups(p)) for p in sorted(files.external)],
    )
    return db, found


def writer_groups(path: str) -> tuple[int, int]:
    """The key groups of the subtask whose database wrote ``path`` (its working
    directory's name, ``<vertex>-<index>-<parallelism>``): a clone of a clone refers to
    SSTs of databases further back than its sources."""
    name = path.split("/")[3]
    _, index, parallelism = name.rsplit("-", 2)
    return key_group_range(MAX_PARALLELISM, int(parallelism), int(index))


def run_working_subtask(
    order: BatchOrder,
    index: int,
    attempt: str,
    streams: Iterable[bytes],
    *,
    attempt_number: int = 0,
    die: Callable[[str], NoReturn] = sigkill,
) -> SubtaskResult:
    """``subtask.run_subtask`` for the working backend (see the module docstring)."""

    def hook(point: str) -> None:
        if order.failures.kills(point, order.batch_id, index, attempt_number):
            die(point)

    started = time.perf_counter()
    subtask = SubtaskId(VERTEX, index, order.parallelism)
    assignment = decode_assignment(order.assignments[index])
    if assignment.subtask != subtask:
        raise UsageError(f"the assignment of {subtask} names {assignment.subtask}")
    recipe = order.recipe
    place = slate.Place(recipe.url, dict(recipe.storage_options))
    store = place.store()  # one object store for every SlateDB call of the task
    sizes = Sizes(recipe.url, recipe.storage_options)
    home = Path(order.work_dir) / subtask.dir_name()
    home.mkdir(parents=True, exist_ok=True)
    mine = home / f"db.{attempt}"
    shared = home / "db"
    if order.sweep_local:
        sweep_leftovers(home, keep={shared.name, mine.name})
    lo, hi = key_group_range(MAX_PARALLELISM, order.parallelism, index)
    sources = pointers(assignment.entries)
    rescaled = order.restoring and any(s.key_groups != (lo, hi) for s in sources)
    if mine.exists():
        shutil.rmtree(mine)
    try:
        shared.rename(mine)
        taken = True
    except FileNotFoundError:
        mine.mkdir()
        taken = False
    marker = read_marker(mine) if taken else None
    # The TM survives an aborted checkpoint (its records are here, and the abort's notice
    # in the mail); a task killed before it put its records back left them in a directory
    # the sweep removed: a new attempt. So is one killed after it put them back (the
    # ``put-back`` kill): its TM acknowledged this very checkpoint in a result the driver
    # never received, and going on with it would write the checkpoint twice under one TM,
    # the first copy's files live for the TM and referred to by nothing (I6 once quiet),
    # and after a restore open the restored files again at the same epoch, which the TM
    # skips (refusing the clone's files as foreign).
    written = marker is not None and marker[0] >= order.checkpoint
    party = recipe.open(mine if taken and not written else None, subtask, order.checkpoint)
    loop = slate.Loop()
    db: slate.SlateCounts | None = None
    restored = False
    try:
        party.apply_mail(order.mail)
        at = {s.lineage for s in sources}
        # After a failover's reset (R60, R105) the database restarts at the retained
        # checkpoint, not at its latest manifest: the reset closed it and released the
        # private files written after that checkpoint (a compaction's outputs)
        in_place = (
            not order.restoring
            and not party.reset
            and marker is not None
            and party.lineage is not None
            and marker == (assignment.latest_completed, party.lineage)
            and at == {party.lineage}
        )
        found: dict[str, int] | None = None
        if in_place:
            assert party.lineage is not None
            db = _open(loop, place, party.lineage, store)
        else:
            party.close_database(subtask)
            if sources:
                restored = True
                db, found = _restore(
                    loop, place, store, party, subtask, order.checkpoint, sources, sizes,
                    order.in_place, project=rescaled, copy=order.restoring and order.no_claim,
                )  # fmt: skip
            else:
                db = _open(loop, place, new_db_dir(recipe.job, subtask), store)
        if found is None:
            found = sizes(db.files().all, party.known_sizes())
        party.track(subtask, found, db.lineage)
        ready = time.perf_counter() - started
        batch = tally(streams, order.windowing, order.watermark)
        n, late, max_event = batch.records, batch.late, batch.max_event
        db.add(batch.counts)
        closed = db.close_windows(range(lo, hi + 1), order.windowing, order.watermark)
        progress = json.dumps(
            {
                "batch": order.batch_id,
                "checkpoint": order.checkpoint,
                "watermark": order.watermark,
                "max_event": max_event,
                "records": n,
                "lineage": db.lineage,
            },
            sort_keys=True,
        ).encode()
        hook("before-snapshot")
        snap_start = time.perf_counter()
        stats = take_working_snapshot(db, party, order.checkpoint, subtask, sizes, progress, hook)
        ack = party.acknowledge(order.checkpoint, subtask)
        snap_seconds = time.perf_counter() - snap_start
        hook("acknowledged")
        db.settle()
        db.close()
        _OPEN.remove(db)
        # A compaction may have replaced files since the snapshot: the TM records the
        # manifest the next task opens (R102 deletes the private files it dropped).
        party.track(subtask, sizes(db.files().all, party.known_sizes()), db.lineage)
    except Exception:
        if db is not None:
            db.close()
            if db in _OPEN:
                _OPEN.remove(db)
        party.close()
        loop.close()
        shutil.rmtree(mine, ignore_errors=True)  # the TM's records go: a new attempt
        raise
    loop.close()
    party.save(mine)
    report = party.report()
    party.close()
    write_marker(mine, order.checkpoint, db.lineage)
    put_back(mine, shared)
    hook("put-back")
    return SubtaskResult(
        index,
        attempt,
        attempt_number,
        ack,
        n,
        late,
        max_event,
        restored,
        stats,
        tuple(sorted(closed)),
        report,
        party.created,
        ready,
        snap_seconds,
    )
