"""Rule tests for reuse of shared state (R20-R23) and notifications and the subsumed
watermark (R30-R35) of SPEC.md.

Every test runs twice (``tests/rule_impls.py``): on the reference model through ``Harness``
(which checks I1-I5 after every command), and on the product in lockstep with the model,
and asserts on storage effects, the observation, the notifications in flight or
the refusal reason. The default job has two TMs: tm-1 hosts agg[0] and src[0], tm-2 hosts
agg[1] and src[1]. ``Harness.checkpoint`` writes ``sst-1`` (100 bytes) per subtask.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.harness import ALL_MODES, MERGING, Harness, of_type
from refimpl.state import NoticeKind
from spec import commands as c
from spec.config import Config, MergingMode, StateKind
from spec.effects import AppendBytes, CreateFile, DeleteFile, Effect
from spec.errors import Reason
from spec.handles import FileHandle, PlaceholderHandle, SegmentHandle
from spec.ids import SubtaskId
from spec.observation import Observation
from tests.rule_impls import channel, current_impl, impl, pending, segments, start  # noqa: F401 (impl: an autouse fixture)

AGG0 = SubtaskId("agg", 0, 2)
SRC0, SRC1 = SubtaskId("src", 0, 2), SubtaskId("src", 1, 2)
SHARED = StateKind.KEYED_SHARED
COMPLETE, ABORT = NoticeKind.COMPLETE, NoticeKind.ABORT
Extent = tuple[str, int, int]


def make(mode: MergingMode, **kwargs: object) -> Harness:
    return start(Config.for_mode(mode, **kwargs))


def write(
    h: Harness, cp: int, sub: SubtaskId, name: str = "sst-1", size: int = 100
) -> tuple[Effect, ...]:
    return h.run(c.WriteState(cp, sub, SHARED, name, size))


def ack_all(h: Harness, cp: int, skip: Iterable[SubtaskId] = ()) -> None:
    for s in h.subtasks:
        if s not in set(skip):
            h.run(c.Acknowledge(cp, s))


def notices(h: Harness) -> set[tuple[str, NoticeKind, int, int]]:
    return {(n.tm, n.kind, n.checkpoint, n.mark) for n in channel(h)}


def index_of(
    h: Harness, tm: str | None = None, kind: NoticeKind | None = None, cp: int | None = None
) -> int | None:
    for i, n in enumerate(channel(h)):
        if tm in (None, n.tm) and kind in (None, n.kind) and cp in (None, n.checkpoint):
            return i
    return None


def deliver(
    h: Harness, tm: str | None = None, kind: NoticeKind | None = None, cp: int | None = None
) -> tuple[Effect, ...]:
    i = index_of(h, tm, kind, cp)
    assert i is not None, (tm, kind, cp, channel(h))
    return h.run(c.DeliverNotification(i))


def drop_all(h: Harness, kind: NoticeKind | None = None, cp: int | None = None) -> None:
    while (i := index_of(h, None, kind, cp)) is not None:
        h.run(c.DropNotification(i))


def extents(obs: Observation) -> set[Extent]:
    return {(p, off, n) for p, segs in obs.live_segments.items() for off, n in segs}


def stream(
    h: Harness, sub: SubtaskId, name: str = "sst-1", at: int = -1
) -> SegmentHandle | FileHandle:
    """The resolved handle of ``sub``'s ``name`` in the retained checkpoint ``at``."""
    r = h.observe().retained[at]
    out = [e.handle for e in r.entries if e.subtask == sub and e.name == name]
    assert len(out) == 1 and isinstance(out[0], SegmentHandle | FileHandle), out
    return out[0]


def extent_of(handle: SegmentHandle | FileHandle) -> Extent:
    assert isinstance(handle, SegmentHandle), handle
    return handle.path, handle.offset, handle.length


def core(obs: Observation) -> tuple[object, ...]:
    """What must not depend on the order notifications arrive in."""
    return (
        obs.files,
        obs.open_files,
        obs.owners,
        obs.ref_counts,
        obs.live_segments,
        obs.registry,
        obs.retained,
        obs.pending_deletes,
    )


def reason(h: Harness, cmd: c.Command) -> Reason | None:
    err = h.try_run(cmd)
    return None if err is None else err.reason


def aborted(h: Harness, cp: int) -> bool:
    return reason(h, c.Complete(cp)) is Reason.CHECKPOINT_NOT_PENDING


# ---------------------------------------------------------------------------- R20 reuse


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r20_reuse_of_known_completed_state_writes_nothing(mode: MergingMode) -> None:
    h = make(mode, num_retained=2)
    h.checkpoint()
    h.run(c.Trigger())
    assert reason(h, c.ReuseShared(2, SRC0, "never-written")) is Reason.NO_SUCH_STATE
    assert h.run(c.ReuseShared(2, SRC0, "sst-1")) == ()
    ack_all(h, 2)
    h.run(c.Complete(2))
    assert stream(h, SRC0, at=1) == stream(h, SRC0, at=0)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("case", ["completion_not_delivered", "checkpoint_still_pending"])
def test_r20_reuse_of_unconfirmed_state_uploads_again(mode: MergingMode, case: str) -> None:
    h = make(mode, num_retained=2)
    if case == "completion_not_delivered":
        h.checkpoint(deliver=False)
        old = stream(h, SRC0)
    else:
        h.run(c.Trigger())
        write(h, 1, SRC0)
        old = None
    h.run(c.Trigger())
    eff = h.run(c.ReuseShared(2, SRC0, "sst-1"))
    appends = of_type(eff, AppendBytes)
    assert len(appends) == 1 and appends[0].length == 100
    if old is not None:
        ack_all(h, 2)
        h.run(c.Complete(2))
        new = stream(h, SRC0)
        assert new.logical_id != old.logical_id and new.path == appends[0].path


@pytest.mark.parametrize("mode", MERGING)
def test_r20_reuse_from_file_no_longer_reusable_uploads_again(mode: MergingMode) -> None:
    h = make(mode, max_space_amplification=1.5)
    h.checkpoint(shared=("sst-1", "sst-2"))
    old = stream(h, SRC0)
    h.checkpoint(shared=(), reuse=("sst-1",))  # sst-2 dies: the file is 2x amplified
    assert stream(h, SRC0) == old
    h.run(c.Trigger())
    eff = h.run(c.ReuseShared(3, SRC0, "sst-1"))
    assert of_type(eff, AppendBytes) and of_type(eff, AppendBytes)[0].path != old.path
    assert of_type(eff, AppendBytes)[0].length == old.length


# ---------------------------------------------------------------------------- R21 last_used


@pytest.mark.parametrize("mode", MERGING)
def test_r21_reuse_extends_segment_past_watermark(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    seg = stream(h, SRC0)
    h.checkpoint(shared=(), reuse=("sst-1",))  # complete(2, watermark 1) delivered
    assert extent_of(seg) in extents(h.observe())
    assert segments(h, "tm-1")[seg.logical_id][3] == 2
    h.checkpoint(shared=())  # complete(3, watermark 2): nobody uses it any more
    assert extent_of(seg) not in extents(h.observe())


@pytest.mark.parametrize("mode", MERGING)
def test_r21_last_used_is_the_max_of_reusing_checkpoints(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    seg = stream(h, SRC0)
    ext = extent_of(seg)
    h.run(c.Trigger())
    h.run(c.Trigger())
    for s in h.subtasks:  # reuse in 3 first, then in the older 2
        h.run(c.ReuseShared(3, s, "sst-1"))
        h.run(c.ReuseShared(2, s, "sst-1"))
    assert segments(h, "tm-1")[seg.logical_id][3] == 3
    for cp in (2, 3):
        ack_all(h, cp)
        h.run(c.Complete(cp))
    h.deliver_all()  # complete(3, watermark 2): 3 still refers to it
    assert ext in extents(h.observe())


def test_r21_placeholder_reuse_keeps_registry_entry() -> None:
    h = make(MergingMode.NONE)
    h.checkpoint()
    f = stream(h, SRC0)
    h.checkpoint(shared=(), reuse=("sst-1",))  # 1 subsumed, 2 refers through a placeholder
    obs = h.observe()
    assert obs.registry[f.logical_id].refs == frozenset({2})
    assert obs.files[f.path] == 100 and obs.owners[f.path] == "coordinator"
    h.checkpoint(shared=())  # 2 subsumed: now nobody refers to it
    assert f.logical_id not in h.observe().registry and f.path not in h.observe().files


# ---------------------------------------------------------------------------- R22 placeholders


def test_r22_reuse_is_a_placeholder_resolved_by_the_registry() -> None:
    h = make(MergingMode.NONE, num_retained=2)
    h.checkpoint()
    f = stream(h, SRC0)
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(2, SRC0, "sst-1")) == ()
    h.run(c.Acknowledge(2, SRC0))
    assert [e.handle for e in pending(h)[2].acks[SRC0] if e.name == "sst-1"] == [
        PlaceholderHandle(f.logical_id)
    ]
    ack_all(h, 2, skip=[SRC0])
    h.run(c.Complete(2))
    assert stream(h, SRC0) == f
    assert h.observe().registry[f.logical_id].refs == frozenset({1, 2})


def _reuse_in_3_while_2_drops_sst1() -> tuple[Harness, FileHandle]:
    h = make(MergingMode.NONE)
    h.checkpoint()
    f = stream(h, SRC0)
    assert isinstance(f, FileHandle)
    h.run(c.Trigger())
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()
    return h, f


def test_r22_placeholder_to_a_gone_entry_aborts_the_checkpoint() -> None:
    h, f = _reuse_in_3_while_2_drops_sst1()
    ack_all(h, 2)
    h.run(c.Complete(2))  # subsumes 1: nothing pins sst-1's entry, it goes
    assert f.logical_id not in h.observe().registry and f.path not in h.observe().files
    h.run(c.Acknowledge(3, SRC0))
    assert aborted(h, 3)
    assert {(n.kind, n.checkpoint) for n in channel(h)} >= {(ABORT, 3)}


def test_r22_pinned_entry_survives_until_the_checkpoint_completes() -> None:
    h, f = _reuse_in_3_while_2_drops_sst1()
    h.run(c.Acknowledge(3, SRC0))  # pins the entry
    ack_all(h, 2)
    h.run(c.Complete(2))
    assert f.logical_id in h.observe().registry and f.path in h.observe().files
    ack_all(h, 3, skip=[SRC0])
    h.run(c.Complete(3))
    assert h.observe().registry[f.logical_id].refs == frozenset({3})
    assert stream(h, SRC0) == f


def test_r22_pinned_entry_released_when_the_checkpoint_aborts() -> None:
    h, f = _reuse_in_3_while_2_drops_sst1()
    h.run(c.Acknowledge(3, SRC0))
    ack_all(h, 2)
    h.run(c.Complete(2))
    assert f.path in h.observe().files
    assert DeleteFile(f.path, "coordinator") in h.run(c.Abort(3))
    assert f.logical_id not in h.observe().registry


# ---------------------------------------------------------------------------- R23 baseline


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r23_names_not_in_the_completed_checkpoint_are_forgotten(mode: MergingMode) -> None:
    h = make(mode, max_space_amplification=0.5)  # R82: no roll for dead bytes
    h.checkpoint(shared=("sst-1", "sst-2"))
    h.checkpoint(shared=("sst-1",))
    h.run(c.Trigger())
    assert reason(h, c.ReuseShared(3, SRC0, "sst-2")) is Reason.NO_SUCH_STATE
    assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()


@pytest.mark.parametrize("mode", [MergingMode.NONE, *MERGING])
def test_r23_reused_state_stays_reusable(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    first = stream(h, SRC0)
    h.checkpoint(shared=(), reuse=("sst-1",))
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()
    ack_all(h, 3)
    h.run(c.Complete(3))
    assert stream(h, SRC0) == first


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r23_newer_names_are_not_forgotten(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    h.run(c.Trigger())
    h.run(c.Trigger())
    write(h, 3, SRC0, "sst-new")
    ack_all(h, 2)  # 2 has no shared state
    h.run(c.Complete(2))
    h.deliver_all()
    ack_all(h, 3)
    h.run(c.Complete(3))
    h.deliver_all()
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(4, SRC0, "sst-new")) == ()


# ---------------------------------------------------------------------------- R30 notifications


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("retained", [1, 2])
def test_r30_complete_notifies_every_live_tm_with_watermark(
    mode: MergingMode, retained: int
) -> None:
    h = make(mode, num_retained=retained)
    for cp in range(1, 5):
        h.checkpoint(deliver=False)
        mark = max(0, cp - retained)
        assert notices(h) == {("tm-1", COMPLETE, cp, mark), ("tm-2", COMPLETE, cp, mark)}
        h.deliver_all()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r30_abort_notifies_latest_completed(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    h.run(c.Abort(1))
    assert notices(h) == {("tm-1", ABORT, 1, 0), ("tm-2", ABORT, 1, 0)}
    h.deliver_all()
    h.checkpoint()
    h.checkpoint()
    h.run(c.Trigger())
    h.run(c.Abort(4))
    assert notices(h) == {("tm-1", ABORT, 4, 3), ("tm-2", ABORT, 4, 3)}


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r30_lost_tm_is_not_notified(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint(complete=False)
    h.run(c.CrashTm("tm-2"))  # R57 aborts 1; only tm-1 still counts
    assert notices(h) == {("tm-1", ABORT, 1, 0)}
    h.run(c.Failover())  # tm-3 replaces tm-2
    h.deliver_all()
    h.checkpoint(deliver=False)
    assert notices(h) == {("tm-1", COMPLETE, 2, 0), ("tm-3", COMPLETE, 2, 0)}


# ---------------------------------------------------------------------------- R31 complete(c, k)


@pytest.mark.parametrize("mode", MERGING)
def test_r31_complete_discards_segments_up_to_watermark(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    cp1 = extents(h.observe())
    h.checkpoint(shared=("sst-2",), deliver=False)
    cp2 = extents(h.observe()) - cp1
    assert cp1 and cp2 and cp1 <= extents(h.observe())
    owners = h.observe().owners
    tm1 = {e for e in cp1 if owners[e[0]] == "tm:tm-1"}
    assert tm1 and cp1 - tm1
    deliver(h, tm="tm-1")  # complete(2, watermark 1) reaches tm-1 only
    assert not tm1 & extents(h.observe()) and cp1 - tm1 <= extents(h.observe())
    h.deliver_all()
    assert not cp1 & extents(h.observe()) and cp2 <= extents(h.observe())


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r31_complete_discards_unacknowledged_older_writes(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    append = of_type(write(h, 1, SRC0, "late", 30), AppendBytes)[0]
    h.checkpoint(deliver=False)  # completes 2, aborts 1
    drop_all(h, ABORT, 1)
    ext = (append.path, append.offset, append.length)
    assert (ext in extents(h.observe())) is (mode is not MergingMode.NONE)
    eff = deliver(h, tm="tm-1")
    assert ext not in extents(h.observe())
    if mode is not MergingMode.ACROSS_CHECKPOINT:  # a pooled ACROSS file stays open
        assert DeleteFile(append.path, "tm:tm-1") in eff


# ---------------------------------------------------------------------------- R32 abort(c, L)


@pytest.mark.parametrize("mode", MERGING)
def test_r32_abort_discards_segments_created_for_the_checkpoint(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    cp1 = extents(h.observe())
    h.checkpoint(shared=("sst-2",), complete=False)  # acknowledged by everyone
    cp2 = extents(h.observe()) - cp1
    h.run(c.Abort(2))
    assert cp2 <= extents(h.observe())  # nobody has heard yet
    h.deliver_all()
    assert not cp2 & extents(h.observe()) and cp1 <= extents(h.observe())


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r32_abort_discards_unacknowledged_writes(mode: MergingMode) -> None:
    h = make(mode, max_space_amplification=0.0)  # keep the emptied pool file open (no R81)
    h.run(c.Trigger())
    path = of_type(write(h, 1, SRC0), AppendBytes)[0].path
    h.run(c.Abort(1))
    assert path in h.observe().files
    eff = deliver(h, tm="tm-1")
    if mode is MergingMode.ACROSS_CHECKPOINT:
        assert h.observe().ref_counts[path] == 0 and path in h.observe().open_files
    else:
        assert DeleteFile(path, "tm:tm-1") in eff and path not in h.observe().files


@pytest.mark.parametrize("mode", MERGING)
def test_r32_abort_keeps_an_older_segment_it_reused(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    seg = stream(h, SRC0)
    h.checkpoint(shared=(), reuse=("sst-1",), complete=False)
    h.run(c.Abort(2))
    h.deliver_all()
    assert extent_of(seg) in extents(h.observe())
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r32_abort_carries_latest_completed_as_confirmation(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint(deliver=False)
    drop_all(h, COMPLETE, 1)
    h.run(c.Trigger())
    h.run(c.Abort(2))
    h.deliver_all()  # abort(2, 1): 1 counts as completed
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()


# ---------------------------------------------------------------------------- R33 idempotence


@pytest.mark.parametrize("mode", MERGING)
def test_r33_duplicate_complete_discards_once(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    h.checkpoint(shared=("sst-2",), deliver=False)
    i = index_of(h, tm="tm-1")
    assert i is not None
    h.run(c.DuplicateNotification(i))
    before = h.observe()
    deliver(h, tm="tm-1")
    once = h.observe()
    assert sum(once.ref_counts.values()) < sum(before.ref_counts.values())
    assert deliver(h, tm="tm-1") == ()
    assert h.observe() == once


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r33_abort_after_complete_discards_once(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    write(h, 1, SRC0, "late", 30)
    h.checkpoint(deliver=False)  # completes 2, aborts 1
    deliver(h, tm="tm-1", kind=COMPLETE)  # drops the unacknowledged write of 1
    once = h.observe()
    assert deliver(h, tm="tm-1", kind=ABORT) == ()
    assert h.observe() == once


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r33_duplicate_abort_discards_once(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    h.checkpoint(shared=("sst-2",), complete=False)
    h.run(c.Abort(2))
    i = index_of(h, tm="tm-1")
    assert i is not None
    h.run(c.DuplicateNotification(i))
    deliver(h, tm="tm-1")
    once = h.observe()
    assert deliver(h, tm="tm-1") == ()
    assert h.observe() == once


# ---------------------------------------------------------------------------- R34 delivery faults


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r34_lost_complete_covered_by_a_later_one(mode: MergingMode) -> None:
    a, b = make(mode), make(mode)
    a.checkpoint()
    a.checkpoint()
    b.checkpoint(deliver=False)
    drop_all(b, COMPLETE, 1)
    b.checkpoint()
    assert core(a.observe()) == core(b.observe())
    for h in (a, b):
        h.run(c.Trigger())
        assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r34_stale_complete_after_a_newer_one_changes_nothing(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint(deliver=False)
    h.checkpoint(deliver=False)
    deliver(h, tm="tm-1", cp=2)
    deliver(h, tm="tm-2", cp=2)
    before = h.observe()
    assert deliver(h, cp=1) + deliver(h, cp=1) == ()
    assert h.observe() == before
    h.run(c.Trigger())
    assert h.run(c.ReuseShared(3, SRC0, "sst-1")) == ()


@pytest.mark.parametrize("mode", MERGING)
def test_r34_lost_abort_covered_by_a_later_watermark(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    cp1 = extents(h.observe())
    h.checkpoint(shared=("sst-2",), complete=False)
    cp2 = extents(h.observe()) - cp1
    h.run(c.Abort(2))
    drop_all(h, ABORT, 2)
    h.checkpoint(shared=("sst-3",))  # complete(3, watermark 1): 2 may still be retained
    assert cp2 <= extents(h.observe())
    h.checkpoint(shared=("sst-4",))  # complete(4, watermark 3) covers the lost abort
    assert not cp2 & extents(h.observe())
    assert not h.quiesce()


@pytest.mark.parametrize("mode", ALL_MODES)
@settings(max_examples=15)
@given(order=st.permutations(range(6)))
def test_r34_any_delivery_order_with_duplicates_ends_equal(
    mode: MergingMode, order: list[int]
) -> None:
    def run(perm: Iterable[int]) -> Observation:
        h = make(mode)
        h.checkpoint(deliver=False)
        h.checkpoint(shared=("sst-2",), deliver=False)
        h.run(c.DuplicateNotification(0))
        h.run(c.DuplicateNotification(3))
        notes = channel(h)
        for k in perm:
            h.run(c.DeliverNotification(channel(h).index(notes[k])))
        return h.observe()

    key = (current_impl(), mode)
    if key not in _IN_ORDER:
        _IN_ORDER[key] = core(run(range(6)))
    assert core(run(order)) == _IN_ORDER[key]


_IN_ORDER: dict[tuple[str, MergingMode], tuple[object, ...]] = {}
"""The in-order outcome of the test above, by implementation and mode (the same each time)."""


def test_r34_unknown_notification_index_refused() -> None:
    h = make(MergingMode.WITHIN_CHECKPOINT)
    h.checkpoint(deliver=False)
    assert len(channel(h)) == 2
    for cmd in (c.DeliverNotification(2), c.DropNotification(5), c.DuplicateNotification(-1)):
        assert reason(h, cmd) is Reason.NO_SUCH_NOTIFICATION


# ---------------------------------------------------------------------------- R35 savepoints


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_savepoint_neither_subsumes_nor_moves_the_watermark(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    h.checkpoint(savepoint=True, deliver=False)
    assert {(n.checkpoint, n.mark) for n in channel(h)} == {(2, 0)}
    assert [r.checkpoint for r in h.observe().retained] == [1]
    h.deliver_all()
    h.checkpoint(deliver=False)
    assert {(n.checkpoint, n.mark) for n in channel(h)} == {(3, 1)}
    assert [r.checkpoint for r in h.observe().retained] == [3]
    sp = {p: o for p, o in h.observe().owners.items() if p.startswith("savepoints/")}
    data = [p for p in sp if not p.endswith("/_metadata")]
    assert len(data) == 8 and set(sp.values()) == {"user"}
    h.run(c.Cancel(retain=False))
    assert set(sp) <= set(h.observe().files)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_later_completion_does_not_finish_a_pending_savepoint(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger(savepoint=True))
    h.run(c.Trigger())
    path = of_type(write(h, 1, SRC0, "sp"), CreateFile)[0].path
    for s in h.subtasks:
        write(h, 2, s)
        h.run(c.Acknowledge(2, s))
    h.run(c.Complete(2))
    h.deliver_all()  # complete(2) reaches both TMs
    assert h.observe().owners[path] == "tm:tm-1"
    assert h.try_run(c.WriteState(1, SRC1, SHARED, "sp", 10)) is None
    ack_all(h, 1)
    h.run(c.Complete(1))
    assert h.observe().owners[path] == "user"


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_complete_finishes_savepoints_no_longer_pending(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger(savepoint=True))
    h.run(c.Trigger())
    path = of_type(write(h, 1, SRC0, "sp"), CreateFile)[0].path
    h.run(c.Abort(1))
    drop_all(h, ABORT, 1)  # the savepoint's abort is lost
    ack_all(h, 2)
    h.run(c.Complete(2))
    assert {n.pending_savepoints for n in channel(h)} == {frozenset()}
    assert DeleteFile(path, "tm:tm-1") in deliver(h, tm="tm-1")
    assert reason(h, c.WriteState(1, AGG0, SHARED, "sp", 10)) is Reason.CHECKPOINT_FINISHED_FOR_TM


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_complete_does_not_finish_newer_savepoints(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    h.run(c.Trigger(savepoint=True))
    path = of_type(write(h, 2, SRC0, "sp"), CreateFile)[0].path
    h.run(c.Abort(2))
    drop_all(h, ABORT, 2)
    ack_all(h, 1)
    h.run(c.Complete(1))
    h.deliver_all()  # complete(1) says nothing about savepoint 2 > 1
    assert h.observe().owners[path] == "tm:tm-1"
    h.checkpoint()  # complete(3) covers it
    assert path not in h.observe().files
    assert not h.quiesce()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_savepoint_listed_as_pending_is_not_finished(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger(savepoint=True))
    h.run(c.Trigger())
    path = of_type(write(h, 1, SRC0, "sp"), CreateFile)[0].path
    ack_all(h, 2)
    h.run(c.Complete(2))  # complete(2) lists savepoint 1 as still pending
    h.run(c.Abort(1))  # aborted afterwards: tm-1 hears it only from abort(1)
    assert deliver(h, tm="tm-1", kind=COMPLETE) == ()
    assert path in h.observe().files
    assert DeleteFile(path, "tm:tm-1") in deliver(h, tm="tm-1", kind=ABORT)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_delayed_complete_spares_a_savepoint_triggered_after_it(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint(deliver=False)  # complete(1) in flight, listing no savepoint
    h.run(c.Trigger(savepoint=True))
    path = of_type(write(h, 2, SRC0, "sp"), CreateFile)[0].path
    h.deliver_all()
    assert h.observe().owners[path] == "tm:tm-1"
    ack_all(h, 2)
    h.run(c.Complete(2))
    assert h.observe().owners[path] == "user"


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r35_savepoint_completion_does_not_finish_older_checkpoints(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    h.checkpoint(savepoint=True)  # savepoint 2 completes and is delivered
    assert h.try_run(c.WriteState(1, SRC0, SHARED, "sst-1", 10)) is None
    ack_all(h, 1)
    h.run(c.Complete(1))
    assert [r.checkpoint for r in h.observe().retained] == [1]
