"""A TaskManager with records of its own applies the coordinator's duties
(``spec.messages``: ``ResetTm``, ``TmAssignment``, ``ReusableFiles``, ``EndJob``,
``Holdings``) once: repeated, late or out of order they change nothing (issue 16); and
the files one notice or the job's end frees go in the order they were made."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from fastimpl.ids import RandomIds
from fastimpl.taskmanager import TaskManager
from spec.commands import StorageOp
from spec.config import Config, Scope, StateKind
from spec.effects import COORDINATOR
from spec.handles import FileHandle, SegmentHandle, StateEntry
from spec.ids import SubtaskId
from spec.layout import shared_dir, taskowned_dir
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    EndJob,
    Held,
    Holdings,
    KeptFile,
    ResetTm,
    RetainedCheckpoint,
    ReusableFiles,
    TmAssignment,
    TmEnded,
    decode_message,
    encode_message,
)

JOB = "job-0"
S = SubtaskId("map", 0, 1)
WITHIN = Config(file_merging_enabled=True, max_file_size=4096, num_retained=1)


def a_tm(tmp_path: Path, config: Config = WITHIN, tm: str = "tm-1") -> TaskManager:
    party = TaskManager.alone(f"file://{tmp_path}", "", config, JOB, tm)
    party.host([S])
    return party


def state(party: TaskManager) -> dict[str, Any]:
    """Everything a duty may change, as comparable values."""
    cat = party.catalog
    return {
        "files": {p: (f.size, f.open, f.owner, f.creator) for p, f in cat.files.items()},
        "dirs": dict(cat.dir_owner),
        "handed": {p: (d.creator, d.handed_over, sorted(d.used_by)) for p, d in cat.dirs.items()},
        "segs": {k: (s.path, s.offset, s.length, s.last_used) for k, s in party.m.segs.items()},
        "pfiles": {p: (f.ref_count, f.live_bytes, f.open) for p, f in party.m.pfiles.items()},
        "backend": {str(k): (r.entry, r.checkpoint, r.confirmed) for k, r in party.backend.items()},
        "known": (party.known_completed, party.finished_mark, party.first_checkpoint),
        "outputs": copy.deepcopy(party.outputs),
    }


def bytes_of(msg: Any) -> Any:
    """Every duty travels as bytes."""
    return decode_message(encode_message(msg))


def acknowledged_checkpoint(party: TaskManager, cid: int) -> tuple[StateEntry, ...]:
    party.write(S, cid, StateKind.KEYED_SHARED, "a", 100, 1, b"a" * 100)
    party.write(S, cid, StateKind.OPERATOR_LIST, "ops", 50, 1, b"o" * 50)
    _, ack = party.acknowledge(S, cid)
    return ack.entries


def assignment(entries: tuple[StateEntry, ...], epoch: int = 1, cid: int = 1) -> TmAssignment:
    done = RetainedCheckpoint(cid, entries)
    return TmAssignment(
        JOB, "tm-1", epoch, (S,), (done,), done, frozenset(), (), (), (), cid + 1, cid, cid, 0
    )


def test_an_assignment_applied_twice_or_after_a_newer_one_changes_nothing(
    tmp_path: Path,
) -> None:
    party = a_tm(tmp_path)
    entries = acknowledged_checkpoint(party, 1)
    party.write(S, 2, StateKind.KEYED_SHARED, "a", 70, 1, b"b" * 70)  # never acknowledged
    assert party.on_duty(bytes_of(ResetTm(JOB, "tm-1", 1))) is None
    assert party.outputs == {}  # R60: what was never acknowledged is dropped
    assert party.on_duty(bytes_of(assignment(entries))) is None
    segs = [e.handle for e in entries if isinstance(e.handle, SegmentHandle)]
    assert {h.logical_id for h in segs} == set(party.m.segs)  # R61: taken over, once
    acknowledged_checkpoint(party, 2)  # the restarted TM works on
    once = state(party)
    party.on_duty(bytes_of(assignment(entries)))  # repeated
    party.on_duty(bytes_of(ResetTm(JOB, "tm-1", 1)))  # late: the assignment came first
    assert state(party) == once
    # a newer failover's assignment without its reset: the TM resets first (what it
    # wrote for checkpoint 2 is forgotten), then restarts from checkpoint 1 again
    party.on_duty(bytes_of(assignment(entries, epoch=2)))
    assert set(party.m.segs) == {h.logical_id for h in segs}
    again = state(party)
    party.on_duty(bytes_of(ResetTm(JOB, "tm-1", 2)))  # late for epoch 2
    party.on_duty(bytes_of(assignment(entries, epoch=1)))  # older
    assert state(party) == again


def test_an_assignment_records_the_directories_and_files_it_hands(tmp_path: Path) -> None:
    """R61, R42: a new TM knows nothing of its directories but what the assignment
    says: one taken over is its own, one the coordinator's stays the coordinator's, and
    a file handed with its record is its own."""
    writer = a_tm(tmp_path, tm="tm-1")
    entries = acknowledged_checkpoint(writer, 1)
    new = a_tm(tmp_path, tm="tm-3")
    seg = next(e.handle for e in entries if isinstance(e.handle, SegmentHandle))
    kept = (KeptFile(seg.path, 150, "tm-1"),)
    done = RetainedCheckpoint(1, entries)
    msg = TmAssignment(
        JOB,
        "tm-3",
        1,
        (S,),
        (done,),
        done,
        frozenset(),
        (taskowned_dir(JOB, "tm-3"),),
        (shared_dir(JOB, S),),
        kept,
        2,
        1,
        1,
        0,
    )
    new.on_duty(bytes_of(msg))
    assert new.catalog.dir_owner[shared_dir(JOB, S)] == COORDINATOR
    assert new.catalog.dirs[shared_dir(JOB, S)].handed_over
    assert new.catalog.files[seg.path].owner == "tm:tm-3"
    assert seg.logical_id in new.m.segs
    # it writes into the coordinator's directory and never claims it back
    new.write(S, 2, StateKind.KEYED_SHARED, "a", 10, 1, b"c" * 10)
    assert new.catalog.dir_owner[shared_dir(JOB, S)] == COORDINATOR


def test_reusable_files_of_an_older_epoch_are_ignored(tmp_path: Path) -> None:
    config = Config(file_merging_enabled=False, num_retained=1)
    party = a_tm(tmp_path, config)
    h = FileHandle(f"{JOB}/shared/{S.dir_name()}/old", 10, "lid", Scope.SHARED)
    e = StateEntry(S, StateKind.KEYED_SHARED, "a", h, 1, (0, 127))
    party.on_duty(bytes_of(assignment((), epoch=2)))
    party.on_duty(bytes_of(ReusableFiles(JOB, "tm-1", 1, 1, (e,))))
    assert party.backend == {}
    party.on_duty(bytes_of(ReusableFiles(JOB, "tm-1", 2, 1, (e,))))
    assert party.backend_ref(S, "a").entry == e


def test_end_job_answers_what_remains_and_a_repeat_gets_the_same_answer(
    tmp_path: Path,
) -> None:
    party = a_tm(tmp_path)
    entries = acknowledged_checkpoint(party, 1)
    keep = frozenset(e.handle.logical_id for e in entries if isinstance(e.handle, SegmentHandle))
    ended = party.on_duty(bytes_of(EndJob(JOB, "tm-1", keep)))
    assert isinstance(ended, TmEnded)
    assert {k.path for k in ended.files} == {
        e.handle.path for e in entries if isinstance(e.handle, SegmentHandle)
    }
    assert set(ended.directories) == {shared_dir(JOB, S), taskowned_dir(JOB, "tm-1")}
    assert party.catalog.files == {} and party.catalog.dir_owner == {}  # handed over
    after = state(party)
    assert party.on_duty(bytes_of(EndJob(JOB, "tm-1", keep))) == ended
    assert party.on_duty(bytes_of(ResetTm(JOB, "tm-1", 5))) is None  # the job is over here
    assert state(party) == after


def test_holdings_lists_what_the_tm_records_under_the_directories(tmp_path: Path) -> None:
    party = a_tm(tmp_path)
    acknowledged_checkpoint(party, 1)
    held = party.on_duty(bytes_of(Holdings(JOB, "tm-1", (shared_dir(JOB, S),))))
    assert isinstance(held, Held)
    d = shared_dir(JOB, S)
    files = {p for p in party.catalog.files if p.startswith(d + "/")}
    assert files and set(held.paths) == files | {d}  # and the directory, its own (R40)


def test_a_duty_for_another_tm_or_job_is_refused(tmp_path: Path) -> None:
    party = a_tm(tmp_path)
    before = state(party)
    with pytest.raises(ValueError, match="tm-2"):
        party.on_duty(ResetTm(JOB, "tm-2", 1))
    with pytest.raises(ValueError, match="job-9"):
        party.on_duty(EndJob("job-9", "tm-1", frozenset()))
    assert state(party) == before


# ------------------------------------------------ the deletes of one notice, in order made

FULL = Config(file_merging_enabled=True, max_file_size=100, num_retained=1)
"""Each 100-byte write fills a file of its own."""
UNBOUNDED = attrs.evolve(WITHIN, max_space_amplification=0)
"""No bound on space amplification (R82): a file whose segments are all discarded stays
open until it is closed (R81 would close it at once)."""


def ids_at_a_new_digit() -> RandomIds:
    """A ``RandomIds`` whose next draws are "...x", "...y", "...z", "...10", "...11", ...:
    its counter, written in base 36 unpadded, gains a digit, so a plain sort of what it
    draws next puts the later names first."""
    ids = RandomIds()
    for _ in range(32):
        ids.logical_id()
    return ids


def _subsume(party: TaskManager) -> list[str]:
    party.write(S, 2, StateKind.KEYED_SHARED, "a", 10, 1, b"n" * 10)
    party.acknowledge(S, 2)
    party.on_notice(CheckpointComplete(JOB, 1, 0, False))
    party.catalog.storage.arm(StorageOp.DELETE)
    party.on_notice(CheckpointComplete(JOB, 2, 1, False))  # R31: checkpoint 1's go
    return [d.path for d in party.catalog.deferred]


def _abort(party: TaskManager) -> list[str]:
    party.catalog.storage.arm(StorageOp.DELETE)
    party.on_notice(CheckpointAborted(JOB, 1, 0, False))  # R32
    return [d.path for d in party.catalog.deferred]


def _end(party: TaskManager) -> list[str]:
    party.catalog.storage.arm(StorageOp.DELETE)
    ended = party.on_duty(bytes_of(EndJob(JOB, "tm-1", frozenset())))  # R90: nothing kept
    assert isinstance(ended, TmEnded)
    return [w.path for w in ended.waiting]


@pytest.mark.parametrize(
    ("still_open", "notice"),
    [
        pytest.param(False, _subsume, id="subsumed"),
        pytest.param(False, _abort, id="aborted"),
        pytest.param(False, _end, id="job-end"),
        pytest.param(True, _end, id="job-end-open-files"),
    ],
)
def test_a_notice_deletes_the_files_it_frees_in_the_order_they_were_made(
    tmp_path: Path, still_open: bool, notice: Callable[[TaskManager], list[str]]
) -> None:
    """R45 with R31, R32, R90: one notice frees several files (closed ones whose segments
    it discards, or open ones it closes) and deletes them in the order they were made, as
    the model does: which delete an armed storage fault hits shows it. The file made
    first is the one that fails and waits for a retry; the later ones are gone. Here
    their ids and names gain a digit (``RandomIds`` writes its counter unpadded), so a
    plain sort of either would delete a later file first (soak seed 14-within-s3)."""
    ids = ids_at_a_new_digit()
    if still_open:  # checkpoints 1-3 pending, a file each being written (WITHIN)
        party = TaskManager.alone(f"file://{tmp_path}", "", UNBOUNDED, JOB, "tm-1", ids=ids)
        cps = [1, 2, 3]
    else:  # checkpoint 1 acknowledged, three files full and closed
        party = TaskManager.alone(f"file://{tmp_path}", "", FULL, JOB, "tm-1", ids=ids)
        cps = [1, 1, 1]
    party.host([S])
    made: list[SegmentHandle] = []
    for n, cp in enumerate(cps):
        e = party.write(S, cp, StateKind.KEYED_SHARED, f"s{n}", 100, 1, b"x" * 100)
        assert isinstance(e.handle, SegmentHandle)
        made.append(e.handle)
    if not still_open:
        party.acknowledge(S, 1)
    paths = [h.path for h in made]
    lids = [h.logical_id for h in made]
    assert [party.catalog.files[p].open for p in paths] == [still_open] * 3
    assert sorted(lids) != lids and sorted(paths) != paths  # not in the order drawn
    failed = notice(party)
    party.flush()
    assert failed == paths[:1]  # the first delete was the first file's: kept (R45)
    assert [(tmp_path / p).exists() for p in paths] == [True, False, False]
