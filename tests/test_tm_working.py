"""A TM in a process of its own (``TaskManager.alone``) keeps working state from the
coordinator's messages alone (§11): it opens the files an ``OpenDatabase`` names in
place, copies the user's (NO_CLAIM, R105) before a snapshot refers to one, hands what a
snapshot refers to in place over with its acknowledgement and then forgets it, and never
deletes a file that is not its own (R102)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest

from conformance.fastimpl_commands import apply
from fastimpl.storage import StorageFault
from fastimpl.taskmanager import TaskManager
from fastimpl.working import is_working_path, overlaps
from spec.commands import DropWorking, FailNextCall, SnapshotWorking, StorageOp, Trigger
from spec.config import Config, MergingMode, RestoreMode
from spec.effects import COORDINATOR
from spec.errors import CommandError, Reason
from spec.handles import InPlaceFile
from spec.ids import SubtaskId
from spec.invariants import check_safety
from spec.layout import working_dir
from spec.messages import (
    DatabaseFiles,
    DatabasesOpened,
    Duty,
    EndJob,
    InUse,
    KeptFile,
    OpenDatabase,
)
from tests.faultyfs import Place
from tests.working_jobs import working_engine, working_store

SUB = SubtaskId("v", 0, 1)
OLD = SubtaskId("v", 0, 1)


def _tm(root: str) -> tuple[TaskManager, Any]:
    fs = fsspec.filesystem("memory")
    tm = TaskManager.alone(
        fs, root, Config.for_mode(MergingMode.WITHIN_CHECKPOINT), "job-1", "tm-3"
    )
    return tm, fs


def test_a_tm_of_its_own_copies_the_users_files_and_deletes_only_its_own() -> None:
    root = "/tm-working-1"
    tm, fs = _tm(root)
    user = f"{working_dir('job-0', OLD)}/f000007"  # the NO_CLAIM source's file
    fs.pipe(f"{root}/{user}", b"u" * 120)
    tm.host([SUB])
    msg = OpenDatabase("job-1", "tm-3", 0, SUB, (InPlaceFile(user, 120, (0, 127)),), (), True)
    assert tm.on_duty(msg) is None
    answer = tm.on_duty(DatabaseFiles("job-1", "tm-3"))
    assert isinstance(answer, InUse) and answer.paths == (user,)
    written: list[str] = []

    def write(name: str, data: bytes) -> object:
        written.append(name)
        return None

    tm.working.snapshot(SUB, 2, 0, False, write)
    (pinned,) = tm.working.pins[(SUB, 2)]
    assert pinned != user and pinned.startswith(working_dir("job-1", SUB) + "/")
    assert fs.cat(f"{root}/{pinned}") == b"u" * 120  # a copy of the user's bytes
    assert written == []  # nothing small: referred to in place
    _, ack = tm.acknowledge(SUB, 2)
    assert [f.path for f in ack.in_place] == [pinned]
    tm.on_duty(DatabasesOpened("job-1", "tm-3", 0))
    tm.working.drop(SUB, pinned)  # handed over: the coordinator's, never deleted here
    assert fs.exists(f"{root}/{pinned}") and fs.exists(f"{root}/{user}")
    private = tm.working.write(SUB, b"p" * 10)
    tm.working.drop(SUB, private)  # its own, unused: deleted at once (R102)
    tm.catalog.storage.drain()
    assert not fs.exists(f"{root}/{private}")
    assert fs.exists(f"{root}/{user}")  # the user's: copied, never deleted (R105)


@pytest.mark.parametrize("mode", list(RestoreMode), ids=lambda m: m.name)
def test_what_a_restore_opens_tells_a_tm_of_its_own_whose_the_files_are(
    mode: RestoreMode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """R105, R73: the databases of a restored job open on the checkpoint's working files in
    place. A TM in a process of its own records none of them, so the coordinator's
    ``OpenDatabase`` is all it has to tell a NO_CLAIM source's file (the user's: its
    snapshot copies it first) from a claimed one (the coordinator's: referred to in place
    again). Here a job's databases are checkpointed on the in-process engine, it is
    restored, and what the coordinator sends is applied by TMs of their own."""
    place = Place.make("memory", tmp_path)
    fs, root = place.inner, place.root
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    engine, cp, _, in_place = working_store(place, config)
    restored = set(in_place)
    sent: list[Duty] = []
    duty = engine.duty

    def spy(tm: str, msg: Duty) -> object:
        sent.append(msg)
        return duty(tm, msg)

    monkeypatch.setattr(engine, "duty", spy)
    engine.restore(cp, mode=mode)
    opens = [m for m in sent if isinstance(m, OpenDatabase)]
    assert {f.path for m in opens for f in m.in_place} == restored
    for msg in opens:
        tm = TaskManager.alone(fs, root, config, msg.job, msg.tm)
        tm.host([msg.subtask])
        tm.on_duty(msg)
        tm.working.snapshot(msg.subtask, cp + 1, 0, False, lambda name, data: None)
        pinned = set(tm.working.pins[(msg.subtask, cp + 1)])
        if mode is RestoreMode.NO_CLAIM:  # copies of the user's files, in the new job
            assert not pinned & restored and all(p.startswith(f"{msg.job}/") for p in pinned)
        else:
            assert pinned == {f.path for f in msg.in_place}
    engine.storage.close_all()
    place.cleanup()


def test_a_database_that_writes_its_own_files_is_tracked_by_its_manifest() -> None:
    """``Databases.track`` (SlateDB, R101, R102): a file of the database's own directory
    it did not use before is its attempt's private file; a file it no longer lists goes
    at once if still its own and unpinned, and a handed-over one never; a file outside its
    directory that it was not opened on is refused and nothing is recorded."""
    root = "/tm-working-track"
    tm, fs = _tm(root)
    tm.host([SUB])
    lineage = f"{working_dir('job-1', SUB)}/0123456789ab"
    a, b, c = (f"{lineage}/compacted/{n}.sst" for n in ("A", "B", "C"))
    for p in (a, b, c):
        fs.pipe(f"{root}/{p}", b"s" * 50)
    tm.working.track(SUB, {a: 50, b: 50}, lineage)
    assert tm.catalog.files[a].owner == "tm:tm-3" and set(tm.working.in_use()) == {a, b}
    tm.working.snapshot(SUB, 1, 1, False, lambda name, data: None)
    _, ack = tm.acknowledge(SUB, 1)
    assert sorted(f.path for f in ack.in_place) == [a, b]  # handed over: no longer its own
    tm.working.track(SUB, {b: 50, c: 50}, lineage)  # a compaction replaced a by c
    tm.catalog.storage.drain()
    assert fs.exists(f"{root}/{a}")  # the coordinator's now: never deleted here
    tm.working.snapshot(SUB, 2, 1, False, lambda name, data: None)  # pins b and c
    tm.working.track(SUB, {b: 50}, lineage)
    tm.catalog.storage.drain()
    assert fs.exists(f"{root}/{c}")  # pinned by the unacknowledged snapshot of 2
    tm.working.drop_pins(SUB, 2)  # never acknowledged: private and unused, so it goes
    tm.catalog.storage.drain()
    assert not fs.exists(f"{root}/{c}")
    foreign = f"{working_dir('job-1', SubtaskId('v', 1, 2))}/0123456789ab/compacted/D.sst"
    with pytest.raises(ValueError, match="neither wrote nor was opened on"):
        tm.working.track(SUB, {b: 50, foreign: 50}, lineage)
    assert foreign not in tm.catalog.files and set(tm.working.in_use()) == {b}
    with pytest.raises(ValueError, match="is not a database directory of"):
        tm.working.track(SUB, {}, working_dir("job-1", SubtaskId("v", 1, 2)) + "/x")


def _big(tm: TaskManager, n: int, fill: bytes) -> str:
    """A working file of ``n`` bytes the database of ``SUB`` writes (R101)."""
    return tm.working.write(SUB, fill * n)


def test_a_snapshot_refers_in_place_to_every_file_of_at_least_the_inline_size() -> None:
    """R103: only a file smaller than ``inline_below`` is written inline; each other file
    is pinned, whatever the order of the files (an inline one first stops nothing)."""
    tm, _ = _tm("/tm-working-inline")
    tm.host([SUB])
    small = _big(tm, 10, b"s")
    exact = _big(tm, 50, b"e")
    large = _big(tm, 80, b"l")
    assert small < exact < large  # names in writing order: the inline one sorts first
    written: list[str] = []
    tm.working.snapshot(SUB, 1, 50, False, lambda name, data: written.append(name))
    assert written == [f"db:{small.rsplit('/', 1)[1]}"]
    assert tm.working.pins[(SUB, 1)] == (exact, large)


def test_a_second_snapshot_for_one_checkpoint_keeps_the_first_ones_pins() -> None:
    """R103: what an earlier snapshot of the same checkpoint refers to stays pinned
    (and is acknowledged) with what the later one adds; a pinned file the database stops
    using is not deleted."""
    tm, fs = _tm("/tm-working-twice")
    tm.host([SUB])
    a = _big(tm, 60, b"a")
    tm.working.snapshot(SUB, 1, 1, False, lambda name, data: None)
    b = _big(tm, 60, b"b")
    tm.working.drop(SUB, a)  # pinned by the first snapshot: kept
    tm.working.snapshot(SUB, 1, 1, False, lambda name, data: None)
    scratch = _big(tm, 5, b"x")
    tm.working.drop(SUB, scratch)  # a release: only the unpinned scratch file goes
    tm.catalog.storage.drain()
    assert fs.exists(f"/tm-working-twice/{a}") and not fs.exists(f"/tm-working-twice/{scratch}")
    assert [f.path for f in tm.working.unpin(SUB, 1)] == [a, b]


def test_every_file_of_the_users_is_copied_and_the_copy_arms_no_fault() -> None:
    """R105 (NO_CLAIM): each of the user's files a database was opened on is copied
    before a snapshot refers to it, not only the first; the copy is the restore's and
    leaves a fault armed for the database's next write (the model's ``unfaulted``)."""
    root = "/tm-working-users"
    tm, fs = _tm(root)
    users = [f"{working_dir('job-0', OLD)}/f00000{i}" for i in (1, 2)]
    for u in users:
        fs.pipe(f"{root}/{u}", b"u" * 70)
    tm.host([SUB])
    files = tuple(InPlaceFile(u, 70, (0, 127)) for u in users)
    assert tm.on_duty(OpenDatabase("job-1", "tm-3", 0, SUB, files, (), True)) is None
    storage = tm.catalog.storage
    storage.arm(StorageOp.CREATE)
    tm.working.snapshot(SUB, 2, 1, False, lambda name, data: None)
    pins = tm.working.pins[(SUB, 2)]
    assert len(pins) == 2 and not set(pins) & set(users)
    assert all(p.startswith(working_dir("job-1", SUB) + "/") for p in pins)
    assert storage.armed == [StorageOp.CREATE]  # still armed for the next write
    with pytest.raises(StorageFault):
        tm.working.write(SUB, b"w" * 3)


def test_a_database_directory_and_its_files_are_checked_before_anything_is_recorded() -> None:
    """``Databases.track``: the subtask's working directory itself is no database
    directory, a file of no bytes is refused, one of a single byte is accepted; a refusal
    records nothing. ``drop`` of a subtask with no database is ``NO_SUCH_STATE``."""
    tm, _ = _tm("/tm-working-checks")
    tm.host([SUB])
    with pytest.raises(ValueError, match="is not a database directory of"):
        tm.working.track(SUB, {}, working_dir("job-1", SUB))
    lineage = f"{working_dir('job-1', SUB)}/0123456789ab"
    empty, one = f"{lineage}/e.sst", f"{lineage}/o.sst"
    with pytest.raises(ValueError, match="working files of no bytes"):
        tm.working.track(SUB, {empty: 0}, lineage)
    assert empty not in tm.catalog.files and tm.working.in_use() == ()
    tm.working.track(SUB, {one: 1}, lineage)
    assert tm.working.in_use() == (one,) and tm.catalog.files[one].owner == "tm:tm-3"
    other = SubtaskId("v", 1, 2)
    with pytest.raises(CommandError) as err:
        tm.working.drop(other, one)
    assert err.value.reason is Reason.NO_SUCH_STATE


def test_a_file_whose_key_groups_touch_a_subtasks_range_at_one_end_is_opened_by_it() -> None:
    """R105 on a rescale: key-group ranges are inclusive, so a file whose range ends
    where a subtask's begins (or begins where it ends) holds state of that subtask."""
    assert overlaps((0, 5), (5, 9)) and overlaps((5, 9), (0, 5))
    assert overlaps((3, 3), (3, 3))
    assert not overlaps((0, 4), (5, 9)) and not overlaps((5, 9), (0, 4))


def test_a_file_handed_over_is_no_longer_the_tms_at_the_jobs_end() -> None:
    """R103, R90: once an acknowledgement handed a working file to the coordinator, a TM
    with records of its own forgets it: its answer to ``EndJob`` does not hand it back
    as its own, and its end deletes only the private file nothing refers to."""
    root = "/tm-working-end"
    tm, fs = _tm(root)
    tm.host([SUB])
    shared = _big(tm, 60, b"a")
    tm.working.snapshot(SUB, 1, 1, False, lambda name, data: None)
    _, ack = tm.acknowledge(SUB, 1)
    assert [f.path for f in ack.in_place] == [shared]
    private = _big(tm, 60, b"p")
    ended = tm.end(EndJob("job-1", "tm-3", frozenset()))
    tm.catalog.storage.drain()
    assert shared not in {k.path for k in ended.files}
    assert fs.exists(f"{root}/{shared}") and not fs.exists(f"{root}/{private}")


def test_a_restored_file_referred_to_in_place_is_handed_over_without_a_record() -> None:
    """R105 CLAIM, R103: a database opened on a restored file holds no record of it (the
    file is the coordinator's); a snapshot refers to it in place and the acknowledgement
    hands it over all the same, and the TM never deletes it."""
    root = "/tm-working-claim"
    tm, fs = _tm(root)
    restored = f"{working_dir('job-0', OLD)}/f000009"
    fs.pipe(f"{root}/{restored}", b"r" * 90)
    tm.host([SUB])
    msg = OpenDatabase("job-1", "tm-3", 0, SUB, (InPlaceFile(restored, 90, (0, 127)),), (), False)
    assert tm.on_duty(msg) is None
    assert restored not in tm.catalog.files
    tm.working.snapshot(SUB, 1, 1, False, lambda name, data: None)
    assert tm.working.pins[(SUB, 1)] == (restored,)  # not copied: not the user's
    _, ack = tm.acknowledge(SUB, 1)
    assert [f.path for f in ack.in_place] == [restored]
    tm.working.drop(SUB, restored)
    tm.catalog.storage.drain()
    assert fs.exists(f"{root}/{restored}")


def test_a_tracked_file_the_tm_could_not_delete_is_handed_over_with_its_record() -> None:
    """R90, R102: at the job's end a database's private file goes; if its delete fails
    the TM hands it to the coordinator in its ``TmEnded`` answer with the size and the
    creator its manifest gave, so that the coordinator can delete it (waiting for that
    attempt if it is lost, R64)."""
    root = "/tm-working-undeleted"
    tm, fs = _tm(root)
    tm.host([SUB])
    lineage = f"{working_dir('job-1', SUB)}/0123456789ab"
    sst = f"{lineage}/compacted/A.sst"
    fs.pipe(f"{root}/{sst}", b"s" * 50)
    tm.working.track(SUB, {sst: 50}, lineage)
    tm.catalog.storage.arm(StorageOp.DELETE)
    ended = tm.end(EndJob("job-1", "tm-3", frozenset()))
    tm.catalog.storage.drain()
    assert ended.files == (KeptFile(sst, 50, "tm-3"),)
    assert fs.exists(f"{root}/{sst}")


@pytest.mark.parametrize(
    ("path", "working"),
    [
        ("job-0/taskowned/working/v-0-1/db/f000001", True),
        ("job-0/taskowned/working/v-0-1/db/0123456789ab/compacted/A.sst", True),
        ("job-0/taskowned/tm-1/x/db/f000001", False),  # a TM's own directory
        ("job-0/shared/working/v-0-1/db/f000001", False),
        ("job-0/shared/v-0-1/x/db/f000001", False),
        ("job-0/shared/v-0-1/a/b/c", False),
        ("job-0/taskowned/working/v-0-1/dbx/f000001", False),
        ("job-0/taskowned/working/v-0-1/f000001", False),
    ],
)
def test_only_files_below_a_subtasks_db_directory_are_working_files(
    path: str, working: bool
) -> None:
    """R1, §11: what the coordinator takes over from an acknowledgement, keeps while
    referred to, and what recovery leaves to an outside store (``leave_working``) is only
    ``<base>/taskowned/working/<subtask>/db/...``."""
    assert is_working_path(path) is working


def test_a_replaced_tm_alone_reopens_its_databases_on_the_coordinators_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """R105, R66: after a task-level failover only the new attempt opens databases: on
    the latest checkpoint's working files of the subtasks it runs, in place and as the
    coordinator's (not the user's, so its next snapshot refers to them again instead of
    copying them), and only it is told its databases are open (R62: it deletes then the
    private files none of them uses). The replaced TM runs the later subtask, so a walk
    over the placement that stopped at another TM's subtask would open nothing."""
    place = Place.make("memory", tmp_path)
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    engine, cp, _, _ = working_store(place, config)
    last = max(engine.placement)
    old = engine.placement[last]
    assert sorted(engine.placement)[0] != last and engine.placement[min(engine.placement)] != old
    files = {w.path: w for r in engine.coord.retained for s, w in r.working if s == last}
    assert files
    sent: list[tuple[str, Duty]] = []
    duty = engine.duty

    def spy(tm: str, msg: Duty) -> object:
        sent.append((tm, msg))
        return duty(tm, msg)

    monkeypatch.setattr(engine, "duty", spy)
    new = engine.replace_tm(old)
    opens = [(tm, m) for tm, m in sent if isinstance(m, OpenDatabase)]
    assert [(tm, m.subtask, m.users) for tm, m in opens] == [(new, last, False)]
    assert set(opens[0][1].in_place) == set(files.values())
    assert [tm for tm, m in sent if isinstance(m, DatabasesOpened)] == [new]
    tm = TaskManager.alone(place.inner, place.root, config, engine.job, new)
    tm.host([last])
    tm.on_duty(opens[0][1])
    tm.working.snapshot(last, cp + 1, 0, False, lambda name, data: None)
    assert set(tm.working.pins[(last, cp + 1)]) == set(files)  # in place, not copied
    engine.storage.close_all()
    place.cleanup()


def test_a_release_frees_every_private_file_past_one_handed_over(tmp_path: Path) -> None:
    """R102: one release can free several files. Here an aborted snapshot's pins go at
    once on a file the coordinator took over at the checkpoint before (never deleted
    by the TM, which forgets it) and on a private file the database no longer uses
    (deleted at once). The handed-over file sorts first."""
    place = Place.make("memory", tmp_path)
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    engine, _, _, _ = working_store(place, config)
    sub = SubtaskId("v", 1, 2)  # its database wrote no private file after the checkpoint
    taken = engine.coord.catalog.files
    (handed,) = [w.path for s, w in engine.coord.retained[-1].working if s == sub]
    assert taken[handed].owner == COORDINATOR
    private = engine.working.write(sub, b"p" * 300)
    assert private is not None and handed < private
    apply(engine, Trigger())
    nxt = engine.coord.next_checkpoint - 1
    apply(engine, SnapshotWorking(nxt, sub, 0))  # pins both, in place
    apply(engine, DropWorking(sub, handed))
    apply(engine, DropWorking(sub, private))
    engine.storage.drain()
    assert place.inner.exists(f"{place.root}/{private}")  # pinned still
    engine.parties[engine.coord.placement[sub]].drop_outputs(sub, nxt)  # never acknowledged
    engine.storage.drain()
    assert not place.inner.exists(f"{place.root}/{private}")
    assert place.inner.exists(f"{place.root}/{handed}") and taken[handed].owner == COORDINATOR
    engine.storage.close_all()
    place.cleanup()


def test_a_private_file_whose_delete_failed_is_deleted_again_at_the_next_release(
    tmp_path: Path,
) -> None:
    """R102, R45: a TM's delete of a private file its database no longer uses fails; the
    file stays its own, and the TM's next release deletes it."""
    place = Place.make("memory", tmp_path)
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    engine, _, private, _ = working_store(place, config)
    sub = SubtaskId("v", 0, 2)  # wrote ``private`` after the checkpoint
    apply(engine, FailNextCall(StorageOp.DELETE))
    apply(engine, DropWorking(sub, private))
    engine.storage.drain()
    assert place.inner.exists(f"{place.root}/{private}")  # the delete failed
    later = engine.working.write(sub, b"q" * 40)
    assert later is not None
    apply(engine, DropWorking(sub, later))
    engine.storage.drain()
    assert not place.inner.exists(f"{place.root}/{private}")
    assert not place.inner.exists(f"{place.root}/{later}")
    assert check_safety(engine.observe()) == []
    engine.storage.close_all()
    place.cleanup()


def test_a_database_that_drops_every_file_leaves_no_empty_folder(tmp_path: Path) -> None:
    """R102 on a local disk: a private working file the database drops is deleted at once,
    and the folders it emptied go with it (its ``db`` directory, the subtask's, the
    job's ``working`` folder), up to the running job's ``taskowned`` folder, which its TMs
    write in and which stays: the pruning neither stops short of it nor takes it."""
    place = Place.make("local", tmp_path)
    engine = working_engine(place, Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1))
    sub = SubtaskId("v", 0, 2)
    private = engine.working.write(sub, b"p" * 30)
    assert private is not None and private.startswith(working_dir("job-0", sub) + "/")
    engine.storage.drain()
    apply(engine, DropWorking(sub, private))
    engine.storage.drain()
    left = sorted(
        str(Path(d).relative_to(place.root)) for d, _, _ in os.walk(place.root) if d != place.root
    )
    assert left == ["job-0", "job-0/taskowned"], left
    assert check_safety(engine.observe()) == []
    engine.storage.close_all()
