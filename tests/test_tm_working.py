"""A TM in a process of its own (``TaskManager.alone``) keeps working state from the
coordinator's messages alone (§11): it opens the files an ``OpenDatabase`` names in
place, copies the user's (NO_CLAIM, R105) before a snapshot refers to one, hands what a
snapshot refers to in place over with its acknowledgement and then forgets it, and never
deletes a file that is not its own (R102)."""

from __future__ import annotations

from typing import Any

import fsspec  # type: ignore[import-untyped]

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
