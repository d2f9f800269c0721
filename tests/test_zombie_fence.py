"""R64 across processes: until a lost attempt (a zombie) is known to have stopped, nobody
but it deletes a file it created, though no other party sees its records or its deletes.

Each party keeps records of its own (the coordinator in this process, every TM attempt
an OS process, ``tests.tm_cluster``), so who created a file the coordinator never heard
of is read from the file's name (``fastimpl.ids.creator_of``). Three ways another party
could delete a zombie's file, each scripted here in the soak's harness
(``tests.process_soak.Soak``: the model replays the trace and the real files are compared
with the model's after every step), on a local directory and on S3:

- the sweep of another stopped attempt must not take a zombie's file in a directory both
  wrote in as the stopped one's: the zombie deletes it applying a notice it already had,
  and a second delete breaks I2 (the long soak's seed ``1004-within-local``);
- the attempt a failover handed a zombie's file to (R61) must not delete it, once no
  retained checkpoint uses it, before the zombie stops: its delete waits for the zombie's
  stop, then runs (the coordinator tells it, ``LostAttemptStopped``);
- a recursive directory delete (R42, R90) must not take a file the zombie wrote after the
  failover;

and, since the zombie's deletes are out of sight, a record of its file that changed hands
meanwhile is checked against storage once it stopped, before the delete that waited runs.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from fastimpl.catalog import Catalog
from fastimpl.ids import RandomIds
from fastimpl.records import Status, Tm
from fastimpl.reports import TmReport
from fastimpl.storage import Storage
from model_tests.replay import replay
from spec import commands as c
from spec.config import MergingMode, RestoreMode, StateKind
from spec.effects import COORDINATOR, tm_actor
from spec.ids import SubtaskId, TmId
from spec.layout import shared_dir, taskowned_dir
from tests.file_compare import compare_with_model
from tests.process_soak import JOB, Soak, make_setting
from tests.tm_cluster import checked

MAP1 = SubtaskId("map", 1, 2)
"""Placed on ``tm-2`` (round-robin over ``tm-1``, ``tm-2``): the zombie's subtask."""
WHERE = ["local", "s3"]


def soak(tmp_path: Path, request: pytest.FixtureRequest, where: str, name: str) -> Soak:
    mode = MergingMode.WITHIN_CHECKPOINT
    config, fs, root, target = make_setting(mode, where, tmp_path, request)
    return Soak(f"{name}-{where}", config, fs, root, target)


def put(
    s: Soak, cid: int, sub: SubtaskId, kind: StateKind, name: str, attempt: TmId | None = None
) -> None:
    """One state handle of ``sub`` written by its TM (or by the lost ``attempt``)."""
    tm = s.host(sub) if attempt is None else attempt
    size = 300
    req = ("write", (sub.vertex, sub.index, sub.parallelism), cid, kind.value, name, b"z" * size)
    assert s.engine.call(tm, (*req, False)) == ("ok",)
    s.run(c.WriteState(cid, sub, kind, name, size, 1, attempt), lambda: None)


def checkpoint(s: Soak, keyed: set[SubtaskId]) -> int:
    """A checkpoint every subtask writes for (keyed state if in ``keyed``, else operator
    state) and acknowledges, completed; its notices stay in flight."""
    cid = s.run_trigger()
    for sub in sorted(s.coord.placement, key=str):
        if sub in keyed:
            put(s, cid, sub, StateKind.KEYED_SHARED, "a")
        else:
            put(s, cid, sub, StateKind.OPERATOR_LIST, "ops")
        s.ack(cid, sub)
    assert s.complete(cid) is not None
    s.check()
    return cid


def deliver_to(s: Soak, tms: set[TmId]) -> None:
    """Every notice in flight to one of ``tms``, in order."""
    while True:
        mine = [n for n, (t, _) in enumerate(s.engine.outbox) if t in tms]
        if not mine:
            return
        first = mine[0]
        s.run(c.DeliverNotification(first), partial(s.engine.deliver, first))
        s.check()


def zombie(s: Soak, tm: TmId) -> None:
    """``tm`` is lost to the coordinator; its process runs on; the job fails over."""
    s.run(c.CrashTm(tm), lambda: s.coord.lose(tm))
    s.zombies.add(tm)
    s.run(c.Failover(), s.coord.failover)
    s.check()


def files_of(s: Soak, tm: TmId, directory: str) -> set[str]:
    """The files in ``directory`` on storage now that ``tm``'s records hold as its own."""
    owners = TmReport.from_json(s.engine.call(tm, ("records",))[1]).owners
    here = s.coord.storage.files_under(directory)
    return {p for p, o in owners.items() if o == tm_actor(tm) and p in here}


def deletions_of(s: Soak, path: str) -> list[str]:
    """Who deleted ``path``, from every party's log (live and lost attempts')."""
    out = [d.actor for d in s.coord.catalog.deletions or () if d.path == path]
    for tm in s.engine.live():
        report = TmReport.from_json(s.engine.call(tm, ("records",))[1])
        out += [d.actor for d in report.deletions if d.path == path]
    return out


def agrees_with_the_model(s: Soak) -> None:
    """The zombies stop, the job quiesces, nothing leaks (I6), the model replays the
    trace with the same outcomes and holds the same files after every step."""
    while s.zombies:
        s.zombie_stops()
        s.check()
    s.quiesce()
    s.check(quiet=True)
    lines = s.out.getvalue().splitlines()
    report = replay(lines)
    assert report.agrees and report.stopped is None, report.summary()
    compared, diff = compare_with_model(lines, s.snapshots, s.user_deleted)
    assert diff is None and compared > 0, diff


def run(s: Soak, body: Any) -> None:
    try:
        s.check(quiet=True)
        body(s)
        agrees_with_the_model(s)
    finally:
        s.engine.stop_all()


@pytest.mark.parametrize("where", WHERE)
def test_r64_a_stopped_attempts_sweep_leaves_a_zombies_file_to_the_zombie(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The zombie ``tm-2`` wrote a shared file no retained checkpoint uses any more, and
    still holds the notice that discards it. Its replacement ``tm-3`` is killed: the sweep
    of what ``tm-3`` left in ``map-1-2`` must not take the zombie's file (the zombie would
    then delete it a second time, I2). The zombie deletes it, once."""

    def body(s: Soak) -> None:
        checkpoint(s, {MAP1})
        deliver_to(s, {"tm-1"})
        checkpoint(s, set())  # subsumes the first: tm-2's shared file is garbage
        deliver_to(s, {"tm-1"})  # tm-2's notices stay in flight
        (mine,) = files_of(s, "tm-2", shared_dir(JOB, MAP1))
        zombie(s, "tm-2")
        assert s.host(MAP1) == "tm-3"
        s.engine.kill("tm-3")
        s.run(c.CrashTm("tm-3"), lambda: s.coord.lose("tm-3"))
        s.stopped("tm-3")  # the coordinator sweeps what tm-3 left (R64, R65)
        assert mine in s.coord.storage.files_under(shared_dir(JOB, MAP1))
        assert deletions_of(s, mine) == []
        deliver_to(s, {"tm-2"})  # the zombie applies what it was sent before it was lost
        assert deletions_of(s, mine) == [tm_actor("tm-2")]

    run(soak(tmp_path, request, where, "sweep-fence"), body)


@pytest.mark.parametrize("where", WHERE)
def test_r64_a_file_handed_over_from_a_zombie_is_deleted_once_the_zombie_stopped(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The failover hands ``tm-3`` the zombie's shared file of the retained checkpoint
    (R61). Once no retained checkpoint uses it, ``tm-3``'s delete waits (R64) while
    ``tm-2`` may still run; when the engine says ``tm-2`` stopped, ``tm-3`` deletes it."""

    def body(s: Soak) -> None:
        checkpoint(s, {MAP1})
        deliver_to(s, {"tm-1", "tm-2"})
        (handed,) = files_of(s, "tm-2", shared_dir(JOB, MAP1))
        zombie(s, "tm-2")
        for _ in range(2):
            checkpoint(s, set())
            deliver_to(s, {"tm-1", "tm-3"})
        assert handed in s.coord.storage.files_under(shared_dir(JOB, MAP1))
        assert handed in TmReport.from_json(s.engine.call("tm-3", ("records",))[1]).pending
        s.zombie_stops()
        s.check()
        assert deletions_of(s, handed) == [tm_actor("tm-3")]

    run(soak(tmp_path, request, where, "handed-fence"), body)


@pytest.mark.parametrize("where", WHERE)
def test_r64_ending_the_job_leaves_a_zombies_late_file_until_it_stopped(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The zombie writes into the shared directory its replacement manages, for a
    checkpoint triggered after it was lost. Ending the job deletes that directory (R42,
    R90) only once the zombie stopped: no record of the coordinator's holds the file, the
    file's name says whose it is."""

    def body(s: Soak) -> None:
        checkpoint(s, {MAP1})
        deliver_to(s, {"tm-1", "tm-2"})
        zombie(s, "tm-2")
        cid = s.run_trigger()
        before = files_of(s, "tm-2", shared_dir(JOB, MAP1))
        put(s, cid, MAP1, StateKind.KEYED_SHARED, "late", attempt="tm-2")
        s.ack(cid, MAP1, attempt="tm-2")  # ignored (R56); the file closes (on S3: exists)
        (late,) = files_of(s, "tm-2", shared_dir(JOB, MAP1)) - before
        deliver_to(s, {"tm-1", "tm-3"})
        s.run(c.Cancel(False), lambda: s.coord.end_job(retain=False))
        s.check()
        assert late in s.coord.storage.files_under(shared_dir(JOB, MAP1))
        s.zombie_stops()
        s.check(quiet=True)
        assert late not in s.coord.storage.list_files()

    def stop_only(s: Soak) -> None:  # the job ended: nothing to quiesce
        lines = s.out.getvalue().splitlines()
        report = replay(lines)
        assert report.agrees and report.stopped is None, report.summary()
        compared, diff = compare_with_model(lines, s.snapshots, s.user_deleted)
        assert diff is None and compared > 0, diff

    s = soak(tmp_path, request, where, "dir-fence")
    try:
        s.check(quiet=True)
        body(s)
        stop_only(s)
    finally:
        s.engine.stop_all()


@pytest.mark.parametrize("where", WHERE)
def test_r64_a_claim_leaves_a_zombie_its_late_files_until_it_stops(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R72 with R64: the zombie writes for a checkpoint triggered after it was lost, into
    the shared directory of a retained checkpoint and into its own task-owned directory,
    which that checkpoint does not name; no record of the coordinator's holds either file.
    A CLAIM restore of the checkpoint takes its directories, but neither file: the
    checkpoint refers to neither, so both stay the zombie's until it stops (then the
    sweep of what it left takes them). Once the claimed checkpoint is subsumed its
    directory's delete waits for the zombie's stop."""

    def body(s: Soak) -> None:
        claimed = checkpoint(s, {MAP1})
        deliver_to(s, {"tm-1", "tm-2"})
        shared, own = shared_dir(JOB, MAP1), taskowned_dir(JOB, "tm-2")
        zombie(s, "tm-2")
        cid = s.run_trigger()
        before = files_of(s, "tm-2", shared) | files_of(s, "tm-2", own)
        put(s, cid, MAP1, StateKind.KEYED_SHARED, "late", attempt="tm-2")
        put(s, cid, MAP1, StateKind.OPERATOR_LIST, "ops", attempt="tm-2")
        s.ack(cid, MAP1, attempt="tm-2")  # ignored (R56); the files close (on S3: exist)
        (late,) = files_of(s, "tm-2", shared) - before
        (outside,) = files_of(s, "tm-2", own) - before
        deliver_to(s, {"tm-1", "tm-3"})
        s.restore(claimed, RestoreMode.CLAIM)
        assert set(s.coord.retained[0].directories) == {shared, taskowned_dir(JOB, "tm-1")}
        s.check()
        _, obs = checked(s.coord, s.engine, quiet=False)
        assert obs.owners.get(late) == tm_actor("tm-2"), obs.owners.get(late)
        assert obs.owners.get(outside) == tm_actor("tm-2"), obs.owners.get(outside)
        for _ in range(2):  # num_retained 1: the claimed checkpoint is subsumed
            checkpoint(s, set())
            s.drain_notices()
        assert claimed not in {r.id for r in s.coord.retained}
        here = s.coord.storage.list_files()
        assert late in here and outside in here  # R64: the zombie may still run
        s.zombie_stops()
        s.check()
        here = s.coord.storage.list_files()
        assert late not in here and outside not in here

    run(soak(tmp_path, request, where, "claim-fence"), body)


@pytest.mark.parametrize("where", WHERE)
def test_r64_a_zombies_late_file_is_swept_at_its_stop_after_two_restores(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R64 across restores: the zombie writes a late file into the shared directory of the
    subtask it ran, which no record of the coordinator's holds; two NO_CLAIM restores
    follow while it still runs. When it stops, the sweep of where it could write (its
    subtasks' directories in the job it ran for) takes the file and deletes it."""

    def body(s: Soak) -> None:
        first = checkpoint(s, {MAP1})
        deliver_to(s, {"tm-1", "tm-2"})
        shared = shared_dir(JOB, MAP1)
        zombie(s, "tm-2")
        cid = s.run_trigger()
        before = files_of(s, "tm-2", shared)
        put(s, cid, MAP1, StateKind.KEYED_SHARED, "late", attempt="tm-2")
        s.ack(cid, MAP1, attempt="tm-2")  # ignored (R56); the file closes (on S3: exists)
        (late,) = files_of(s, "tm-2", shared) - before
        deliver_to(s, {"tm-1", "tm-3"})
        s.restore(first, RestoreMode.NO_CLAIM)
        s.check()
        s.restore(checkpoint(s, set()), RestoreMode.NO_CLAIM)
        s.check()
        assert s.coord.job == "job-2"
        assert late in s.coord.storage.files_under(shared)  # R64: the zombie may run
        s.zombie_stops()
        s.check()
        assert late not in s.coord.storage.files_under(shared)

    run(soak(tmp_path, request, where, "restores-fence"), body)


class _Host:
    """The guards' questions (``fastimpl.catalog.CatalogHost``), answered by a test."""

    def __init__(self, lost: TmId) -> None:
        self.bases = {JOB}
        self.triggered_savepoints: set[int] = set()
        self.tms = {lost: Tm(lost, Status.LOST)}

    def hot_dirs(self) -> frozenset[str]:
        return frozenset()


def test_r64_a_record_of_a_file_the_zombie_deleted_unseen_goes_without_a_delete(
    tmp_path: Path,
) -> None:
    """A record of a zombie's file that changed hands without the zombie knowing (a claim,
    R72) waits for the zombie before its delete runs; the zombie may meanwhile delete the
    file itself, out of sight. Once it stopped, the record is checked against storage:
    the gone file's record goes with no delete of its own (no second delete, I2), the
    file still there is deleted."""
    host = _Host("tm-2")
    cat = Catalog(Storage(LocalFileSystem(), str(tmp_path)), RandomIds(), host, deletion_log=True)
    d = shared_dir(JOB, MAP1)
    kept, gone = f"{d}/fa.tm-2", f"{d}/fb.tm-2"
    for path in (kept, gone):
        cat.create(path, COORDINATOR, "tm-2")
        cat.append(path, b"z" * 10)
        cat.close(path)
        cat.delete_file(path, COORDINATOR)  # waits: tm-2 may still run
    assert {x.path for x in cat.deferred} == {kept, gone} and cat.deletions == []
    (tmp_path / gone).unlink()  # the zombie's own delete, which the coordinator never sees
    host.tms["tm-2"].status = Status.STOPPED
    cat.release_waits("tm-2")
    assert [(x.path, x.actor) for x in cat.deletions or ()] == [(kept, COORDINATOR)]
    assert cat.deferred == [] and cat.files == {}
    cat.storage.drain()
    assert not (tmp_path / kept).exists()
