"""fastimpl.shared_registry: Flink's watermark rule (an entry goes once no retained
checkpoint uses it) with the explicit exceptions the rules need: a placeholder of a
pending checkpoint pins its entry (R22), an abort releases it at once, and what a
subsumption releases goes in the subsumed checkpoint's order. The lockstep and
conformance tests compare every resulting delete with the model; these pin the
registry's own contract."""

from __future__ import annotations

from fastimpl.records import Completed
from fastimpl.shared_registry import DIR_PREFIX, SharedStateRegistry, shared_keys
from spec.config import Scope, StateKind
from spec.handles import FileHandle, SegmentHandle, StateEntry
from spec.ids import SubtaskId

S = SubtaskId("win", 0, 1)


def _done(cid: int, *lids: str, dirs: tuple[str, ...] = ()) -> Completed:
    entries = tuple(
        StateEntry(
            S,
            StateKind.KEYED_SHARED,
            lid,
            FileHandle(f"job-0/shared/{lid}", 1, lid, Scope.SHARED),
            1,
        )
        for lid in lids
    )
    return Completed(cid, "job-0", False, entries, dirs, f"job-0/chk-{cid}/_metadata")


def _register(reg: SharedStateRegistry, done: Completed) -> None:
    for e in done.entries:
        h = e.handle
        assert isinstance(h, FileHandle)
        reg.register(h.logical_id, h.path, h, True, done.id)
    for d in done.directories:
        reg.register(DIR_PREFIX + d, d, None, True, done.id)


def test_an_entry_goes_once_no_retained_checkpoint_uses_it() -> None:
    reg = SharedStateRegistry()
    one, two = _done(1, "a", "b"), _done(2, "b", "c")
    _register(reg, one)
    _register(reg, two)
    assert reg.view([one, two])["b"].refs == frozenset({1, 2})
    gone = reg.unregister_unused(2, shared_keys(one))  # retention keeps checkpoint 2
    assert [e.key for e in gone] == ["a"], "b is still used by the retained checkpoint 2"
    assert set(reg) == {"b", "c"}
    assert reg.view([two])["b"].refs == frozenset({2})
    gone = reg.unregister_unused(None, shared_keys(two))  # nothing retained
    assert [e.key for e in gone] == ["b", "c"], "in the subsumed checkpoint's order"
    assert len(reg) == 0


def test_a_pending_placeholder_pins_its_entry_until_the_checkpoint_ends() -> None:
    reg = SharedStateRegistry()
    one, two = _done(1, "a"), _done(2, "x")
    _register(reg, one)
    assert reg.pin("a", 3), "checkpoint 3 refers to a by a placeholder (R22)"
    assert not reg.pin("nope", 3), "a placeholder of nothing registered pins nothing"
    _register(reg, two)
    assert reg.unregister_unused(2, shared_keys(one)) == [], "pinned: kept past the watermark"
    assert "a" in reg
    released = reg.unpin(3, 2)  # checkpoint 3 aborts
    assert [e.key for e in released] == ["a"] and "a" not in reg


def test_completing_the_pinning_checkpoint_moves_last_used_and_drops_its_pin() -> None:
    reg = SharedStateRegistry()
    one = _done(1, "a")
    _register(reg, one)
    reg.pin("a", 2)
    two = _done(2, "a")
    _register(reg, two)
    entry = reg.get("a")
    assert entry is not None and entry.last_used == 2 and not entry.pinned_by
    assert reg.unregister_unused(2, shared_keys(one)) == []
    assert reg.view([two])["a"].refs == frozenset({2})


def test_a_key_registered_for_another_path_is_a_conflict_and_directories_are_keys() -> None:
    reg = SharedStateRegistry()
    _register(reg, _done(1, "a", dirs=("job-0/shared/win-0-1",)))
    assert reg.conflict("a", "job-0/shared/a") is None
    assert reg.conflict("a", "job-0/shared/elsewhere") == "job-0/shared/a"
    entry = reg.get(DIR_PREFIX + "job-0/shared/win-0-1")
    assert entry is not None and entry.is_dir and entry.owned
    seg = SegmentHandle("job-0/shared/win-0-1/f1", 0, 4, "s", Scope.SHARED)
    excl = FileHandle("job-0/chk-2/f2", 4, "e", Scope.EXCLUSIVE)
    done = Completed(
        2,
        "job-0",
        False,
        (
            StateEntry(S, StateKind.KEYED_SHARED, "s", seg, 1),
            StateEntry(S, StateKind.OPERATOR_LIST, "o", excl, 1),
            StateEntry(S, StateKind.KEYED_SHARED, "s", seg, 1),
        ),
        ("job-0/shared/win-0-1",),
        "job-0/chk-2/_metadata",
    )
    assert shared_keys(done) == ["s", DIR_PREFIX + "job-0/shared/win-0-1"]


def test_a_withdrawn_acknowledgement_releases_only_its_own_pins() -> None:
    """R66: ``unpin_keys`` drops pending checkpoint 3's pins on the keys named and no
    other: an entry another pending checkpoint pins stays, an entry checkpoint 3 does not
    pin is neither touched nor released (though unused), a key nothing registered is
    skipped and the keys after it are still released, and a pin on a key not named
    stays."""
    reg = SharedStateRegistry()
    _register(reg, _done(1, "a", "b", "c", "d"))
    _register(reg, _done(2, "x"))  # retention keeps 2: a-d are unused unless pinned
    for key in ("a", "b", "c"):
        assert reg.pin(key, 3)
    assert reg.pin("a", 4)
    released = reg.unpin_keys({"_unknown", "a", "b", "d"}, 3, 2)
    assert [e.key for e in released] == ["b"]
    assert set(reg) == {"a", "c", "d", "x"}
    a, c = reg.get("a"), reg.get("c")
    assert a is not None and a.pinned_by == {4}
    assert c is not None and c.pinned_by == {3}
