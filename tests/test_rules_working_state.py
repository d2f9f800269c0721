"""Rules R100-R106 (disaggregated working state: private, pinned and shared working files,
checkpoints that refer to them in place, the coordinator's collection, restore in place,
zombies) and invariant I7 of SPEC.md, against the reference model and the product.

Every test that drives commands runs twice (``tests/rule_impls.py``): on the reference
model through ``Harness``, which checks I1-I5 and I7 after every command, and on the
product in lockstep with the model; the conformance corpus records their sequences
(fastimpl runs them in ``test_conformance.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.harness import Harness
from spec import commands as c
from spec.commands import StorageOp
from spec.config import Config, JobSpec, MergingMode, RestoreMode, VertexSpec
from spec.effects import COORDINATOR, USER, AppendBytes, CreateFile, DeleteFile, Effect
from spec.errors import CommandError, Reason
from spec.handles import SegmentHandle
from spec.ids import SubtaskId
from spec.invariants import (
    Violation,
    check_working,
    no_working_leak_once_quiet,
    working_files_kept,
)
from spec.layout import is_under, shared_dir, working_dir
from spec.observation import Observation, WorkingFileView, WorkingObservation
from tests.rule_impls import impl, impl_free, is_model, start_as  # noqa: F401 (impl: an autouse fixture)

TWO = JobSpec((VertexSpec("v", 2),), num_tms=2)
A = SubtaskId("v", 0, 2)
B = SubtaskId("v", 1, 2)
JOB = "job-0"
TM1 = "tm:tm-1"


class WorkingHarness(Harness):
    """The model with working commands; ``Harness.run`` checks I1-I5 and I7 after every
    command (a refused command leaves the state the same object, ``try_run``)."""

    def view(self, path: str) -> WorkingFileView:
        return self.working().files[path]

    def write(self, subtask: SubtaskId, size: int, attempt: str | None = None) -> str:
        effects = self.run(c.WriteWorking(subtask, size, attempt))
        return next(e.path for e in effects if isinstance(e, CreateFile))

    def working_checkpoint(
        self,
        *,
        inline_below: int = 0,
        complete: bool = True,
        only: Iterable[SubtaskId] | None = None,
    ) -> int:
        """Trigger; every subtask snapshots its database and acknowledges; complete."""
        self.run(c.Trigger())
        cp = self.last_checkpoint
        for s in self.subtasks if only is None else only:
            self.run(c.SnapshotWorking(cp, s, inline_below))
            self.run(c.Acknowledge(cp, s))
        if complete:
            self.run(c.Complete(cp))
            self.deliver_all()
        return cp

    def quiet_working(self) -> list[Violation]:
        """Quiet (R60) and then the coordinator's collection (R104): every invariant."""
        self.quiesce()
        if self.state.running:
            self.run(c.CollectWorking())
        return check_working(self.observe(), self.working(), quiet=True)


def harness(mode: MergingMode = MergingMode.WITHIN_CHECKPOINT, **kw: object) -> WorkingHarness:
    return start_as(WorkingHarness, Config.for_mode(mode, **kw), TWO)


def deletes(effects: Iterable[Effect]) -> list[tuple[str, str]]:
    return [(e.path, e.actor) for e in effects if isinstance(e, DeleteFile)]


# ---------------------------------------------------------------- R100 the three states


def test_r100_a_working_file_is_private_then_pinned_then_shared_for_good() -> None:
    h = harness()
    path = h.write(A, 100)
    assert is_under(path, working_dir(JOB, A))
    assert (h.view(path).state, h.view(path).owner) == ("private", TM1)
    h.run(c.Trigger())
    h.run(c.SnapshotWorking(1, A))
    assert (h.view(path).state, h.view(path).owner) == ("pinned", TM1)
    h.run(c.Acknowledge(1, A))
    assert (h.view(path).state, h.view(path).owner) == ("shared", COORDINATOR)
    assert h.view(path).refs == {1}
    h.run(c.Abort(1))
    h.deliver_all()
    # the checkpoint that shared it aborted: it stays the coordinator's, never the DB's again
    assert (h.view(path).state, h.view(path).owner) == ("shared", COORDINATOR)
    assert h.view(path).users == {f"{A}@{TM1}"}


# ---------------------------------------------------------------- R101 writing


def test_r101_a_database_writes_whole_files_that_its_attempt_owns_and_uses() -> None:
    h = harness()
    effects = h.run(c.WriteWorking(A, 70))
    path = effects[0].path
    assert [type(e).__name__ for e in effects] == ["CreateFile", "AppendBytes", "CloseFile"]
    assert {e.actor for e in effects} == {TM1}
    assert h.observe().files[path] == 70 and path not in h.observe().open_files
    assert h.working().uses[f"{A}@{TM1}"] == {path}
    assert h.try_run(c.WriteWorking(A, 0)) is not None


def test_r101_a_failed_write_leaves_nothing_the_database_uses() -> None:
    h = harness()
    h.run(c.FailNextCall(StorageOp.APPEND))
    h.run(c.WriteWorking(A, 70))
    assert h.working().uses.get(f"{A}@{TM1}", frozenset()) == frozenset()
    assert h.working().files == {}
    assert not any(is_under(p, working_dir(JOB, A)) for p in h.observe().files)


# ---------------------------------------------------------------- R102 stop using


def test_r102_a_database_deletes_its_private_file_once_it_stops_using_it() -> None:
    h = harness()
    path = h.write(A, 100)
    assert deletes(h.run(c.DropWorking(A, path))) == [(path, TM1)]
    err = h.try_run(c.DropWorking(A, path))
    assert isinstance(err, CommandError) and err.reason is Reason.NO_SUCH_STATE


def test_r102_a_pinned_file_waits_for_its_snapshot() -> None:
    h = harness()
    path = h.write(A, 100)
    h.run(c.Trigger())
    h.run(c.SnapshotWorking(1, A))
    assert deletes(h.run(c.DropWorking(A, path))) == []
    assert h.view(path).state == "pinned"
    # the snapshot is dropped (declined): the file is private and unused, so it goes
    assert deletes(h.run(c.Decline(1, A))) == [(path, TM1)]


def test_r102_a_database_never_deletes_a_shared_file() -> None:
    h = harness()
    path = h.write(A, 100)
    h.working_checkpoint()
    assert deletes(h.run(c.DropWorking(A, path))) == []
    assert h.view(path).owner == COORDINATOR and h.view(path).users == frozenset()
    h.run(c.CollectWorking())  # the retained checkpoint still refers to it
    assert path in h.observe().files


# ---------------------------------------------------------------- R103 snapshots


def test_r103_one_checkpoint_mixes_merged_small_files_and_large_files_in_place() -> None:
    h = harness(MergingMode.WITHIN_CHECKPOINT)
    small = [h.write(A, 5), h.write(A, 8)]
    large = h.write(A, 500)
    h.write(B, 600)
    before = len([e for e in h.effects if isinstance(e, AppendBytes)])
    cp = h.working_checkpoint(inline_below=10)
    appends = [e for e in h.effects if isinstance(e, AppendBytes)][before:]
    # only the small files are uploaded, both into one merged file of the subtask
    assert sorted(e.length for e in appends) == [5, 8]
    assert len({e.path for e in appends}) == 1
    assert is_under(appends[0].path, shared_dir(JOB, A))
    retained = h.observe().retained[-1]
    segs = [e for e in retained.entries if e.name.startswith("db:")]
    assert {e.name for e in segs} == {f"db:{p.rsplit('/', 1)[1]}" for p in small}
    assert all(isinstance(e.handle, SegmentHandle) for e in segs)
    assert large in h.working().retained[cp]
    assert not set(small) & h.working().retained[cp]
    assert h.view(large).owner == COORDINATOR
    assert all(h.view(p).state == "private" for p in small)


def test_r103_without_merging_small_files_are_uploaded_one_file_each() -> None:
    h = harness(MergingMode.NONE)
    h.write(A, 5)
    h.write(A, 6)
    before = len(h.effects)
    h.working_checkpoint(inline_below=10, only=None)
    uploaded = {e.path for e in h.effects[before:] if isinstance(e, AppendBytes)}
    assert len(uploaded) == 2


def test_r103_a_late_acknowledgement_still_hands_its_files_to_the_coordinator() -> None:
    h = harness()
    path = h.write(A, 100)
    h.run(c.Trigger())
    h.run(c.SnapshotWorking(1, A))
    h.run(c.Abort(1))  # the notice is not delivered yet: A may still acknowledge
    h.run(c.Acknowledge(1, A))
    assert h.view(path).owner == COORDINATOR
    h.run(c.DropWorking(A, path))
    assert deletes(h.run(c.CollectWorking())) == [(path, COORDINATOR)]


def test_r103_a_savepoint_copies_every_file() -> None:
    h = harness()
    path = h.write(A, 100)
    h.run(c.Trigger(savepoint=True))
    effects = h.run(c.SnapshotWorking(1, A))
    assert [e.length for e in effects if isinstance(e, AppendBytes)] == [100]
    h.run(c.Acknowledge(1, A))
    assert h.view(path).state == "private"


# ---------------------------------------------------------------- R104 collection


def test_r104_collection_waits_for_retained_pending_and_live_users() -> None:
    h = harness()
    path = h.write(A, 100)
    h.working_checkpoint()
    # pending checkpoint 2 refers to it too; then the database stops using it
    h.run(c.Trigger())
    h.run(c.SnapshotWorking(2, A))
    h.run(c.Acknowledge(2, A))
    h.run(c.DropWorking(A, path))
    assert deletes(h.run(c.CollectWorking())) == []
    h.run(c.SnapshotWorking(2, B))
    h.run(c.Acknowledge(2, B))
    h.run(c.Complete(2))
    h.deliver_all()
    assert deletes(h.run(c.CollectWorking())) == []  # retained 2 refers to it
    h.working_checkpoint()  # 3 does not: 2 is subsumed
    assert deletes(h.run(c.CollectWorking())) == [(path, COORDINATOR)]


def test_r104_a_subsumed_file_a_live_database_uses_stays() -> None:
    h = harness()
    path = h.write(A, 100)
    h.working_checkpoint()
    h.run(c.Trigger())  # checkpoint 2 without A's file: A's database dropped it ...
    h.run(c.DropWorking(A, path))
    h.run(c.SnapshotWorking(2, A))
    h.run(c.Acknowledge(2, A))
    h.run(c.SnapshotWorking(2, B))
    h.run(c.Acknowledge(2, B))
    h.run(c.Complete(2))
    h.deliver_all()
    assert deletes(h.run(c.CollectWorking())) == [(path, COORDINATOR)]
    # ... whereas B's file, still in use, survives every collection
    b_file = h.write(B, 10)
    h.working_checkpoint()
    h.working_checkpoint()
    h.run(c.CollectWorking())
    assert b_file in h.observe().files


def test_r104_a_file_only_a_pending_checkpoint_refers_to_stays() -> None:
    h = harness()
    path = h.write(A, 100)
    h.run(c.Trigger())
    h.run(c.SnapshotWorking(1, A))
    h.run(c.Acknowledge(1, A))
    h.run(c.DropWorking(A, path))  # unused, not retained: only pending 1 refers to it
    assert deletes(h.run(c.CollectWorking())) == []
    h.run(c.Acknowledge(1, B))
    h.run(c.Complete(1))
    assert path in h.working().retained[1] and path in h.observe().files


def test_r104_a_file_a_lost_attempt_wrote_waits_until_it_stopped() -> None:
    h = harness()
    path = h.write(A, 100)
    h.working_checkpoint()
    h.run(c.CrashTm("tm-1"))
    h.run(c.Failover())
    h.run(c.DropWorking(A, path))  # the new database compacts it away
    h.working_checkpoint()
    h.working_checkpoint()
    assert deletes(h.run(c.CollectWorking())) == []
    assert path in h.observe().pending_deletes
    assert deletes(h.run(c.AttemptStopped("tm-1"))) == [(path, COORDINATOR)]


def test_r104_a_zombies_use_keeps_nothing() -> None:
    """Only live databases keep a file: a zombie still using one does not (R100, R106)."""
    h = harness()
    path = h.write(A, 100)
    h.working_checkpoint()
    h.run(c.CrashTm("tm-1"))
    h.run(c.Failover())
    h.run(c.AttemptStopped("tm-1"))  # the file's writer is gone: no R64 wait
    second = h.tm_of(A)
    h.run(c.CrashTm(second))  # a zombie that still uses the file
    h.run(c.Failover())
    if is_model(h):  # a zombie's database is not live: no observation shows its files
        assert path in h.state.dbs[(second, A)]
    h.run(c.DropWorking(A, path))
    h.working_checkpoint()
    h.working_checkpoint()
    assert deletes(h.run(c.CollectWorking())) == [(path, COORDINATOR)]


# ---------------------------------------------------------------- R105 restore


def test_r105_failover_opens_the_checkpointed_files_in_place() -> None:
    h = harness()
    large = h.write(A, 500)
    small = h.write(A, 5)
    cp = h.working_checkpoint(inline_below=10)
    garbage = h.write(A, 50)  # written after the checkpoint: not in it
    h.run(c.CrashTm("tm-1"))
    effects = h.run(c.Failover())
    new = h.tm_of(A)
    uses = h.working().uses[f"{A}@tm:{new}"]
    assert large in uses and garbage not in uses
    # the large file is not copied; the small one comes back from its segment
    assert [e.length for e in effects if isinstance(e, AppendBytes)] == [5]
    assert large in h.working().retained[cp]
    # the lost attempt's private files (the small one was copied, not shared) wait for it
    # to stop (R64); then the coordinator deletes them
    assert garbage in h.observe().files and small in h.observe().files
    stopped = deletes(h.run(c.AttemptStopped("tm-1")))
    assert sorted(stopped) == sorted([(small, COORDINATOR), (garbage, COORDINATOR)])


def test_r105_a_survivor_deletes_its_private_files_the_checkpoint_lacks() -> None:
    h = harness()
    h.write(B, 500)
    h.working_checkpoint()
    garbage = h.write(B, 50)
    h.run(c.CrashTm("tm-1"))
    assert deletes(h.run(c.Failover())) == [(garbage, "tm:tm-2")]


def test_r105_claim_opens_in_place_and_the_old_files_go_once_unreferenced() -> None:
    h = harness()
    files = [h.write(A, 500), h.write(B, 400)]
    cp = h.working_checkpoint()
    h.run(c.Restore(cp, mode=RestoreMode.CLAIM))
    w = h.working()
    assert {p for uses in w.uses.values() for p in uses} == set(files)
    assert all(h.view(p).owner == COORDINATOR for p in files)
    for s in h.subtasks:
        for p in sorted(w.uses[f"{s}@tm:{h.tm_of(s)}"]):
            h.run(c.DropWorking(s, p))  # a compaction replaces them
        h.write(s, 300)
    h.working_checkpoint()
    assert sorted(p for p, _ in deletes(h.run(c.CollectWorking()))) == sorted(files)


def test_r105_no_claim_never_deletes_the_source_and_copies_it_before_its_first_checkpoint() -> None:
    h = harness()
    files = [h.write(A, 500), h.write(B, 400)]
    cp = h.working_checkpoint()
    h.run(c.Restore(cp, mode=RestoreMode.NO_CLAIM))
    assert all(h.observe().owners[p] == USER for p in files)
    new_cp = h.working_checkpoint()
    refers = h.working().retained[new_cp]
    assert refers and all(is_under(p, "job-1") for p in refers)
    for _ in range(3):
        h.working_checkpoint()
        h.run(c.CollectWorking())
    assert all(p in h.observe().files for p in files)
    assert h.quiet_working() == []


@pytest.mark.parametrize("new_par", [1, 3])
def test_r105_rescale_projects_by_key_groups_and_old_files_go_only_when_unreferenced(
    new_par: int,
) -> None:
    h = harness()
    a, b = h.write(A, 500), h.write(B, 400)
    cp = h.working_checkpoint()
    h.run(c.Restore(cp, (("v", new_par),), RestoreMode.CLAIM))
    uses = {s: h.working().uses[f"{s}@tm:{h.tm_of(s)}"] for s in h.subtasks}
    if new_par == 1:
        assert uses == {SubtaskId("v", 0, 1): {a, b}}  # a union of both sources
    else:  # the middle subtask's key groups straddle both old ranges
        assert uses == {
            SubtaskId("v", 0, 3): {a},
            SubtaskId("v", 1, 3): {a, b},
            SubtaskId("v", 2, 3): {b},
        }
    # subtask 0 compacts a away; a stays while anyone (retained or live) needs it
    first = h.subtasks[0]
    h.run(c.DropWorking(first, a))
    h.working_checkpoint()
    h.run(c.CollectWorking())
    assert (a in h.observe().files) == any(a in u for s, u in uses.items() if s != first)
    for s in h.subtasks:
        for p in sorted(h.working().uses[f"{s}@tm:{h.tm_of(s)}"]):
            h.run(c.DropWorking(s, p))
    h.working_checkpoint()
    h.run(c.CollectWorking())
    assert a not in h.observe().files and b not in h.observe().files
    assert h.quiet_working() == []


# Two operators with working state on the same key groups: a window and a join.
TWO_OPERATORS = JobSpec((VertexSpec("window", 2), VertexSpec("join", 2)), num_tms=2)


def _operator_of(db: str) -> str:
    return db.split("[", 1)[0]


@pytest.mark.parametrize(
    ("restart", "new_par"),
    [("failover", 2), ("claim", 2), ("claim", 1), ("claim", 3), ("no_claim", 3)],
)
def test_r105_a_database_opens_only_its_own_operators_files(restart: str, new_par: int) -> None:
    """R105, R75: after a failover or a restore (CLAIM or NO_CLAIM, rescaled or not), each
    database opens only files its own operator's databases wrote, projected by key
    groups; the other operator's files, on the same key groups, are not its own, so it
    neither uses them nor keeps them alive (I7, R104)."""
    h = start_as(WorkingHarness, Config.for_mode(MergingMode.WITHIN_CHECKPOINT), TWO_OPERATORS)
    written = {s: h.write(s, 500) for s in h.subtasks}
    of_operator = {v: {p for s, p in written.items() if s.vertex == v} for v in ("window", "join")}
    cp = h.working_checkpoint()
    if restart == "failover":
        h.run(c.CrashTm("tm-1"))
        h.run(c.Failover())
    else:
        mode = RestoreMode.CLAIM if restart == "claim" else RestoreMode.NO_CLAIM
        h.run(c.Restore(cp, (("window", new_par), ("join", new_par)), mode))
    w = h.working()
    assert w.uses and set(w.operators) == set(w.uses)
    for db, paths in w.uses.items():
        operator = _operator_of(db)
        assert w.operators[db] == operator
        assert paths and paths <= of_operator[operator], (db, sorted(paths))
    # every file of an operator is opened by some database of that operator
    for v, files in of_operator.items():
        opened = {p for db, ps in w.uses.items() if w.operators[db] == v for p in ps}
        assert opened == files
    if restart == "no_claim":
        assert h.quiet_working() == []
        return
    # the join's databases compact their files away: once no checkpoint refers to them,
    # they go, whatever the window's databases still use
    for s in h.subtasks:
        if s.vertex == "join":
            for p in sorted(w.uses[f"{s}@tm:{h.tm_of(s)}"]):
                h.run(c.DropWorking(s, p))
    h.working_checkpoint()
    h.run(c.CollectWorking())
    if restart == "failover":
        h.run(c.AttemptStopped("tm-1"))  # R64: what the lost attempt wrote waited for it
    assert not of_operator["join"] & set(h.observe().files)
    assert of_operator["window"] <= set(h.observe().files)
    assert h.quiet_working() == []


# ---------------------------------------------------------------- R106 zombies


def test_r106_a_zombie_database_writes_and_deletes_without_breaking_an_invariant() -> None:
    h = harness()
    shared = h.write(A, 500)
    h.working_checkpoint()
    h.run(c.CrashTm("tm-1"))
    z1 = h.write(A, 60, attempt="tm-1")
    h.run(c.Failover())
    z2 = h.write(A, 70, attempt="tm-1")  # after being replaced
    assert deletes(h.run(c.DropWorking(A, shared, "tm-1"))) == []  # never a shared file
    assert deletes(h.run(c.DropWorking(A, z1, "tm-1"))) == [(z1, TM1)]  # its own private
    live = h.working().uses[f"{A}@tm:{h.tm_of(A)}"]
    assert shared in live and z2 not in live
    h.run(c.Trigger())
    h.run(c.SnapshotWorking(2, A, attempt="tm-1"))
    h.run(c.Acknowledge(2, A, attempt="tm-1"))  # ignored (R56)
    # the zombie cannot tell: it never deletes what it acknowledged, and the coordinator
    # took nothing, so the file stays the zombie's until it stopped (R103)
    assert h.view(z2).state == "shared" and h.view(z2).owner == TM1
    assert deletes(h.run(c.DropWorking(A, z2, "tm-1"))) == []
    h.run(c.CollectWorking())
    assert z2 in h.observe().files
    assert deletes(h.run(c.AttemptStopped("tm-1"))) == [(z2, COORDINATOR)]
    assert h.quiet_working() == []


def test_r45_a_failed_delete_of_a_file_deleted_since_is_pending_no_more() -> None:
    """R45: a delete whose storage call failed is pending until the file is gone; when
    the database's next release deletes the file, nothing is left to retry, and the
    attempt's records agree with the coordinator's once it is lost (R57)."""
    h = harness()
    h.write(A, 500)
    h.working_checkpoint()
    path = h.write(A, 60)
    h.run(c.FailNextCall(StorageOp.DELETE))
    assert deletes(h.run(c.DropWorking(A, path))) == []
    assert h.observe().pending_deletes == (path,)
    released = [d for cmd in _snapshot_and_ack(h) for d in deletes(cmd)]
    assert released == [(path, TM1)]
    assert h.observe().pending_deletes == () and path not in h.observe().files
    h.run(c.CrashTm("tm-1"))
    assert h.observe().pending_deletes == ()
    assert deletes(h.run(c.RetryDeletes())) == []


def _snapshot_and_ack(h: Harness) -> list[tuple[Effect, ...]]:
    h.run(c.Trigger())
    cp = h.last_checkpoint
    return [h.run(c.SnapshotWorking(cp, s, 0)) + h.run(c.Acknowledge(cp, s)) for s in h.subtasks]


def test_r64_a_zombies_failed_delete_is_carried_out_at_its_stop() -> None:
    """R45 with R64: a delete the zombie's storage call failed is kept for a retry; when
    the zombie stops, its memory of it goes with it, and the coordinator, owner of what
    it still owned (R44), deletes the file: nothing is left pending or on storage."""
    h = harness()
    h.write(A, 500)
    h.working_checkpoint()
    h.run(c.CrashTm("tm-1"))
    h.run(c.Failover())
    z = h.write(A, 60, attempt="tm-1")
    h.run(c.FailNextCall(StorageOp.DELETE))
    assert deletes(h.run(c.DropWorking(A, z, "tm-1"))) == []
    assert h.observe().pending_deletes == (z,) and z in h.observe().files
    assert deletes(h.run(c.AttemptStopped("tm-1"))) == [(z, COORDINATOR)]
    assert h.observe().pending_deletes == () and z not in h.observe().files
    assert deletes(h.run(c.RetryDeletes())) == []
    assert h.quiet_working() == []


def test_r106_a_zombie_acts_only_within_its_job() -> None:
    h = harness()
    h.write(A, 500)
    cp = h.working_checkpoint()
    h.run(c.CrashTm("tm-1"))
    h.run(c.Restore(cp, mode=RestoreMode.CLAIM))
    err = h.try_run(c.WriteWorking(SubtaskId("v", 0, 2), 10, "tm-1"))
    assert isinstance(err, CommandError) and err.reason is Reason.NOT_HOSTED


# ---------------------------------------------------------------- I6, I7 predicates

W = f"{working_dir(JOB, A)}/f000001"
DB = f"{A}@{TM1}"


def _obs(files: dict[str, int], owners: dict[str, str]) -> Observation:
    return Observation(
        files=files,
        open_files=frozenset(),
        directories={},
        owners=owners,
        claims={},
        retained=(),
        restoring=(),
        ref_counts={},
        live_segments={},
        registry={},
        deletions=(),
        pending_deletes=(),
        pool_files=frozenset(),
        metadata_files=frozenset(),
        live_parties=frozenset({COORDINATOR, TM1}),
    )


def _w(
    owner: str, *, refs: frozenset[int] = frozenset(), used: bool = True, retained: bool = False
) -> WorkingObservation:
    return WorkingObservation(
        files={W: WorkingFileView(owner, "shared" if refs else "private", frozenset(), refs)},
        uses={DB: frozenset({W})} if used else {},
        retained={1: frozenset({W})} if retained else {},
        operators={DB: A.vertex} if used else {},
    )


@impl_free
def test_i7_holds_for_a_private_file_in_use_and_a_shared_one_retained() -> None:
    assert working_files_kept(_obs({W: 1}, {W: TM1}), _w(TM1)) == []
    w = _w(COORDINATOR, refs=frozenset({1}), retained=True)
    assert working_files_kept(_obs({W: 1}, {W: COORDINATOR}), w) == []


@impl_free
def test_i7_a_file_a_live_database_uses_is_missing() -> None:
    (v,) = working_files_kept(_obs({}, {}), _w(TM1))
    assert v.invariant == "I7" and "uses missing" in v.detail


@impl_free
def test_i7_a_retained_working_file_is_missing() -> None:
    w = WorkingObservation(files={}, uses={}, retained={1: frozenset({W})}, operators={})
    (v,) = working_files_kept(_obs({}, {}), w)
    assert "chk 1" in v.detail


@impl_free
def test_i7_a_file_a_checkpoint_refers_to_is_still_a_databases() -> None:
    w = _w(TM1, refs=frozenset({1}), used=False)
    (v,) = working_files_kept(_obs({W: 1}, {W: TM1}), w)
    assert "referred to by [1]" in v.detail


@impl_free
def test_i7_a_live_database_uses_another_attempts_file() -> None:
    (v,) = working_files_kept(_obs({W: 1}, {W: "tm:tm-9"}), _w("tm:tm-9"))
    assert "of tm:tm-9" in v.detail


@impl_free
def test_i7_a_live_database_uses_a_file_of_another_operator() -> None:
    """R105: a database of operator ``join`` on the same attempt and key groups as the
    file's writer still may not use a file of ``v``'s working directory."""
    other = f"{SubtaskId('join', 0, 2)}@{TM1}"
    w = WorkingObservation(
        files={W: WorkingFileView(TM1, "private", frozenset({other}), frozenset())},
        uses={other: frozenset({W})},
        retained={},
        operators={other: "join"},
    )
    (v,) = working_files_kept(_obs({W: 1}, {W: TM1}), w)
    assert v.invariant == "I7" and "operator 'join'" in v.detail and W in v.detail
    # an operator whose escaped name is another's prefix is still another operator
    w = attrs.evolve(w, operators={other: "v-0"})
    assert [x.invariant for x in working_files_kept(_obs({W: 1}, {W: TM1}), w)] == ["I7"]
    assert working_files_kept(_obs({W: 1}, {W: TM1}), attrs.evolve(w, operators={other: "v"})) == []


@impl_free
def test_i6_a_leaked_working_file() -> None:
    w = _w(COORDINATOR, used=False)
    (v,) = no_working_leak_once_quiet(_obs({W: 1}, {W: COORDINATOR}), w)
    assert v.invariant == "I6" and W in v.detail
    assert no_working_leak_once_quiet(_obs({W: 1}, {W: USER}), _w(USER, used=False)) == []


# ---------------------------------------------------------------- random runs


def _commands(h: WorkingHarness) -> st.SearchStrategy[c.AnyCommand]:
    s = h.state
    subs = sorted(s.placement)
    pending = sorted(s.pending)
    used = sorted(
        {(sub, p) for (t, sub), uses in s.dbs.items() for p in uses if t == s.placement.get(sub)}
    )
    lost = sorted(t for t, r in s.tms.items() if r.status.value == "lost")
    options: list[st.SearchStrategy[c.AnyCommand]] = [
        st.builds(c.WriteWorking, st.sampled_from(subs), st.integers(1, 30)),
        st.just(c.Trigger()),
        st.just(c.CollectWorking()),
        st.just(c.Failover()),
        st.builds(c.CrashTm, st.sampled_from(sorted(set(s.placement.values())))),
    ]
    if used:
        options.append(st.sampled_from(used).map(lambda u: c.DropWorking(u[0], u[1])))
    if pending:
        cps, ss = st.sampled_from(pending), st.sampled_from(subs)
        options += [
            st.builds(c.SnapshotWorking, cps, ss, st.sampled_from([0, 10])),
            st.builds(c.Acknowledge, cps, ss),
            st.builds(c.Complete, cps),
            st.builds(c.Abort, cps),
        ]
    if s.channel:
        options.append(st.integers(0, len(s.channel) - 1).map(c.DeliverNotification))
    if lost:
        options.append(st.sampled_from(lost).map(c.AttemptStopped))
        zombies = [(t, sub) for t in lost for sub in sorted(s.tms[t].hosted) if sub in s.placement]
        if zombies:
            options.append(st.sampled_from(zombies).map(lambda z: c.WriteWorking(z[1], 7, z[0])))
    if s.retained:
        ids = [r.id for r in s.retained]
        options.append(
            st.builds(
                c.Restore,
                st.sampled_from(ids),
                st.sampled_from([(), (("v", 1),), (("v", 3),)]),
                st.sampled_from(list(RestoreMode)),
            )
        )
    return st.one_of(options)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), mode=st.sampled_from(list(MergingMode)))
def test_i7_random_runs_keep_every_invariant_and_leak_nothing_once_quiet(
    data: st.DataObject, mode: MergingMode
) -> None:
    """Random runs with working state: I1-I5 and I7 after every command (the harness),
    I6 once quiet. A failure prints the command sequence."""
    h = harness(mode)
    for _ in range(data.draw(st.integers(5, 40), label="length")):
        cmd = data.draw(_commands(h), label="command")
        try:
            h.run(cmd)
        except CommandError:
            continue
    assert h.quiet_working() == [], h.history
