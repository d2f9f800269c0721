"""Whole files an acknowledgement hands to the coordinator (R43) that a checkpoint still
needs, on local files and memory.

The acknowledgement comes from the subtask's current attempt (``receive_ack``, as a TM in
another process sends it). A TM that lost its registry's knowledge may send an unchanged
file whole again; a message may arrive twice; a hostile or buggy TM can send anything. The
end of a pending checkpoint must not take a file another checkpoint needs with it (I1,
I5). Three ways it could, each checked here:

- an acknowledgement of a pending checkpoint naming as its own whole file a file of the
  retained checkpoint, its ``_metadata``, or a file of the checkpoint a NO_CLAIM restore
  started from (the user's, R73, while the restore runs and after) aborts its checkpoint
  and hands nothing over: taken over, the file would be deleted by that abort;
- the acknowledgement that completed a checkpoint, received again, is not a late one
  whose whole files are deleted (R43): they are the completed checkpoint's own;
- a whole file two pending checkpoints received (sent whole to both) stays through the
  abort of the older one (R53) when the newer one completed with it, and through a
  restart (R95).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs
import pytest

from conformance.fastimpl_commands import apply
from fastimpl import CheckpointStore, CompletionFailed, testing
from fastimpl.records import ManagedDir
from spec.commands import (
    Acknowledge,
    AttemptStopped,
    CollectWorking,
    Complete,
    DropWorking,
    ReplaceTm,
    SnapshotWorking,
    Trigger,
    WriteState,
    WriteWorking,
)
from spec.config import Config, MergingMode, RestoreMode, Scope, StateKind
from spec.effects import COORDINATOR, USER, tm_actor
from spec.errors import CommandError
from spec.handles import DirectoryHandle, FileHandle, InPlaceFile, SegmentHandle, StateEntry
from spec.ids import SubtaskId, TmId
from spec.invariants import check_safety
from spec.layout import taskowned_dir, working_dir
from spec.messages import Acknowledgement
from tests.faultyfs import Place, payload
from tests.storage_settings import JOB, KS, OP, _checkpoint
from tests.working_jobs import working_checkpoint, working_engine

KINDS = ("local", "memory")
NAMED = ("retained-file", "retained-metadata", "restored-file", "users-file")


def _ack_naming(place: Place, named: str) -> tuple[CheckpointStore, str, int]:
    """NONE mode (whole files): checkpoint 1 retained (or restored from in NO_CLAIM
    mode); a later checkpoint triggered, and an acknowledgement that names the ``named``
    file as its own sent for it. The store, that file's path and the checkpoint."""
    store, _ = place.store(Config.for_mode(MergingMode.NONE, num_retained=1), JOB)
    cid = _checkpoint(store)
    assert cid is not None
    co = store._engine.coord
    if named in ("restored-file", "users-file"):
        store.coordinator.restore(cid, mode=RestoreMode.NO_CLAIM)
        entry = next(e for e in co.restoring if isinstance(e.handle, FileHandle))
        if named == "users-file":  # no checkpoint uses it once the new job completed one
            assert _checkpoint(store) is not None
            assert not co.restoring
    else:
        (done,) = co.retained
        entry = next(e for e in done.entries if isinstance(e.handle, FileHandle))
        if named == "retained-metadata":
            size = co.catalog.files[done.metadata].size
            meta = FileHandle(done.metadata, size, "whole-metadata", Scope.EXCLUSIVE)
            entry = StateEntry(entry.subtask, StateKind.OPERATOR_LIST, "meta", meta)
    assert isinstance(entry.handle, FileHandle)
    pending = store.coordinator.trigger()
    attempt = store.placement()[entry.subtask]
    co.receive_ack(Acknowledgement(co.job, pending, entry.subtask, attempt, (entry,)))
    return store, entry.handle.path, pending


def _still_there(store: CheckpointStore, path: str) -> None:
    store.flush()
    obs = testing.observe(store)
    assert path in obs.files, f"{path}: deleted though a checkpoint needs it"
    assert [d for d in obs.deletions if d.path == path] == []
    assert [v for v in testing.check_invariants(store) if v.invariant in ("I1", "I5")] == []
    views = store.coordinator.retained()
    entries = [e for v in views for e in v.entries] or list(store._engine.coord.restoring)
    assert entries and all(store.read(e) for e in entries)  # every byte still reads


@pytest.mark.parametrize("named", NAMED)
@pytest.mark.parametrize("kind", KINDS)
def test_r43_an_acknowledgement_naming_a_needed_file_aborts_its_checkpoint_and_takes_nothing(
    tmp_path: Path, kind: str, named: str
) -> None:
    place = Place.make(kind, tmp_path)
    store, path, pending = _ack_naming(place, named)
    try:
        co = store._engine.coord
        assert pending not in co.pending, "the acknowledgement was taken"
        owner = co.catalog.files[path].owner
        assert owner == (USER if named in ("restored-file", "users-file") else COORDINATOR)
        _still_there(store, path)
        assert _checkpoint(store) is not None  # the job checkpoints on
    finally:
        store.close()
        place.cleanup()


def _sent_whole_three_times(place: Place) -> tuple[CheckpointStore, int, int]:
    """NONE mode: every subtask writes and acknowledges checkpoint ``first``, then
    acknowledges the next two with the same whole files; the middle one completes, so
    ``first`` is aborted (R53) and ``last`` stays pending. The store, ``first``, ``last``."""
    store, _ = place.store(Config.for_mode(MergingMode.NONE, num_retained=1), JOB)
    coord = store.coordinator
    first = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        mgr.write(first, sub, KS, "sst", payload(sub, "sst"))
        mgr.acknowledge(first, sub)
    co = store._engine.coord
    acks = dict(co.pending[first].acks)
    middle, last = coord.trigger(), coord.trigger()
    for cid in (middle, last):
        for sub, tm in sorted(store.placement().items()):
            co.receive_ack(Acknowledgement(co.job, cid, sub, tm, acks[sub]))
    assert coord.complete(middle) is not None
    store.deliver_notifications()
    return store, first, last


def _all_files_kept(store: CheckpointStore) -> None:
    (done,) = store._engine.coord.retained
    for e in done.entries:
        assert isinstance(e.handle, FileHandle)
        _still_there(store, e.handle.path)


@pytest.mark.parametrize("then", ("abort", "restart"))
@pytest.mark.parametrize("kind", KINDS)
def test_r53_r95_an_abort_or_restart_keeps_the_files_a_completed_checkpoint_shares(
    tmp_path: Path, kind: str, then: str
) -> None:
    """The older checkpoint's abort (R53, at the completion) keeps the shared whole
    files; then the pending one's abort (R43), or a coordinator restart (R95), keeps
    them too, and the job checkpoints on."""
    place = Place.make(kind, tmp_path)
    store, first, last = _sent_whole_three_times(place)
    try:
        assert first not in store._engine.coord.pending  # R53 aborted it
        assert last in store._engine.coord.pending
        _all_files_kept(store)
        if then == "abort":
            store.coordinator.abort(last)
        else:
            store.coordinator.restart()
        _all_files_kept(store)
        assert _checkpoint(store) is not None
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r43_a_repeated_acknowledgement_keeps_the_files_its_completed_checkpoint_uses(
    tmp_path: Path, kind: str
) -> None:
    """The acknowledgement that completed checkpoint 1, received once more (a retried
    message) after the completion: a late acknowledgement's whole files are deleted
    (R43), but these are the retained checkpoint's own."""
    place, store = _none_store(tmp_path, kind)
    try:
        cid = _checkpoint(store)
        assert cid is not None
        co = store._engine.coord
        (done,) = co.retained
        entry = next(e for e in done.entries if isinstance(e.handle, FileHandle))
        assert isinstance(entry.handle, FileHandle)
        again = [e for e in done.entries if e.subtask == entry.subtask]
        attempt = store.placement()[entry.subtask]
        co.receive_ack(Acknowledgement(co.job, cid, entry.subtask, attempt, tuple(again)))
        _still_there(store, entry.handle.path)
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r66_a_replaced_attempts_withdrawn_files_stay_while_a_completed_checkpoint_uses_them(
    tmp_path: Path, kind: str
) -> None:
    """R66: replacing a TM withdraws its acknowledgements of pending checkpoints with the
    whole files they handed over, deleted once the attempt stopped (R64); these are also
    the completed checkpoint's."""
    place = Place.make(kind, tmp_path)
    store, _, last = _sent_whole_three_times(place)
    try:
        co = store._engine.coord
        tm = sorted(set(store.placement().values()))[0]
        co.replace(tm)
        assert not any(co.placement.get(s) == tm for s in co.pending[last].acks)
        _all_files_kept(store)
        co.attempt_stopped(tm)
        _all_files_kept(store)
    finally:
        store.close()
        place.cleanup()


def _scoped(entries: Iterable[StateEntry], scope: Scope) -> list[StateEntry]:
    return [
        e
        for e in entries
        if isinstance(e.handle, FileHandle | SegmentHandle) and e.handle.scope is scope
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_r66_a_withdrawn_placeholder_pins_nothing_and_its_acknowledgement_is_gone(
    tmp_path: Path, kind: str
) -> None:
    """Checkpoints 2 and 3 pending; a subtask acknowledged only 3, reusing checkpoint
    1's shared file (a placeholder pinning it, R22), and its TM is replaced (R66): the
    acknowledgement is withdrawn with its pin. Checkpoint 2 then completes without that
    file and subsumes checkpoint 1: the file goes at once (nothing pins it), and 3 waits
    for the new attempt's acknowledgement."""
    place, store = _none_store(tmp_path, kind)
    try:
        coord = store.coordinator
        c1, sub, first = _first_sst(store)
        old = first.path
        c2, c3 = coord.trigger(), coord.trigger()
        tm = store.placement()[sub]
        mgr = store.task_manager(tm)
        mgr.write(c3, sub, KS, "new", payload(sub, "new"))
        assert mgr.reuse_shared(c3, sub, f"sst-{c1}") is not None
        mgr.acknowledge(c3, sub)
        new = store._engine.replace_tm(tm)
        assert store.placement()[sub] == new
        for s, t in sorted(store.placement().items()):
            store.task_manager(t).write(c2, s, KS, "fresh", payload(s, "fresh"))
            store.task_manager(t).acknowledge(c2, s)
        assert coord.complete(c2) is not None  # subsumes checkpoint 1
        store.deliver_notifications()
        store._engine.attempt_stopped(tm)  # its files' deletes wait for it (R64)
        store.flush()
        assert old not in testing.observe(store).files, "still pinned by the withdrawn placeholder"
        for s, t in sorted(store.placement().items()):
            if s != sub:
                store.task_manager(t).acknowledge(c3, s)
        with pytest.raises(CommandError):
            coord.complete(c3)  # the replaced attempt's acknowledgement is gone
        assert testing.check_invariants(store) == []
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r66_r103_a_withdrawn_acknowledgement_takes_its_in_place_references_with_it(
    tmp_path: Path, kind: str
) -> None:
    """A subtask's database snapshot refers to its working file in place (R103) and is
    acknowledged; its TM is replaced before the checkpoint completes (R66). The new
    attempt acknowledges without a snapshot: the checkpoint completes without the
    replaced attempt's working file, which its database, gone with it, no longer keeps."""
    place = Place.make(kind, tmp_path)
    engine = working_engine(place)
    try:
        first, second = SubtaskId("v", 0, 2), SubtaskId("v", 1, 2)
        for s in (first, second):
            apply(engine, WriteWorking(s, 300))
        apply(engine, Trigger())
        cp = engine.coord.next_checkpoint - 1
        apply(engine, SnapshotWorking(cp, first, 0))
        apply(engine, Acknowledge(cp, first))
        assert first in engine.coord.pending[cp].working
        apply(engine, ReplaceTm(engine.coord.placement[first]))
        apply(engine, WriteState(cp, first, KS, "s", 20))
        apply(engine, Acknowledge(cp, first))
        apply(engine, SnapshotWorking(cp, second, 0))
        apply(engine, Acknowledge(cp, second))
        apply(engine, Complete(cp))
        (done,) = engine.coord.retained
        assert [sub for sub, _ in done.working] == [second]
    finally:
        engine.storage.close_all()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r103_in_place_references_are_taken_only_where_the_store_writes(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """I5, R103: a TM of its own is not trusted to refer in place only to working files
    of the running job, and the coordinator may hold no record of one it wrote (another
    process). Of an acknowledgement's in-place references, one outside every working
    directory and one into another job's are dropped; an unrecorded working file of the
    running job becomes the coordinator's, written by the acknowledging attempt; and
    the ones after a dropped reference are still taken."""
    place = Place.make(kind, tmp_path)
    engine = working_engine(place)
    try:
        sub = SubtaskId("v", 0, 2)
        apply(engine, WriteWorking(sub, 300))
        apply(engine, Trigger())
        cp = engine.coord.next_checkpoint - 1
        apply(engine, SnapshotWorking(cp, sub, 0))
        db = f"{working_dir(engine.job, sub)}/db"
        stray = InPlaceFile(f"{engine.job}/shared/{sub.dir_name()}/stray", 300, (0, 63))
        foreign = InPlaceFile(f"{working_dir('job-9', sub)}/db/f1", 300, (0, 63))
        behind = InPlaceFile(f"{db}/behind", 200, (0, 63))
        for f in (stray, foreign, behind):
            place.inner.makedirs(f"{place.root}/{f.path.rsplit('/', 1)[0]}", exist_ok=True)
            place.write(f.path, b"w" * f.length)
        receive = engine.coord.receive_ack
        acks: list[Acknowledgement] = []

        def forged(ack: Acknowledgement) -> None:
            acks.append(ack)
            receive(attrs.evolve(ack, in_place=(stray, foreign, *ack.in_place, behind)))

        monkeypatch.setattr(engine.coord, "receive_ack", forged)
        apply(engine, Acknowledge(cp, sub))
        (ack,) = acks
        taken = engine.coord.pending[cp].working[sub]
        assert list(taken) == [*ack.in_place, behind]
        files = engine.coord.catalog.files
        assert all(files[w.path].owner == COORDINATOR for w in taken)
        assert (files[behind.path].creator, files[behind.path].size) == (ack.attempt, 200)
        assert behind.path not in engine.observe().open_files  # a database's file is done
        assert stray.path not in files and foreign.path not in files
    finally:
        engine.storage.close_all()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r64_r103_a_file_referred_to_in_place_again_keeps_its_creator(
    tmp_path: Path, kind: str
) -> None:
    """R103, R64: a working file a checkpoint took over is referred to in place again by
    the attempt that replaced its writer (R105 opened it there). Taking it again leaves
    its record's creator alone: once no checkpoint uses it, its delete waits for the
    lost writer to stop, which may still have it open."""
    place = Place.make(kind, tmp_path)
    engine = working_engine(place)
    subs = (SubtaskId("v", 0, 2), SubtaskId("v", 1, 2))

    def checkpoint() -> int:
        return working_checkpoint(engine, subs)

    try:
        for s in subs:
            apply(engine, WriteWorking(s, 300))
        checkpoint()
        first = subs[0]
        ((_, w),) = [(s, w) for s, w in engine.coord.retained[-1].working if s == first]
        writer = engine.coord.placement[first]
        assert engine.coord.catalog.files[w.path].creator == writer
        apply(engine, ReplaceTm(writer))  # lost: a zombie until it stops
        checkpoint()  # the new attempt refers to w in place again
        assert engine.coord.catalog.files[w.path].creator == writer
        apply(engine, DropWorking(first, w.path))  # a compaction replaced it
        apply(engine, WriteWorking(first, 300))
        checkpoint()  # the last checkpoint naming w is subsumed
        apply(engine, CollectWorking())  # R104: unused now, and the coordinator's
        engine.storage.drain()
        assert place.inner.exists(f"{place.root}/{w.path}")  # waits for its writer
        assert [d.waits_for for d in engine.coord.catalog.deferred if d.path == w.path] == [
            writer
        ]
        apply(engine, AttemptStopped(writer))
        engine.storage.drain()
        assert not place.inner.exists(f"{place.root}/{w.path}")
        assert check_safety(engine.observe()) == []
    finally:
        engine.storage.close_all()
        place.cleanup()


def _written_behind(
    place: Place, sub: SubtaskId, where: SubtaskId, name: str
) -> tuple[StateEntry, str]:
    """A whole file a TM in a process of its own wrote in ``where``'s shared directory,
    behind the coordinator's back: the operator state its acknowledgement names, and
    the file's path."""
    rel = f"job-0/shared/{where.dir_name()}/{name}"
    data = payload(sub, name)
    place.inner.makedirs(f"{place.root}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
    place.write(rel, data)
    handle = FileHandle(rel, len(data), name, Scope.EXCLUSIVE)
    return StateEntry(sub, StateKind.OPERATOR_LIST, "offsets", handle, 1), rel


def _none_store(tmp_path: Path, kind: str) -> tuple[Place, CheckpointStore]:
    """NONE mode on ``kind``; "memory-unreadable": memory with object-store rules (R65:
    a stopped writer's open files never appear)."""
    place = Place.make(kind.split("-")[0], tmp_path)
    cfg = Config.for_mode(MergingMode.NONE, num_retained=1)
    cfg = attrs.evolve(cfg, open_files_readable=kind != "memory-unreadable")
    store, _ = place.store(cfg, JOB)
    return place, store


def _first_sst(store: CheckpointStore) -> tuple[int, SubtaskId, FileHandle]:
    """Checkpoint 1, the only one retained, its first subtask, and that subtask's keyed
    file of checkpoint 1 (a whole file in NONE mode)."""
    c1 = _checkpoint(store)
    assert c1 is not None
    (done,) = store.coordinator.retained()
    sub = min(store.placement())
    (handle,) = [
        e.handle
        for e in done.entries
        if e.subtask == sub and e.name == f"sst-{c1}" and isinstance(e.handle, FileHandle)
    ]
    return c1, sub, handle


def _on_two_tms(
    store: CheckpointStore,
) -> tuple[list[tuple[SubtaskId, TmId]], tuple[SubtaskId, TmId], tuple[SubtaskId, TmId]]:
    """The placement in order, its first subtask, and the first one on another TM."""
    placed = sorted(store.placement().items())
    first = placed[0]
    return placed, first, next((s, t) for s, t in placed if t != first[1])


@pytest.mark.parametrize("sender", ["lost-host", "alive-non-host", "unknown"])
@pytest.mark.parametrize("kind", KINDS)
def test_r56_an_acknowledgement_from_an_attempt_given_up_or_not_hosting_is_ignored(
    tmp_path: Path, kind: str, sender: str
) -> None:
    """R56: only the subtask's current attempt, alive, acknowledges for it. The attempt
    that hosts it but is lost (it may still run), a live TM that does not host it (a
    TM of its own sending what it should not), and an attempt the coordinator never
    started are ignored: the checkpoint still lacks the subtask."""
    place, store = _none_store(tmp_path, kind)
    try:
        coord = store.coordinator
        co = store._engine.coord
        placement, (sub, host), (_, other) = _on_two_tms(store)
        if sender == "lost-host":
            co.lose(host)  # it may still run; its subtasks wait for a failover
        cid = coord.trigger()
        for s, t in placement[1:]:
            if t == host:
                continue
            store.task_manager(t).write(cid, s, OP, "offsets", payload(s, "offsets", cid))
            store.task_manager(t).acknowledge(cid, s)
        entry, _ = _written_behind(place, sub, sub, "forged")
        attempt = {"lost-host": host, "alive-non-host": other, "unknown": "tm-99"}[sender]
        co.receive_ack(Acknowledgement(co.job, cid, sub, attempt, (entry,)))
        assert sub not in co.pending[cid].acks
        with pytest.raises(CommandError, match="lacks acks"):
            coord.complete(cid)
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", (*KINDS, "memory-unreadable"))
def test_r43_a_late_acknowledgements_file_the_coordinator_has_no_record_of_is_deleted(
    tmp_path: Path, kind: str
) -> None:
    """A TM in a process of its own wrote a whole file and acknowledges after its
    checkpoint was aborted: the coordinator, with no record of the file, takes it over
    as created by that attempt (never as nobody's) and deletes it (R43, no leak), waiting
    for nothing."""
    place, store = _none_store(tmp_path, kind)
    try:
        coord = store.coordinator
        co = store._engine.coord
        cid = coord.trigger()
        sub, tm = min(store.placement().items())
        entry, rel = _written_behind(place, sub, sub, "late")
        coord.abort(cid)
        co.receive_ack(Acknowledgement(co.job, cid, sub, tm, (entry,)))
        store._engine.send_ready()  # the host's part after a call: its deletes go
        store.flush()
        assert not place.inner.exists(f"{place.root}/{rel}"), "left behind"
        assert [d.path for d in testing.observe(store).deletions if d.path == rel] == [rel]
        assert testing.check_invariants(store, quiet=True) == []
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r64_a_lost_attempts_late_file_is_its_own_until_it_stops_then_deleted(
    tmp_path: Path, kind: str
) -> None:
    """A lost attempt (R57; it may still run) of a TM in a process of its own
    acknowledges a whole file it wrote, after its loss aborted the checkpoint. The
    coordinator, with no record of it, records it as that attempt's (R56, R64): it is
    not deleted while the attempt may run, and is taken and deleted when the attempt is
    known stopped, even where the stop's sweep does not look (another subtask's
    directory)."""
    place, store = _none_store(tmp_path, kind)
    try:
        coord = store.coordinator
        co = store._engine.coord
        cid = coord.trigger()
        _, (sub, host), (elsewhere, _) = _on_two_tms(store)
        entry, rel = _written_behind(place, sub, elsewhere, "late")
        co.lose(host)  # aborts the checkpoint (R57)
        assert cid not in co.pending
        co.receive_ack(Acknowledgement(co.job, cid, sub, host, (entry,)))
        store._engine.send_ready()  # the host's part after a call: its deletes go
        store.flush()
        assert place.inner.exists(f"{place.root}/{rel}")  # it may still run
        assert testing.observe(store).owners.get(rel) == f"tm:{host}"
        co.attempt_stopped(host)
        store._engine.send_ready()
        store.flush()
        assert not place.inner.exists(f"{place.root}/{rel}"), "left behind"
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("what", ["reported", "released"])
@pytest.mark.parametrize("mode", (MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT))
@pytest.mark.parametrize("kind", KINDS)
def test_r40_r41_the_directories_a_tm_of_its_own_reports_are_recorded_the_others_forgotten(
    tmp_path: Path, kind: str, mode: MergingMode, what: str
) -> None:
    """R40, R41 with file merging: a TM in a process of its own creates its managed
    directories where the coordinator keeps no record of them, and its acknowledgement
    reports each that exists. "reported": the coordinator's records of them are taken
    out before the acknowledgement arrives, and each reported directory is recorded as
    the attempt's.
    "released": a record of the attempt's planted for a task-owned directory the
    acknowledgement does not report (the TM deleted it) goes."""
    place = Place.make(kind, tmp_path)
    store, _ = place.store(Config.for_mode(mode, num_retained=1), JOB)
    try:
        co = store._engine.coord
        cid = store.coordinator.trigger()
        sub, tm = min(store.placement().items())
        gone = taskowned_dir(co.job, tm)
        if what == "released":
            assert gone not in co.catalog.dir_owner
            co.catalog.dir_owner[gone] = tm_actor(tm)
            co.catalog.dirs[gone] = ManagedDir(gone, tm)
        store.task_manager(tm).write(cid, sub, KS, "sst", payload(sub, "sst"))
        _, ack = store._engine.parties[tm].acknowledge(sub, cid, False)
        reported = [e.handle.path for e in ack.entries if isinstance(e.handle, DirectoryHandle)]
        if what == "reported":
            assert reported
            for d in reported:
                co.catalog.dir_owner.pop(d, None)
                co.catalog.dirs.pop(d, None)
            co.receive_ack(ack)
            for d in reported:
                assert co.catalog.dir_owner[d] == tm_actor(tm)
                assert co.catalog.dirs[d].creator == tm
        else:
            sent = tuple(
                e
                for e in ack.entries
                if not (isinstance(e.handle, DirectoryHandle) and e.handle.path == gone)
            )
            co.receive_ack(attrs.evolve(ack, entries=sent))
            assert sub in co.pending[cid].acks
            assert gone not in co.catalog.dir_owner and gone not in co.catalog.dirs
            assert gone not in testing.observe(store).directories
    finally:
        store.close()
        place.cleanup()


CLASHES = ("registered", "within-the-checkpoint", "exclusive-within", "exclusive-retained")


@pytest.mark.parametrize("clash", CLASHES)
@pytest.mark.parametrize("mode", (MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT))
@pytest.mark.parametrize("kind", KINDS)
def test_r54_acknowledgements_giving_one_logical_id_two_paths_abort_the_checkpoint(
    tmp_path: Path, kind: str, mode: MergingMode, clash: str
) -> None:
    """R54: every subtask acknowledges the next checkpoint, one of them (a TM of its own,
    not trusted) with a file under a logical id that names another extent: shared state
    the registry holds for another path, or another entry of the checkpoint, or (its
    operator state) another subtask's operator state or the retained checkpoint's. The
    checkpoint cannot be registered, and its ``_metadata`` would be refused by the reader
    (``check_ids`` counts every handle), so recovery could not read it back: it is
    aborted before its ``_metadata`` is written, ``complete`` says it did not complete,
    and the retained checkpoint and its files stay. Each subtask writes operator state
    before its keyed state, so an exclusive entry comes first."""
    place = Place.make(kind, tmp_path)
    store, _ = place.store(Config.for_mode(mode, num_retained=2), JOB)
    try:
        assert _checkpoint(store) is not None
        co = store._engine.coord
        (done,) = co.retained
        coord = store.coordinator
        nxt = coord.trigger()
        subs = sorted(store.placement().items())
        for sub, tm in subs:
            mgr = store.task_manager(tm)
            mgr.write(nxt, sub, OP, "offsets", payload(sub, "offsets", nxt))
            mgr.write(nxt, sub, KS, "sst-x", payload(sub, "sst-x"))
            mgr.acknowledge(nxt, sub)
        first, second = subs[0][0], subs[1][0]
        if clash.startswith("exclusive"):
            mine = _scoped(co.pending[nxt].acks[first], Scope.EXCLUSIVE)[0]
            if clash == "exclusive-within":
                taken = _scoped(co.pending[nxt].acks[second], Scope.EXCLUSIVE)[0]
            else:
                taken = _scoped(done.entries, Scope.EXCLUSIVE)[0]
        else:
            mine = _scoped(co.pending[nxt].acks[first], Scope.SHARED)[0]
            if clash == "registered":
                here = getattr(mine.handle, "path", "")
                old = _scoped(done.entries, Scope.SHARED)
                taken = next(e for e in old if getattr(e.handle, "path", "") != here)
            else:
                taken = _scoped(co.pending[nxt].acks[second], Scope.SHARED)[0]
        assert isinstance(mine.handle, FileHandle | SegmentHandle)
        assert isinstance(taken.handle, FileHandle | SegmentHandle)
        assert taken.handle.path != mine.handle.path
        forged = attrs.evolve(
            mine, handle=attrs.evolve(mine.handle, logical_id=taken.handle.logical_id)
        )
        p = co.pending[nxt]
        p.acks[first] = tuple(forged if e is mine else e for e in p.acks[first])
        with pytest.raises(CompletionFailed, match="logical id"):
            coord.complete(nxt)
        assert nxt not in co.pending
        store.deliver_notifications()  # the TMs drop what they wrote for it
        store.flush()
        obs = testing.observe(store)
        assert f"job-0/chk-{nxt}/_metadata" not in obs.files
        assert [r.checkpoint for r in coord.retained()] == [done.id]
        assert testing.check_invariants(store, quiet=True) == []
        assert all(store.read(e) for e in done.entries)
        assert _checkpoint(store) is not None  # the job checkpoints on
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r54_a_logical_id_only_a_pending_placeholder_keeps_registered_is_not_given_away(
    tmp_path: Path, kind: str
) -> None:
    """R54, R22: checkpoints 2, 3 and 4 pending; a subtask's acknowledgement of 3 reuses
    checkpoint 1's shared file (a placeholder pinning it). Checkpoint 2 completes and
    subsumes 1: the file stays registered for 3 alone, in no retained checkpoint. An
    acknowledgement of 4 (a TM of its own, not trusted) names another file under that
    logical id: only the registry knows the id's path, and 4 is aborted before its
    ``_metadata`` is written; 3 completes on the pinned file."""
    place, store = _none_store(tmp_path, kind)
    try:
        co = store._engine.coord
        coord = store.coordinator
        c1, sub, pinned = _first_sst(store)
        c2, c3, c4 = coord.trigger(), coord.trigger(), coord.trigger()
        mgr = store.task_manager(store.placement()[sub])
        assert mgr.reuse_shared(c3, sub, f"sst-{c1}") is not None
        mgr.acknowledge(c3, sub)
        for cid in (c2, c4):
            for s, t in sorted(store.placement().items()):
                store.task_manager(t).write(cid, s, KS, "fresh", payload(s, "fresh", cid))
                store.task_manager(t).acknowledge(cid, s)
        assert coord.complete(c2) is not None  # subsumes checkpoint 1
        assert [r.id for r in co.retained] == [c2]
        assert all(pinned.logical_id not in {getattr(e.handle, "logical_id", None)
                                             for e in r.entries} for r in co.retained)
        other = max(store.placement())
        mine = _scoped(co.pending[c4].acks[other], Scope.SHARED)[0]
        assert isinstance(mine.handle, FileHandle) and mine.handle.path != pinned.path
        forged = attrs.evolve(mine, handle=attrs.evolve(mine.handle, logical_id=pinned.logical_id))
        p = co.pending[c4]
        p.acks[other] = tuple(forged if e is mine else e for e in p.acks[other])
        with pytest.raises(CompletionFailed, match="logical id"):
            coord.complete(c4)
        assert c4 not in co.pending and c3 in co.pending
        store.deliver_notifications()
        store.flush()
        assert pinned.path in testing.observe(store).files
        for s, t in sorted(store.placement().items()):
            if s != sub:
                store.task_manager(t).acknowledge(c3, s)
        assert coord.complete(c3) is not None
        store.flush()
        assert pinned.path in testing.observe(store).files
        assert testing.check_invariants(store) == []
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_r64_a_file_another_attempt_acknowledges_keeps_its_creator_and_waits_for_it(
    tmp_path: Path, kind: str
) -> None:
    """The coordinator's record of a file says who created it, whatever a later
    acknowledgement says: a second attempt naming another attempt's whole file as its own
    takes nothing from that record. Once the creator is lost (a zombie that may still
    write), the abort's delete of the file waits until it stopped (R64)."""
    place, store = _none_store(tmp_path, kind)
    try:
        coord = store.coordinator
        co = store._engine.coord
        cid = coord.trigger()
        _, (s1, t1), (s2, t2) = _on_two_tms(store)
        mgr = store.task_manager(t1)
        mgr.write(cid, s1, KS, "sst", payload(s1, "sst"))
        mgr.acknowledge(cid, s1)
        (theirs,) = co.pending[cid].acks[s1]
        assert isinstance(theirs.handle, FileHandle)
        path = theirs.handle.path
        assert co.catalog.files[path].creator == t1
        co.receive_ack(Acknowledgement(co.job, cid, s2, t2, (attrs.evolve(theirs, subtask=s2),)))
        assert co.catalog.files[path].creator == t1
        co.replace(t1)  # t1 is a zombie now: it may still run
        if cid in co.pending:
            coord.abort(cid)
        store.flush()
        assert path in testing.observe(store).files, "deleted while its creator may still run"
        co.attempt_stopped(t1)
        store.flush()
        assert path not in testing.observe(store).files
        assert testing.check_invariants(store) == []
    finally:
        store.close()
        place.cleanup()


@pytest.mark.parametrize("kind", (*KINDS, "memory-unreadable"))
def test_r43_a_whole_file_the_coordinator_has_no_record_of_becomes_its_own(
    tmp_path: Path, kind: str
) -> None:
    """A TM in a process of its own writes its files where the coordinator keeps no
    record of them: the acknowledgement is all it learns. Here every subtask's file is
    written on storage behind the coordinator's back and acknowledged. Each becomes the
    coordinator's, created by the acknowledging attempt (I3), closed (its attempt
    stopping takes nothing of it, R65), and goes when its checkpoint is subsumed (no
    leak, I6)."""
    place, store = _none_store(tmp_path, kind)
    try:
        coord = store.coordinator
        co = store._engine.coord
        cid = coord.trigger()
        written = []
        for n, (sub, tm) in enumerate(sorted(store.placement().items())):
            entry, rel = _written_behind(place, sub, sub, f"remote-{n}")
            co.receive_ack(Acknowledgement(co.job, cid, sub, tm, (entry,)))
            written.append((rel, tm))
        for rel, tm in written:
            f = co.catalog.files[rel]
            assert (f.owner, f.creator) == (COORDINATOR, tm)
        # closed: its writer closed it before acknowledging
        assert not {rel for rel, _ in written} & testing.observe(store).open_files
        assert coord.complete(cid) is not None
        first = written[0][1]
        co.replace(first)  # its writer stops: what it wrote and closed stays (R64, R65)
        co.attempt_stopped(first)
        store.flush()
        assert {rel for rel, _ in written} <= set(testing.observe(store).files)
        (done,) = coord.retained()
        assert all(store.read(e) for e in done.entries)
        assert _checkpoint(store) is not None  # subsumes it
        store.flush()
        files = testing.observe(store).files
        assert not any(rel in files for rel, _ in written), "left behind"
        on_storage = [rel for rel, _ in written if place.inner.exists(f"{place.root}/{rel}")]
        assert on_storage == [], "left behind on storage"
        assert testing.check_invariants(store, quiet=True) == []
    finally:
        store.close()
        place.cleanup()
