"""The streaming job's RocksDB snapshots (issue 17) in one process: incremental uploads,
reuse of unchanged SSTs, SSTs retired by compaction released, restores that reproduce the
counts, in every merging mode; a rescale's restore holds exactly its key groups, as the
key-by-key copy it replaced built them (``bench.rescale_restore``). No Spark:
``tests/stream_harness.py`` runs the job's own driver and subtask code partition by
partition."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import rocksdict

from bench.rescale_restore import restore_key_by_key
from pipeline.stream import snapshot
from pipeline.stream.check import compare
from pipeline.stream.checkpointing import VERTEX, CheckpointNotCompleted, decode_assignment
from pipeline.stream.coordination import open_coordinator
from pipeline.stream.kills import KILL_LOG, KILL_POINTS, Failures, read_kills
from pipeline.stream.local_db import put_back
from pipeline.stream.rocks import (
    LAYOUT,
    WindowCounts,
    decode_key,
    encode_key,
    group_ranges,
    new_lineage,
    options,
)
from pipeline.stream.snapshot import (
    META,
    OPERATOR_STATE,
    SST,
    RestoreError,
    copy_ranges,
    file_of,
    meta_name,
    restore,
    restore_key_groups,
    reusable,
    sst_name,
    take_snapshot,
)
from pipeline.stream.subtask import run_subtask, subtask_dir
from pipeline.stream.windows import Windowing
from pipeline.stream.words import MAX_PARALLELISM
from pipeline.stream.worker_tm import StateReader, WorkerTaskManager
from spec.config import Config, MergingMode, RestoreMode, Scope, StateKind
from spec.errors import CommandError
from spec.handles import FileHandle, InlineHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.keygroups import key_group_range
from tests.lockstep import S3_BUCKET
from tests.stream_harness import LocalJob

MODES = list(MergingMode)
S0 = SubtaskId(VERTEX, 0, 1)


class OneSubtask:
    """One subtask's DB checkpointed by its TM (one attempt, kept in this process) for the
    coordinator, step by step; the TM applies its mail before each snapshot."""

    def __init__(self, tmp: Path, mode: MergingMode, lineage: str = LAYOUT + "-a") -> None:
        self.lineage = lineage
        self.url = str(tmp / "base")
        self.coordinator = open_coordinator(self.url, Config.for_mode(mode, num_retained=1), 1)
        self.scratch = tmp / "local"
        self.scratch.mkdir()
        self.db = WindowCounts(
            self.scratch / "db", options(write_buffer_size=1 << 20, auto_compactions=False)
        )
        self.recipe = self.coordinator.task_manager_recipe()
        self.party: WorkerTaskManager | None = None

    def tm(self, checkpoint: int) -> WorkerTaskManager:
        if self.party is None:
            self.party = self.recipe.open(None, S0, checkpoint)
        self.party.apply_mail(self.coordinator.mail())
        return self.party

    def put(self, lo: int, hi: int) -> None:
        self.db.add({(g % 128, 0, f"word{g:06d}"): 1 for g in range(lo, hi)})

    def assignment(self, checkpoint: int) -> tuple[StateEntry, ...]:
        return decode_assignment(self.coordinator.restore_assignment(S0, checkpoint)).entries

    def checkpoint(self) -> tuple[int, dict[str, StateEntry]]:
        """Snapshot and complete; the checkpoint and its SST entries by local file."""
        c = self.coordinator.trigger()
        base = reusable(self.assignment(c))
        party = self.tm(c)
        self.stats = take_snapshot(
            self.db,
            party,
            c,
            S0,
            lineage=self.lineage,
            base=base,
            scratch=self.scratch,
            operator_state=b"progress",
        )
        self.coordinator.receive(party.acknowledge(c, S0), party.report())
        self.coordinator.complete(c)
        self.coordinator.settle()
        return c, reusable(self.assignment(c + 1))

    def live_ssts(self) -> set[str]:
        return {f["name"].lstrip("/") for f in self.db.db.live_files()}

    def storage_paths(self) -> set[str]:
        root = Path(self.url)
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_the_second_checkpoint_uploads_only_new_ssts_and_reuses_the_rest(
    tmp_path: Path, mode: MergingMode
) -> None:
    s = OneSubtask(tmp_path, mode)
    s.put(0, 500)
    _, first = s.checkpoint()
    assert s.stats.uploaded == len(first) == len(s.live_ssts()) >= 1
    assert s.stats.reused == 0
    s.put(500, 900)
    _, second = s.checkpoint()
    new = set(second) - set(first)
    assert new and set(first) <= set(second)
    assert (s.stats.uploaded, s.stats.reused) == (len(new), len(first))
    for name, old in first.items():
        # The same bytes on storage, not a copy: the reused handle names the old upload.
        a, b = stream_of(old.handle), stream_of(second[name].handle)
        assert a is not None and b is not None
        assert (a.path, a.length) == (b.path, b.length)
        assert old.name == second[name].name
    # MANIFEST, OPTIONS, CURRENT and the operator state: written again at every checkpoint.
    assert s.stats.exclusive == 4
    # Registry names carry the lineage: a bare 000009.sst of another DB is another name.
    assert all(e.name == f"sst/W1-a/{f}" for f, e in second.items())
    assert s.coordinator.violations() == []


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_ssts_a_compaction_retired_are_no_longer_referenced(
    tmp_path: Path, mode: MergingMode
) -> None:
    s = OneSubtask(tmp_path, mode)
    for lo in range(0, 1200, 300):
        s.put(lo, lo + 300)
        s.db.db.flush(True)
    _, before = s.checkpoint()
    assert len(before) >= 4
    old_paths = {h.path for e in before.values() if (h := stream_of(e.handle)) is not None}
    s.db.db.compact_range(None, None)
    live = s.live_ssts()
    assert not live & set(before), "the compaction kept an old SST"
    _, after = s.checkpoint()
    assert set(after) == live
    assert s.stats.reused == 0 and s.stats.uploaded == len(live)
    retained = s.coordinator.co.retained
    referenced = {
        h.path for r in retained for e in r.entries if (h := stream_of(e.handle)) is not None
    }
    names = {e.name for r in retained for e in r.entries}
    assert not names & {e.name for e in before.values()}
    if mode is MergingMode.NONE:  # one file per SST: the retired ones are deleted
        assert old_paths and not old_paths & s.storage_paths()
        assert not old_paths & referenced
    assert s.coordinator.violations() == []


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_restore_from_the_assignment_reproduces_the_counts(
    tmp_path: Path, mode: MergingMode
) -> None:
    s = OneSubtask(tmp_path, mode)
    s.put(0, 700)
    s.checkpoint()
    s.put(300, 1000)  # counts of 2 for 300..699
    c, _ = s.checkpoint()
    want = list(s.db.items())
    entries = s.assignment(c + 1)
    party = s.recipe.reader()
    target = tmp_path / "elsewhere" / "db"
    operator = restore(party, entries, target)
    assert operator == b"progress"
    got = WindowCounts(target, options())
    try:
        assert list(got.items()) == want
        assert sorted(os.listdir(target)) != []
    finally:
        got.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_missing_db_is_restored_and_every_window_counts_once(
    tmp_path: Path, mode: MergingMode
) -> None:
    job = LocalJob(tmp_path, Config.for_mode(mode, num_retained=2), parallelism=2)
    missing_db_restores(job)


_s3_bases = iter(range(10**6))


@pytest.mark.parametrize(
    "mode", [MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT], ids=lambda m: m.name
)
def test_on_s3_a_missing_db_is_restored_and_every_window_counts_once(
    tmp_path: Path, mode: MergingMode, s3_endpoint: str
) -> None:
    """Checkpoint storage on S3 (moto): the workers read their restore from it directly.
    (ACROSS needs open files to be readable, which S3 refuses: R16.)"""
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": s3_endpoint},
    }
    url = f"s3://{S3_BUCKET}/stream{next(_s3_bases)}"
    job = LocalJob(
        tmp_path,
        Config.for_mode(mode, num_retained=2, open_files_readable=False),
        parallelism=2,
        url=url,
        storage_options=options,
    )
    missing_db_restores(job)


def missing_db_restores(job: LocalJob) -> None:
    for _ in range(4):
        job.batch()
    job.lose_local_state(1)
    report = job.batch()
    assert report.restored == 1
    for _ in range(4):
        assert job.batch().restored == 0
    cmp = job.comparison()
    assert cmp.windows >= 2 and cmp.equal, cmp.mismatches[:5]
    assert job.coordinator.violations() == []


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_batch_whose_checkpoint_is_aborted_is_rerun_from_the_previous_one(
    tmp_path: Path, mode: MergingMode
) -> None:
    """The tasks' DBs move on to checkpoint c before it completes: when c is aborted, the
    re-run of the batch must restore c - 1 (the local DBs are ahead), not count twice."""
    job = LocalJob(tmp_path, Config.for_mode(mode), parallelism=2)
    for _ in range(3):
        job.batch()
    order = job.driver.order(job.next_batch)
    job.run_tasks(order)  # every subtask snapshots c; the batch then fails
    job.driver.coordinator.abort(order.checkpoint)
    rerun = job.batch()
    assert rerun.batch_id == order.batch_id and rerun.checkpoint == order.checkpoint + 1
    assert rerun.restored == 2
    for _ in range(4):
        job.batch()
    cmp = job.comparison()
    assert cmp.windows >= 2 and cmp.equal, cmp.mismatches[:5]
    assert job.coordinator.violations() == []


def test_the_comparison_catches_a_wrong_missing_or_duplicate_count() -> None:
    w = Windowing(1000)
    expected = {(0, "a"): 2, (0, "b"): 1, (1000, "a"): 5, (5000, "z"): 1}
    ok = compare(expected, [(0, "a", 2), (0, "b", 1), (1000, "a", 5)], w, 2000)
    assert ok.equal and (ok.windows, ok.counts) == (2, 3)  # (5000, z) is not closed yet
    assert not compare(expected, [(0, "a", 2), (0, "b", 2), (1000, "a", 5)], w, 2000).equal
    assert not compare(expected, [(0, "a", 2), (1000, "a", 5)], w, 2000).equal
    dup = compare(expected, [(0, "a", 1), (0, "a", 1), (0, "b", 1), (1000, "a", 5)], w, 2000)
    assert dup.duplicates == ((0, "a"),) and not dup.equal


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        (StateKind.KEYED_SHARED, "sst/W1-a/../../etc/passwd"),
        (StateKind.KEYED_SHARED, "sst/W1-a/000009.sst/x"),
        (StateKind.KEYED_SHARED, "000009.sst"),
        (StateKind.KEYED_FULL, "meta/W1-a/LOCK"),
        (StateKind.KEYED_FULL, "meta/../CURRENT"),
        (StateKind.KEYED_FULL, "meta/CURRENT"),
        (StateKind.OPERATOR_UNION, OPERATOR_STATE),
    ],
)
def test_a_restore_refuses_names_that_are_not_rocksdb_files(
    tmp_path: Path, kind: StateKind, name: str
) -> None:
    e = StateEntry(S0, kind, name, FileHandle("x", 1, "l", Scope.EXCLUSIVE))
    with pytest.raises(RestoreError, match="not a RocksDB file"):
        file_of(e)
    with pytest.raises(RestoreError):
        restore(StateReader(str(tmp_path), {}), [e], tmp_path / "db")
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize(
    ("lineage", "said"),
    [("0123456789ab", r"keys key group first \(no layout named\)"), ("W2-a", "key layout 'W2'")],
    ids=["before-named-layouts", "a-later-layout"],
)
def test_a_checkpoint_of_another_key_layout_is_refused_not_misread(
    tmp_path: Path, lineage: str, said: str
) -> None:
    """Counts read with the wrong layout land in wrong windows silently: a DB's lineage
    names its layout (``rocks.LAYOUT``), and every restore path refuses another."""
    assert new_lineage().startswith(LAYOUT) and new_lineage() != new_lineage()
    s = OneSubtask(tmp_path, MergingMode.NONE, lineage=lineage)
    s.put(0, 300)
    c = s.coordinator.trigger()
    party = s.tm(c)
    take_snapshot(s.db, party, c, S0, lineage=lineage, base={}, scratch=s.scratch,
                  operator_state=b"p")  # fmt: skip
    s.coordinator.receive(party.acknowledge(c, S0), party.report())
    s.coordinator.complete(c)
    entries = s.assignment(c + 1)
    reader = s.recipe.reader()
    target = tmp_path / "new" / "db"
    for attempt in (
        lambda: reusable(entries),
        lambda: restore(reader, entries, target),
        lambda: restore_key_groups(reader, entries, target, (0, 63), options()),
    ):
        with pytest.raises(RestoreError, match=f"/{lineage}/.*written with {said}; .*'{LAYOUT}'"):
            attempt()
        assert not target.parent.exists() or os.listdir(target.parent) == []


def test_a_handle_outside_the_base_is_not_read(tmp_path: Path) -> None:
    party = StateReader(str(tmp_path / "base"), {})
    for path in ("../secret", "/etc/passwd", "a/../../b"):
        e = StateEntry(
            S0, StateKind.KEYED_FULL, "meta/W1-a/CURRENT", FileHandle(path, 4, "l", Scope.EXCLUSIVE)
        )
        with pytest.raises(ValueError, match="not inside the base"):
            party.read(e)


def test_a_damaged_acknowledgement_changes_nothing(tmp_path: Path) -> None:
    s = OneSubtask(tmp_path, MergingMode.NONE)
    s.put(0, 300)
    c = s.coordinator.trigger()
    party = s.tm(c)
    take_snapshot(
        s.db, party, c, S0, lineage=s.lineage, base={}, scratch=s.scratch, operator_state=b"p"
    )
    ack = party.acknowledge(c, S0)
    before = s.storage_paths()
    for bad in (ack[:-1], ack + b"x", b"junk" + ack, ack[:20]):
        with pytest.raises(ValueError, match="not a message"):
            s.coordinator.receive(bad)
    assert s.storage_paths() == before
    assert s.coordinator.co.pending[c].acks == {}
    s.coordinator.receive(ack, party.report())
    s.coordinator.complete(c)
    assert [r.id for r in s.coordinator.co.retained] == [c]


@pytest.mark.parametrize("inline", [0, 20 << 10], ids=["files", "inline"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_tasks_killed_anywhere_in_their_snapshot_are_retried_and_count_once(
    tmp_path: Path, mode: MergingMode, inline: int
) -> None:
    """``--kill-worker-prob`` without Spark: a task dies (no cleanup, as under SIGKILL) at
    every point of its snapshot in some batch (and while its TM deletes, in the merging
    modes: without merging the coordinator deletes, R54); its retry restores what the
    killed attempt took or left ahead, and every window still counts each record once."""
    job = LocalJob(
        tmp_path,
        Config.for_mode(mode, num_retained=2, inline_threshold=inline),
        parallelism=2,
        failures=Failures(kill_prob=0.25, seed=1),
    )
    for _ in range(12):
        job.batch()
    retained = job.coordinator.co.retained_checkpoints()
    inlined = [e for r in retained for e in r.entries if isinstance(e.handle, InlineHandle)]
    assert bool(inlined) == bool(inline)  # R107: MANIFEST, OPTIONS, CURRENT, progress
    points = set(KILL_POINTS) - ({"deleting"} if mode is MergingMode.NONE else set())
    assert {point for *_, point in job.kills} == points, job.kills
    assert sum(r.retried for r in job.driver.reports) > 0
    assert sum(r.restored for r in job.driver.reports) > 0
    cmp = job.comparison()
    assert cmp.windows >= 3 and cmp.equal, cmp.mismatches[:5]
    assert job.coordinator.violations() == []
    # Each killed task logged its kill just before it died.
    assert [(k.batch, k.subtask, k.attempt, k.point) for k in read_kills(job.work)] == job.kills
    # What killed attempts left on the local disk went with the next task of the subtask.
    for home in Path(job.work).iterdir():
        if home.name != KILL_LOG:
            assert sorted(p.name for p in home.iterdir()) == ["db"]


def test_injected_failures_are_the_same_in_every_process() -> None:
    f = Failures(kill_prob=0.3, seed=9)
    got = [
        f.kills(p, b, i, n)
        for p in KILL_POINTS
        for b in range(5)
        for i in range(3)
        for n in range(2)
    ]
    assert got == [
        f.kills(p, b, i, n)
        for p in KILL_POINTS
        for b in range(5)
        for i in range(3)
        for n in range(2)
    ]
    assert 0 < sum(got) < len(got)
    assert not any(Failures().kills(p, 0, 0, 0) for p in KILL_POINTS)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_local_db_another_attempt_left_is_not_reused(tmp_path: Path, mode: MergingMode) -> None:
    """Two attempts of one subtask run a batch (speculation); the driver accepts one, and
    the other puts its DB back first. That DB is at the right checkpoint but is not the
    one the checkpoint was taken of (its SSTs are not the accepted uploads under the same
    names): the next task must not reuse it, and takes the accepted attempt's, which its
    put-back set aside (``db.<attempt>.done``), instead."""
    job = LocalJob(tmp_path, Config.for_mode(mode), parallelism=2)
    job.driver.sweep_local = False  # as under speculation: another attempt may still run
    for _ in range(3):
        job.batch()
    order = job.driver.order(job.next_batch)
    parts = job.partitions(order.batch_id)
    home = subtask_dir(job.work, SubtaskId(VERTEX, 0, 2))
    loser = run_subtask(order, 0, "loser", parts[0])  # took the DB the last checkpoint holds
    (home / "db").rename(home / "db.loser")  # ...and puts it back only after the winner ran
    winner = run_subtask(order, 0, "winner", parts[0])  # no DB there: it restores
    assert winner.restored and not loser.restored
    put_back(home / "db.loser", home / "db")  # the loser's put-back, last
    assert sorted(p.name for p in home.iterdir()) == ["db", "db.loser.done"]
    other = run_subtask(order, 1, "one", parts[1])
    job.emitted[order.batch_id] = [w for r in (winner, other) for w in r.closed]
    job.driver.finish(order, [winner, other])
    job.next_batch += 1
    assert job.batch().restored == 0  # the winner's DB, found set aside
    assert sorted(p.name for p in home.iterdir()) == ["db"]
    job.lose_local_state(0)  # what that checkpoint holds restores right
    for _ in range(4):
        job.batch()
    cmp = job.comparison()
    assert cmp.windows >= 2 and cmp.equal, cmp.mismatches[:5]
    assert job.coordinator.violations() == []


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_late_attempt_putting_its_db_back_after_the_next_batch_keeps_the_live_tm(
    tmp_path: Path, mode: MergingMode
) -> None:
    """I6 under Spark's speculation (``test_stream_failures`` reaches it): a copy of batch
    b's task that Spark killed because the other attempt won runs on in its Python worker
    and puts its DB (with its own TM's records) back after batch b + 1's task has put back
    the live one. The late DB is set aside and dropped by the next taker, never put in the
    live one's place: that would remove the live TM's DB and records, the delivery at the
    end of the run would reach the late attempt's TM, and the live one, never hearing the
    last notices, would leak its files (I6). The live TM gets its mail and quiet holds."""
    job = LocalJob(tmp_path, Config.for_mode(mode), parallelism=2)
    job.driver.sweep_local = False  # as under speculation: another attempt may still run
    for _ in range(3):
        job.batch()
    order = job.driver.order(job.next_batch)
    parts = job.partitions(order.batch_id)
    home = subtask_dir(job.work, SubtaskId(VERTEX, 0, 2))
    winner = run_subtask(order, 0, "winner", parts[0])
    (home / "db").rename(home / "db.winner")  # the winner's DB, while the copy runs
    late = run_subtask(order, 0, "late", parts[0])  # restores: the winner holds the DB
    assert late.restored
    (home / "db").rename(home / "db.late")  # its put-back comes after the next batch
    (home / "db.winner").rename(home / "db")
    other = run_subtask(order, 1, "one", parts[1])
    job.emitted[order.batch_id] = [w for r in (winner, other) for w in r.closed]
    job.driver.finish(order, [winner, other])
    job.next_batch += 1
    assert job.batch().restored == 0
    put_back(home / "db.late", home / "db")
    assert sorted(p.name for p in home.iterdir()) == ["db", "db.late.done"]
    job.quiesce()
    assert job.coordinator.finish_attempts()  # the late attempt's files: nobody's, swept
    assert job.coordinator.violations(quiet=True) == []
    assert sorted(p.name for p in home.iterdir()) == ["db"]  # the delivery dropped it
    assert job.batch().restored == 0
    cmp = job.comparison()
    assert cmp.windows >= 1 and cmp.equal, cmp.mismatches[:5]


def _new_files(base: Path, seen: set[str]) -> set[str]:
    now = {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}
    new = now - seen
    seen |= new
    return new


def test_within_writes_at_most_one_exclusive_file_per_tm_and_checkpoint(tmp_path: Path) -> None:
    job = LocalJob(
        tmp_path, Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1), parallelism=4
    )
    base, seen = Path(job.url), set[str]()
    tms: set[str] = set()
    for b in range(8):
        r = job.batch()
        job.coordinator.settle()
        new = _new_files(base, seen)
        # Four subtasks write MANIFEST, OPTIONS, CURRENT and their operator state each:
        # sixteen EXCLUSIVE handles, pooled into one file per TM (R13, R14); each
        # subtask's TM is the same attempt from batch to batch (its records travel with
        # the local DB), and created the files itself (counted on the worker).
        assert r.exclusive == 16
        exclusive = {f for f in new if "/taskowned/" in f}
        owners = [f.split("/")[2] for f in exclusive]
        assert len(exclusive) == len(set(owners)) == 4, sorted(new)
        assert tms == set(owners) if b else not tms
        tms = set(owners)
        state = {f for f in new if "/shared/" in f or "/taskowned/" in f}
        assert r.created == len(state), sorted(new)
        assert r.new_tms == (4 if b == 0 else 0)
    job.quiesce()
    assert job.coordinator.violations(quiet=True) == []


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("restore_mode", [RestoreMode.NO_CLAIM, RestoreMode.CLAIM])
@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2)])
@pytest.mark.parametrize("inline", [0, 20 << 10], ids=["files", "inline"])
def test_a_rescaled_subtask_holds_exactly_its_key_groups_and_counts_once(
    tmp_path: Path,
    mode: MergingMode,
    restore_mode: RestoreMode,
    before: int,
    after: int,
    inline: int,
) -> None:
    job = LocalJob(
        tmp_path,
        Config.for_mode(mode, num_retained=1, restore_mode=restore_mode, inline_threshold=inline),
        parallelism=before,
        windowing=Windowing(3000),
    )
    for _ in range(5):
        job.batch()
    job.quiesce()  # the TMs heard checkpoint 5 completed; its subsume's deletes are done
    old_files = {p for p in Path(job.url, "job-0").rglob("*") if p.is_file()}
    job.rescale(after)
    assert job.driver.last_batch == 4 and job.driver.ran_watermark == job.source.event_ms(3)
    first = job.batch()
    # Every new subtask restored from the key groups it owns, and uploaded everything.
    assert first.restored == after and first.reused == 0
    for i in range(after):
        lo, hi = key_group_range(MAX_PARALLELISM, after, i)
        home = subtask_dir(job.work, SubtaskId(VERTEX, i, after)) / "db"
        db = WindowCounts(home, options())
        try:
            groups = {g for (g, _start, _word), _n in db.items()}
        finally:
            db.close()
        assert groups and groups <= set(range(lo, hi + 1)), (i, sorted(groups))
    # The new job's checkpoint names its own files only (R71); NO_CLAIM leaves the old
    # job's untouched, CLAIM deletes them once subsumed (R72, R73).
    for s in job.driver.subtasks():
        for e in decode_assignment(job.coordinator.restore_assignment(s, 99)).entries:
            h = stream_of(e.handle)
            assert isinstance(e.handle, InlineHandle) or (h and h.path.startswith("job-1/")), e
    job.coordinator.settle()
    left = {p for p in Path(job.url, "job-0").rglob("*") if p.is_file()}
    if restore_mode is RestoreMode.NO_CLAIM:
        assert left == old_files
    else:
        assert not left
    for _ in range(3):
        job.batch()
    emitted = [w for ws in job.emitted.values() for w in ws]
    cmp = compare(job.expected(), emitted, job.windowing, job.closed_watermark())
    assert cmp.windows >= 2 and cmp.equal, cmp.mismatches[:10]
    job.quiesce()
    assert job.coordinator.violations(quiet=True) == []


def _state(seed: int, empty: frozenset[int] = frozenset()) -> dict[bytes, bytes]:
    """Keys of the job's shape over every key group but ``empty``: three windows, a seeded
    draw of words and counts (some key groups end up with none by chance too)."""
    rng = random.Random(seed)
    out: dict[bytes, bytes] = {}
    for g in range(MAX_PARALLELISM):
        if g not in empty:
            for start in (0, 1000, 2000):
                for _ in range(rng.randint(0, 12)):
                    word = f"w{rng.randrange(10**6):06d}"
                    out[encode_key(g, start, word)] = rng.randrange(1, 99).to_bytes(8, "big")
    return out


def _old_dbs(root: Path, parallelism: int, keys: Mapping[bytes, bytes]) -> list[StateEntry]:
    """The RocksDBs of a job at ``parallelism``, each holding the keys of its subtask's key
    groups, flushed three times (overlapping level-0 SSTs), as the entries of a
    checkpoint that ``StateReader(root)`` reads, one lineage each."""
    entries: list[StateEntry] = []
    for i in range(parallelism):
        lo, hi = key_group_range(MAX_PARALLELISM, parallelism, i)
        d = root / f"p{parallelism}" / str(i)
        db = rocksdict.Rdict(str(d), options())
        mine = sorted((k, v) for k, v in keys.items() if lo <= decode_key(k)[0] <= hi)
        for part in (mine[0::3], mine[1::3], mine[2::3]):
            batch = rocksdict.WriteBatch(raw_mode=True)
            for k, v in part:
                batch.put(k, v)
            db.write(batch)
            db.flush(True)
        db.close()
        lineage, sub = f"W1-p{parallelism}s{i}", SubtaskId(VERTEX, i, parallelism)
        for f in sorted(os.listdir(d)):
            if SST.fullmatch(f):
                kind, name = StateKind.KEYED_SHARED, sst_name(lineage, f)
            elif META.fullmatch(f):
                kind, name = StateKind.KEYED_FULL, meta_name(lineage, f)
            else:
                continue
            handle = FileHandle(
                f"p{parallelism}/{i}/{f}", (d / f).stat().st_size, name, Scope.SHARED
            )
            entries.append(StateEntry(sub, kind, name, handle, key_groups=(lo, hi)))
    return entries


def _assigned(entries: Sequence[StateEntry], groups: tuple[int, int]) -> list[StateEntry]:
    """What a rescale assigns a new subtask: the old keyed state overlapping its range (R75)."""
    return [
        e
        for e in entries
        if e.key_groups is not None
        and e.key_groups[0] <= groups[1]
        and groups[0] <= e.key_groups[1]
    ]


def _items(path: Path) -> list[tuple[Any, Any]]:
    db = rocksdict.Rdict(str(path), options(), access_type=rocksdict.AccessType.read_only(False))
    try:
        return list(db.items())
    finally:
        db.close()


def _in(keys: Mapping[bytes, bytes], first: int, last: int) -> list[tuple[bytes, bytes]]:
    return sorted((k, v) for k, v in keys.items() if first <= decode_key(k)[0] <= last)


@pytest.mark.parametrize(
    ("before", "after"),
    [(4, 2), (4, 1), (2, 4), (1, 3), (3, 2), (2, 3), (5, 3), (3, 5)],
    ids=lambda n: str(n),
)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_a_rescale_restore_holds_exactly_its_key_groups_as_the_key_by_key_copy_did(
    tmp_path: Path, before: int, after: int, sparse: bool
) -> None:
    """``restore_key_groups`` takes the old DB overlapping the new range the most as the
    base (clipped by range on the sides where it holds more: both sides for 1 -> 3's
    middle subtask) and ingests the other old DBs' keys of the range: every key of the
    range is there with its value and none outside (an iteration past the range
    tombstones), the same as the key-by-key copy builds on the same input. Sparse: an old
    DB with no key at all (4 -> 2's base is empty), and empty key groups at the ranges'
    edges. The number returned counts the keys of the old DBs other than the base."""
    empty = frozenset(range(40)) | {42, 43, 63, 64, 85, 86, 127} if sparse else frozenset()
    keys = _state(before * 10 + after, empty)
    entries = _old_dbs(tmp_path, before, keys)
    reader = StateReader(str(tmp_path), {})
    old_ranges = [key_group_range(MAX_PARALLELISM, before, j) for j in range(before)]
    for i in range(after):
        groups = key_group_range(MAX_PARALLELISM, after, i)
        mine = _assigned(entries, groups)
        target, reference = tmp_path / "new" / str(i), tmp_path / "ref" / str(i)
        copied = restore_key_groups(reader, mine, target, groups, options())
        restore_key_by_key(reader, mine, reference, groups, options())
        want = _in(keys, *groups)
        got = _items(target)
        assert got == want, (i, len(got), len(want))
        assert got == _items(reference)
        # The base: the largest overlap, the first among equals (lineages sort by subtask).
        overlaps = [max(0, min(hi, groups[1]) - max(lo, groups[0]) + 1) for lo, hi in old_ranges]
        base = old_ranges[overlaps.index(max(overlaps))]
        assert copied == len(want) - len(
            _in(keys, max(base[0], groups[0]), min(base[1], groups[1]))
        )
    assert sorted(os.listdir(tmp_path / "new")) == [str(i) for i in range(after)]


def test_copied_keys_are_cut_into_many_ssts_and_all_ingested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded memory and files: ``COPY_CHUNK`` keys a step, a file cut once it reached
    ``SST_BYTES``. With 7 keys a step and a 1-byte bound, a file is cut at the first step
    after its writer wrote a data block (its size counts written blocks, 4 KiB each):
    several files per old DB, which together hold every key of the range in order; the
    new DB holds every key of the new range."""
    keys = _state(7)
    entries = _old_dbs(tmp_path, 4, keys)
    monkeypatch.setattr(snapshot, "COPY_CHUNK", 7)
    monkeypatch.setattr(snapshot, "SST_BYTES", 1)
    made: list[int] = []
    real = snapshot.copy_ranges

    def counting(*args: Any, **kwargs: Any) -> tuple[int, list[str]]:
        n, files = real(*args, **kwargs)
        made.append(len(files))
        return n, files

    monkeypatch.setattr(snapshot, "copy_ranges", counting)
    groups = (0, 127)
    copied = restore_key_groups(
        StateReader(str(tmp_path), {}), entries, tmp_path / "new", groups, options()
    )
    assert _items(tmp_path / "new") == _in(keys, *groups)
    assert copied == len(_in(keys, 32, 127))  # the base: subtask 0's DB, kept whole
    assert len(made) == 3 and min(made) >= 2, made  # subtasks 1-3, several files each
    src = rocksdict.Rdict(
        str(tmp_path / "p4" / "1"), options(), access_type=rocksdict.AccessType.read_only(False)
    )
    try:
        (tmp_path / "ssts").mkdir()
        ranges = group_ranges(src, (32, 63))
        n, files = copy_ranges(src, ranges, options(), tmp_path / "ssts", file_bytes=1)
    finally:
        src.close()
    assert n == len(_in(keys, 32, 63))
    assert len(files) >= 2
    written: list[list[tuple[Any, Any]]] = []
    for f in files:
        one = rocksdict.Rdict(str(tmp_path / f"one-{len(written)}"), options())
        try:
            one.ingest_external_file([f])
            written.append(list(one.items()))
        finally:
            one.close()
    assert all(written) and [kv for w in written for kv in w] == _in(keys, 32, 63)


class _Counting:
    def __init__(self, inner: StateReader, fail_on: str | None = None) -> None:
        self.inner, self.fail_on, self.reads = inner, fail_on, 0

    def read(self, entry: StateEntry) -> bytes:
        self.reads += 1
        if self.fail_on is not None and entry.name.startswith(self.fail_on):
            raise OSError(f"injected: {entry.name}")
        return self.inner.read(entry)


def test_a_rescale_restore_refuses_a_foreign_name_before_reading_and_leaves_nothing_on_failure(
    tmp_path: Path,
) -> None:
    """A name that is not one of ours is refused before any read; a read that fails in the
    middle (an old DB other than the base), or an old DB whose SST is damaged (a read
    error, never a short copy), leaves no new DB and nothing half-built beside it."""
    keys = _state(3)
    entries = _old_dbs(tmp_path, 4, keys)
    out = tmp_path / "new"
    out.mkdir()
    bad = StateEntry(
        S0, StateKind.KEYED_SHARED, "sst/W1-p4s9/../../x", entries[0].handle, key_groups=(0, 31)
    )
    party = _Counting(StateReader(str(tmp_path), {}))
    with pytest.raises(RestoreError, match="not a RocksDB file"):
        restore_key_groups(party, [*entries, bad], out / "db", (0, 127), options())
    assert party.reads == 0 and os.listdir(out) == []
    party = _Counting(StateReader(str(tmp_path), {}), fail_on="sst/W1-p4s2/")
    with pytest.raises(OSError, match="injected"):
        restore_key_groups(party, entries, out / "db", (0, 127), options())
    assert party.reads > 0 and os.listdir(out) == []
    # A damaged data block in subtask 1's DB (not the base: subtask 0's).
    sst = next(f for f in sorted((tmp_path / "p4" / "1").iterdir()) if SST.fullmatch(f.name))
    data = bytearray(sst.read_bytes())
    data[20:40] = bytes(20)
    sst.write_bytes(bytes(data))
    with pytest.raises(Exception, match=r"[Cc]orrupt|checksum"):
        restore_key_groups(StateReader(str(tmp_path), {}), entries, out / "db", (0, 127), options())
    assert os.listdir(out) == []


@pytest.mark.parametrize("damage", [b"not json", b"[]", b'{"batch": "x", "watermark": 0}', b"{}"])
def test_a_damaged_progress_record_stops_the_restart_with_a_clear_error(
    tmp_path: Path, damage: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = LocalJob(tmp_path, Config.for_mode(MergingMode.WITHIN_CHECKPOINT), parallelism=2)
    for _ in range(2):
        job.batch()
    real = job.coordinator.read
    monkeypatch.setattr(
        job.coordinator, "read", lambda e: damage if e.name == "operator/progress" else real(e)
    )
    with pytest.raises(ValueError, match="is not a progress record"):
        job.driver.recover_progress()
    assert job.driver.last_batch == 1  # nothing taken from the damaged record


def test_a_checkpoint_the_store_aborted_while_receiving_fails_as_not_completed(
    tmp_path: Path,
) -> None:
    """A decline (or an acknowledgement the registry refuses, R22) aborts the checkpoint
    inside ``receive``; ``complete`` then says so with ``CheckpointNotCompleted``, the one
    error the driver re-runs a batch on, not with the store's refusal of a checkpoint that
    is no longer pending. A checkpoint completed already is still the store's refusal."""
    s = OneSubtask(tmp_path, MergingMode.NONE)
    s.put(0, 300)
    c = s.coordinator.trigger()
    s.coordinator.receive(s.tm(c).decline(c, S0))
    with pytest.raises(CheckpointNotCompleted, match="aborted"):
        s.coordinator.complete(c)
    done, _ = s.checkpoint()
    with pytest.raises(CommandError, match="not pending"):
        s.coordinator.complete(done)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_task_killed_mid_upload_ends_its_tm_attempt_whose_files_are_swept(
    tmp_path: Path, mode: MergingMode
) -> None:
    """The killed task took the subtask's DB and TM records with it: the retry restores
    and starts a new TM attempt, which the coordinator first hears of by its
    acknowledgement. Once that checkpoint completes, the old attempt is given up and
    known stopped (R64): nothing under its exclusive directory is left, and every file
    on storage has an owner (I3) before and after the TMs applied their mail."""
    job = LocalJob(
        tmp_path,
        Config.for_mode(mode, num_retained=1),
        parallelism=2,
        failures=Failures(kill_at=(2, 1, "mid-upload")),
    )
    tms = []
    for _ in range(4):
        r = job.batch()
        tms.append(job.coordinator.co.placement[SubtaskId(VERTEX, 1, 2)])
        assert job.coordinator.violations() == []
    assert job.kills == [(2, 1, 0, "mid-upload")]
    assert tms[0] == tms[1] != tms[2] == tms[3]  # the same attempt until the kill
    assert r.new_tms == 0 and job.driver.reports[2].new_tms == 1
    assert tms[1] in job.coordinator.retired
    gone = Path(job.url, "job-0", "taskowned", tms[1])
    assert not (gone.exists() and any(p.is_file() for p in gone.rglob("*")))
    job.quiesce()
    assert job.coordinator.violations(quiet=True) == []
    assert job.comparison().equal
