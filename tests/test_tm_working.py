"""A TM in a process of its own (``TaskManager.alone``) keeps working state from the
coordinator's messages alone (§11): it opens the files an ``OpenDatabase`` names in
place, copies the user's (NO_CLAIM, R105) before a snapshot refers to one, hands what a
snapshot refers to in place over with its acknowledgement and then forgets it, and never
deletes a file that is not its own (R102)."""

from __future__ import annotations

from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.taskmanager import TaskManager
from spec.config import Config, MergingMode
from spec.handles import InPlaceFile
from spec.ids import SubtaskId
from spec.layout import working_dir
from spec.messages import DatabaseFiles, DatabasesOpened, InUse, OpenDatabase

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
