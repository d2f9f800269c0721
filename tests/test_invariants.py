"""The invariant predicates of spec/invariants.py (I1-I6 of SPEC.md): each one is shown a
hand-built observation that breaks it and one that satisfies it, and the reference model's
own observation after realistic runs must satisfy all of them once quiet."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import pytest
from attrs import evolve

from conformance.harness import Harness
from spec import commands as c
from spec.commands import StorageOp
from spec.config import Config, MergingMode, RestoreMode, Scope, StateKind
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
)
from spec.ids import SubtaskId
from spec.invariants import (
    Violation,
    check_all,
    check_safety,
    no_dangling_reference,
    no_double_delete,
    no_foreign_delete,
    no_leak_once_quiet,
    one_owner,
    sound_counts,
)
from spec.observation import DeletionRecord, Observation, RegistryView, RetainedView

CO = "coordinator"
TM = "tm:tm-1"
META = "job/chk-1/_metadata"
SHARED = "job/shared/v-0-1"
POOL = f"{SHARED}/f000001"  # 100 bytes, one live segment (0, 60)
EXCL = "job/chk-1/f000002"  # a whole exclusive file, 20 bytes
SUB = SubtaskId("v", 0, 1)
SEG = StateEntry(
    SUB, StateKind.KEYED_SHARED, "sst", SegmentHandle(POOL, 0, 60, "s1", Scope.SHARED), 1, (0, 127)
)
WHOLE = StateEntry(
    SUB, StateKind.OPERATOR_LIST, "offsets", FileHandle(EXCL, 20, "s2", Scope.EXCLUSIVE), 2
)
CHK = RetainedView(1, "job", META, (SEG, WHOLE), (SHARED,))

GOOD = Observation(
    files={META: 2, POOL: 100, EXCL: 20},
    open_files=frozenset(),
    directories={SHARED: CO},
    owners={META: CO, POOL: TM, EXCL: CO},
    claims={META: frozenset({CO}), POOL: frozenset({TM}), EXCL: frozenset({CO})},
    retained=(CHK,),
    restoring=(),
    ref_counts={POOL: 1},
    live_segments={POOL: ((0, 60),)},
    registry={
        "s1": RegistryView(POOL, frozenset({1}), False),
        f"dir:{SHARED}": RegistryView(SHARED, frozenset({1}), True),
    },
    deletions=(DeletionRecord("job/chk-0/_metadata", CO, CO, True, False),),
    pending_deletes=(),
    pool_files=frozenset(),
    metadata_files=frozenset({META}),
    live_parties=frozenset({CO, TM}),
)

Check = Callable[[Observation], list[Violation]]
T = TypeVar("T")


def ids(violations: list[Violation]) -> set[str]:
    return {v.invariant for v in violations}


def without(mapping: Mapping[str, T], *keys: str) -> dict[str, T]:
    return {k: v for k, v in mapping.items() if k not in keys}


def only(obs: Observation, check: Check, invariant: str) -> list[Violation]:
    """The observation breaks ``check`` (reported as ``invariant``) and nothing else."""
    found = check(obs)
    assert found and ids(found) == {invariant}, found
    assert ids(check_all(obs, quiet=True)) == {invariant}, check_all(obs, quiet=True)
    return found


def test_i1_i6_the_well_formed_observation_satisfies_every_invariant() -> None:
    for check in (
        no_dangling_reference,
        no_double_delete,
        one_owner,
        sound_counts,
        no_foreign_delete,
        no_leak_once_quiet,
    ):
        assert check(GOOD) == []
    assert check_all(GOOD, quiet=True) == []


# ---------------------------------------------------------------- I1 no dangling reference


def test_i1_handle_to_a_missing_file() -> None:
    obs = evolve(GOOD, files=without(GOOD.files, POOL), owners=without(GOOD.owners, POOL))
    (v,) = only(obs, no_dangling_reference, "I1")
    assert POOL in v.detail


def test_i1_segment_beyond_the_file_size() -> None:
    obs = evolve(GOOD, files={**GOOD.files, POOL: 59})
    (v,) = only(obs, no_dangling_reference, "I1")
    assert "ends at 60 > size 59" in v.detail


def test_i1_missing_metadata_or_directory() -> None:
    obs = evolve(GOOD, files=without(GOOD.files, META), owners=without(GOOD.owners, META))
    assert "metadata" in only(obs, no_dangling_reference, "I1")[0].detail
    obs = evolve(GOOD, directories={})
    assert SHARED in only(obs, no_dangling_reference, "I1")[0].detail


def test_i1_restoring_state_and_unresolved_handles() -> None:
    gone = StateEntry(
        SUB, StateKind.KEYED_FULL, "heap", FileHandle("old/f9", 5, "s9", Scope.EXCLUSIVE)
    )
    assert (
        "restoring" in only(evolve(GOOD, restoring=(gone,)), no_dangling_reference, "I1")[0].detail
    )
    ok = StateEntry(SUB, StateKind.KEYED_FULL, "heap", FileHandle(EXCL, 20, "s2", Scope.EXCLUSIVE))
    assert no_dangling_reference(evolve(GOOD, restoring=(ok,))) == []
    for handle in (PlaceholderHandle("s7"), DirectoryHandle("job/taskowned/tm-9")):
        bad = evolve(CHK, entries=(*CHK.entries, evolve(WHOLE, handle=handle)))
        only(evolve(GOOD, retained=(bad,)), no_dangling_reference, "I1")


# ---------------------------------------------------------------- I2 no double delete


def test_i2_deleting_what_does_not_exist() -> None:
    obs = evolve(GOOD, deletions=(DeletionRecord("job/nope", CO, None, False, False),))
    assert "did not exist" in only(obs, no_double_delete, "I2")[0].detail


def test_i2_deleting_a_path_twice() -> None:
    twice = DeletionRecord("job/chk-0/_metadata", CO, CO, True, False)
    obs = evolve(GOOD, deletions=(*GOOD.deletions, twice))
    assert "2 times" in only(obs, no_double_delete, "I2")[0].detail
    other = evolve(twice, path="job/chk-0/f1")
    assert no_double_delete(evolve(GOOD, deletions=(*GOOD.deletions, other))) == []


# ---------------------------------------------------------------- I3 one owner


def test_i3_a_file_without_owner() -> None:
    obs = evolve(GOOD, owners=without(GOOD.owners, EXCL))
    assert "no owner" in only(obs, one_owner, "I3")[0].detail


def test_i3_a_live_party_claims_a_file_someone_else_owns() -> None:
    obs = evolve(GOOD, claims={**GOOD.claims, POOL: frozenset({TM, CO})})
    assert "claimed by ['coordinator']" in only(obs, one_owner, "I3")[0].detail
    assert one_owner(evolve(GOOD, claims={})) == []  # nobody claiming is fine


# ---------------------------------------------------------------- I4 sound counts


def test_i4_ref_count_differs_from_live_segments() -> None:
    obs = evolve(GOOD, ref_counts={POOL: 2})
    assert "ref count 2 != 1" in only(obs, sound_counts, "I4")[0].detail
    obs = evolve(GOOD, ref_counts={})
    assert "untracked" in only(obs, sound_counts, "I4")[0].detail


def test_i4_registry_refs_differ_from_retained_checkpoints() -> None:
    wrong = evolve(
        GOOD, registry={**GOOD.registry, "s1": RegistryView(POOL, frozenset({1, 2}), False)}
    )
    assert "registry s1" in only(wrong, sound_counts, "I4")[0].detail
    missing = evolve(GOOD, registry=without(GOOD.registry, f"dir:{SHARED}"))
    assert f"dir:{SHARED}" in only(missing, sound_counts, "I4")[0].detail
    extra = evolve(GOOD, registry={**GOOD.registry, "s9": RegistryView("x", frozenset({3}), True)})
    assert "s9" in only(extra, sound_counts, "I4")[0].detail


# ---------------------------------------------------------------- I5 no foreign delete


def test_i5_deleting_what_another_party_owns() -> None:
    obs = evolve(GOOD, deletions=(DeletionRecord("job/chk-0/f1", TM, CO, True, False),))
    assert "owned by coordinator" in only(obs, no_foreign_delete, "I5")[0].detail


def test_i5_deleting_something_protected() -> None:
    obs = evolve(
        GOOD, deletions=(DeletionRecord("savepoints/sp-1/f1", "user", "user", True, True),)
    )
    assert "protected" in only(obs, no_foreign_delete, "I5")[0].detail


# ---------------------------------------------------------------- I6 no leak once quiet


def test_i6_a_leaked_file_unless_pooled_or_the_users() -> None:
    leak = f"{SHARED}/f000009"
    obs = evolve(
        GOOD,
        files={**GOOD.files, leak: 5},
        owners={**GOOD.owners, leak: TM},
        claims={**GOOD.claims, leak: frozenset({TM})},
    )
    assert check_safety(obs) == []  # not a safety matter
    assert leak in only(obs, no_leak_once_quiet, "I6")[0].detail
    assert (
        check_all(
            evolve(obs, pool_files=frozenset({leak}), open_files=frozenset({leak})), quiet=True
        )
        == []
    )
    users = evolve(obs, owners={**obs.owners, leak: "user"}, claims=GOOD.claims)
    assert check_all(users, quiet=True) == []


def test_i6_a_leaked_directory_unless_a_live_party_holds_it() -> None:
    d = "job/taskowned/tm-9"
    obs = evolve(GOOD, directories={**GOOD.directories, d: "tm:tm-9"})
    assert d in only(obs, no_leak_once_quiet, "I6")[0].detail
    held = evolve(obs, live_parties=GOOD.live_parties | {"tm:tm-9"})
    assert check_all(held, quiet=True) == []


def test_i6_a_pending_delete() -> None:
    obs = evolve(GOOD, pending_deletes=("job/chk-0/f1",))
    assert "pending" in only(obs, no_leak_once_quiet, "I6")[0].detail
    assert check_all(obs, quiet=False) == []  # only judged in a quiet state


# ---------------------------------------------------------------- the model's own runs


def _realistic_run(h: Harness) -> None:
    zombie = [s for s in h.subtasks if h.tm_of(s) == "tm-2"]
    h.checkpoint(shared=["a", "b"])
    h.checkpoint(shared=["c"], reuse=["a"])
    h.checkpoint(savepoint=True)
    h.checkpoint(reuse=["c"], complete=False)
    h.run(c.FailNextCall(StorageOp.DELETE))
    h.run(c.CrashTm("tm-2"))
    h.run(c.Trigger())
    h.run(c.CrashDuringWrite(h.last_checkpoint, h.subtasks[0], StateKind.KEYED_SHARED, "x", 80, 30))
    h.run(c.Failover())
    h.run(c.Trigger())
    h.run(
        c.WriteState(h.last_checkpoint, zombie[0], StateKind.OPERATOR_LIST, "z", 40, attempt="tm-2")
    )
    h.run(c.Acknowledge(h.last_checkpoint, zombie[0], attempt="tm-2"))
    h.checkpoint(shared=["a"], deliver=False)
    h.run(c.DuplicateNotification(0))
    h.run(c.DropNotification(1))
    for tm in h.lost_tms():  # R95: a restart waits for the lost attempts' stop
        h.run(c.AttemptStopped(tm))
    h.run(c.RestartCoordinator())
    h.checkpoint(shared=["d"])
    h.run(c.Trigger())  # a lost attempt's torn upload: a leftover until it stops (R64, R65)
    h.run(c.CrashDuringWrite(h.last_checkpoint, h.subtasks[0], StateKind.KEYED_SHARED, "y", 80, 30))


@pytest.mark.parametrize("num_retained", [1, 2])
@pytest.mark.parametrize("mode", list(MergingMode))
def test_i1_i6_model_run_satisfies_every_invariant_once_quiet(
    mode: MergingMode, num_retained: int
) -> None:
    h = Harness(Config.for_mode(mode, num_retained=num_retained, max_file_size=150))
    _realistic_run(h)
    before = h.observe()
    assert check_safety(before) == []
    assert ids(no_leak_once_quiet(before)) == {"I6"}  # lost attempts' leftovers: not quiet
    assert h.quiesce() == []
    assert check_all(h.observe(), quiet=True) == []
    h.run(c.Restore(h.state.retained[-1].id, (("agg", 3),), RestoreMode.CLAIM))
    h.checkpoint()
    assert h.quiesce() == [] and check_all(h.observe(), quiet=True) == []
    h.run(c.Cancel(retain=False))
    assert h.quiesce() == [] and check_all(h.observe(), quiet=True) == []
    assert set(h.observe().owners.values()) <= {"user"}


@pytest.mark.parametrize("mode", list(MergingMode))
def test_i6_model_leak_is_reported_until_the_lost_attempt_stops(mode: MergingMode) -> None:
    h = Harness(Config.for_mode(mode, max_file_size=100))  # full pools close: a new file
    h.checkpoint()
    h.run(c.Trigger())
    s = h.subtasks[1]
    h.run(c.CrashDuringWrite(h.last_checkpoint, s, StateKind.KEYED_SHARED, "x", 100, 40))
    h.run(c.Failover())
    h.checkpoint()
    h.checkpoint()
    half = [p for p, n in h.observe().files.items() if n == 40]
    assert len(half) == 1 and check_safety(h.observe()) == []
    assert any(half[0] in v.detail for v in no_leak_once_quiet(h.observe()))
    h.run(c.AttemptStopped(h.lost_tms()[0]))
    assert check_all(h.observe(), quiet=True) == []
