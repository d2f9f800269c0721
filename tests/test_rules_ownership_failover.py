"""Rules R40-R45 (directories, hand-over, one owner, retried deletes) and R60-R66
(failover, safe cleanup, exclusive directories, zombies, crashes mid-write, task-level
failover) of SPEC.md, checked one scenario at a time against the reference model and against
the product in lockstep with it (``tests/rule_impls.py``: every test runs on each)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from conformance.harness import ALL_MODES, JOB, KS, MERGING, ONE, OP, Harness, S, created, deleted
from spec import commands as c
from spec.commands import StorageOp
from spec.config import Config, MergingMode, RestoreMode
from spec.effects import (
    COORDINATOR,
    AppendBytes,
    CallFailed,
    CloseFile,
    CreateFile,
    DeleteDir,
    Effect,
    MakeDir,
)
from spec.errors import Reason
from spec.handles import stream_of
from spec.ids import SubtaskId
from spec.layout import is_under, shared_dir, taskowned_dir
from spec.observation import Observation
from tests.rule_impls import channel, impl, pending, pins, start, start_as  # noqa: F401 (impl: an autouse fixture)


def appended(effects: Iterable[Effect]) -> list[str]:
    return [e.path for e in effects if isinstance(e, AppendBytes)]


def dir_deletes(effects: Iterable[Effect]) -> list[tuple[str, str]]:
    return [(e.path, e.actor) for e in effects if isinstance(e, DeleteDir)]


def ref_paths(obs: Observation) -> set[str]:
    """Every file a handle of a retained checkpoint refers to."""
    return {s.path for r in obs.retained for e in r.entries if (s := stream_of(e.handle))}


def one(mode: MergingMode, **kw: object) -> Harness:
    return start(Config.for_mode(mode, **kw), ONE)


def cp_one(
    h: Harness,
    *,
    write: Iterable[str] = (),
    reuse: Iterable[str] = (),
    size: int = 100,
    complete: bool = True,
) -> tuple[int, list[Effect]]:
    """One checkpoint of the single-subtask job; returns its id and the write effects."""
    h.run(c.Trigger())
    cp = h.last_checkpoint
    effects: list[Effect] = []
    for name in reuse:
        effects += h.run(c.ReuseShared(cp, S, name))
    for name in write:
        effects += h.run(c.WriteState(cp, S, KS, name, size))
    h.run(c.Acknowledge(cp, S))
    if complete:
        h.run(c.Complete(cp))
        h.deliver_all()
    return cp, effects


def on_tm(h: Harness, tm: str) -> list[SubtaskId]:
    return [s for s in h.subtasks if h.tm_of(s) == tm]


# ---------------------------------------------------------------- R40 directories


@pytest.mark.parametrize("mode", MERGING)
def test_r40_directories_created_lazily_at_first_write(mode: MergingMode) -> None:
    h = one(mode)
    assert h.run(c.Trigger()) == ()
    assert h.observe().directories == {}
    first = h.run(c.WriteState(1, S, KS, "a", 10))
    assert [e for e in first if isinstance(e, MakeDir)] == [MakeDir(shared_dir(JOB, S), "tm:tm-1")]
    second = h.run(c.WriteState(1, S, KS, "b", 10))
    assert not [e for e in second if isinstance(e, MakeDir)]
    excl = h.run(c.WriteState(1, S, OP, "o", 10))
    assert [e for e in excl if isinstance(e, MakeDir)] == [
        MakeDir(taskowned_dir(JOB, "tm-1"), "tm:tm-1")
    ]
    assert h.observe().directories == {
        shared_dir(JOB, S): "tm:tm-1",
        taskowned_dir(JOB, "tm-1"): "tm:tm-1",
    }


@pytest.mark.parametrize("mode", MERGING)
def test_r40_every_ack_reports_existing_directories(mode: MergingMode) -> None:
    h = one(mode)
    h.run(c.Trigger())
    h.run(c.WriteState(1, S, OP, "o", 10))  # only the exclusive directory exists
    h.run(c.Acknowledge(1, S))
    h.run(c.Complete(1))
    assert h.observe().retained[-1].directories == (taskowned_dir(JOB, "tm-1"),)
    h.deliver_all()
    cp_one(h, write=["a"])
    cp, _ = cp_one(h)  # writes nothing: both directories exist and are still reported
    obs = h.observe()
    assert set(obs.retained[-1].directories) == {shared_dir(JOB, S), taskowned_dir(JOB, "tm-1")}
    assert cp in obs.registry[f"dir:{shared_dir(JOB, S)}"].refs


# ---------------------------------------------------------------- R41 TM deletes its dirs


def test_r41_directory_deleted_only_when_all_uses_aborted() -> None:
    h = one(MergingMode.WITHIN_CHECKPOINT)
    d = shared_dir(JOB, S)
    h.run(c.Trigger())
    h.run(c.Trigger())
    h.run(c.WriteState(1, S, KS, "a", 100))
    h.run(c.Acknowledge(1, S))
    h.run(c.Acknowledge(2, S))  # reports the directory again: used by {1, 2}
    h.run(c.Abort(1))
    h.run(c.DuplicateNotification(0))  # a counter would reach zero on two abort(1)
    effects = h.run(c.DeliverNotification(0)) + h.run(c.DeliverNotification(0))
    assert not dir_deletes(effects)
    assert d in h.observe().directories
    h.run(c.Abort(2))
    assert dir_deletes(h.run(c.DeliverNotification(0))) == [(d, "tm:tm-1")]
    assert h.observe().directories == {}


def test_r41_directory_with_a_file_in_it_is_kept() -> None:
    h = one(MergingMode.ACROSS_CHECKPOINT, max_space_amplification=0.0)  # no R81 roll
    d = shared_dir(JOB, S)
    h.run(c.Trigger())
    path = created(h.run(c.WriteState(1, S, KS, "a", 100)))[0]
    h.run(c.Acknowledge(1, S))
    h.run(c.Abort(1))
    assert dir_deletes(h.run(c.DeliverNotification(0))) == []
    obs = h.observe()
    assert path in obs.open_files and is_under(path, d)  # the pool file still lies in it
    assert obs.directories[d] == "tm:tm-1"


@pytest.mark.parametrize("mode", MERGING)
def test_r41_a_zombies_abort_never_takes_the_directory_its_replacement_writes_in(
    mode: MergingMode,
) -> None:
    """R41, R66: the replaced attempt made the subtask's shared directory and reported it
    only for a checkpoint that then aborted; the new attempt of the subtask writes in the
    same directory. The zombie hears the abort: the directory is not empty, so it stays,
    with the new attempt's file in it."""
    h = one(mode)
    d = shared_dir(JOB, S)
    h.run(c.Trigger())  # 1
    h.run(c.WriteState(1, S, KS, "a", 100))
    h.run(c.Acknowledge(1, S))  # reports the directory: used by {1}
    h.run(c.Abort(1))  # the notice waits for tm-1
    h.run(c.ReplaceTm("tm-1"))
    h.run(c.Trigger())  # 2
    path = created(h.run(c.WriteState(2, S, KS, "b", 100)))[0]
    assert is_under(path, d)
    assert dir_deletes(h.run(c.DeliverNotification(0))) == []  # the zombie's abort of 1
    obs = h.observe()
    assert path in obs.files and d in obs.directories


@pytest.mark.parametrize("mode", MERGING)
def test_r41_empty_directory_used_by_a_completed_checkpoint_is_kept(mode: MergingMode) -> None:
    h = one(mode, max_file_size=100)
    d = shared_dir(JOB, S)
    cp_one(h, write=["a"])
    cp_one(h)  # reports d but keeps nothing in it: a's file goes once 1 is subsumed
    assert not [p for p in h.observe().files if is_under(p, d)]
    cp_one(h, complete=False)
    h.run(c.Abort(h.last_checkpoint))
    effects: list[Effect] = []
    while channel(h):
        effects += h.run(c.DeliverNotification(0))
    assert dir_deletes(effects) == []  # used by 1 and 2, which did not abort
    assert h.observe().directories[d] == COORDINATOR


# ---------------------------------------------------------------- R42 coordinator's dirs


@pytest.mark.parametrize("mode", MERGING)
def test_r42_completed_checkpoint_hands_directories_to_coordinator(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    cp = h.checkpoint()
    obs = h.observe()
    assert len(obs.directories) == 6  # four subtask dirs, two TM dirs
    for d, owner in obs.directories.items():
        assert owner == COORDINATOR
        assert obs.registry[f"dir:{d}"].refs == frozenset({cp})


@pytest.mark.parametrize("mode", MERGING)
def test_r42_coordinator_deletes_abandoned_directory_once_unreferenced(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    lost = taskowned_dir(JOB, "tm-2")
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    assert lost in h.observe().directories  # still referenced by checkpoint 1
    h.checkpoint()
    h.checkpoint()
    obs = h.observe()
    assert lost in obs.directories and lost in obs.pending_deletes  # waits for tm-2 (R64)
    assert (lost, COORDINATOR) in dir_deletes(h.run(c.AttemptStopped("tm-2")))
    obs = h.observe()
    assert lost not in obs.directories and lost not in obs.pending_deletes
    assert taskowned_dir(JOB, "tm-1") in obs.directories  # a live TM still works in it


# ---------------------------------------------------------------- R43 hand-over by ack


def test_r43_ack_hands_whole_files_to_coordinator_who_deletes_on_abort() -> None:
    h = one(MergingMode.NONE)
    h.run(c.Trigger())
    paths = created(h.run(c.WriteState(1, S, KS, "a", 10)) + h.run(c.WriteState(1, S, OP, "o", 5)))
    assert {h.observe().owners[p] for p in paths} == {"tm:tm-1"}
    h.run(c.Acknowledge(1, S))
    assert {h.observe().owners[p] for p in paths} == {COORDINATOR}
    assert sorted(deleted(h.run(c.Abort(1)), COORDINATOR)) == sorted(paths)
    assert h.observe().files == {}


def test_r43_late_ack_after_abort_still_hands_over() -> None:
    h = one(MergingMode.NONE)
    h.run(c.Trigger())
    paths = created(h.run(c.WriteState(1, S, KS, "a", 10)))
    h.run(c.Abort(1))  # the TM has not heard of it yet
    assert deleted(h.run(c.Acknowledge(1, S)), COORDINATOR) == paths
    assert h.observe().files == {}


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r43_savepoint_ack_hands_files_to_coordinator(mode: MergingMode) -> None:
    h = one(mode)
    h.run(c.Trigger(savepoint=True))
    paths = created(h.run(c.WriteState(1, S, KS, "a", 10)) + h.run(c.WriteState(1, S, OP, "o", 5)))
    h.run(c.Acknowledge(1, S))
    assert {h.observe().owners[p] for p in paths} == {COORDINATOR}
    assert sorted(deleted(h.run(c.Abort(1)), COORDINATOR)) == sorted(paths)


# ---------------------------------------------------------------- R44 one owner

HAND_OVERS = (
    c.Acknowledge,
    c.Complete,
    c.Failover,
    c.RestartCoordinator,
    c.AttemptStopped,
    c.Restore,
    c.Cancel,
)


class _Tracking(Harness):
    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.changes: list[tuple[str, str, str, str]] = []

    def run(self, cmd: c.Command) -> tuple[Effect, ...]:
        before = dict(self.observe().owners)
        effects = super().run(cmd)
        for path, owner in self.observe().owners.items():
            if path in before and before[path] != owner:
                self.changes.append((type(cmd).__name__, path, before[path], owner))
        return effects


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r44_owner_changes_only_at_hand_overs(mode: MergingMode) -> None:
    h = start_as(_Tracking, Config.for_mode(mode, num_retained=2))
    h.checkpoint()
    h.checkpoint(savepoint=True)
    h.checkpoint(reuse=["sst-1"], shared=["sst-2"], complete=False)
    zombie = on_tm(h, "tm-2")[0]
    h.run(c.CrashTm("tm-2"))
    h.run(c.Trigger())
    h.run(c.WriteState(h.last_checkpoint, zombie, KS, "z", 30, attempt="tm-2"))
    h.run(c.Failover())
    h.checkpoint()
    h.run(c.AttemptStopped("tm-2"))
    h.checkpoint()
    h.run(c.Cancel(retain=True))
    kinds = {k for k, *_ in h.changes}
    assert kinds <= {t.__name__ for t in HAND_OVERS}, h.changes
    assert all(new == "user" for k, _, _, new in h.changes if k == "Complete")  # R55
    assert {"Acknowledge", "Complete", "Cancel"} <= kinds  # R43 savepoint, R55, R91
    if mode is not MergingMode.NONE:
        assert {"Failover", "AttemptStopped"} <= kinds  # R61, R64
    obs = h.observe()
    assert set(obs.owners) == set(obs.files)


# ---------------------------------------------------------------- R45 failed deletes


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r45_failed_delete_is_kept_and_retried(mode: MergingMode) -> None:
    h = one(mode, max_file_size=100)
    h.checkpoint()
    h.run(c.FailNextCall(StorageOp.DELETE))
    h.checkpoint(deliver=False)  # subsumes checkpoint 1: the first delete fails
    failed = [e for e in h.last_effects if isinstance(e, CallFailed)]
    assert len(failed) == 1 and failed[0].op == "delete"
    path = failed[0].path
    assert path in h.observe().files and h.observe().pending_deletes == (path,)
    h.deliver_all()
    h.run(c.FailNextCall(StorageOp.DELETE))
    h.run(c.RetryDeletes())  # fails again: still kept
    assert path in h.observe().pending_deletes and path in h.observe().files
    assert path in deleted(h.run(c.RetryDeletes()), failed[0].actor)
    assert path not in h.observe().files and h.observe().pending_deletes == ()


def test_r45_failed_directory_delete_is_retried() -> None:
    h = one(MergingMode.WITHIN_CHECKPOINT)
    d = shared_dir(JOB, S)
    h.run(c.Trigger())
    h.run(c.Trigger())
    h.run(c.WriteState(1, S, KS, "a", 100))
    h.run(c.Acknowledge(1, S))
    h.run(c.Acknowledge(2, S))
    h.run(c.Abort(1))
    assert deleted(h.run(c.DeliverNotification(0)))  # the file goes, the directory stays
    h.run(c.Abort(2))
    h.run(c.FailNextCall(StorageOp.DELETE))
    assert [e for e in h.run(c.DeliverNotification(0)) if isinstance(e, CallFailed)]
    assert d in h.observe().directories and d in h.observe().pending_deletes
    assert dir_deletes(h.run(c.RetryDeletes())) == [(d, "tm:tm-1")]
    assert h.observe().directories == {} and h.observe().pending_deletes == ()


# ---------------------------------------------------------------- R60 failover


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r60_failover_aborts_pending_and_replaces_lost_tm(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    moved = on_tm(h, "tm-2")
    pending = h.checkpoint(complete=False)  # fully acknowledged
    h.run(c.Failover())
    err = h.try_run(c.Complete(pending))
    assert err is not None and err.reason is Reason.CHECKPOINT_NOT_PENDING
    assert h.live_tms() == ["tm-1", "tm-2"]  # nobody was lost: nobody is replaced
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    assert h.live_tms() == ["tm-1", "tm-3"]
    assert [h.tm_of(s) for s in moved] == ["tm-3", "tm-3"]
    h.run(c.Trigger())
    assert h.last_checkpoint == pending + 1  # R50: ids go on


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r60_survivor_drops_unacknowledged_state(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode, max_file_size=100))
    h.checkpoint()  # the 100-byte shared files are full and closed
    h.run(c.Trigger())
    s = on_tm(h, "tm-1")[0]
    path = created(h.run(c.WriteState(h.last_checkpoint, s, KS, "sst-1", 10)))
    assert path and path[0] in h.observe().files
    h.run(c.CrashTm("tm-2"))
    assert path[0] in deleted(h.run(c.Failover()), "tm:tm-1")
    assert path[0] not in h.observe().files


def test_r60_no_stale_pool_survives_failover() -> None:
    h = start(Config.for_mode(MergingMode.ACROSS_CHECKPOINT))
    h.checkpoint()
    mine = h.observe().open_files
    assert len(mine) == 6  # four subtask pools, two TM pools
    closed = {e.path for e in h.run(c.Failover()) if isinstance(e, CloseFile)}
    assert closed == mine and not h.observe().open_files
    h.run(c.Trigger())
    s = on_tm(h, "tm-1")[0]
    new = created(h.run(c.WriteState(h.last_checkpoint, s, KS, "x", 10)), "tm:tm-1")
    assert len(new) == 1 and new[0] not in mine


# ---------------------------------------------------------------- R61 hand back segments


@pytest.mark.parametrize("mode", MERGING)
def test_r61_segments_of_all_retained_checkpoints_are_kept(mode: MergingMode) -> None:
    h = one(mode, num_retained=2, max_file_size=100)
    _, e1 = cp_one(h, write=["a"])
    _, e2 = cp_one(h, write=["b"])  # checkpoint 1 alone refers to a's file
    f1, f2 = created(e1)[0], created(e2)[0]
    h.run(c.Failover())
    obs = h.observe()
    assert obs.owners[f1] == obs.owners[f2] == "tm:tm-1"
    assert obs.ref_counts[f1] == obs.ref_counts[f2] == 1


@pytest.mark.parametrize("mode", MERGING)
def test_r61_last_used_is_the_newest_retained_checkpoint(mode: MergingMode) -> None:
    h = one(mode, num_retained=2, max_file_size=100)
    _, e1 = cp_one(h, write=["a"])
    cp_one(h, reuse=["a"], write=["b"])  # checkpoint 2 uses a's segment too
    f1 = created(e1)[0]
    h.run(c.Failover())
    cp_one(h, write=["c"])  # subsumes 1; 2 still refers to a
    assert f1 in h.observe().files
    assert [r.checkpoint for r in h.observe().retained] == [2, 3]
    cp_one(h, write=["d"])  # subsumes 2: nobody refers to a any more
    assert f1 not in h.observe().files
    assert any(d.path == f1 and d.actor == "tm:tm-1" for d in h.observe().deletions)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r61_handed_back_state_stays_reusable(mode: MergingMode) -> None:
    h = one(mode, num_retained=2)
    cp_one(h, write=["a", "b"])
    h.run(c.Failover())
    h.run(c.Trigger())
    effects = h.run(c.ReuseShared(h.last_checkpoint, S, "a"))
    assert not [e for e in effects if isinstance(e, CreateFile | AppendBytes)]


@pytest.mark.parametrize("mode", MERGING)
def test_r61_replacement_tm_takes_over_lost_tms_shared_files(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    obs = h.observe()
    for s in on_tm(h, "tm-3"):
        files = [p for p in obs.files if is_under(p, shared_dir(JOB, s))]
        assert files and all(obs.owners[p] == "tm:tm-3" for p in files)
    exclusive = [p for p in obs.files if is_under(p, taskowned_dir(JOB, "tm-2"))]
    assert exclusive and all(obs.owners[p] == "tm:tm-2" for p in exclusive)  # R63


# ---------------------------------------------------------------- R62 safe cleanup


@pytest.mark.parametrize("mode", MERGING)
def test_r62_failover_deletes_garbage_of_unfinished_checkpoints(mode: MergingMode) -> None:
    h = one(mode, num_retained=2, max_file_size=100)
    _, e1 = cp_one(h, write=["a"])
    _, e2 = cp_one(h, write=["b"])
    _, e3 = cp_one(h, write=["c"], complete=False)  # acknowledged, never completed
    garbage = created(e3)[0]
    assert deleted(h.run(c.Failover()), "tm:tm-1") == [garbage]
    files = h.observe().files
    assert garbage not in files and created(e1)[0] in files and created(e2)[0] in files


@pytest.mark.parametrize("mode", MERGING)
def test_r62_garbage_of_a_lost_attempt_waits_for_it(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode, max_file_size=50))
    h.checkpoint()
    h.run(c.Trigger())
    s = on_tm(h, "tm-2")[0]
    garbage = created(h.run(c.WriteState(h.last_checkpoint, s, KS, "x", 50)))[0]
    h.run(c.CrashTm("tm-2"))
    assert garbage not in deleted(h.run(c.Failover()))
    assert h.observe().owners[garbage] == "tm:tm-2"
    assert garbage in deleted(h.run(c.AttemptStopped("tm-2")), COORDINATOR)


# ---------------------------------------------------------------- R63 exclusive dirs


@pytest.mark.parametrize("mode", MERGING)
def test_r63_exclusive_directory_reused_only_by_the_same_tm(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.run(c.Trigger())
    for s in h.subtasks:
        h.run(c.WriteState(1, s, OP, "o", 10))
    assert h.observe().directories[taskowned_dir(JOB, "tm-2")] == "tm:tm-2"
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    obs = h.observe()
    # R64: the lost attempt may still run, and deletes its directory once it is empty
    # (R41) without knowing it was replaced: the directory stays its own until its stop
    assert obs.directories[taskowned_dir(JOB, "tm-2")] == "tm:tm-2"
    assert obs.directories[taskowned_dir(JOB, "tm-1")] == "tm:tm-1"
    h.run(c.Trigger())
    cp = h.last_checkpoint
    survivor = h.run(c.WriteState(cp, on_tm(h, "tm-1")[0], OP, "o", 10))
    newcomer = h.run(c.WriteState(cp, on_tm(h, "tm-3")[0], OP, "o", 10))
    assert not [e for e in survivor if isinstance(e, MakeDir)]
    assert all(is_under(p, taskowned_dir(JOB, "tm-1")) for p in created(survivor))
    assert MakeDir(taskowned_dir(JOB, "tm-3"), "tm:tm-3") in newcomer
    assert all(not is_under(p, taskowned_dir(JOB, "tm-2")) for p in created(newcomer))
    # stopped, it is abandoned to the coordinator (R63), which deletes it with the aborted
    # checkpoint's file in it that nothing references (R64)
    gone = h.run(c.AttemptStopped("tm-2"))
    assert DeleteDir(taskowned_dir(JOB, "tm-2"), COORDINATOR) in gone
    assert taskowned_dir(JOB, "tm-2") not in h.observe().directories


# ---------------------------------------------------------------- R64 zombies


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r64_zombie_may_write_but_its_ack_is_ignored(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    zombie = on_tm(h, "tm-2")
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.run(c.Trigger())
    cp = h.last_checkpoint
    written = appended(h.run(c.WriteState(cp, zombie[0], OP, "x", 10, attempt="tm-2")))
    assert written and h.observe().owners[written[0]] == "tm:tm-2"
    for s in zombie:
        h.run(c.Acknowledge(cp, s, attempt="tm-2"))
    for s in h.subtasks:
        if s != zombie[0]:
            h.run(c.Acknowledge(cp, s))
    err = h.try_run(c.Complete(cp))
    assert err is not None and err.reason is Reason.NOT_ALL_ACKNOWLEDGED
    assert h.observe().owners[written[0]] == "tm:tm-2"  # not handed over (R43 needs a live ack)
    h.run(c.Acknowledge(cp, zombie[0]))
    h.run(c.Complete(cp))
    assert written[0] not in ref_paths(h.observe())


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r64_deletes_of_a_zombies_files_wait_until_it_stopped(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode, max_file_size=100))
    h.run(c.Trigger())
    made: list[str] = []
    for s in h.subtasks:
        made += created(h.run(c.WriteState(1, s, KS, "sst", 100)), "tm:tm-2")
        h.run(c.Acknowledge(1, s))
    h.run(c.Complete(1))
    h.deliver_all()
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.checkpoint()
    h.checkpoint()  # checkpoint 1 is subsumed: its files are garbage
    obs = h.observe()
    assert made and all(p in obs.files and p in obs.pending_deletes for p in made)
    assert not any(d.path in made for d in obs.deletions)
    h.run(c.AttemptStopped("tm-2"))
    obs = h.observe()
    assert not set(made) & set(obs.files) and obs.pending_deletes == ()


@pytest.mark.parametrize("mode", MERGING)
def test_r64_zombie_applies_notifications_already_sent(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode, max_file_size=100))
    h.checkpoint()
    h.checkpoint(deliver=False)  # complete(2, watermark 1) is in flight to tm-2
    h.run(c.CrashTm("tm-2"))
    idx = next(i for i, n in enumerate(channel(h)) if n.tm == "tm-2")
    own = deleted(h.run(c.DeliverNotification(idx)))
    assert own and own == deleted(h.last_effects, "tm:tm-2")


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r64_coordinator_takes_and_deletes_what_a_stopped_attempt_owned(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.run(c.Trigger())
    z = on_tm(h, "tm-3")[0]
    h.run(c.WriteState(h.last_checkpoint, z, OP, "zombie", 10, attempt="tm-2"))
    h.run(c.WriteState(h.last_checkpoint, z, KS, "zombie", 10, attempt="tm-2"))
    owned = {p for p, o in h.observe().owners.items() if o == "tm:tm-2"}
    assert owned
    gone = set(deleted(h.run(c.AttemptStopped("tm-2")), COORDINATOR))
    obs = h.observe()
    assert all(o != "tm:tm-2" for o in obs.owners.values())
    for path in owned:  # deleted by the coordinator, or its and still referenced
        assert path in gone or (obs.owners[path] == COORDINATOR and path in ref_paths(obs))
    assert gone or mode is MergingMode.ACROSS_CHECKPOINT  # ACROSS: only pooled, live files


def _a_collected_directory_waiting_for_a_zombie(
    mode: MergingMode,
) -> tuple[Harness, SubtaskId, str]:
    """``tm-3`` creates a subtask's shared directory and acknowledges, the zombie ``tm-2``
    writes there too; ``tm-3`` is lost and stops, and the coordinator's delete of the
    directory waits for ``tm-2``; a failover starts ``tm-4`` on the subtask."""
    h = start(Config.for_mode(mode, max_file_size=100))
    h.checkpoint(shared=())
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.run(c.Trigger())
    s = on_tm(h, "tm-3")[0]
    h.run(c.WriteState(h.last_checkpoint, s, KS, "live", 10))
    h.run(c.WriteState(h.last_checkpoint, s, KS, "zombie", 10, attempt="tm-2"))
    h.run(c.Acknowledge(h.last_checkpoint, s))
    directory = shared_dir(JOB, s)
    assert h.observe().directories[directory] == "tm:tm-3"
    h.run(c.CrashTm("tm-3"))
    h.run(c.AttemptStopped("tm-3"))
    assert directory in h.observe().pending_deletes  # it waits for tm-2
    h.run(c.Failover())
    assert h.tm_of(s) == "tm-4"
    return h, s, directory


@pytest.mark.parametrize("mode", MERGING)
def test_r64_a_waiting_directory_delete_is_decided_again_when_it_runs(mode: MergingMode) -> None:
    """R64, R42, R45: the replacement ``tm-3`` creates a subtask's shared directory, the
    zombie ``tm-2`` writes into it, ``tm-3`` is lost and stops: the coordinator would
    collect the directory, but the delete waits for the zombie. The next attempt ``tm-4``
    writes there and a retained checkpoint refers to the directory; when the zombie
    stops, R42 is asked again and keeps it (long soak seed 1028-across-local)."""
    h, _s, directory = _a_collected_directory_waiting_for_a_zombie(mode)
    h.checkpoint()
    assert any(directory in r.directories for r in h.observe().retained)
    effects = h.run(c.AttemptStopped("tm-2"))
    obs = h.observe()
    assert directory not in [d for d, _ in dir_deletes(effects)]
    assert directory in obs.directories and directory not in obs.pending_deletes


@pytest.mark.parametrize("mode", MERGING)
def test_r64_a_waiting_directory_delete_spares_a_live_attempts_unacknowledged_file(
    mode: MergingMode,
) -> None:
    """R64, R42: two failovers leave two zombies of a subtask, ``tm-1`` and ``tm-3``;
    ``tm-1`` creates the subtask's shared directory and both write there. When ``tm-1``
    stops, the coordinator takes the directory but makes no delete, not even one waiting
    for ``tm-3``: the live attempt ``tm-4`` works in the directories it manages before it
    writes there (R42). ``tm-4`` writes there and has not acknowledged yet: when ``tm-3``
    stops, the directory stays with ``tm-4``'s file."""
    h = start(Config.for_mode(mode, max_file_size=100))
    s = on_tm(h, "tm-1")[0]
    h.run(c.CrashTm("tm-1"))
    h.run(c.Failover())
    h.run(c.CrashTm("tm-3"))
    h.run(c.Failover())
    assert h.tm_of(s) == "tm-4"
    h.run(c.Trigger())
    cp = h.last_checkpoint
    h.run(c.WriteState(cp, s, KS, "zombie", 10, attempt="tm-1"))
    h.run(c.WriteState(cp, s, KS, "zombie", 10, attempt="tm-3"))
    directory = shared_dir(JOB, s)
    h.run(c.AttemptStopped("tm-1"))
    obs = h.observe()  # the coordinator's, and tm-4 works there (R42): no delete waits
    assert obs.directories[directory] == COORDINATOR and directory not in obs.pending_deletes
    live = created(h.run(c.WriteState(cp, s, KS, "live", 10)), "tm:tm-4")
    effects = h.run(c.AttemptStopped("tm-3"))  # I5: tm-4's live file must not go with it
    obs = h.observe()
    assert directory not in [d for d, _ in dir_deletes(effects)]
    assert live and set(live) <= set(obs.files) and directory not in obs.pending_deletes
    h.run(c.Acknowledge(cp, s))
    assert h.quiesce() == []


@pytest.mark.parametrize("mode", MERGING)
def test_r42_a_live_attempt_works_in_the_directories_it_manages_before_it_writes(
    mode: MergingMode,
) -> None:
    """R42, R61, R45: the directory of a subtask the coordinator holds is not collected
    while a live TM runs the subtask, whether or not it has written there yet: a
    restarting TM told that the directory is the coordinator's writes into it without
    creating it again. ``tm-3`` creates the subtask's directory and stops; the
    coordinator's delete waits for the zombie ``tm-2``, which wrote there too; a failover
    starts ``tm-4`` on the subtask; ``tm-2`` stops before ``tm-4`` writes. The model
    deleted the directory (no live TM held a file there) where fastimpl kept it (``tm-4``
    was handed it at the failover)."""
    h, s, directory = _a_collected_directory_waiting_for_a_zombie(mode)
    effects = h.run(c.AttemptStopped("tm-2"))
    obs = h.observe()
    assert directory not in [d for d, _ in dir_deletes(effects)]
    assert obs.directories[directory] == COORDINATOR and directory not in obs.pending_deletes
    h.run(c.Trigger())
    written = h.run(c.WriteState(h.last_checkpoint, s, KS, "next", 10))
    assert not [e for e in written if isinstance(e, MakeDir)]  # it is there
    assert h.quiesce() == []


# ---------------------------------------------------------------- R65 crash mid-write


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r65_crash_during_write_leaves_half_written_file(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.run(c.Trigger())
    s = on_tm(h, "tm-2")[0]
    effects = h.run(c.CrashDuringWrite(1, s, KS, "x", 100, 40))
    path = created(effects)[0]
    assert [e.length for e in effects if isinstance(e, AppendBytes)] == [40]
    assert not [e for e in effects if isinstance(e, CloseFile)]
    obs = h.observe()
    assert obs.files[path] == 40 and obs.owners[path] == "tm:tm-2"
    assert h.lost_tms() == ["tm-2"]
    h.run(c.Failover())
    h.checkpoint()
    assert path not in ref_paths(h.observe())  # no handle ever pointed at it
    assert deleted(h.run(c.AttemptStopped("tm-2")), COORDINATOR) == [path]
    assert h.quiesce() == []


def test_r65_crash_in_pooled_file_leaves_dead_bytes() -> None:
    h = start(Config.for_mode(MergingMode.ACROSS_CHECKPOINT))
    h.checkpoint()
    s = on_tm(h, "tm-2")[0]
    pool = next(p for p in h.observe().open_files if is_under(p, shared_dir(JOB, s)))
    size = h.observe().files[pool]
    h.run(c.Trigger())
    effects = h.run(c.CrashDuringWrite(h.last_checkpoint, s, KS, "x", 100, 40))
    assert effects == (AppendBytes(pool, size, 40, "tm:tm-2"),)
    obs = h.observe()
    assert obs.files[pool] == size + 40 and obs.owners[pool] == "tm:tm-2"
    h.run(c.Failover())  # tm-3 takes the pool over with the live segments only (R61)
    obs = h.observe()
    assert obs.owners[pool] == "tm:tm-3" and obs.ref_counts[pool] == 1
    assert obs.live_segments[pool] == ((0, size),)  # no segment for the 40 dead bytes
    assert h.quiesce() == []


def _zombie_writes_after_failover(
    *, open_files_readable: bool
) -> tuple[Harness, SubtaskId, list[str]]:
    """WITHIN: ``tm-2`` crashes after a checkpoint, a failover replaces it, and its zombie
    attempt writes shared state for the next checkpoint: the harness, the subtask and the
    files it created."""
    cfg = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, open_files_readable=open_files_readable)
    h = start(cfg)
    h.checkpoint()
    s = on_tm(h, "tm-2")[0]
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.run(c.Trigger())
    left = created(h.run(c.WriteState(h.last_checkpoint, s, KS, "z", 10, attempt="tm-2")))
    return h, s, left


@pytest.mark.parametrize("claim", [False, True], ids=["stop", "claim-then-stop"])
def test_r65_an_object_store_never_has_a_file_its_stopped_writer_left_open(claim: bool) -> None:
    """R65, R12, R64, R72: on an object store an object is written when its file is
    closed, so a file a lost attempt still had open when it stopped never exists: it
    leaves the model at the stop without a delete, whoever owns it by then. The long
    soak's seed 1002-within-s3: the zombie ``tm-2`` writes into a WITHIN file; a CLAIM
    restore gives the claimed directories to the coordinator, but the zombie's file
    stays its own (R72: the checkpoint does not reference it); when ``tm-2`` stops, the
    never written file is gone at once: not kept until the directory goes (storage has
    nothing there), nor deleted (I2)."""
    h, s, left = _zombie_writes_after_failover(open_files_readable=False)
    assert left and left[0] in h.observe().open_files and is_under(left[0], shared_dir(JOB, s))
    if claim:
        h.run(c.Restore(1, (), RestoreMode.CLAIM))
        obs = h.observe()
        assert obs.directories[shared_dir(JOB, s)] == COORDINATOR  # R72: claimed
        assert obs.owners[left[0]] == "tm:tm-2"  # the zombie's own, unreferenced
    effects = h.run(c.AttemptStopped("tm-2"))
    assert left[0] not in h.observe().files
    assert left[0] not in deleted(effects)  # never written, so never deleted (I2)
    assert h.quiesce() == []


def test_r65_a_readable_store_keeps_a_file_its_stopped_writer_left_open() -> None:
    """R65: where flushed bytes are durable (a local disk) the same file exists, closed,
    once its writer stopped, and the coordinator deletes it (R64)."""
    h, _, left = _zombie_writes_after_failover(open_files_readable=True)
    assert deleted(h.run(c.AttemptStopped("tm-2")), COORDINATOR) == left


# ---------------------------------------------------------------- R66 task-level failover


def _all_write_and_ack(h: Harness, cp: int, tm: str | None = None) -> list[str]:
    """Every subtask (of ``tm`` only, if given) writes shared and operator state for
    ``cp`` and acknowledges; the files created."""
    made: list[str] = []
    for s in h.subtasks:
        if tm is None or h.tm_of(s) == tm:
            made += created(h.run(c.WriteState(cp, s, KS, "sst-1", 100)))
            made += created(h.run(c.WriteState(cp, s, OP, "offsets", 30, entries=2)))
            h.run(c.Acknowledge(cp, s))
    return made


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r66_a_replaced_tm_leaves_pending_checkpoints_pending_and_its_acks_are_withdrawn(
    mode: MergingMode,
) -> None:
    h = start(Config.for_mode(mode, max_file_size=100))
    h.checkpoint()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    moved = on_tm(h, "tm-2")
    old = _all_write_and_ack(h, cp, "tm-2")
    _all_write_and_ack(h, cp, "tm-1")
    notices = channel(h)
    h.run(c.ReplaceTm("tm-2"))
    assert cp in pending(h) and channel(h) == notices  # nothing aborted or told
    assert h.lost_tms() == ["tm-2"] and h.live_tms() == ["tm-1", "tm-3"]
    assert [h.tm_of(s) for s in moved] == ["tm-3", "tm-3"]
    assert set(pending(h)[cp].acks) == set(on_tm(h, "tm-1"))  # tm-1's stay
    err = h.try_run(c.Complete(cp))
    assert err is not None and err.reason is Reason.NOT_ALL_ACKNOWLEDGED
    for s in moved:  # the zombie may still acknowledge: ignored (R56)
        assert h.try_run(c.Acknowledge(cp, s, attempt="tm-2")) is not None
    new = _all_write_and_ack(h, cp, "tm-3")
    h.run(c.Complete(cp))
    referenced = ref_paths(h.observe())
    assert not referenced & set(old)  # I1: only the accepted attempts' files
    assert referenced & set(new)
    h.deliver_all()
    assert h.quiesce() == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r66_the_new_attempt_writes_for_the_pending_checkpoints_and_later_ones_only(
    mode: MergingMode,
) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    for _ in range(3):
        h.run(c.Trigger())  # 2, 3, 4
    h.run(c.Abort(3))
    h.run(c.ReplaceTm("tm-2"))
    s = on_tm(h, "tm-3")[0]
    for cp, ok in ((1, False), (2, True), (3, False), (4, True)):
        err = h.try_run(c.WriteState(cp, s, OP, "offsets", 10))
        assert (err is None) is ok, (cp, err)
        if err is not None:
            assert err.reason is Reason.CHECKPOINT_FINISHED_FOR_TM
    h.run(c.Trigger())
    h.run(c.WriteState(5, s, OP, "offsets", 10))


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r66_a_finished_savepoint_above_a_pending_checkpoint_is_over_for_the_new_attempt(
    mode: MergingMode,
) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.run(c.Trigger())  # 2: pending
    h.run(c.Trigger(savepoint=True))  # 3: completes while 2 stays pending (R53, R55)
    _all_write_and_ack(h, 3)
    h.run(c.Complete(3))
    assert 2 in pending(h)
    h.run(c.ReplaceTm("tm-1"))
    s = on_tm(h, "tm-3")[0]
    err = h.try_run(c.WriteState(3, s, OP, "offsets", 10))
    assert err is not None and err.reason is Reason.CHECKPOINT_FINISHED_FOR_TM
    h.run(c.WriteState(2, s, OP, "offsets", 10))


def test_r66_withdrawn_whole_files_are_deleted_once_the_replaced_attempt_stopped() -> None:
    h = start(Config.for_mode(MergingMode.NONE))
    h.checkpoint()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    handed = _all_write_and_ack(h, cp, "tm-2")
    assert handed and all(h.observe().owners[p] == COORDINATOR for p in handed)  # R43
    h.run(c.ReplaceTm("tm-2"))
    obs = h.observe()
    assert all(p in obs.files and p in obs.pending_deletes for p in handed)  # R64: waits
    assert not pending(h)[cp].received & set(handed)
    gone = deleted(h.run(c.AttemptStopped("tm-2")), COORDINATOR)
    assert sorted(gone) == sorted(handed)
    assert h.observe().pending_deletes == ()


def test_r66_a_withdrawn_placeholder_no_longer_pins_its_registry_entry() -> None:
    h = start(Config.for_mode(MergingMode.NONE))
    h.checkpoint()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    s = on_tm(h, "tm-2")[0]
    h.run(c.ReuseShared(cp, s, "sst-1"))  # R22: a placeholder
    h.run(c.Acknowledge(cp, s))
    pinned = [k for k, by in pins(h).items() if cp in by]
    assert len(pinned) == 1
    h.run(c.ReplaceTm("tm-2"))
    assert not any(cp in by for by in pins(h).values())
    assert pinned[0] in pins(h)  # checkpoint 1 still refers to it
    h.run(c.ReuseShared(cp, s, "sst-1"))  # the new attempt reuses it again (R61)
    h.run(c.Acknowledge(cp, s))
    assert [k for k, by in pins(h).items() if cp in by] == pinned


@pytest.mark.parametrize("mode", MERGING)
def test_r66_the_new_attempt_takes_over_the_retained_segments_and_the_replaced_ones_wait(
    mode: MergingMode,
) -> None:
    h = start(Config.for_mode(mode, max_file_size=100))
    h.checkpoint()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    pending = _all_write_and_ack(h, cp, "tm-2")
    h.run(c.ReplaceTm("tm-2"))
    obs = h.observe()
    for s in on_tm(h, "tm-3"):  # R61: the retained checkpoint's files are tm-3's
        kept = [p for p in ref_paths(obs) if is_under(p, shared_dir(JOB, s))]
        assert kept and all(obs.owners[p] == "tm:tm-3" for p in kept)
    assert pending and all(obs.owners[p] == "tm:tm-2" for p in pending)  # R64: tm-2's
    assert obs.directories[taskowned_dir(JOB, "tm-2")] == COORDINATOR  # R63
    h.run(c.AttemptStopped("tm-2"))
    obs = h.observe()
    assert not set(pending) & set(obs.files)  # nothing refers to them: the coordinator's, gone
    assert h.quiesce() == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r66_an_attempt_replaced_before_it_acknowledged_is_collected_at_its_stop(
    mode: MergingMode,
) -> None:
    """A task that started a new attempt, wrote and died before its acknowledgement
    reached the coordinator, then retried: the attempt the coordinator never heard from
    is replaced in turn, and its files go at its stop."""
    h = start(Config.for_mode(mode, max_file_size=100))
    h.checkpoint()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    _all_write_and_ack(h, cp, "tm-1")
    h.run(c.ReplaceTm("tm-2"))  # the first retry: tm-3
    stray: list[str] = []
    for s in on_tm(h, "tm-3"):
        stray += created(h.run(c.WriteState(cp, s, KS, "sst-1", 100)), "tm:tm-3")
    assert stray
    h.run(c.ReplaceTm("tm-3"))  # it died unheard of: the second retry, tm-4
    _all_write_and_ack(h, cp, "tm-4")
    h.run(c.Complete(cp))
    assert not ref_paths(h.observe()) & set(stray)
    gone = deleted(h.run(c.AttemptStopped("tm-3")), COORDINATOR)
    assert set(stray) <= set(gone) and not set(stray) & set(h.observe().files)
    h.run(c.AttemptStopped("tm-2"))
    assert h.quiesce() == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r66_a_zombie_of_a_replacement_writes_but_nothing_it_does_reaches_a_checkpoint(
    mode: MergingMode,
) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    h.run(c.ReplaceTm("tm-2"))
    z = on_tm(h, "tm-3")[0]
    written = created(h.run(c.WriteState(cp, z, KS, "zombie", 60, attempt="tm-2")))
    h.run(c.Acknowledge(cp, z, attempt="tm-2"))  # ignored (R56)
    _all_write_and_ack(h, cp)
    h.run(c.Complete(cp))
    assert not ref_paths(h.observe()) & set(written)
    h.deliver_all()
    h.run(c.AttemptStopped("tm-2"))
    assert not set(written) & set(h.observe().files)
    assert h.quiesce() == []


@pytest.mark.parametrize("mode", MERGING)
def test_r66_a_directory_delete_waiting_for_a_replaced_attempt_spares_the_new_ones_files(
    mode: MergingMode,
) -> None:
    """R66, R64, R42: two replaced attempts at once (TLC's soak model, 7 moves). The
    zombie ``tm-1`` creates the subtask's shared directory, the zombie ``tm-3`` writes
    into it; when ``tm-1`` stops the coordinator takes the directory but makes no delete,
    not even one waiting for ``tm-3``: the live attempt ``tm-4`` works in the directories
    it manages before it writes there (R42). ``tm-4`` writes there: when ``tm-3`` stops,
    R42 keeps the directory with ``tm-4``'s file in it."""
    h = start(Config.for_mode(mode, max_file_size=100))
    h.run(c.Trigger())
    cp = h.last_checkpoint
    s = on_tm(h, "tm-1")[0]
    h.run(c.ReplaceTm("tm-1"))
    h.run(c.ReplaceTm("tm-3"))
    assert h.tm_of(s) == "tm-4" and h.lost_tms() == ["tm-1", "tm-3"]
    zombies = created(h.run(c.WriteState(cp, s, KS, "zombie", 10, attempt="tm-1")))
    zombies += created(h.run(c.WriteState(cp, s, KS, "zombie", 10, attempt="tm-3")))
    directory = shared_dir(JOB, s)
    assert h.observe().directories[directory] == "tm:tm-1"  # the zombie created it
    h.run(c.AttemptStopped("tm-1"))
    obs = h.observe()  # the coordinator's, and tm-4 works there (R42): no delete waits
    assert obs.directories[directory] == COORDINATOR and directory not in obs.pending_deletes
    live = created(h.run(c.WriteState(cp, s, KS, "live", 10)), "tm:tm-4")
    assert live and all(is_under(p, directory) for p in live)
    effects = h.run(c.AttemptStopped("tm-3"))  # I5: tm-4's live file must not go with it
    obs = h.observe()
    assert directory not in [d for d, _ in dir_deletes(effects)]
    assert set(live) <= set(obs.files) and directory not in obs.pending_deletes
    assert not set(zombies) & set(obs.files)
    _all_write_and_ack(h, cp)
    h.run(c.Complete(cp))
    assert any(directory in r.directories for r in h.observe().retained)
    h.deliver_all()
    assert h.quiesce() == []
