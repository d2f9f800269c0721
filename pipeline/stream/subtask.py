"""What one subtask does with one micro-batch, on a worker: find or restore its RocksDB,
count the batch's words into their windows, emit and forget the windows the watermark
closed, snapshot for the batch's checkpoint and acknowledge.

Spark gives a subtask no affinity to a worker: consecutive batches of one partition run
in different Python processes. So the DB lives on the executor's local disk under
``<work>/<subtask>/db``, and a task takes it by renaming it to ``db.<attempt>`` (atomic:
two attempts of one subtask never open one DB, and RocksDB's LOCK would refuse the second
anyway), and puts it back when its acknowledgement is ready (set aside, never replacing
another attempt's: ``local_db.put_back``). A DB that is not at the latest completed checkpoint
(its checkpoint was aborted, another attempt's was accepted, or it is missing: a new
worker, a task retried elsewhere) is dropped and restored from the restore assignment. The
subtask's TM (``worker_tm``) is saved in the DB's directory and travels with it: a DB
dropped or restored means a new TM attempt.

Nothing here depends on Spark: ``run_subtask`` takes the partition's streams of counts.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NoReturn

from pipeline.stream.batch_order import BatchOrder, SubtaskResult
from pipeline.stream.checkpointing import VERTEX, decode_assignment
from pipeline.stream.kills import log_kill, sigkill
from pipeline.stream.local_db import SET_ASIDE, put_back, sweep_leftovers
from pipeline.stream.partial_counts import tally
from pipeline.stream.rocks import WindowCounts, new_lineage, options
from pipeline.stream.snapshot import (
    SnapshotStats,
    lineage_of,
    read_marker,
    restore,
    restore_key_groups,
    reusable,
    take_snapshot,
    write_marker,
)
from pipeline.stream.words import MAX_PARALLELISM
from pipeline.stream.worker_tm import deliver_mail
from pipeline.stream.working_names import PointerError, pointers
from pipeline.stream.working_task import run_working_subtask
from spec.errors import UsageError
from spec.handles import StateEntry
from spec.ids import SubtaskId
from spec.keygroups import key_group_range


def subtask_dir(work_dir: str, subtask: SubtaskId) -> Path:
    return Path(work_dir) / subtask.dir_name()


def run_subtask(
    order: BatchOrder,
    index: int,
    attempt: str,
    streams: Iterable[bytes],
    *,
    attempt_number: int = 0,
    die: Callable[[str], NoReturn] = sigkill,
) -> SubtaskResult:
    """Process subtask ``index``'s part of a batch: ``streams`` of partial counts of its
    records (Arrow IPC, ``partial_counts.partial_counts``), one per source partition.

    ``attempt`` names this attempt uniquely (its local directories); ``attempt_number``
    counts the retries of the task (0 first); ``die`` is how an injected failure kills it.
    """

    if order.backend == "working":
        return run_working_subtask(
            order, index, attempt, streams, attempt_number=attempt_number, die=die
        )

    def hook(point: str) -> None:
        f = order.failures
        if f.stalls(point, order.batch_id, index, attempt_number):
            time.sleep(f.stall_s)
        if f.kills(point, order.batch_id, index, attempt_number):
            log_kill(order.work_dir, order.batch_id, index, attempt_number, point)
            die(point)

    started = time.perf_counter()
    subtask = SubtaskId(VERTEX, index, order.parallelism)
    reader = order.recipe.reader()
    assignment = decode_assignment(order.assignments[index])
    if assignment.subtask != subtask:
        raise UsageError(f"the assignment of {subtask} names {assignment.subtask}")
    home = subtask_dir(order.work_dir, subtask)
    home.mkdir(parents=True, exist_ok=True)
    mine = home / f"db.{attempt}"
    shared = home / "db"
    if order.sweep_local:
        sweep_leftovers(home, keep={shared.name, mine.name})
    restored = False
    lo, hi = key_group_range(MAX_PARALLELISM, order.parallelism, index)
    # After a rescale the restored DBs hold other key groups too: never taken up whole.
    rescaled = order.restoring and any(
        e.kind.keyed and e.key_groups is not None and e.key_groups != (lo, hi)
        for e in assignment.entries
    )
    opt = options(
        write_buffer_size=order.write_buffer_size,
        auto_compactions=order.auto_compactions,
        l0_compaction_trigger=order.l0_compaction_trigger,
        bloom_bits=order.bloom_bits,
    )
    lineage = (
        None
        if rescaled or not order.snapshot
        else _take(home, mine, assignment.latest_completed, lineage_of(assignment.entries))
    )
    taken = lineage is not None
    if lineage is None:
        lineage = new_lineage()
        if not order.snapshot:
            _take_any(shared, mine)
        elif rescaled:
            restored = True
            restore_key_groups(reader, assignment.entries, mine, (lo, hi), opt)
        elif assignment.entries:
            restored = True
            restore(reader, assignment.entries, mine)
    # The subtask's TM comes with its DB when the DB is the latest completed checkpoint's;
    # otherwise this task starts a new TM attempt (``worker_tm``).
    party = (
        order.recipe.open(mine if taken else None, subtask, order.checkpoint)
        if order.snapshot
        else None
    )
    base = {} if order.restoring else reusable(assignment.entries)
    db = WindowCounts(mine, opt)
    ready = time.perf_counter() - started
    try:
        if party is not None:
            party.on_delete = lambda: hook("deleting")
            party.apply_mail(order.mail)
            party.on_delete = None
        batch = tally(streams, order.windowing, order.watermark)
        n, late, max_event = batch.records, batch.late, batch.max_event
        db.add(batch.counts)
        closed = db.close_windows(range(lo, hi + 1), order.windowing, order.watermark)
        if order.compact_every and order.checkpoint % order.compact_every == 0:
            db.db.compact_range(None, None)
        progress = json.dumps(
            {
                "batch": order.batch_id,
                "checkpoint": order.checkpoint,
                "watermark": order.watermark,
                "max_event": max_event,
                "records": n,
                "lineage": lineage,
            },
            sort_keys=True,
        ).encode()
        if party is None:
            db.close()
            put_back(mine, shared)
            return SubtaskResult(
                index, attempt, attempt_number, b"", n, late, max_event, False,
                SnapshotStats(0, 0, 0, 0, 0, ()), tuple(sorted(closed)),
            )  # fmt: skip
        hook("before-snapshot")
        snap_start = time.perf_counter()
        stats = take_snapshot(
            db,
            party,
            order.checkpoint,
            subtask,
            lineage=lineage,
            base=base,
            scratch=home,
            operator_state=progress,
            hook=hook,
        )
        ack = party.acknowledge(order.checkpoint, subtask)
        snap_seconds = time.perf_counter() - snap_start
        hook("acknowledged")
    except Exception:
        db.close()
        if party is not None:
            party.close()
        shutil.rmtree(mine, ignore_errors=True)  # ahead of every checkpoint: useless now
        raise
    db.close()
    party.save(mine)
    report = party.report()
    party.close()
    write_marker(mine, order.checkpoint, lineage)
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


def deliver(order: BatchOrder, index: int) -> bytes:
    """Apply the mail to subtask ``index``'s TM where no batch follows (the end of a run:
    the last complete's notices, so that each TM deletes what it no longer needs); its
    report, or b"" when the subtask has no TM of this job here. The TM is the one saved
    with the DB the latest completed checkpoint was taken of (``order.assignments``),
    found as a task finds it (``_take``): a DB a late attempt put back is not it."""
    subtask = SubtaskId(VERTEX, index, order.parallelism)
    home = subtask_dir(order.work_dir, subtask)
    shared = home / "db"
    mine = home / f"db.deliver-{uuid.uuid4().hex[:8]}"
    assignment = decode_assignment(order.assignments[index])
    if _take(home, mine, assignment.latest_completed, _lineage(order, assignment.entries)) is None:
        return b""
    try:
        out = deliver_mail(order.recipe, mine, subtask, order.mail)
    finally:
        put_back(mine, shared)
    return out


def _lineage(order: BatchOrder, entries: Sequence[StateEntry]) -> str | None:
    """The lineage the local state of the subtask's latest completed checkpoint is marked
    with: the RocksDB's (``lineage_of``), or with ``working`` the SlateDB directory its one
    pointer names (``working_task`` marks its TM's records so); ``None`` when unknown."""
    if order.backend != "working":
        return lineage_of(entries)
    try:
        found = {p.lineage for p in pointers(entries)}
    except PointerError:
        return None  # not one of ours: no local state is taken for it
    return found.pop() if len(found) == 1 else None


def _take(home: Path, mine: Path, latest_completed: int, lineage: str | None) -> str | None:
    """Take the local DB checkpoint ``latest_completed`` was taken of (at that checkpoint,
    and of the lineage its metadata names), from those attempts put back (``db``, and
    those set aside, ``put_back``): its lineage, else ``None`` (and no DB at ``mine``).
    A DB at the right checkpoint but of another lineage is another attempt's (a
    speculative loser's): its SSTs are not the uploads the checkpoint names under the
    same file names, so reusing it would be wrong. Every DB that is not the one is of no
    use to any attempt of this batch, and is removed; its attempt put it back, so it
    touches it no more."""
    if mine.exists():
        shutil.rmtree(mine)  # this attempt's id is new: a leftover is nobody's
    found: str | None = None
    for candidate in [home / "db", *sorted(home.glob(f"db.*{SET_ASIDE}"))]:
        claimed = mine if found is None else mine.with_name(f"{mine.name}.drop")
        try:
            candidate.rename(claimed)  # atomic: a concurrent attempt takes it or we do
        except FileNotFoundError:
            continue
        marker = read_marker(claimed)
        if found is None and latest_completed > 0 and marker == (latest_completed, lineage):
            found = marker[1]
        else:
            shutil.rmtree(claimed)
    return found


def _take_any(shared: Path, mine: Path) -> None:
    """Without checkpoints (the baseline) the local DB is the state, whatever it is at."""
    if mine.exists():
        shutil.rmtree(mine)
    try:
        shared.rename(mine)
    except FileNotFoundError:
        pass
