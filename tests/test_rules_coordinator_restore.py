"""Rules R50-R56 (ids, completion, retention, registry, savepoints, zombie acks), R70-R76
(restore, claim modes, rescaling), R80-R82 (space amplification), R90-R91 (job end) and
R95 (coordinator restart) of SPEC.md, checked against the reference model and against the
product in lockstep with it (``tests/rule_impls.py``: every test runs on each)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import ALL_MODES, JOB, KS, MERGING, ONE, OP, Harness, S, created, deleted
from refimpl.redistribute import redistribute
from spec import commands as c
from spec import effects as ef
from spec.commands import StorageOp
from spec.config import Config, JobSpec, MergingMode, RestoreMode, Scope, StateKind, VertexSpec
from spec.effects import COORDINATOR, USER, Effect
from spec.errors import Reason
from spec.handles import FileHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.keygroups import key_group_range, max_parallelism_refusal, ranges_overlap
from spec.layout import is_under, metadata_path, savepoint_dir, taskowned_dir
from spec.observation import Observation
from tests.rule_impls import channel, impl, impl_free, is_model, pending, placement, start  # noqa: F401 (impl: an autouse fixture)

AGG3 = (("agg", 3),)


def writes(effects: Iterable[Effect]) -> list[Effect]:
    return [e for e in effects if isinstance(e, ef.CreateFile | ef.AppendBytes)]


def ref_paths(obs: Observation) -> set[str]:
    return {s.path for r in obs.retained for e in r.entries if (s := stream_of(e.handle))}


def shared_ids(obs: Observation) -> dict[int, set[str]]:
    return {
        r.checkpoint: {
            s.logical_id for e in r.entries if (s := stream_of(e.handle)) and e.kind is KS
        }
        for r in obs.retained
    }


def one(mode: MergingMode, **kw: object) -> Harness:
    return start(Config.for_mode(mode, **kw), ONE)


def cp_one(
    h: Harness, *, write: Iterable[str] = (), reuse: Iterable[str] = (), size: int = 100
) -> tuple[int, list[Effect]]:
    """A completed, delivered checkpoint of the one-subtask job, and its write effects."""
    cp = trigger(h)
    effects: list[Effect] = []
    for name in reuse:
        effects += h.run(c.ReuseShared(cp, S, name))
    for name in write:
        effects += h.run(c.WriteState(cp, S, KS, name, size))
    h.run(c.Acknowledge(cp, S))
    effects += h.run(c.Complete(cp))
    h.deliver_all()
    return cp, effects


def trigger(h: Harness, savepoint: bool = False) -> int:
    h.run(c.Trigger(savepoint=savepoint))
    return h.last_checkpoint


def refused(h: Harness, cmd: c.Command) -> Reason | None:
    err = h.try_run(cmd)
    return None if err is None else err.reason


# ---------------------------------------------------------------- R50-R53 coordinator


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r50_ids_increase_across_failover_restart_and_restore(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    ids = [h.checkpoint()]
    h.run(c.Trigger())
    ids.append(h.last_checkpoint)  # pending, then aborted by the crash (R57)
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    ids.append(h.checkpoint())
    h.run(c.AttemptStopped("tm-2"))  # R95: a restart waits for the lost attempt's stop
    h.run(c.RestartCoordinator())
    ids.append(h.checkpoint())
    h.run(c.Restore(ids[-1], AGG3, RestoreMode.CLAIM))
    ids.append(h.checkpoint())
    assert ids == [1, 2, 3, 4, 5]
    assert h.observe().retained[-1].metadata == metadata_path("job-1", 5)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r51_completes_only_when_all_acknowledged_and_metadata_written(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    for cp in (trigger(h), trigger(h)):
        *first, last = h.subtasks
        for s in h.subtasks:
            h.run(c.WriteState(cp, s, KS, "sst-1", 10))
        for s in first:
            h.run(c.Acknowledge(cp, s))
        assert refused(h, c.Complete(cp)) is Reason.NOT_ALL_ACKNOWLEDGED
        h.run(c.Acknowledge(cp, last))
        if cp == 2:  # the metadata write fails: aborted, and what acks handed over goes
            received = {p for p, o in h.observe().owners.items() if o == COORDINATOR}
            received -= ref_paths(h.observe()) | {metadata_path(JOB, 1)}
            h.run(c.FailNextCall(StorageOp.METADATA))
            effects = h.run(c.Complete(2))
            assert effects[0] == ef.CallFailed("metadata", metadata_path(JOB, 2), COORDINATOR)
            assert set(deleted(effects, COORDINATOR)) == received
            assert [r.checkpoint for r in h.observe().retained] == [1]
            assert metadata_path(JOB, 2) not in h.observe().files
            assert refused(h, c.Complete(2)) is Reason.CHECKPOINT_NOT_PENDING
    effects = h.run(c.Complete(3))  # checkpoint 2 failing did not affect 3
    assert effects[0] == ef.WriteMetadata(metadata_path(JOB, 3), 3, 4, COORDINATOR)  # first
    assert metadata_path(JOB, 1) in deleted(effects[1:])  # subsumed only afterwards
    assert h.quiesce() == []


@pytest.mark.parametrize("num_retained", [1, 2, 3])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_r52_retains_the_latest_num_retained(mode: MergingMode, num_retained: int) -> None:
    h = start(Config.for_mode(mode, num_retained=num_retained))
    for k in range(1, 6):
        h.checkpoint(reuse=["sst-1"] if k == 2 else (), shared=[f"s{k}" if k > 1 else "sst-1"])
        obs = h.observe()
        keep = list(range(max(1, k - num_retained + 1), k + 1))
        assert [r.checkpoint for r in obs.retained] == keep
        assert obs.metadata_files == {metadata_path(JOB, i) for i in keep}
        gone = [d.path for d in obs.deletions if d.path.endswith("/_metadata")]
        assert gone == [metadata_path(JOB, i) for i in range(1, keep[0])]  # in order


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r53_completion_aborts_older_pending_except_savepoints(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.run(c.Trigger())
    h.run(c.Trigger(savepoint=True))
    h.run(c.Trigger())
    for s in h.subtasks:
        for cp in (1, 2, 3):
            h.run(c.WriteState(cp, s, KS, "a", 10))
            h.run(c.Acknowledge(cp, s))
    handed = {
        p
        for p, o in h.observe().owners.items()
        if o == COORDINATOR and not p.startswith("savepoints/")
    }
    effects = h.run(c.Complete(3))
    assert refused(h, c.Complete(1)) is Reason.CHECKPOINT_NOT_PENDING
    # R43: checkpoint 1's handed-over files go with it (only NONE mode hands any over)
    assert set(deleted(effects, COORDINATOR)) == handed - ref_paths(h.observe())
    assert bool(handed) == (mode is MergingMode.NONE)
    h.run(c.Complete(2))  # the savepoint is still pending
    assert all(o == USER for p, o in h.observe().owners.items() if p.startswith("savepoints/"))


# ---------------------------------------------------------------- R54 registry


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r54_registry_is_keyed_by_unique_handle_ids(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode, num_retained=2))
    h.checkpoint(shared=["sst-1"])
    h.checkpoint(shared=["sst-1"])  # the same local name, uploaded again
    obs = h.observe()
    ids = shared_ids(obs)
    assert len(ids[1]) == len(ids[2]) == 4 and not ids[1] & ids[2]
    keys = {k for k in obs.registry if not k.startswith("dir:")}
    assert keys == ids[1] | ids[2] and "sst-1" not in keys
    for cp, lids in ids.items():
        assert all(obs.registry[k].refs == frozenset({cp}) for k in lids)


@pytest.mark.parametrize("mode", [MergingMode.NONE, *MERGING])
def test_r54_references_are_the_set_of_retained_checkpoints(mode: MergingMode) -> None:
    h = one(mode, num_retained=3, max_file_size=100)
    cp_one(h, write=["a"])
    (key,) = shared_ids(h.observe())[1]
    path = h.observe().registry[key].path
    for reuse, refs in ((["a"], {1, 2}), (["a"], {1, 2, 3}), ([], {2, 3}), ([], {3})):
        cp_one(h, reuse=reuse, write=[] if reuse else ["b"])
        assert h.observe().registry[key].refs == frozenset(refs)
    cp = trigger(h)
    h.run(c.WriteState(cp, S, KS, "b", 100))
    h.run(c.Acknowledge(cp, S))
    effects = h.run(c.Complete(cp))
    assert key not in h.observe().registry
    if mode is MergingMode.NONE:  # the coordinator owns the file and deletes it
        assert path in deleted(effects, COORDINATOR)
    else:  # not the coordinator's: its TM deletes it once told
        assert path not in deleted(effects) and path in h.observe().files
        h.deliver_all()
        assert path not in h.observe().files
        assert any(d.path == path and d.actor == "tm:tm-1" for d in h.observe().deletions)


# ---------------------------------------------------------------- R55 savepoints


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r55_savepoint_one_file_per_handle_never_merged_or_reused(mode: MergingMode) -> None:
    h = one(mode)
    cp_one(h, write=["a"])
    sp = trigger(h, savepoint=True)
    effects = list(h.run(c.ReuseShared(sp, S, "a")))
    effects += h.run(c.WriteState(sp, S, KS, "b", 10))
    effects += h.run(c.WriteState(sp, S, OP, "o", 10))
    paths = created(effects)
    assert len(set(paths)) == 3 and all(is_under(p, savepoint_dir(sp)) for p in paths)
    assert [e.offset for e in effects if isinstance(e, ef.AppendBytes)] == [0, 0, 0]
    h.run(c.Abort(sp))  # an aborted savepoint's files are deleted
    h.deliver_all()
    assert not set(paths) & set(h.observe().files)
    assert {d.actor for d in h.observe().deletions if d.path in paths} == {"tm:tm-1"}


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r55_savepoint_metadata_lives_in_the_savepoint_directory(mode: MergingMode) -> None:
    h = one(mode)
    sp = h.checkpoint(savepoint=True)
    meta = h.observe().metadata_files  # the savepoint's is the only one
    assert len(meta) == 1 and all(is_under(p, savepoint_dir(sp)) for p in meta)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r55_completed_savepoint_is_the_users_and_never_deleted(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    before = h.observe().retained
    sp = trigger(h, savepoint=True)
    for s in h.subtasks:
        h.run(c.WriteState(sp, s, KS, "sst-1", 10))
        h.run(c.Acknowledge(sp, s))
    effects = h.run(c.Complete(sp))
    assert not deleted(effects)  # it subsumes nothing
    obs = h.observe()
    assert obs.retained == before
    mine = {p for p in obs.files if is_under(p, savepoint_dir(sp))}
    assert f"{savepoint_dir(sp)}/_metadata" in mine
    assert len(mine) == 5 and {obs.owners[p] for p in mine} == {USER}
    h.deliver_all()
    for _ in range(3):
        h.checkpoint()  # never subsumed
    h.run(c.Cancel(retain=False))
    obs = h.observe()
    assert mine <= set(obs.files) and not any(d.path in mine for d in obs.deletions)


# ---------------------------------------------------------------- R56 zombie acks


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r56_ack_from_a_replaced_attempt_is_ignored(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    moved = [s for s in h.subtasks if h.tm_of(s) == "tm-2"]
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    cp = trigger(h)
    for s in moved:
        h.run(c.WriteState(cp, s, KS, "zombie", 10, attempt="tm-2"))
        h.run(c.Acknowledge(cp, s, attempt="tm-2"))
    assert refused(h, c.Complete(cp)) is Reason.NOT_ALL_ACKNOWLEDGED
    for s in h.subtasks:
        h.run(c.WriteState(cp, s, KS, "real", 10))
        h.run(c.Acknowledge(cp, s))
    h.run(c.Complete(cp))
    names = {e.name for e in h.observe().retained[-1].entries if e.kind is KS}
    assert names == {"real"}


# ---------------------------------------------------------------- R70-R74 restore


def _two_checkpoints(mode: MergingMode, **kw: object) -> tuple[Harness, dict[str, str]]:
    h = start(Config.for_mode(mode, num_retained=2, **kw))
    h.checkpoint(shared=["a"])
    h.checkpoint(shared=["b"], reuse=["a"])
    return h, dict(h.observe().owners)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r70_restore_starts_a_new_job_and_keeps_old_checkpoints(mode: MergingMode) -> None:
    h, old = _two_checkpoints(mode)
    h.run(c.Restore(1))
    obs = h.observe()
    assert {p: obs.owners.get(p) for p in old} == {p: USER for p in old}
    assert obs.restoring and all(s.path in old for e in obs.restoring if (s := stream_of(e.handle)))
    h.checkpoint()
    new = set(h.observe().files) - set(old)
    assert new and all(p.startswith("job-1/") for p in new)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r70_restoring_anything_else_is_refused(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.checkpoint()  # subsumes 1
    h.run(c.Trigger(savepoint=True))  # 3: pending
    h.run(c.Trigger())
    h.run(c.Abort(4))
    for cp in (1, 3, 4, 99):
        assert refused(h, c.Restore(cp)) is Reason.NOT_RETAINED
    assert refused(h, c.Restore(2, (("nope", 2),))) is Reason.BAD_ARGUMENT


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r70_a_restore_starts_as_many_tms_as_it_asks_for(mode: MergingMode) -> None:
    """Spark runs one TM per subtask: a rescale to 3 ``agg`` subtasks starts 5 TMs, one
    for each subtask, and a later restore keeps the count unless it asks for another."""
    h = start(Config.for_mode(mode))
    h.checkpoint()
    assert refused(h, c.Restore(1, (("agg", 3),), num_tms=0)) is Reason.BAD_ARGUMENT
    assert refused(h, c.Restore(1, num_tms=2**15 + 1)) is Reason.BAD_ARGUMENT
    h.run(c.Restore(1, (("agg", 3),), num_tms=5))
    assert len(h.live_tms()) == 5 and len(set(placement(h).values())) == 5
    h.checkpoint()
    h.run(c.Restore(h.last_checkpoint))
    assert len(h.live_tms()) == 5
    h.checkpoint()
    h.run(c.Restore(h.last_checkpoint, num_tms=1))
    assert h.live_tms() == ["tm-13"] and set(placement(h).values()) == {"tm-13"}
    h.checkpoint()
    assert h.quiesce() == []


NOT_REUSABLE = [
    (m, r)
    for m in ALL_MODES
    for r in RestoreMode
    if (m, r) != (MergingMode.NONE, RestoreMode.CLAIM)
]


@pytest.mark.parametrize(("mode", "restore"), NOT_REUSABLE)
def test_r71_restored_files_never_owned_reused_or_deleted_by_tms(
    mode: MergingMode, restore: RestoreMode
) -> None:
    h, old = _two_checkpoints(mode)
    h.run(c.Restore(2, (), restore))
    h.run(c.Trigger())
    for s in h.subtasks:
        assert refused(h, c.ReuseShared(3, s, "a")) is Reason.NO_SUCH_STATE
        assert writes(h.run(c.WriteState(3, s, KS, "a", 100)))  # uploaded again
        h.run(c.Acknowledge(3, s))
    h.run(c.Complete(3))
    h.deliver_all()
    assert h.observe().restoring == ()
    for _ in range(2):
        h.checkpoint(shared=["a"], reuse=["a"])
    obs = h.observe()
    assert not any(o.startswith("tm:") for p, o in obs.owners.items() if p in old)
    assert not any(d.path in old and d.actor.startswith("tm:") for d in obs.deletions)


@pytest.mark.parametrize("num_retained", [1, 2])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_r72_claim_owns_the_checkpoint_and_deletes_it_once_subsumed(
    mode: MergingMode, num_retained: int
) -> None:
    h = start(Config.for_mode(mode, num_retained=num_retained))
    h.checkpoint()
    h.checkpoint(reuse=["sst-1"])
    source = h.observe().retained[-1]
    h.run(c.Restore(2, AGG3, RestoreMode.CLAIM))
    obs = h.observe()
    claimed = ref_paths(obs) | {source.metadata}
    claimed |= {p for p in obs.files for d in source.directories if is_under(p, d)}
    assert obs.retained == (source,)
    assert {obs.owners[p] for p in claimed} == {COORDINATOR}
    assert all(obs.directories[d] == COORDINATOR for d in source.directories)
    assert {k for k in obs.registry if not k.startswith("dir:")} == shared_ids(obs)[2]
    assert refused(h, c.Restore(1)) is Reason.NOT_RETAINED  # no other old checkpoint
    for k in range(num_retained):
        h.checkpoint()
        still = set(h.observe().files) & claimed
        assert still == (claimed if k + 1 < num_retained else set())
    dels = {d.path: d.actor for d in h.observe().deletions}
    assert {dels[p] for p in claimed} == {COORDINATOR}


@pytest.mark.parametrize("subsumed", [False, True])
@pytest.mark.parametrize("mode", [MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT])
def test_r72_a_claim_leaves_a_zombie_its_unreferenced_files(
    mode: MergingMode, subsumed: bool
) -> None:
    """R72 with R64: a CLAIM restore gives the new job's coordinator the claimed
    checkpoint's directories, but what a lost attempt owns there and the checkpoint does not
    reference stays the attempt's until it is known stopped: a completion sent to it
    before (R34) deletes some as its own deletes, and nothing the checkpoint references.
    At its stop the coordinator takes the rest and deletes it (R64), also when the new job
    subsumed the claimed checkpoint first (the delete of its directories waited)."""
    h = start(Config.for_mode(mode))
    h.checkpoint()
    for _ in range(2):
        h.checkpoint(shared=(), reuse=("sst-1",))
    h.checkpoint(shared=(), reuse=("sst-1",), deliver=False)
    h.run(c.CrashTm("tm-2"))
    h.run(c.Cancel(retain=True))
    h.run(c.Restore(h.last_checkpoint, (), RestoreMode.CLAIM))
    zombie = ef.tm_actor("tm-2")
    before = h.observe()
    used = ref_paths(before) | {r.metadata for r in before.retained}
    kept = {p for p, o in before.owners.items() if o == zombie}
    assert kept and not kept & used
    assert {before.owners[p] for p in used} == {COORDINATOR}
    late = [i for i, n in enumerate(channel(h)) if n.tm == "tm-2"]
    assert late, "no notice to the zombie is in flight"
    for i in reversed(late):
        h.run(c.DeliverNotification(i))
    after = h.observe()
    gone = kept - set(after.files)
    assert gone and used <= set(after.files)
    assert {(d.actor, d.owner) for d in after.deletions if d.path in gone} == {(zombie, zombie)}
    if subsumed:
        h.checkpoint()
        used = set()
    h.run(c.AttemptStopped("tm-2"))
    stopped = h.observe()
    assert not kept & set(stopped.files) and used <= set(stopped.files)
    assert zombie not in stopped.owners.values()
    if subsumed:  # nothing of the old job is left
        assert not [p for p in stopped.files if is_under(p, "job-0")]


def test_r72_claim_without_merging_reuses_through_the_registry() -> None:
    h = start(Config.for_mode(MergingMode.NONE))
    h.checkpoint(shared=["a"])
    lids = shared_ids(h.observe())[1]
    h.run(c.Restore(1, (), RestoreMode.CLAIM))
    h.run(c.Trigger())
    for s in h.subtasks:
        assert h.run(c.ReuseShared(2, s, "a")) == ()  # a placeholder, no upload
        h.run(c.Acknowledge(2, s))
    h.run(c.Complete(2))
    obs = h.observe()
    assert [r.checkpoint for r in obs.retained] == [2]  # the claimed one is subsumed
    assert shared_ids(obs)[2] == lids
    assert all(obs.registry[k].refs == frozenset({2}) for k in lids)
    assert {obs.registry[k].path for k in lids} <= set(obs.files)


@pytest.mark.parametrize("savepoint", [False, True])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_r73_no_claim_registers_reuses_and_deletes_nothing(
    mode: MergingMode, savepoint: bool
) -> None:
    if savepoint:  # a savepoint is always restored NO_CLAIM, whatever is asked
        h = start(Config.for_mode(mode))
        h.checkpoint(shared=["a"])
        cp = h.checkpoint(savepoint=True)
        old = {p: o for p, o in h.observe().owners.items() if is_under(p, savepoint_dir(cp))}
        h.run(c.Restore(cp, (), RestoreMode.CLAIM))
    else:
        h, old = _two_checkpoints(mode)
        h.run(c.Restore(2))  # NO_CLAIM is the default
    obs = h.observe()
    assert obs.registry == {} and obs.retained == () and old
    cp = trigger(h)
    assert refused(h, c.ReuseShared(cp, h.subtasks[0], "a")) is Reason.NO_SUCH_STATE
    h.run(c.Abort(cp))
    for _ in range(3):
        h.checkpoint(shared=["sst-1"])
    h.run(c.Cancel(retain=False))
    obs = h.observe()
    assert {p: obs.owners.get(p) for p in old} == {p: USER for p in old}
    assert not any(d.path in old for d in obs.deletions)


@pytest.mark.parametrize("restore", list(RestoreMode))
@pytest.mark.parametrize("mode", ALL_MODES)
def test_r74_new_job_new_paths_ownership_by_mode(mode: MergingMode, restore: RestoreMode) -> None:
    h, old = _two_checkpoints(mode)
    olddirs = set(h.observe().directories)
    h.run(c.Restore(2, (), restore))
    made: list[Effect] = []
    h.run(c.Trigger())
    for s in h.subtasks:
        made += h.run(c.WriteState(3, s, KS, "a", 10)) + h.run(c.WriteState(3, s, OP, "o", 5))
    paths = {e.path for e in made if isinstance(e, ef.CreateFile | ef.MakeDir)}
    assert paths and all(p.startswith("job-1/") for p in paths)
    assert not paths & (set(old) | olddirs)
    obs = h.observe()
    claimed = {r.metadata for r in obs.retained} | ref_paths(obs)
    claimed |= {p for p in old for r in obs.retained for d in r.directories if is_under(p, d)}
    assert bool(claimed) == (restore is RestoreMode.CLAIM)
    for p in old:  # the same old paths: the owner follows the mode, not the path
        assert obs.owners[p] == (COORDINATOR if p in claimed else USER)


# ---------------------------------------------------------------- R75, R76 rescaling


def _entry(i: int, p: int, kind: StateKind, n: int = 1, name: str = "x") -> StateEntry:
    sub = SubtaskId("v", i, p)
    kg = key_group_range(16, p, i) if kind.keyed else None
    return StateEntry(
        sub, kind, name, FileHandle(f"f{i}-{name}", 10, f"l{i}{name}", kind.scope), n, kg
    )


@impl_free
def test_r75_keyed_state_goes_to_every_overlapping_subtask() -> None:
    old = [_entry(0, 2, KS), _entry(1, 2, KS), _entry(0, 2, StateKind.KEYED_FULL, name="h")]
    out = redistribute(old, [VertexSpec("v", 3)], 16)
    got = {
        s.index: sorted((e.name, e.handle.path) for e in es)  # type: ignore[union-attr]
        for s, es in out.items()
    }
    assert got == {
        0: [("h", "f0-h"), ("x", "f0-x")],  # groups 0-5 lie in old 0 (0-7)
        1: [("h", "f0-h"), ("x", "f0-x"), ("x", "f1-x")],  # 6-10 span both
        2: [("x", "f1-x")],
    }  # 11-15 lie in old 1 (8-15)
    for s, es in out.items():
        assert all(e.subtask == s for e in es)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r75_restore_rescale_assigns_keyed_state_by_overlap(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    old = [
        e for e in h.observe().retained[-1].entries if e.kind is KS and e.subtask.vertex == "agg"
    ]
    h.run(c.Restore(1, AGG3))
    restoring = h.observe().restoring
    for i in range(3):
        mine = key_group_range(128, 3, i)
        got = {e.handle for e in restoring if e.kind is KS and e.subtask == SubtaskId("agg", i, 3)}
        want = {e.handle for e in old if e.key_groups and ranges_overlap(e.key_groups, mine)}
        assert got == want and got


@impl_free
def test_r76_list_state_is_split_evenly_in_contiguous_runs() -> None:
    for kind in (OP, StateKind.CHANNEL):
        old = [_entry(0, 2, kind, 3), _entry(1, 2, kind, 2)]
        out = redistribute(old, [VertexSpec("v", 3)], 16)
        got = {
            s.index: [(e.handle.path, e.entry_range) for e in es]  # type: ignore[union-attr]
            for s, es in out.items()
        }
        assert got == {
            0: [("f0-x", (0, 2))],
            1: [("f0-x", (2, 3)), ("f1-x", (0, 1))],
            2: [("f1-x", (1, 2))],
        }


@impl_free
def test_r76_union_goes_to_everyone_and_same_parallelism_keeps_own_state() -> None:
    union = StateKind.OPERATOR_UNION
    old = [_entry(0, 2, union, 3), _entry(1, 2, union, 2)]
    for s, es in redistribute(old, [VertexSpec("v", 3)], 16).items():
        assert [(e.handle, e.entry_range, e.subtask) for e in es] == [
            (o.handle, None, s) for o in old
        ]
    kinds = (KS, StateKind.KEYED_FULL, OP, union, StateKind.CHANNEL)
    old = [_entry(i, 3, k, n=i + 2, name=k.value) for i in range(3) for k in kinds]
    out = redistribute(old, [VertexSpec("v", 3)], 16)
    assert {s.index: es for s, es in out.items()} == {
        i: [e for e in old if e.subtask.index == i] for i in range(3)
    }


@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    new_p=st.integers(1, 6),
    kind=st.sampled_from([OP, StateKind.CHANNEL]),
)
@impl_free
def test_r76_list_redistribution_keeps_every_element_exactly_once(
    counts: list[int], new_p: int, kind: StateKind
) -> None:
    old = [_entry(i, len(counts), kind, n) for i, n in enumerate(counts)]
    out = redistribute(old, [VertexSpec("v", new_p)], 16)
    flat = [
        (e.subtask.index, e.handle, k)
        for s in sorted(out)
        for e in out[s]
        for k in range(*(e.entry_range or (0, e.entries)))
    ]
    assert [(h, k) for _, h, k in flat] == [(e.handle, k) for e in old for k in range(e.entries)]
    sizes = [sum(1 for i, _, _ in flat if i == j) for j in range(new_p)]
    total = sum(counts)
    if new_p == len(counts):  # unchanged parallelism: everyone keeps its own
        assert sizes == counts
    else:  # contiguous runs, the first ones one longer
        assert sizes == [total // new_p + (1 if j < total % new_p else 0) for j in range(new_p)]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r76_restore_rescale_splits_operator_state(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint(operator_entries=2)  # agg[0/2] and agg[1/2]: two entries each
    old = {
        e.subtask.index: e.handle
        for e in h.observe().retained[-1].entries
        if e.kind is OP and e.subtask.vertex == "agg"
    }
    h.run(c.Restore(1, AGG3))
    got = {
        i: [
            (e.handle, e.entry_range)
            for e in h.observe().restoring
            if e.kind is OP and e.subtask == SubtaskId("agg", i, 3)
        ]
        for i in range(3)
    }
    # 4 elements over 3 subtasks: runs of 2, 1, 1 in old-subtask order
    assert got == {0: [(old[0], (0, 2))], 1: [(old[1], (0, 1))], 2: [(old[1], (1, 2))]}


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("restore", list(RestoreMode))
def test_r77_a_changed_max_parallelism_is_refused(mode: MergingMode, restore: RestoreMode) -> None:
    """Restore and rescale with a max parallelism other than the checkpoint's are refused
    before anything changes; the same value (said or implied) is accepted."""
    h = start(Config.for_mode(mode, max_parallelism=128))
    h.checkpoint(shared=["a"])
    before = h.observe()
    for other in (64, 256, 129):
        for par in ((), AGG3):
            assert refused(h, c.Restore(1, par, restore, other)) is Reason.MAX_PARALLELISM_CHANGED
    assert h.observe() == before
    h.run(c.Restore(1, AGG3, restore, 128))
    assert h.observe().restoring


def test_r77_the_refusal_names_both_values() -> None:
    h = start(Config.for_mode(MergingMode.WITHIN_CHECKPOINT, max_parallelism=128))
    h.checkpoint(shared=["a"])
    err = h.try_run(c.Restore(1, (), RestoreMode.CLAIM, 256))
    assert err is not None and "128" in err.detail and "256" in err.detail


@impl_free
def test_r77_ranges_decide_when_the_value_was_not_recorded() -> None:
    """A version-1 checkpoint (no recorded value): a keyed range that another max
    parallelism would cut differently is refused; ranges it cuts the same pass."""
    e = StateEntry(
        SubtaskId("v", 1, 2), KS, "s", FileHandle("p", 1, "u", Scope.SHARED), 1, (64, 127)
    )
    assert max_parallelism_refusal(None, 128, [e]) is None
    for other in (64, 256, 1):
        why = max_parallelism_refusal(None, other, [e])
        assert why is not None and str(other) in why and "[64, 127]" in why
    assert max_parallelism_refusal(128, 128, [e]) is None
    assert "128" in (max_parallelism_refusal(128, 256, []) or "")


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r78_a_restore_past_the_max_parallelism_is_refused_and_the_bound_itself_runs(
    mode: MergingMode,
) -> None:
    """Vertices at their max parallelism (4) checkpoint; a restore that would raise a
    parallelism past it, or past Flink's 2**15, or to 2**63 (building a job that large
    would hang the in-process engine) is refused before anything changes; one at
    the bound and below is accepted. (A job, vertex or configuration past the bounds is
    refused when it is made: tests/test_config.py.)"""
    job = JobSpec((VertexSpec("src", 4), VertexSpec("agg", 4)), num_tms=2)
    h = start(Config.for_mode(mode, max_parallelism=4), job)
    h.checkpoint(shared=["a"])
    before = h.observe()
    for par in ((("agg", 5),), (("src", 32769),), (("src", 2**63),)):
        assert refused(h, c.Restore(1, par)) is Reason.BAD_ARGUMENT
    assert h.observe() == before
    h.run(c.Restore(1, (("agg", 4), ("src", 2))))
    assert h.observe().restoring


# ---------------------------------------------------------------- R80-R82 amplification


def _amplified(mode: MergingMode, bound: float, max_file_size: int) -> tuple[Harness, str]:
    """a and b share one file; b is written anew and the old b is discarded: the file
    holds 200 bytes of which 100 are live (amplification 2)."""
    h = one(mode, max_space_amplification=bound, max_file_size=max_file_size)
    _, e1 = cp_one(h, write=["a", "b"])
    cp_one(h, reuse=["a"], write=["b"])
    return h, created(e1)[0]


@pytest.mark.parametrize("mode", MERGING)
def test_r80_amplified_closed_file_is_not_reused(mode: MergingMode) -> None:
    h, f1 = _amplified(mode, 1.5, 200)
    assert f1 not in h.observe().open_files and h.observe().files[f1] == 200
    _, effects = cp_one(h, reuse=["a"])
    again = [e for e in effects if isinstance(e, ef.AppendBytes)]
    assert len(again) == 1 and again[0].length == 100 and again[0].path != f1
    assert f1 not in h.observe().files  # it goes once its segments are discarded
    assert any(d.path == f1 and d.actor == "tm:tm-1" for d in h.observe().deletions)


@pytest.mark.parametrize("bound", [2.0, 0.5])
@pytest.mark.parametrize("mode", MERGING)
def test_r82_r80_disabled_or_at_the_bound_the_file_stays_reusable(
    mode: MergingMode, bound: float
) -> None:
    h, f1 = _amplified(mode, bound, 200)  # 2.0 is not above 2.0; 0.5 disables (R82)
    _, effects = cp_one(h, reuse=["a"])
    assert writes(effects) == []
    assert f1 in h.observe().files and f1 in ref_paths(h.observe())


@pytest.mark.parametrize("bound", [1.2, 0.5])
def test_r81_r82_amplified_open_pool_file_is_rolled_unless_disabled(bound: float) -> None:
    h = one(MergingMode.ACROSS_CHECKPOINT, max_space_amplification=bound, max_file_size=10_000)
    _, e1 = cp_one(h, write=["a", "b"])
    f1 = created(e1)[0]
    cp = trigger(h)
    h.run(c.ReuseShared(cp, S, "a"))
    h.run(c.WriteState(cp, S, KS, "b", 100))  # the pool: a, old b, new b = 300 bytes
    h.run(c.Acknowledge(cp, S))
    h.run(c.Complete(cp))
    assert f1 in h.observe().open_files
    closes = ef.CloseFile(f1, "tm:tm-1") in h.run(c.DeliverNotification(0))  # 300 vs 200 live
    rolled = created(h.run(c.WriteState(trigger(h), S, KS, "c", 10))) != []
    assert closes == rolled == (bound == 1.2)  # R81; a bound below 1 disables it (R82)
    assert (f1 in h.observe().open_files) == (bound < 1)


def test_r81_dead_bytes_of_aborted_checkpoints_do_not_pile_up() -> None:
    h = one(MergingMode.ACROSS_CHECKPOINT, max_space_amplification=2.0, max_file_size=10_000)
    for cp in (1, 2, 3):
        assert trigger(h) == cp
        h.run(c.WriteState(cp, S, KS, "x", 100))
        h.run(c.Abort(cp))
        h.deliver_all()
    cp_one(h, write=["x"])
    obs = h.observe()
    for path in obs.open_files:
        live = sum(n for _, n in obs.live_segments.get(path, ()))
        assert live and obs.files[path] <= 2.0 * live, (path, obs.files[path], live)


# ---------------------------------------------------------------- R90, R91 job end


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r90_cancel_before_the_first_checkpoint_leaves_nothing(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.run(c.Trigger())
    h.run(c.Trigger(savepoint=True))
    for i, s in enumerate(h.subtasks):
        for cp in (1, 2):
            h.run(c.WriteState(cp, s, KS, "a", 50))
            h.run(c.WriteState(cp, s, OP, "o", 10))
            if i % 2 == 0:
                h.run(c.Acknowledge(cp, s))
    assert h.observe().files
    h.run(c.Cancel(retain=True))
    obs = h.observe()
    assert obs.files == {} and obs.directories == {} and obs.pending_deletes == ()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r90_cancel_closes_pools_and_drops_what_nothing_retains(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.run(c.Trigger())
    for s in h.subtasks:  # shared state only: no TM directory is used by checkpoint 1
        h.run(c.WriteState(1, s, KS, "a", 50))
        h.run(c.Acknowledge(1, s))
    h.run(c.Complete(1))
    h.deliver_all()
    h.checkpoint(complete=False)  # writes exclusive state: the TM directories appear
    effects = h.run(c.Cancel(retain=True))
    obs = h.observe()
    assert obs.open_files == frozenset()
    assert set(obs.files) == ref_paths(obs) | {metadata_path(JOB, 1)}
    if mode is not MergingMode.NONE:
        assert {(e.path, e.actor) for e in effects if isinstance(e, ef.DeleteDir)} == {
            (taskowned_dir(JOB, t), f"tm:{t}") for t in ("tm-1", "tm-2")
        }
        assert set(obs.directories) == set(obs.retained[0].directories)


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_r91_cancel_discards_or_gives_retained_checkpoints_to_user(
    mode: MergingMode, retain: bool
) -> None:
    h = start(Config.for_mode(mode, num_retained=2))
    h.checkpoint()
    h.checkpoint(reuse=["sst-1"])
    before = h.observe()
    effects = h.run(c.Cancel(retain=retain))
    obs = h.observe()
    assert refused(h, c.Trigger()) is Reason.JOB_NOT_RUNNING
    if not retain:
        assert obs.files == {} and obs.directories == {} and obs.retained == ()
        assert refused(h, c.Restore(2)) is Reason.NOT_RETAINED
        return
    assert obs.retained == before.retained
    assert not set(deleted(effects)) & (ref_paths(obs) | set(obs.metadata_files))
    assert set(obs.files) == ref_paths(obs) | {metadata_path(JOB, 1), metadata_path(JOB, 2)}
    assert set(obs.owners.values()) == {USER} and set(obs.directories.values()) <= {USER}
    assert h.quiesce() == []


# ---------------------------------------------------------------- R95 coordinator restart


@pytest.mark.parametrize("num_retained", [1, 2, 3])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_r95_restart_rebuilds_registry_and_retained(mode: MergingMode, num_retained: int) -> None:
    h = start(Config.for_mode(mode, num_retained=num_retained))
    h.checkpoint(shared=["a", "b"])
    h.checkpoint(shared=["c"], reuse=["a"])
    h.checkpoint(shared=["d"], reuse=["a", "c"])
    h.checkpoint(shared=["e"], reuse=["a"], complete=False)
    before = h.observe()
    pending = {p for p, o in before.owners.items() if o == COORDINATOR} - ref_paths(before)
    pending -= set(before.metadata_files)
    effects = h.run(c.RestartCoordinator())
    after = h.observe()
    assert after.registry == before.registry and after.retained == before.retained
    assert max(len(r.refs) for r in after.registry.values()) >= min(num_retained, 2)
    kept = ref_paths(before) | set(before.metadata_files)
    assert not set(deleted(effects)) & kept and kept <= set(after.files)
    assert set(deleted(effects, COORDINATOR)) == pending  # the forgotten acks' files
    assert (mode is MergingMode.NONE) == bool(pending)
    assert h.quiesce() == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r95_a_failed_delete_of_the_coordinators_is_done_at_the_restart(mode: MergingMode) -> None:
    """R95, R45: the restarted coordinator remembers none of its failed deletes; what they
    were to delete is unreferenced, so it goes at the restart (the long soak's seed
    1031-within-local: a coordinator rebuilt in a new process deletes the subsumed
    checkpoint's ``_metadata`` whose delete had failed, and the model must not keep it
    pending)."""
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.checkpoint(complete=False)
    h.run(c.FailNextCall(StorageOp.DELETE))
    h.run(c.Complete(h.last_checkpoint))
    before = h.observe()
    failed = set(before.pending_deletes)
    assert failed and {before.owners[p] for p in failed} == {COORDINATOR}
    effects = h.run(c.RestartCoordinator())
    after = h.observe()
    assert failed <= set(deleted(effects, COORDINATOR))
    assert not failed & set(after.files) and after.pending_deletes == ()
    assert h.quiesce() == []


# ---------------------------------------------------------------------------- R57


@pytest.mark.parametrize("mode", list(MergingMode))
def test_r57_losing_a_tm_aborts_every_pending_checkpoint(mode: MergingMode) -> None:
    h = start(Config.for_mode(mode))
    h.checkpoint()
    h.run(c.Trigger())
    h.run(c.Trigger(savepoint=True))
    cp, sp = h.last_checkpoint - 1, h.last_checkpoint
    for s in h.subtasks:
        h.run(c.WriteState(cp, s, StateKind.KEYED_SHARED, "sst-2", 40))
        h.run(c.Acknowledge(cp, s))
    lost = h.tm_of(h.subtasks[0])
    h.run(c.CrashTm(lost))
    assert not pending(h)
    if is_model(h):  # the model records aborted ids; both refuse to complete one below
        assert {cp, sp} <= h.state.aborted
    err = h.try_run(c.Complete(cp))
    assert err is not None and err.reason is Reason.CHECKPOINT_NOT_PENDING
    # the lost TM's acknowledged files are cleaned once it stops; nothing retained breaks
    h.run(c.AttemptStopped(lost))
    assert [r.checkpoint for r in h.observe().retained] == [cp - 1]
    assert h.quiesce() == []
