"""The reuse-after-a-decided-delete races of BRIEF §10 against the streaming job's own
RocksDB snapshot code (``pipeline/stream``: real RocksDB through rocksdict, real files on
a local checkpoint base, no Spark). The same races on the model, with the tickets' text and
where it was read, are in ``tests/test_reuse_races.py``.

Every step is followed by the store's invariants on the real files (I1-I5: no retained
checkpoint names a missing file, nothing is deleted twice or by a non-owner), and every
scenario ends by restoring each subtask's latest completed checkpoint into a fresh
directory and reading its window counts back against the batch computation over the same
input, besides comparing every emitted window.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
from pathlib import Path

import pytest

from fastimpl.taskmanager import TaskManager
from pipeline.stream import subtask as subtask_module
from pipeline.stream.batch_order import SubtaskResult
from pipeline.stream.checkpointing import VERTEX, decode_assignment
from pipeline.stream.coordination import open_coordinator
from pipeline.stream.rocks import WindowCounts, options
from pipeline.stream.snapshot import read_marker, restore, reusable, take_snapshot
from pipeline.stream.subtask import run_subtask
from pipeline.stream.worker_tm import StateReader, WorkerTaskManager
from spec.config import Config, MergingMode, StateKind
from spec.handles import FileHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.messages import decode_message
from tests.stream_harness import LocalJob

MODES = list(MergingMode)
S0 = SubtaskId(VERTEX, 0, 1)
_verify = itertools.count()


# ---------------------------------------------------------------------------- helpers


def files_hold(job: LocalJob, *results: SubtaskResult) -> None:
    """I1-I5 on the real files of the checkpoint base, now; ``results``: tasks whose
    results the driver has not received (the test's knowledge: their TMs' records, and
    the whole files their acknowledgements hand over, R43, still the sender's while the
    message is in flight)."""
    assert job.coordinator.violations(also=[in_flight(r) for r in results]) == []


def in_flight(r: SubtaskResult) -> bytes:
    report = json.loads(r.report)
    for e in getattr(decode_message(r.ack), "entries", ()):
        if isinstance(e.handle, FileHandle):
            report["owners"].setdefault(e.handle.path, f"tm:{report['tm']}")
    return json.dumps(report).encode()


def storage(url: str) -> set[str]:
    """The files under the base now. The coordinator's deleter thread may be pruning a
    folder while this walks (deletes run in the background): a folder that vanishes
    holds no file, so ``os.walk`` passing over it is the listing's truth."""
    out = set()
    for folder, _, files in os.walk(url):
        out |= {os.path.relpath(os.path.join(folder, f), url) for f in files}
    return out


def referenced(job: LocalJob) -> set[tuple[str, int]]:
    """(path, offset) of every stream a retained checkpoint names: a segment's place, so
    that dead bytes in a file ACROSS keeps open are told apart from live ones."""
    return {
        (s.path, getattr(s, "offset", 0))
        for r in job.coordinator.co.retained
        for e in r.entries
        if (s := stream_of(e.handle)) is not None
    }


def latest_entries(job: LocalJob, s: SubtaskId) -> tuple[StateEntry, ...]:
    return decode_assignment(job.coordinator.restore_assignment(s, 1)).entries


def read_back(
    url: str, job_id: str, entries: tuple[StateEntry, ...], tmp: Path
) -> list[tuple[tuple[int, int, str], int]]:
    """Restore ``entries`` into a fresh directory, as a new worker would; its counts."""
    target = tmp / f"verify-{next(_verify)}" / "db"
    restore(StateReader(url, {}), entries, target)
    db = WindowCounts(target, options())
    try:
        return list(db.items())
    finally:
        db.close()


def restored_counts_match(job: LocalJob, tmp: Path) -> None:
    """Every subtask's latest completed checkpoint, downloaded and opened, holds exactly
    the open windows' counts of the batch computation over the batches run so far."""
    got: collections.Counter[tuple[int, str]] = collections.Counter()
    for s in job.driver.subtasks():
        items = read_back(job.url, job.coordinator.job_id, latest_entries(job, s), tmp)
        for (_group, start, word), n in items:
            got[(start, word)] += n
    closed_at = job.driver.ran_watermark
    want = {k: n for k, n in job.expected().items() if not job.windowing.closed(k[0], closed_at)}
    assert want, "no open window to compare"
    assert dict(got) == want


def counts_match(job: LocalJob) -> None:
    cmp = job.comparison()
    assert cmp.windows >= 2 and cmp.equal, cmp.mismatches[:5]


class AckLog:
    """What the subtasks' TMs acknowledged, by checkpoint (instrumentation only: each TM
    keeps what it wrote to itself)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_checkpoint: dict[int, list[StateEntry]] = collections.defaultdict(list)
        real = TaskManager.acknowledge

        def acknowledge(
            tm: TaskManager, subtask: SubtaskId, checkpoint: int, savepoint: bool = False
        ) -> tuple[tuple[StateEntry, ...], object]:
            out = real(tm, subtask, checkpoint, savepoint)
            self.by_checkpoint[checkpoint] += out[0]
            return out

        monkeypatch.setattr(TaskManager, "acknowledge", acknowledge)

    def ssts(self, checkpoint: int) -> dict[str, tuple[str, int, int]]:
        """Logical id -> (path, offset, length) of the SSTs acknowledged for it."""
        out: dict[str, tuple[str, int, int]] = {}
        for e in self.by_checkpoint[checkpoint]:
            s = stream_of(e.handle)
            if e.kind is StateKind.KEYED_SHARED and s is not None:
                out[s.logical_id] = (s.path, getattr(s, "offset", 0), s.length)
        return out


# ---------------------------------------------------------------------------- SPARK-55820


def _55820_abort_then_retry(
    job: LocalJob, log: AckLog, late: pytest.MonkeyPatch | None = None
) -> tuple[int, set[str]]:
    """Three batches complete. The next batch's tasks snapshot checkpoint c (their DBs
    move on to c), subtask 0's acknowledgement reaches the coordinator (its TM wrote its
    uploads for c), then the batch fails (subtask 1's result never comes) and c is
    aborted. The batch is retried as checkpoint c + 1. With ``late`` no notice reaches a
    TM until the retry completed. Returns c and the files c's uploads created."""
    for _ in range(3):
        job.batch()
        files_hold(job)
    before = storage(job.url)
    order = job.driver.order(job.next_batch)
    results = job.run_tasks(order)
    created = {f for f in storage(job.url) - before if "/shared/count-0-" in f}
    job.coordinator.receive(results[0].ack, results[0].report)
    files_hold(job, results[1])
    assert log.ssts(order.checkpoint), "subtask 0 uploaded no SST for the aborted checkpoint"
    if late is not None:
        late.setattr(job.coordinator, "mail", lambda: ())
    job.driver.coordinator.abort(order.checkpoint)
    files_hold(job, results[1])
    rerun = job.batch()
    files_hold(job)
    if late is not None:
        late.undo()
        job.quiesce()
        files_hold(job)
    assert (rerun.batch_id, rerun.checkpoint) == (order.batch_id, order.checkpoint + 1)
    return order.checkpoint, created


@pytest.mark.parametrize("abort", ["heard", "late"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_spark_55820_retried_batch_never_reuses_what_the_aborted_checkpoint_wrote(
    tmp_path: Path, mode: MergingMode, abort: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPARK-55820 (a stale version-to-files cache after a retried batch; see
    ``tests/test_reuse_races.py`` for what was found of it): the retry of a batch whose
    checkpoint was aborted must neither reuse the aborted checkpoint's uploads nor take up
    the local DB that moved on to it. The job keeps no such cache: what a task reuses comes
    from the restore assignment of its own batch (the latest completed checkpoint), and a
    local DB is taken up only at that checkpoint (``subtask._take``), so both retried
    subtasks restore and reuse the uploads of checkpoint c - 1 only, whether the store's
    task managers heard of the abort before the retry or after it completed."""
    log = AckLog(monkeypatch)
    job = LocalJob(tmp_path, Config.for_mode(mode, num_retained=1), parallelism=2)
    late = pytest.MonkeyPatch() if abort == "late" else None
    c, created = _55820_abort_then_retry(job, log, late)
    assert job.driver.reports[-1].restored == 2
    earlier = {lid for k in range(1, c) for lid in log.ssts(k)}
    aborted = {lid: at for lid, at in log.ssts(c).items() if lid not in earlier}
    assert aborted, "the aborted checkpoint uploaded no new SST"
    retry = log.ssts(c + 1)
    assert not set(retry) & set(aborted), "the retry reused an upload of the aborted checkpoint"
    job.coordinator.settle()
    if mode is not MergingMode.ACROSS_CHECKPOINT:
        # Whole files (NONE) and WITHIN files of c alone: gone with the abort (R43, R32).
        # ACROSS keeps the open file they were appended to; their bytes are dead.
        assert not created & storage(job.url)
    assert not {(p, o) for p, o, _n in aborted.values()} & referenced(job)
    for _ in range(5):
        job.batch()
        files_hold(job)
    counts_match(job)
    restored_counts_match(job, tmp_path)


def test_spark_55820_a_stale_local_db_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule swapped out: a task takes up the local DB whatever checkpoint it moved on
    to, as long as it is of the checkpoint's lineage (what a cache kept across the retry
    amounts to here). The retry then counts the failed batch's records a second time, and
    both the sink and the restored checkpoint disagree with the batch computation."""
    real = subtask_module._take

    def take_stale(home: Path, mine: Path, latest: int, lineage: str | None) -> str | None:
        shared = home / "db"
        marker = read_marker(shared) if shared.exists() else None
        if marker is None or marker[1] != lineage:
            return real(home, mine, latest, lineage)
        shared.rename(mine)
        return marker[1]

    monkeypatch.setattr(subtask_module, "_take", take_stale)
    log = AckLog(monkeypatch)
    job = LocalJob(tmp_path, Config.for_mode(MergingMode.NONE, num_retained=1), parallelism=2)
    _55820_abort_then_retry(job, log)
    assert job.driver.reports[-1].restored == 0
    with pytest.raises(AssertionError):
        restored_counts_match(job, tmp_path)  # the retried batch is in it twice
    for _ in range(5):
        job.batch()
    files_hold(job)  # the files are sound; the counts are not
    cmp = job.comparison()
    assert cmp.mismatches and all(
        want is not None and got is not None and got > want for _s, _w, want, got in cmp.mismatches
    )


# ---------------------------------------------------------------------------- SPARK-55892


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_spark_55892_delayed_upload_of_a_speculative_copy_changes_nothing(
    tmp_path: Path, mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPARK-55892 (https://github.com/apache/spark/pull/54697): a snapshot reused SSTs
    of an old version and was uploaded long after it was made; meanwhile another
    executor's maintenance had deleted those SSTs.

    Here two attempts of subtask 0 run batch b (speculation). The winner takes the local
    DB with the subtask's TM and reuses the uploads of the latest completed checkpoint.
    The loser finds no DB: it restores, and starts a TM attempt of its own, which has
    uploaded nothing, so it reuses nothing and uploads every SST again (a TM reuses only
    what it uploaded itself, R20): the reuse the ticket's race needs cannot happen. The
    winner's result completes checkpoint c. The next batch compacts every DB, so its
    checkpoint holds none of c's SSTs and subsumes c: their uploads are deleted (with
    ACROSS their segments are discarded and the open file they lie in stays). Then the
    loser's delayed acknowledgement of c reaches the coordinator: from a TM it never
    placed, for a checkpoint no longer pending, it is ignored (R56) and nothing changes.
    (Spark hands the driver one result per partition, so the job never passes the
    loser's on; the test does, as a coordinator that met it would.) The loser's DB, put
    back last, is not taken up: the next task restores, and the loser's files, which no
    party records, are swept (R64, R65)."""
    log = AckLog(monkeypatch)
    job = LocalJob(
        tmp_path, Config.for_mode(mode, num_retained=1), parallelism=2, auto_compactions=False
    )
    for _ in range(3):
        job.batch()
        files_hold(job)
    order = job.driver.order(job.next_batch)
    parts = job.partitions(order.batch_id)
    winner = run_subtask(order, 0, "winner", parts.get(0, []))
    loser = run_subtask(order, 0, "loser", parts.get(0, []))  # its result is delayed
    other = run_subtask(order, 1, "other", parts.get(1, []))
    assert winner.stats.reused >= 1 and loser.stats.reused == 0 and loser.restored
    assert json.loads(loser.report)["new"] and not json.loads(winner.report)["new"]
    job.emitted[order.batch_id] = [w for r in (winner, other) for w in r.closed]
    job.driver.finish(order, [winner, other])
    job.next_batch += 1
    files_hold(job, loser)  # the loser's TM still owns what it wrote: no party swept it yet
    c = order.checkpoint
    s0 = job.driver.subtasks()[0]
    before_c = {stream_of(e.handle) for e in decode_assignment(order.assignments[0]).entries}
    reused = {
        h.logical_id: (h.path, getattr(h, "offset", 0), h.length)
        for e in latest_entries(job, s0)
        if e.kind is StateKind.KEYED_SHARED
        and (h := stream_of(e.handle)) in before_c
        and h is not None
    }
    assert reused, "checkpoint c reused no upload"
    job.driver.compact_every = c + 1  # every DB compacts in the next batch only
    # The loser put its own DB back last: at c, but of another lineage than the one c
    # was taken of (``subtask._take``), so subtask 0 restores from c.
    assert job.batch().restored == 1
    job.driver.compact_every = 0
    files_hold(job)
    job.coordinator.settle()
    assert not set(log.ssts(c + 1)) & set(reused), "the compaction kept an old SST"
    assert not {(p, o) for p, o, _n in reused.values()} & referenced(job)
    if mode is not MergingMode.ACROSS_CHECKPOINT:
        gone = {p for p, _o, _n in reused.values()}
        assert not gone & storage(job.url), "the subsumed uploads were not deleted"
    before = storage(job.url)
    retained = [(r.id, r.entries) for r in job.coordinator.co.retained]
    loser_tm = json.loads(loser.report)["tm"]
    job.coordinator.receive(loser.ack)  # the delayed upload
    assert storage(job.url) == before
    assert [(r.id, r.entries) for r in job.coordinator.co.retained] == retained
    assert loser_tm not in job.coordinator.co.placement.values()
    files_hold(job)
    for _ in range(5):
        job.batch()
        files_hold(job)
    counts_match(job)
    restored_counts_match(job, tmp_path)


# ---------------------------------------------------------------------------- FLINK-38574


class HeldNotices:
    """One subtask's RocksDB checkpointed by its TM (one attempt, kept in this process),
    with the coordinator's notices to it held back until released oldest first: the
    late confirmation."""

    def __init__(self, tmp: Path, mode: MergingMode) -> None:
        self.url = str(tmp / "base")
        self.coordinator = open_coordinator(self.url, Config.for_mode(mode, num_retained=1), 1)
        self.scratch = tmp / "local"
        self.scratch.mkdir()
        self.db = WindowCounts(
            self.scratch / "db", options(write_buffer_size=1 << 20, auto_compactions=False)
        )
        self.recipe = self.coordinator.task_manager_recipe()
        self.party: WorkerTaskManager | None = None
        self.tmp = tmp

    def _held(self) -> list[tuple[str, int, bytes]]:
        p = self.party
        return [m for m in self.coordinator.mail() if p and m[0] == p.tm_id and m[1] > p.applied]

    def held(self) -> list[int]:
        return [getattr(decode_message(m[2]), "checkpoint", -1) for m in self._held()]

    def release(self) -> None:
        """Deliver the oldest held notice (the transport keeps their order)."""
        assert self.party is not None
        self.party.apply_mail(self._held()[:1])

    def put(self, lo: int, hi: int) -> None:
        self.db.add({(g % 128, 0, f"word{g:06d}"): 1 for g in range(lo, hi)})
        self.db.db.flush(True)

    def entries(self) -> tuple[StateEntry, ...]:
        return decode_assignment(self.coordinator.restore_assignment(S0, 1)).entries

    def checkpoint(self) -> int:
        """Snapshot with the reuse base of the latest completed checkpoint and complete."""
        c = self.coordinator.trigger()
        if self.party is None:
            self.party = self.recipe.open(None, S0, c)
        take_snapshot(
            self.db,
            self.party,
            c,
            S0,
            lineage="W1-a",
            base=reusable(self.entries()),
            scratch=self.scratch,
            operator_state=b"progress",
        )
        self.coordinator.receive(self.party.acknowledge(c, S0), self.party.report())
        self.coordinator.complete(c)
        self.coordinator.settle()
        return c

    def holds(self) -> None:
        assert self.coordinator.violations() == []

    def read_back_matches(self) -> None:
        got = read_back(self.url, self.coordinator.job_id, self.entries(), self.tmp)
        assert got == list(self.db.items())


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_flink_38574_late_confirmation_and_reupload_never_reference_a_deleted_upload(
    tmp_path: Path, mode: MergingMode
) -> None:
    """FLINK-38574 (a late confirmation plus a re-upload let a checkpoint reuse a file the
    coordinator had deleted; BRIEF §10, the ticket's text was not found).

    Checkpoint 1 uploads F; its completion does not reach the TM yet. The task of
    checkpoint 2 is told (by its restore assignment) that F may be reused, but the TM,
    not knowing 1 completed, uploads F again (R20): the re-upload. Checkpoint 2 completes
    and subsumes 1, deciding the delete of F's first upload (without merging it is gone at
    once). Then the confirmation of 1 arrives, late, and the TM's baseline names the first
    upload again. Checkpoint 3 reuses F only if the TM's baseline is the very upload the
    latest completed checkpoint holds (``WorkerTaskManager.reuse``): it is not, so F is
    uploaded a third time and 3 completes, naming no deleted byte. Once every notice
    arrived, checkpoint 4 reuses checkpoint 3's upload."""
    s = HeldNotices(tmp_path, mode)
    s.put(0, 400)
    assert s.checkpoint() == 1
    s.holds()
    first = reusable(s.entries())
    assert first and s.held() == [1]
    s.put(400, 800)
    assert s.checkpoint() == 2
    s.holds()
    second = reusable(s.entries())
    for name, old in first.items():
        a, b = stream_of(old.handle), stream_of(second[name].handle)
        assert a is not None and b is not None and a.logical_id != b.logical_id, (
            "checkpoint 2 reused an upload its TM did not know to be complete"
        )
    f1 = {p for e in first.values() if (p := stream_of(e.handle)) is not None}
    if mode is MergingMode.NONE:
        assert not {h.path for h in f1} & storage(s.url), "the subsumed first upload survived"
    assert s.held() == [1, 2]
    s.release()  # the late confirmation of 1
    s.holds()
    s.put(800, 1000)
    c = s.checkpoint()
    assert c == 3 and [r.id for r in s.coordinator.co.retained] == [3]
    third = reusable(s.entries())
    for name in first:
        h = stream_of(third[name].handle)
        assert h is not None
        assert h.logical_id not in {
            stream_of(first[name].handle).logical_id,  # type: ignore[union-attr]
            stream_of(second[name].handle).logical_id,  # type: ignore[union-attr]
        }, "checkpoint 3 reused an upload that is not its baseline's"
    s.holds()
    s.read_back_matches()
    while s.held():
        s.release()
    s.holds()
    s.put(1000, 1100)
    s.checkpoint()
    fourth = reusable(s.entries())
    if mode is MergingMode.ACROSS_CHECKPOINT:
        # The one open file holds the dead first and second uploads too: past the
        # amplification bound it is given up (R81), and F is uploaded anew.
        for name in first:
            h = stream_of(fourth[name].handle)
            assert h is not None
            assert h.logical_id not in {
                stream_of(first[name].handle).logical_id,  # type: ignore[union-attr]
                stream_of(second[name].handle).logical_id,  # type: ignore[union-attr]
            }
    else:
        assert {n: stream_of(fourth[n].handle) for n in first} == {
            n: stream_of(third[n].handle) for n in first
        }, "once every notice arrived, checkpoint 4 must reuse checkpoint 3's uploads"
    while s.held():
        s.release()
    s.holds()
    s.read_back_matches()


def test_a_speculative_copy_that_may_still_run_keeps_its_files_until_it_ended(
    tmp_path: Path,
) -> None:
    """R64 for an attempt Spark has not seen end (speculation, ``job.TaskAttempts``): while
    a task attempt of the job may still run, the coordinator gives no TM up and sweeps
    nothing nobody records, whatever completes meanwhile; once none may, the copy's files
    (a TM attempt the coordinator never heard of) are swept."""
    job = LocalJob(tmp_path, Config.for_mode(MergingMode.ACROSS_CHECKPOINT), parallelism=2)
    for _ in range(3):
        job.batch()
    order = job.driver.order(job.next_batch)
    parts = job.partitions(order.batch_id)
    winner = run_subtask(order, 0, "winner", parts.get(0, []))
    loser = run_subtask(order, 0, "loser", parts.get(0, []))  # still running, for Spark
    other = run_subtask(order, 1, "other", parts.get(1, []))
    running = [True]
    job.coordinator.may_still_run = lambda: running[0]
    job.emitted[order.batch_id] = [w for r in (winner, other) for w in r.closed]
    job.driver.finish(order, [winner, other])
    job.next_batch += 1
    loser_dir = Path(job.url, "job-0", "taskowned", json.loads(loser.report)["tm"])
    mine = {p for p in storage(job.url) if p.startswith(f"job-0/taskowned/{loser_dir.name}/")}
    assert mine, "the copy wrote no EXCLUSIVE file"
    # The next batch restores subtask 0 (the copy put its own DB back) with a new TM:
    # the old one is replaced and the copy's files lie there unrecorded; both wait.
    assert job.batch().restored == 1
    assert mine <= storage(job.url)
    replaced = set(job.coordinator.replaced)
    assert replaced and not replaced & set(job.coordinator.retired)
    files_hold(job, loser)
    running[0] = False
    assert job.coordinator.finish_attempts(wait_s=0)
    assert not mine & storage(job.url)
    assert replaced <= set(job.coordinator.retired)
    files_hold(job)
    for _ in range(5):
        job.batch()
        files_hold(job)
    counts_match(job)
