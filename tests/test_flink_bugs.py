"""Regression scenarios: the real Flink bugs of BRIEF §6, replayed against the reference model.

Each ``test_flink_NNNNN_*`` drives the model through the command sequence that triggered the
bug in Flink and asserts concretely that the model does not have it: the file or directory
Flink lost still exists, the ref count / ``last_used`` / registry key is the right one, the
effect Flink performed wrongly is absent, and the system ends quiet without a leak.
``Harness.run`` checks I1-I5 after every command.

Each ``test_flink_NNNNN_buggy_rule_is_caught`` swaps Flink's buggy rule into the model (with
pytest's ``monkeypatch``; nothing under ``refimpl/`` changes) and runs the same scenario: an
invariant must then break. That shows the scenario really exercises the rule that prevents
the bug, and that the invariants would notice it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pytest
from attrs import evolve

from conformance.harness import ALL_MODES, MERGING, Harness, InvariantBroken, merging
from model_tests.twins import no_last_used_advance
from refimpl.machine import _Work
from refimpl.state import (
    BackendRef,
    Completed,
    ModelState,
    RegEntry,
    Seg,
    TmRec,
    TmStatus,
    initial_state,
    place,
    subtasks_of,
)
from spec import commands as c
from spec import ids as spec_ids
from spec import layout as spec_layout
from spec.config import JobSpec, MergingMode, RestoreMode, Scope, StateKind, VertexSpec
from spec.effects import (
    COORDINATOR,
    AppendBytes,
    CallFailed,
    CreateFile,
    DeleteDir,
    DeleteFile,
    Effect,
    MakeDir,
    tm_actor,
)
from spec.errors import CommandError, Reason
from spec.handles import (
    FileHandle,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
    extent_of,
    stream_of,
)
from spec.ids import SubtaskId, escape_name, unescape_name
from spec.layout import is_under, shared_dir, taskowned_dir

TmNotice = Callable[[_Work, str, int, int, bool], None]
"""``_Work.tm_complete`` / ``tm_abort``: (tm, checkpoint, mark, savepoint)."""
ReuseRule = Callable[[_Work, c.ReuseShared], None]

SST = "sst-1"


# ---------------------------------------------------------------------------- helpers


def write_all(h: Harness, cp: int, shared: Iterable[str] = (SST,), *, size: int = 100) -> None:
    """Every subtask writes the named shared state and its operator state for ``cp``."""
    for s in h.subtasks:
        for name in shared:
            h.run(c.WriteState(cp, s, StateKind.KEYED_SHARED, name, size))
        h.run(c.WriteState(cp, s, StateKind.OPERATOR_LIST, "offsets", 26, entries=2))


def reuse_all(h: Harness, cp: int, name: str = SST) -> None:
    for s in h.subtasks:
        h.run(c.ReuseShared(cp, s, name))


def ack_all(h: Harness, cp: int) -> None:
    for s in h.subtasks:
        h.run(c.Acknowledge(cp, s))


def drop_all(h: Harness) -> None:
    """Every notification in flight is lost."""
    while h.state.channel:
        h.run(c.DropNotification(0))


def retained(h: Harness, cp: int) -> Completed:
    found = [r for r in h.state.retained if r.id == cp]
    assert found, f"checkpoint {cp} is not retained: {[r.id for r in h.state.retained]}"
    return found[0]


def shared_streams(entries: Iterable[StateEntry], name: str = SST) -> dict[SubtaskId, str]:
    """Subtask -> logical id of its stream handle for the shared state ``name``."""
    out: dict[SubtaskId, str] = {}
    for e in entries:
        s = stream_of(e.handle)
        if e.name == name and e.kind is StateKind.KEYED_SHARED and s is not None:
            out[e.subtask] = s.logical_id
    return out


def handles(entries: Iterable[StateEntry], name: str = SST) -> list[SegmentHandle | FileHandle]:
    return [sh for e in entries if e.name == name and (sh := stream_of(e.handle)) is not None]


def intact(h: Harness, entries: Iterable[StateEntry]) -> None:
    """Every stream handle points at an existing file that holds all its bytes."""
    files = h.observe().files
    for e in entries:
        s = stream_of(e.handle)
        if s is None:
            continue
        assert s.path in files, f"{e.name} of {e.subtask}: {s.path} is gone"
        end = extent_of(s).offset + s.length
        assert files[s.path] >= end, f"{s.path} is shorter than the handle"


def seg_of(h: Harness, logical_id: str) -> Seg:
    found = [seg for (_tm, lid), seg in h.state.segs.items() if lid == logical_id]
    assert len(found) == 1, f"segment {logical_id}: {found}"
    return found[0]


def output_entries(h: Harness, cp: int) -> list[StateEntry]:
    """What the subtasks wrote or reused for ``cp`` and did not acknowledge yet."""
    return [e for (_tm, _s, k), es in h.state.outputs.items() if k == cp for e in es]


def assert_quiet(h: Harness) -> None:
    broken = h.quiesce()
    assert broken == [], h._report(broken)


def deleted_paths(effects: Iterable[Effect]) -> set[str]:
    return {e.path for e in effects if isinstance(e, DeleteFile | DeleteDir)}


@contextmanager
def invariant_breaks(*invariants: str) -> Iterator[list[str]]:
    """The block must break one of the named safety invariants (``InvariantBroken``); the
    yielded list receives the report (violations, then the command history)."""
    seen: list[str] = []
    with pytest.raises(InvariantBroken) as info:
        yield seen
    message = str(info.value)
    seen.append(message)
    assert any(re.search(rf"^{i}: ", message, re.M) for i in invariants), message


# ---------------------------------------------------------------------------- FLINK-38347


def _38347_lost_complete_then_abort(h: Harness, *, started: bool = False) -> int:
    """Checkpoint 1 uses the managed directories and completes, but every completion
    notification is lost; checkpoint 2 is aborted and its abort is delivered. ``started``:
    the subtasks wrote and acknowledged checkpoint 2 first (so it reported the directories
    too); otherwise it was aborted before it started on the TMs. Returns the effect-log
    mark taken after checkpoint 1."""
    h.run(c.Trigger())
    write_all(h, 1)
    ack_all(h, 1)
    h.run(c.Complete(1))
    drop_all(h)
    mark = len(h.effects)
    h.run(c.Trigger())
    if started:
        write_all(h, 2, ("sst-2",))
        ack_all(h, 2)
    h.run(c.Abort(2))
    h.deliver_all()
    return mark


@pytest.mark.parametrize("started", [False, True], ids=["cp2-not-started", "cp2-started"])
@pytest.mark.parametrize("mode", MERGING)
def test_flink_38347_lost_complete_then_abort_keeps_directory(
    mode: MergingMode, started: bool
) -> None:
    """FLINK-38347: the TM counted references to a managed directory; after checkpoint 1's
    completion notification was lost and an abort arrived, the count hit 0 and the TM
    deleted a directory the completed checkpoint 1 still used.
    Prevented by R41 (the TM tracks the *set* of checkpoints that reported the directory and
    deletes it only if all are known aborted) and R42 (once checkpoint 1 completed, the
    directory is the coordinator's)."""
    h = Harness(merging(mode))
    mark = _38347_lost_complete_then_abort(h, started=started)
    cp1 = retained(h, 1)
    obs = h.observe()
    assert cp1.directories, "checkpoint 1 reported no directory"
    for d in cp1.directories:
        assert obs.directories.get(d) == COORDINATOR, f"{d} lost or not handed over"
        assert obs.registry[f"dir:{d}"].refs == frozenset({1})
        if d in h.state.dirs:
            assert h.state.dirs[d].used_by <= frozenset({1, 2})
    assert not [e for e in h.effects[mark:] if isinstance(e, DeleteDir)]
    for tm in h.live_tms():
        rec = h.state.tms[tm]
        assert rec.known_aborted == frozenset({2})
        assert rec.finished_mark == 0, "the TM must not have heard checkpoint 1 complete"
    intact(h, cp1.entries)
    before = shared_streams(cp1.entries)
    # more checkpoints: the state of checkpoint 1 is still reused and still readable
    h.checkpoint(reuse=(SST,), shared=())
    cp3 = h.state.retained[-1]
    assert cp3.id == 3 and shared_streams(cp3.entries) == before
    intact(h, cp3.entries)
    for d in cp1.directories:
        assert d in h.observe().directories
    assert not [e for e in h.effects[mark:] if isinstance(e, DeleteDir)]
    assert_quiet(h)


@pytest.mark.parametrize("mode", MERGING)
def test_flink_38347_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flink's counter (DirectoryHandleWithReferenceTrack before the fix): +1 per checkpoint
    that used the directory, -1 per abort notification, stop tracking only when a
    completion notification arrives; delete recursively at count 0. With the completion of
    checkpoint 1 lost, the abort of checkpoint 2 brings it to 0: I1 breaks."""
    aborts_heard: Counter[str] = Counter()
    completes_heard: set[str] = set()
    orig_abort, orig_complete = _Work.tm_abort, _Work.tm_complete

    def counting_abort(self: _Work, tm: str, checkpoint: int, latest: int, sp: bool) -> None:
        aborts_heard[tm] += 1
        orig_abort(self, tm, checkpoint, latest, sp)

    def counting_complete(self: _Work, tm: str, checkpoint: int, mark: int, sp: bool) -> None:
        completes_heard.add(tm)
        orig_complete(self, tm, checkpoint, mark, sp)

    def counter_release(self: _Work, tm: str) -> None:
        for path, d in sorted(self.dirs.items()):
            if d.creator != tm or tm in completes_heard or path not in self.dir_owner:
                continue
            if len(d.used_by) - aborts_heard[tm] <= 0:
                self._delete_dir(path, tm_actor(tm))

    monkeypatch.setattr(_Work, "tm_abort", counting_abort)
    monkeypatch.setattr(_Work, "tm_complete", counting_complete)
    monkeypatch.setattr(_Work, "_tm_release_dirs", counter_release)
    h = Harness(merging(mode))
    with invariant_breaks("I1") as seen:
        _38347_lost_complete_then_abort(h)
    assert "chk 1: directory" in str(seen[-1])
    deleted = {e.actor for e in h.last_effects if isinstance(e, DeleteDir)}
    assert deleted == {tm_actor(h.tm_of(h.subtasks[0]))}


# ---------------------------------------------------------------------------- FLINK-35803


@pytest.mark.parametrize("rescale", [False, True], ids=["same-parallelism", "rescaled"])
@pytest.mark.parametrize("restore_mode", list(RestoreMode))
@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_35803_restored_files_are_not_reused_nor_deleted_by_tms(
    mode: MergingMode, restore_mode: RestoreMode, rescale: bool
) -> None:
    """FLINK-35803: after restoring a new job from an older job's checkpoint, the file-merging
    manager took the restored files for its own (paths matched) and reused them as if
    they were owned, so the new job could delete what it did not own.
    Prevented by R71 (restored files are never owned, reused or deleted by TMs; the first
    checkpoint re-uploads into the new job's directories) and R74 (ownership comes from the
    restore mode, never from paths). Only NONE + CLAIM with unchanged parallelism may
    reuse, and then through the coordinator's registry (R72), not as a TM's file."""
    h = Harness(merging(mode))
    h.checkpoint()
    h.checkpoint(reuse=(SST,), shared=("sst-2",))
    old_job = h.state.job
    source = retained(h, 2)
    old_paths = {sh.path for e in source.entries if (sh := stream_of(e.handle))}
    par = (("agg", 3),) if rescale else ()
    h.run(c.Restore(2, par, restore_mode))
    new_job = h.state.job
    assert new_job != old_job
    mark = len(h.effects)
    deletions_before = len(h.state.deletions)
    # no TM of the new job owns, tracks or remembers a restored file
    obs = h.observe()
    for p in old_paths:
        assert obs.owners[p] in ("user", COORDINATOR), f"{p} owned by {obs.owners[p]}"
        assert not {cl for cl in obs.claims.get(p, frozenset()) if cl.startswith("tm:")}
    assert not [k for k in h.state.pfiles if k[1] in old_paths]
    registry_reuse = mode is MergingMode.NONE and restore_mode is RestoreMode.CLAIM and not rescale
    h.run(c.Trigger())
    cp = h.last_checkpoint
    for s in h.subtasks:
        err = h.try_run(c.ReuseShared(cp, s, SST))
        if registry_reuse:
            assert err is None  # R72: reuse through the coordinator's registry
        else:
            assert isinstance(err, CommandError) and err.reason is Reason.NO_SUCH_STATE
    if registry_reuse:
        placeholders = output_entries(h, cp)
        assert len(placeholders) == len(h.subtasks)
        for e in placeholders:
            assert isinstance(e.handle, PlaceholderHandle)
            reg = h.observe().registry[e.handle.logical_id]
            assert reg.path in old_paths and h.observe().owners[reg.path] == COORDINATOR
    write_all(h, cp, ("sst-3",))
    ack_all(h, cp)
    h.run(c.Complete(cp))
    h.deliver_all()
    # what the new job wrote lives under the new job's base only
    created = [e.path for e in h.effects[mark:] if isinstance(e, CreateFile | MakeDir)]
    assert created and all(p.startswith(f"{new_job}/") for p in created)
    assert not [e for e in h.effects[mark:] if isinstance(e, AppendBytes) and e.path in old_paths]
    assert_quiet(h)
    later = h.state.deletions[deletions_before:]
    by_tms = [d for d in later if is_under(d.path, old_job) and d.actor != COORDINATOR]
    assert by_tms == [], f"TMs of {new_job} deleted restored files: {by_tms}"
    if restore_mode is RestoreMode.NO_CLAIM:
        assert not [d for d in later if is_under(d.path, old_job)]
        assert old_paths <= set(h.observe().files)


# ---------------------------------------------------------------------------- FLINK-36125


def _36125_reuse_then_subsume(h: Harness) -> tuple[str, str]:
    """Checkpoint 1 writes sst-1 and sst-2; checkpoint 2 reuses sst-1 only and completes,
    subsuming checkpoint 1: sst-2 (and cp1's operator state) are discarded while sst-1
    stays live in the same physical file. Returns (sst-1 path, sst-1 logical id) of the
    first subtask."""
    h.checkpoint(shared=(SST, "sst-2"))
    first = h.subtasks[0]
    lid = shared_streams(retained(h, 1).entries)[first]
    path = seg_of(h, lid).path
    h.checkpoint(reuse=(SST,), shared=())
    return path, lid


@pytest.mark.parametrize("mode", MERGING)
def test_flink_36125_duplicate_notifications_discard_once(mode: MergingMode) -> None:
    """FLINK-36125: a logical file could be discarded twice (a second notification or a
    second discard path), decrementing its physical file's ref count twice, so the file
    was deleted while another segment in it was still referenced.
    Prevented by R33 (discarding is idempotent) and R34 (handlers are idempotent and
    monotonic under duplicated and reordered notifications)."""
    h = Harness(merging(mode))
    h.run(c.Trigger())
    write_all(h, 1, (SST, "sst-2"))
    ack_all(h, 1)
    h.run(c.Complete(1))
    h.deliver_all()
    first = h.subtasks[0]
    tm = h.tm_of(first)
    lid = shared_streams(retained(h, 1).entries)[first]
    path = seg_of(h, lid).path
    # checkpoint 2 reuses sst-1; every completion notice is duplicated and delivered in reverse
    h.run(c.Trigger())
    reuse_all(h, 2)
    ack_all(h, 2)
    h.run(c.Complete(2))
    for i in range(len(h.state.channel)):
        h.run(c.DuplicateNotification(i))
    while h.state.channel:
        h.run(c.DeliverNotification(len(h.state.channel) - 1))
    pf = h.state.pfiles[(tm, path)]
    live = [s for s in h.state.segs.values() if s.tm == tm and s.path == path]
    assert [s.logical_id for s in live if s.subtask == first] == [lid]
    assert pf.ref_count == len(live) >= 1
    assert path in h.observe().files
    # an aborted checkpoint whose abort is duplicated: its segments are discarded once
    h.run(c.Trigger())
    write_all(h, 3, ("sst-3",))
    ack_all(h, 3)
    h.run(c.Abort(3))
    for i in range(len(h.state.channel)):
        h.run(c.DuplicateNotification(i))
    h.deliver_all()
    assert not [s for s in h.state.segs.values() if s.created_for == 3]
    assert h.state.pfiles[(tm, path)].ref_count == len(live)
    intact(h, retained(h, 2).entries)
    assert_quiet(h)


@pytest.mark.parametrize("mode", MERGING)
def test_flink_36125_second_discard_path_is_harmless(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flink's second discard path (the subsumed checkpoint's upload set discarded again,
    the way Flink walked ``uploadedStates``) is wired in; with the model's own idempotent
    discard (R33) the ref counts stay exact and sst-1 survives."""
    monkeypatch.setattr(_Work, "tm_complete", _flink_complete(_Work.tm_complete))
    h = Harness(merging(mode))
    path, lid = _36125_reuse_then_subsume(h)
    assert path in h.observe().files
    assert seg_of(h, lid).last_used == 2
    intact(h, retained(h, 2).entries)
    assert_quiet(h)


def _flink_complete(orig: TmNotice) -> TmNotice:
    """``tm_complete`` followed by a second discard of every segment of every acknowledged
    upload set of a subsumed checkpoint (last-used <= watermark), as Flink did."""

    def tm_complete(self: _Work, tm: str, checkpoint: int, watermark: int, sp: bool) -> None:
        uploaded = {k: v for k, v in self.acked.items() if k[0] == tm}
        orig(self, tm, checkpoint, watermark, sp)
        for (_t, _s, cp), entries in sorted(uploaded.items(), key=lambda kv: str(kv[0])):
            if cp > watermark:
                continue
            for e in entries:
                h = e.handle
                if isinstance(h, SegmentHandle):
                    seg = self.segs.get((tm, h.logical_id))
                    if seg is None or seg.last_used <= watermark:
                        self._discard((tm, h.logical_id))

    return tm_complete


@pytest.mark.parametrize("mode", MERGING)
def test_flink_36125_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same second discard path with Flink's non-idempotent discard (no "discarded"
    flag: a discarded logical file decrements its physical file again): the file holding
    the still-referenced sst-1 loses a reference it never gave (I4) and is deleted (I1)."""
    discarded: dict[tuple[str, str], Seg] = {}

    def discard(self: _Work, key: tuple[str, str]) -> None:
        seg = self.segs.pop(key, None) or discarded.get(key)
        if seg is None:
            return
        discarded[key] = seg
        fkey = (seg.tm, seg.path)
        pf = self.pfiles.get(fkey)
        if pf is None:
            return
        self.pfiles[fkey] = evolve(
            pf, ref_count=pf.ref_count - 1, live_bytes=pf.live_bytes - seg.length
        )
        self._check_file(seg.tm, seg.path)

    monkeypatch.setattr(_Work, "tm_complete", _flink_complete(_Work.tm_complete))
    monkeypatch.setattr(_Work, "_discard", discard)
    h = Harness(merging(mode))
    with invariant_breaks("I1", "I4"):
        _36125_reuse_then_subsume(h)


# ---------------------------------------------------------------------------- FLINK-35570


def _35570_reuse_then_subsume(h: Harness) -> dict[SubtaskId, str]:
    """Checkpoint 1 uploads sst-1; checkpoint 2 only reuses it and completes, subsuming
    checkpoint 1 (num_retained = 1). Returns subtask -> logical id of sst-1."""
    h.checkpoint()
    lids = shared_streams(retained(h, 1).entries)
    h.checkpoint(reuse=(SST,), shared=())
    return lids


@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_35570_placeholder_reuse_advances_last_used(mode: MergingMode) -> None:
    """FLINK-35570: reuse of a merged file through a placeholder handle did not advance the
    logical file's last-used checkpoint, so subsuming the checkpoint that created it
    discarded state the newer checkpoint still used.
    Prevented by R21 (reuse sets last_used = max(last_used, c), through placeholders too)
    and, without merging, R22/R54 (the registry entry's references include the reusing
    checkpoint)."""
    h = Harness(merging(mode, max_file_size=100))
    lids = _35570_reuse_then_subsume(h)
    cp2 = retained(h, 2)
    assert [r.id for r in h.state.retained] == [2]
    assert shared_streams(cp2.entries) == lids  # the same state, not a re-upload
    obs = h.observe()
    for lid in lids.values():
        assert obs.registry[lid].refs == frozenset({2})
        if mode is MergingMode.NONE:
            assert obs.registry[lid].owned
        else:
            seg = seg_of(h, lid)
            assert (seg.created_for, seg.last_used) == (1, 2)
    paths = {s.path for s in handles(cp2.entries)}
    assert paths and not paths & deleted_paths(h.effects)
    intact(h, cp2.entries)
    h.checkpoint(reuse=(SST,), shared=())
    if mode is not MergingMode.NONE:
        assert {seg_of(h, lid).last_used for lid in lids.values()} == {3}
    assert_quiet(h)


@pytest.mark.parametrize("mode", MERGING)
def test_flink_35570_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reuse that leaves last_used where it was (Flink's placeholder path): subsuming
    checkpoint 1 discards sst-1, its file is deleted, checkpoint 2 dangles (I1)."""
    monkeypatch.setattr(_Work, "reuse_shared", no_last_used_advance(_Work.reuse_shared))
    h = Harness(merging(mode, max_file_size=100))
    with invariant_breaks("I1") as seen:
        _35570_reuse_then_subsume(h)
    assert "chk 2: sst-1 -> missing file" in str(seen[-1])


# ---------------------------------------------------------------------------- FLINK-35784


@pytest.mark.parametrize("mode", MERGING)
def test_flink_35784_directories_are_registered_and_deleted(mode: MergingMode) -> None:
    """FLINK-35784: the directory handles of file merging were never registered with the
    shared-state registry, so the coordinator never deleted the managed directories.
    Prevented by R40 (every acknowledgement reports the managed directories), R42 (a
    completed checkpoint hands them to the coordinator, registered, and the coordinator
    deletes them recursively once no retained checkpoint refers to them) and R91."""
    h = Harness(merging(mode))
    h.checkpoint()
    cp1 = retained(h, 1)
    expected = {shared_dir(h.state.job, s) for s in h.subtasks} | {
        taskowned_dir(h.state.job, t) for t in h.live_tms()
    }
    assert set(cp1.directories) == expected
    obs = h.observe()
    for d in expected:
        assert obs.registry[f"dir:{d}"].refs == frozenset({1})
        assert obs.registry[f"dir:{d}"].owned
        assert obs.directories[d] == COORDINATOR
    h.checkpoint()
    assert {h.observe().registry[f"dir:{d}"].refs for d in expected} == {frozenset({2})}
    # a lost TM's exclusive directory is abandoned; once unreferenced, the coordinator
    # deletes it
    lost = h.tm_of(h.subtasks[-1])
    gone = taskowned_dir(h.state.job, lost)
    h.run(c.CrashTm(lost))
    h.run(c.Failover())
    assert_quiet(h)
    assert DeleteDir(gone, COORDINATOR) in h.effects
    obs = h.observe()
    assert gone not in obs.directories and f"dir:{gone}" not in obs.registry
    assert not [p for p in obs.files if is_under(p, gone)]
    # cancelling the job deletes every registered directory
    registered = [k[4:] for k in obs.registry if k.startswith("dir:")]
    assert registered
    h.run(c.Cancel(retain=False))
    for d in registered:
        assert DeleteDir(d, COORDINATOR) in h.effects
    obs = h.observe()
    assert obs.directories == {} and obs.files == {} and obs.registry == {}


@pytest.mark.parametrize("mode", MERGING)
def test_flink_35784_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completion that registers only the file handles, not the directory handles: the
    registry no longer matches the retained checkpoints (I4), and the directories would
    never be deleted."""
    orig = _Work._register

    def register_files_only(self: _Work, done: Completed) -> None:
        orig(self, evolve(done, directories=()))

    monkeypatch.setattr(_Work, "_register", register_files_only)
    h = Harness(merging(mode))
    with invariant_breaks("I4") as seen:
        h.checkpoint()
    assert "registry dir:" in str(seen[-1])


# ---------------------------------------------------------------------------- FLINK-32086


@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_32086_job_ending_before_any_checkpoint_leaves_nothing(mode: MergingMode) -> None:
    """FLINK-32086: managed directories that no checkpoint ever used were not cleaned when
    the job ended. Prevented by R90 (a job that ends before its first completed checkpoint
    leaves nothing: each TM deletes the directories it created that no completed
    checkpoint used)."""
    h = Harness(merging(mode))
    h.run(c.Trigger())
    write_all(h, 1)
    first = h.subtasks[0]
    h.run(c.Acknowledge(1, first))  # one ack: the checkpoint never completes
    made = [e for e in h.effects if isinstance(e, MakeDir)]
    if mode is not MergingMode.NONE:
        assert {e.path for e in made} >= {shared_dir(h.state.job, s) for s in h.subtasks}
    h.run(c.Cancel(retain=False))
    for e in made:
        assert DeleteDir(e.path, e.actor) in h.effects, f"{e.path} not deleted by its creator"
    obs = h.observe()
    assert obs.files == {} and obs.directories == {}
    assert_quiet(h)


def test_flink_32086_directory_of_aborted_checkpoints_is_deleted_by_its_tm() -> None:
    """FLINK-32086, while the job runs: a directory reported only by checkpoints the TM knows
    aborted, with nothing left in it, is deleted by the TM that made it (R41)."""
    h = Harness(merging(MergingMode.WITHIN_CHECKPOINT))
    h.run(c.Trigger())
    write_all(h, 1)
    ack_all(h, 1)
    made = [e for e in h.effects if isinstance(e, MakeDir)]
    assert made
    h.run(c.Abort(1))
    h.deliver_all()
    for e in made:
        assert DeleteDir(e.path, e.actor) in h.effects
    obs = h.observe()
    assert obs.directories == {} and obs.files == {}
    h.checkpoint()  # the directories come back at the next write
    assert {e.path for e in made} <= set(h.observe().directories)
    assert_quiet(h)


# ---------------------------------------------------------------------------- FLINK-35400


def _35400_failover_with_open_pools(h: Harness) -> tuple[int, set[str]]:
    """Checkpoint 1 completes; checkpoint 2 writes sst-2 into open pooled files, half of the
    subtasks acknowledge; then a failover with every TM surviving. Returns the effect-log
    mark after the failover and the files that existed before it."""
    h.checkpoint()
    h.run(c.Trigger())
    write_all(h, 2, ("sst-2",))
    for s in h.subtasks[::2]:
        h.run(c.Acknowledge(2, s))
    before = set(h.observe().files)
    h.run(c.Failover())
    return len(h.effects), before


@pytest.mark.parametrize("mode", MERGING)
def test_flink_35400_failover_rebuilds_the_manager(mode: MergingMode) -> None:
    """FLINK-35400: the file-merging manager lived as long as the job on a TM, so a failover
    that kept the TM reused the old attempt's manager, with its pools and segments.
    Prevented by R60 (surviving TMs drop all in-memory state of the old attempt) and R61
    (they rebuild it from the retained checkpoints only)."""
    h = Harness(merging(mode))
    tms = set(h.live_tms())
    mark, before = _35400_failover_with_open_pools(h)
    assert set(h.live_tms()) == tms, "every TM survived"
    assert dict(h.state.pools) == {}, "no pool of the old attempt survives"
    assert not h.observe().open_files, "every file of the old attempt is closed"
    assert not h.state.outputs and not h.state.acked
    cp1 = retained(h, 1)
    kept = {sh.logical_id for e in cp1.entries if (sh := stream_of(e.handle))}
    assert {lid for (_t, lid) in h.state.segs} == kept, "only segments of checkpoint 1 remain"
    for seg in h.state.segs.values():
        assert seg.created_for <= 1 and seg.confirmed
    for (tm, path), pf in h.state.pfiles.items():
        live = [s for s in h.state.segs.values() if s.tm == tm and s.path == path]
        assert pf.ref_count == len(live) and not pf.open
    h.deliver_all()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    for s in h.subtasks:
        err = h.try_run(c.ReuseShared(cp, s, "sst-2"))
        assert isinstance(err, CommandError) and err.reason is Reason.NO_SUCH_STATE
    reuse_all(h, cp)  # checkpoint 1's state is restored, owned and reusable (R61)
    write_all(h, cp, ("sst-3",))
    ack_all(h, cp)
    h.run(c.Complete(cp))
    h.deliver_all()
    new = h.effects[mark:]
    appended = {e.path for e in new if isinstance(e, AppendBytes)}
    assert appended and not appended & before, "an old attempt's file was written again"
    assert shared_streams(retained(h, cp).entries) == shared_streams(cp1.entries)
    assert_quiet(h)


def test_flink_35400_buggy_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failover that keeps the surviving TMs' managers (pools, segments, acknowledged
    outputs), in ACROSS mode where the old attempt's pooled files hold segments of both
    checkpoints: the stale segments of checkpoint 2 sit in files whose ref counts were
    rebuilt from checkpoint 1 alone (I4), at the failover itself."""
    orig_failover, orig_forget = _Work.failover, _Work._forget_tm
    in_failover: list[bool] = []

    def failover(self: _Work) -> None:
        in_failover.append(True)
        try:
            orig_failover(self)
        finally:
            in_failover.pop()

    def forget(self: _Work, tm: str) -> None:
        if not in_failover:
            orig_forget(self, tm)

    monkeypatch.setattr(_Work, "failover", failover)
    monkeypatch.setattr(_Work, "_forget_tm", forget)
    h = Harness(merging(MergingMode.ACROSS_CHECKPOINT))
    with invariant_breaks("I4"):
        _35400_failover_with_open_pools(h)
    assert isinstance(h.history[-1], c.Failover)


# ---------------------------------------------------------------------------- FLINK-25395


@pytest.mark.parametrize("fate", ["aborted", "complete-unheard"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_25395_unconfirmed_state_is_uploaded_again(mode: MergingMode, fate: str) -> None:
    """FLINK-25395: the backend reused shared files of a checkpoint that had not been
    confirmed; that checkpoint was then aborted, its files were discarded, and the later
    checkpoint that reused them lost its data.
    Prevented by R20 (reuse only from a checkpoint the TM knows completed; otherwise the
    state is uploaded again as a new segment or file)."""
    h = Harness(merging(mode, max_file_size=100))
    h.run(c.Trigger())
    write_all(h, 1)
    ack_all(h, 1)
    if fate == "complete-unheard":
        h.run(c.Complete(1))
        drop_all(h)
    first_lids = {
        e.subtask: sh.logical_id
        for (_t, _s, cp), es in h.state.acked.items()
        if cp == 1
        for e in es
        if e.name == SST and (sh := stream_of(e.handle)) is not None
    }
    assert len(first_lids) == len(h.subtasks)
    h.run(c.Trigger())
    mark = len(h.effects)
    reuse_all(h, 2)
    # not reused: uploaded again, a new logical id in a new stream
    reused: dict[SubtaskId, str] = {}
    for e in output_entries(h, 2):
        assert isinstance(e.handle, SegmentHandle | FileHandle), e.handle
        if e.name == SST:
            reused[e.subtask] = e.handle.logical_id
    assert len(reused) == len(h.subtasks)
    assert not set(reused.values()) & set(first_lids.values())
    assert any(isinstance(e, CreateFile | AppendBytes) for e in h.effects[mark:])
    if fate == "aborted":
        h.run(c.Abort(1))
        h.deliver_all()
        assert not {lid for (_t, lid) in h.state.segs} & set(first_lids.values())
    for s in h.subtasks:
        h.run(c.WriteState(2, s, StateKind.OPERATOR_LIST, "offsets", 26, entries=2))
    ack_all(h, 2)
    h.run(c.Complete(2))
    h.deliver_all()
    cp2 = retained(h, 2)
    assert shared_streams(cp2.entries) == reused
    intact(h, cp2.entries)
    assert_quiet(h)


@pytest.mark.parametrize("mode", MERGING)
def test_flink_25395_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flink before both fixes: reuse of unconfirmed state (FLINK-25395) by a reuse that
    does not advance last-used (FLINK-35570). Aborting checkpoint 1 discards the segments
    checkpoint 2 reused: checkpoint 2 completes with dangling handles (I1).
    (Broken R20 alone is masked in this model by R21 in merging modes, and by R22 without
    merging, which aborts a checkpoint whose placeholder does not resolve.)"""
    orig_reusable = _Work._reusable

    def reusable_unconfirmed(self: _Work, tm: str, ref: BackendRef) -> bool:
        return orig_reusable(self, tm, evolve(ref, confirmed=True))

    monkeypatch.setattr(_Work, "_reusable", reusable_unconfirmed)
    monkeypatch.setattr(_Work, "reuse_shared", no_last_used_advance(_Work.reuse_shared))
    h = Harness(merging(mode, max_file_size=100))
    h.run(c.Trigger())
    write_all(h, 1)
    ack_all(h, 1)
    h.run(c.Trigger())
    reuse_all(h, 2)
    h.run(c.Abort(1))
    h.deliver_all()
    for s in h.subtasks:
        h.run(c.WriteState(2, s, StateKind.OPERATOR_LIST, "offsets", 26, entries=2))
    ack_all(h, 2)
    with invariant_breaks("I1") as seen:
        h.run(c.Complete(2))
    assert "chk 2: sst-1 -> missing file" in str(seen[-1])


# ---------------------------------------------------------------------------- FLINK-26985


def _26985_claim_restore(h: Harness, *, reuse: bool) -> tuple[Completed, int]:
    """Two checkpoints, then a CLAIM restore from the second with unchanged parallelism,
    then an aborted checkpoint of the new job; the next one is acknowledged but not yet
    completed. Returns the restored checkpoint and the pending checkpoint id."""
    h.checkpoint()
    h.checkpoint(reuse=(SST,), shared=("sst-2",))
    source = retained(h, 2)
    h.run(c.Restore(2, (), RestoreMode.CLAIM))
    h.run(c.Trigger())
    write_all(h, h.last_checkpoint, ("sst-3",))
    h.run(c.Abort(h.last_checkpoint))
    h.deliver_all()
    h.run(c.Trigger())
    cp = h.last_checkpoint
    if reuse:
        reuse_all(h, cp)
    write_all(h, cp, ("sst-3",))
    ack_all(h, cp)
    return source, cp


@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_26985_claimed_checkpoint_lives_until_subsumed(mode: MergingMode) -> None:
    """FLINK-26985: restoring a job discarded the restored checkpoint's shared state while
    the restored checkpoint (and the new job) still needed it.
    Prevented by R72 (CLAIM: the new job's coordinator owns the restored checkpoint,
    registers its shared files, retains it until subsumed, and only then deletes it)."""
    h = Harness(merging(mode))
    source, cp = _26985_claim_restore(h, reuse=False)
    shared = {
        sh.path
        for e in source.entries
        if (sh := stream_of(e.handle)) is not None and sh.scope is Scope.SHARED
    }
    assert shared
    obs = h.observe()
    assert [r.id for r in h.state.retained] == [2]
    for p in shared:
        assert p in obs.files and obs.owners[p] == COORDINATOR
    for lid in shared_streams(source.entries).values():
        assert obs.registry[lid].refs == frozenset({2})
    assert not shared & deleted_paths(h.effects)
    intact(h, source.entries)
    mark = len(h.effects)
    h.run(c.Complete(cp))
    h.deliver_all()
    obs = h.observe()
    assert [r.id for r in h.state.retained] == [cp]
    assert not shared & set(obs.files), "the subsumed claimed checkpoint must be deleted"
    assert not [k for k in obs.registry if k in shared_streams(source.entries).values()]
    gone = [e for e in h.effects[mark:] if isinstance(e, DeleteFile | DeleteDir)]
    assert gone and {e.actor for e in gone} == {COORDINATOR}
    for d in source.directories:
        assert DeleteDir(d, COORDINATOR) in gone
    assert source.metadata not in obs.files
    assert_quiet(h)


def test_flink_26985_claimed_shared_state_reused_by_the_new_job() -> None:
    """FLINK-26985 without merging: the new job's first checkpoint reuses the claimed
    shared files through the registry (R72); subsuming the restored checkpoint must keep
    them (R54: the new checkpoint refers to them) and they go once nothing refers to them."""
    h = Harness(merging(MergingMode.NONE))
    source, cp = _26985_claim_restore(h, reuse=True)
    reused = {s.path for s in handles(source.entries)}
    h.run(c.Complete(cp))
    h.deliver_all()
    obs = h.observe()
    assert reused <= set(obs.files)
    for lid in shared_streams(source.entries).values():
        assert obs.registry[lid].refs == frozenset({cp})
    assert not reused & deleted_paths(h.effects)
    intact(h, retained(h, cp).entries)
    h.checkpoint()  # no reuse: the claimed files lose their last reference
    assert not reused & set(h.observe().files)
    assert {e.actor for e in h.effects if isinstance(e, DeleteFile) and e.path in reused} == {
        COORDINATOR
    }
    assert_quiet(h)


def test_flink_26985_buggy_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subsuming the restored checkpoint discards all its shared state, as if the restored
    checkpoint alone referred to it: the new checkpoint that reused it dangles (I1)."""
    orig = _Work._subsume

    def subsume(self: _Work, old: Completed) -> None:
        orig(self, old)
        if old.job != self.job:
            for e in old.entries:
                s = stream_of(e.handle)
                if s is not None and s.scope is Scope.SHARED and s.path in self.files:
                    self._delete_file(s.path, COORDINATOR)

    monkeypatch.setattr(_Work, "_subsume", subsume)
    h = Harness(merging(MergingMode.NONE))
    _source, cp = _26985_claim_restore(h, reuse=True)
    with invariant_breaks("I1"):
        h.run(c.Complete(cp))


# ---------------------------------------------------------------------------- FLINK-29913

LOCAL_NAME = "000001.sst"
JOBS_29913 = {
    "two-subtasks": JobSpec((VertexSpec("op", 2),), num_tms=2),
    "concurrent": JobSpec((VertexSpec("op", 1),), num_tms=1),
}


def _29913_same_local_name(h: Harness, variant: str) -> dict[int, dict[SubtaskId, str]]:
    """``two-subtasks``: both subtasks of "op" upload "000001.sst" in checkpoint 1, which
    completes. ``concurrent``: the one subtask uploads "000001.sst" in checkpoints 1 and 2,
    both pending at once (so not reusable: unconfirmed), which complete in order.
    Returns checkpoint -> subtask -> logical id of "000001.sst", for each completion."""
    seen: dict[int, dict[SubtaskId, str]] = {}
    if variant == "two-subtasks":
        cp = h.checkpoint(shared=(LOCAL_NAME,))
        seen[cp] = shared_streams(retained(h, cp).entries, LOCAL_NAME)
        return seen
    h.run(c.Trigger())
    h.run(c.Trigger())
    for cp in (1, 2):
        write_all(h, cp, (LOCAL_NAME,))
        ack_all(h, cp)
    for cp in (1, 2):
        h.run(c.Complete(cp))
        seen[cp] = shared_streams(retained(h, cp).entries, LOCAL_NAME)
    h.deliver_all()
    return seen


@pytest.mark.parametrize("variant", list(JOBS_29913))
@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_29913_registry_keys_are_unique_handle_ids(mode: MergingMode, variant: str) -> None:
    """FLINK-29913: the shared-state registry was keyed by local file names; two different
    uploads named "000001.sst" (two subtasks, or one subtask in two concurrent checkpoints)
    collided, and one was taken for a duplicate and discarded while still referenced.
    Prevented by R54 (keys are unique handle ids, never local names; a conflicting
    registration is an error) and R2 (ids and paths are never reused)."""
    h = Harness(merging(mode), JOBS_29913[variant])
    seen = _29913_same_local_name(h, variant)
    all_lids = [lid for by_subtask in seen.values() for lid in by_subtask.values()]
    assert len(all_lids) == 2 and len(set(all_lids)) == 2, seen
    latest = h.state.retained[-1]
    streams = handles(latest.entries, LOCAL_NAME)
    obs = h.observe()
    assert LOCAL_NAME not in obs.registry
    for s in streams:
        assert obs.registry[s.logical_id].path == s.path
        assert obs.registry[s.logical_id].refs == frozenset({latest.id})
        assert s.path in obs.files
    if variant == "two-subtasks":
        assert len(streams) == 2 and streams[0].path != streams[1].path
    else:  # checkpoint 1 was subsumed: its upload goes, checkpoint 2's stays
        assert [r.id for r in h.state.retained] == [2]
        assert seen[1] != seen[2] and set(seen[1].values()).isdisjoint(obs.registry)
    intact(h, latest.entries)
    # what the latest checkpoint uploaded survives another checkpoint that reuses it
    lids = shared_streams(latest.entries, LOCAL_NAME)
    h.checkpoint(reuse=(LOCAL_NAME,), shared=())
    assert shared_streams(h.state.retained[-1].entries, LOCAL_NAME) == lids
    intact(h, h.state.retained[-1].entries)
    assert not {s.path for s in streams} & deleted_paths(h.effects)
    assert_quiet(h)


@pytest.mark.parametrize("variant", list(JOBS_29913))
def test_flink_29913_buggy_rule_is_caught(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry keyed by the local file name that, like Flink, takes a second handle under
    a known key for a duplicate upload and discards it. Two subtasks: checkpoint 1 refers
    to the discarded file (I1). Concurrent checkpoints: the name-keyed entry already fails
    I4 at checkpoint 1's completion (registry keys must be the unique handle ids), before
    checkpoint 2's upload would be discarded."""

    def register_by_name(self: _Work, done: Completed) -> None:
        for e in done.entries:
            h = e.handle
            if not isinstance(h, SegmentHandle | FileHandle) or h.scope is not Scope.SHARED:
                continue
            reg = self.registry.get(e.name)
            if reg is not None and reg.path != h.path:
                if h.path in self.files and self.files[h.path].owner == COORDINATOR:
                    self._delete_file(h.path, COORDINATOR)  # "a duplicate": discarded
                self.registry[e.name] = evolve(reg, refs=reg.refs | {done.id})
                continue
            refs = (reg.refs if reg else frozenset()) | {done.id}
            self.registry[e.name] = RegEntry(e.name, h.path, h, refs, True)

    monkeypatch.setattr(_Work, "_register", register_by_name)
    h = Harness(merging(MergingMode.NONE), JOBS_29913[variant])
    with invariant_breaks("I1", "I4") as seen:
        _29913_same_local_name(h, variant)
    assert h.history[-1] == c.Complete(1)
    if variant == "two-subtasks":
        assert f"I1: chk 1: {LOCAL_NAME} -> missing file" in str(seen[-1])
    assert f"I4: registry {LOCAL_NAME}: refs [1] != []" in str(seen[-1])


# ---------------------------------------------------------------------------- FLINK-35778

ODD_VERTICES = (
    VertexSpec("Source: Kafka[topic=a/b]", 2),
    VertexSpec("a/b", 1),
    VertexSpec("a:b", 1),
    VertexSpec("a-b", 1),
    VertexSpec("a_2Fb", 1),
    VertexSpec("..", 1),
    VertexSpec(".hidden", 1),
    VertexSpec("Window (5 s) → Sink ü", 1),
)
ODD_TMS = ("10.0.0.1:6122-7a3f", "10.0.0.1/6122-7a3f", "10.0.0.1-6122-7a3f", "tm?x=1&y=[2]")
ODD_JOB = "job/0 #1"
SAFE_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")


def _odd_state(mode: MergingMode) -> ModelState:
    """A running job whose job id, vertex names and TM ids carry special characters."""
    job = JobSpec(ODD_VERTICES, num_tms=len(ODD_TMS))
    s = initial_state(merging(mode), job, job_id=ODD_JOB)
    return evolve(
        s,
        placement=place(subtasks_of(job.vertices), list(ODD_TMS)),
        tms={t: TmRec(t, TmStatus.ALIVE) for t in ODD_TMS},
    )


def _35778_run(h: Harness) -> None:
    h.checkpoint()
    h.checkpoint(reuse=(SST,), shared=("sst-2",))
    h.run(c.Failover())
    h.deliver_all()
    h.checkpoint(reuse=(SST,), shared=())


def _paths(effects: Iterable[Effect]) -> set[str]:
    out: set[str] = set()
    for e in effects:
        if not isinstance(e, CallFailed):
            out.add(e.path)
    return out


@pytest.mark.parametrize("mode", ALL_MODES)
def test_flink_35778_special_characters_never_reach_paths(mode: MergingMode) -> None:
    """FLINK-35778: TM resource ids (and other ids) with special characters broke the
    file-merging directory paths; Flink's fix replaces reserved URI characters with "-",
    which can map two ids to one directory. Prevented by R3 (every id that reaches a path
    is escaped to [A-Za-z0-9._-], injectively: ``spec.ids.escape_name``)."""
    h = Harness(state=_odd_state(mode))
    _35778_run(h)
    paths = _paths(h.effects)
    assert paths
    for p in paths:
        for part in p.split("/"):
            assert SAFE_COMPONENT.fullmatch(part), f"{part!r} in {p}"
            assert part not in (".", "..") and not part.startswith("."), p
    # injective: different names, different directories; and the names come back
    subtasks = h.subtasks
    dirs = {shared_dir(ODD_JOB, s) for s in subtasks}
    assert len(dirs) == len(subtasks)
    owned = {taskowned_dir(ODD_JOB, t) for t in ODD_TMS}
    assert len(owned) == len(ODD_TMS)
    for name in [ODD_JOB, *ODD_TMS, *(v.name for v in ODD_VERTICES)]:
        assert unescape_name(escape_name(name)) == name
    created = {e.path for e in h.effects if isinstance(e, CreateFile)}
    shared_parents = {p.rsplit("/", 1)[0] for p in created if "/shared/" in p}
    assert shared_parents == dirs, "every subtask writes into its own directory"
    for d in dirs:
        vertex, index, par = d.rsplit("/", 1)[1].rsplit("-", 2)
        assert SubtaskId(unescape_name(vertex), int(index), int(par)) in subtasks
    if mode is not MergingMode.NONE:
        made = {e.path for e in h.effects if isinstance(e, MakeDir)}
        assert dirs <= made and owned <= made
    assert_quiet(h)


def _flink_uri_escape(name: str) -> str:
    """Flink's fix for FLINK-35778: reserved URI characters become "-" (not injective)."""
    return re.sub(r"[;/?:@&=+$,\[\]]", "-", name) or "-"


@pytest.mark.parametrize("mode", MERGING)
def test_flink_35778_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a non-injective escape, "a/b" and "a:b" (and two TM ids) share one directory; at
    failover each restarting TM takes the other's files in that directory as its own
    (I3) or cleans them up as garbage while a retained checkpoint uses them (I1)."""
    monkeypatch.setattr(spec_ids, "escape_name", _flink_uri_escape)
    monkeypatch.setattr(spec_layout, "escape_name", _flink_uri_escape)
    h = Harness(state=_odd_state(mode))
    collide = {shared_dir(ODD_JOB, SubtaskId(v, 0, 1)) for v in ("a/b", "a:b")}
    assert len(collide) == 1
    with invariant_breaks("I1", "I3"):
        _35778_run(h)
    assert isinstance(h.history[-1], c.Failover)
