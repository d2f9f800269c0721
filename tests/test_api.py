"""The public API (fastimpl.api): streams, handles, threads, restore, refusals."""

from __future__ import annotations

import io
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from fastimpl import (
    CheckpointStore,
    CheckpointStream,
    CommandTrace,
    CompletionFailed,
    CounterIds,
    StorageFault,
    testing,
)
from fastimpl.api import FileMergingManager, ManagerClosedError, publish_state
from fastimpl.storage import WRITER_LEASE
from fastimpl.writer_state import WRITER_STATE
from model_tests.replay import replay
from spec.commands import StorageOp
from spec.config import (
    MAX_TMS,
    Config,
    JobSpec,
    MergingMode,
    RestoreMode,
    StateKind,
    VertexSpec,
)
from spec.errors import CkptError, CommandError, Reason
from spec.handles import PlaceholderHandle, SegmentHandle, StateEntry
from spec.ids import SubtaskId

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("w", 4),), num_tms=2)


def _store(tmp_path: Path, mode: MergingMode, **kw: object) -> CheckpointStore:
    return CheckpointStore(str(tmp_path / "ckpt"), Config.for_mode(mode, **kw), JOB)


def _checkpoint(store: CheckpointStore, payload: dict[SubtaskId, bytes]) -> int:
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in store.placement().items():
        mgr = store.task_manager(tm)
        mgr.write(cid, sub, KS, f"sst-{cid}", payload[sub])
        mgr.acknowledge(cid, sub)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    return cid


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_handles_name_exactly_the_bytes_written(tmp_path: Path, mode: MergingMode) -> None:
    with _store(tmp_path, mode, num_retained=2) as store:
        written = {}
        for n in range(3):
            payload = {s: bytes([n, s.index]) * (100 + s.index) for s in store.placement()}
            cid = _checkpoint(store, payload)
            written[cid] = payload
        for r in store.coordinator.retained():
            for e in r.entries:
                assert store.read(e) == written[r.checkpoint][e.subtask]
        assert testing.check_invariants(store) == []


def test_an_empty_stream_gives_no_handle_and_no_file(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        with store.task_manager(tm).open_stream(cid, sub, OP, "nothing") as out:
            pass
        assert out.handle is None  # R10
        assert testing.observe(store).files == {}


def test_a_closed_stream_refuses_more_bytes(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.NONE) as store:
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        out = store.task_manager(tm).open_stream(cid, sub, OP, "s")
        out.write(b"abc")
        entry = out.close_and_get_handle()
        assert entry is not None and store.read(entry) == b"abc"
        with pytest.raises(ValueError, match="closed"):
            out.write(b"more")
        assert out.close_and_get_handle() is entry


def test_an_exception_inside_a_stream_writes_nothing(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        with pytest.raises(RuntimeError), store.task_manager(tm).stream(cid, sub, OP, "s") as out:
            out.write(b"half")
            raise RuntimeError("snapshot failed")
        assert testing.observe(store).files == {}


def test_segments_of_one_checkpoint_share_a_file_within_checkpoint(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        tm = store.task_managers()[0]
        mgr = store.task_manager(tm)
        entries = [mgr.write(cid, s, OP, f"op{i}", b"x" * 10) for i, s in enumerate(mgr.subtasks())]
        handles = [e.handle for e in entries if e is not None]
        assert all(isinstance(h, SegmentHandle) for h in handles)
        assert len({h.path for h in handles if isinstance(h, SegmentHandle)}) == 1  # R13
        assert [h.offset for h in handles if isinstance(h, SegmentHandle)] == [0, 10]


def test_reuse_gives_the_old_handle_or_a_placeholder(tmp_path: Path) -> None:
    for mode in MergingMode:
        with _store(tmp_path / mode.name, mode) as store:
            payload = {s: b"v1" for s in store.placement()}
            _checkpoint(store, payload)
            cid = store.coordinator.trigger()
            sub, tm = next(iter(store.placement().items()))
            again = store.task_manager(tm).reuse_shared(cid, sub, "sst-1")
            assert again is not None
            if mode is MergingMode.NONE:
                assert isinstance(again.handle, PlaceholderHandle)
            else:
                assert isinstance(again.handle, SegmentHandle)


def test_a_claim_without_merging_lets_only_keyed_shared_files_be_reused(tmp_path: Path) -> None:
    """R72: after a CLAIM restore without merging and at the same parallelism, each
    subtask may reuse its keyed shared files of the claimed checkpoint (a placeholder, no
    upload); its operator state is no shared state (exclusive, deleted with the claimed
    checkpoint, R52), so reusing it is refused and it is written again."""
    with _store(tmp_path, MergingMode.NONE) as store:
        coord = store.coordinator
        cid = coord.trigger()
        for sub, tm in store.placement().items():
            mgr = store.task_manager(tm)
            mgr.write(cid, sub, KS, "sst-1", b"k" * 10)
            mgr.write(cid, sub, OP, "offsets", b"o" * 10)
            mgr.acknowledge(cid, sub)
        assert coord.complete(cid) is not None
        store.deliver_notifications()
        assert coord.restore(cid, mode=RestoreMode.CLAIM) == "job-1"
        cid = coord.trigger()
        for sub, tm in store.placement().items():
            mgr = store.task_manager(tm)
            again = mgr.reuse_shared(cid, sub, "sst-1")
            assert again is not None and isinstance(again.handle, PlaceholderHandle)
            with pytest.raises(CommandError) as err:
                mgr.reuse_shared(cid, sub, "offsets")
            assert err.value.reason is Reason.NO_SUCH_STATE
            mgr.write(cid, sub, OP, "offsets", b"p" * 10)
            mgr.acknowledge(cid, sub)
        assert coord.complete(cid) is not None
        store.deliver_notifications()
        _checkpoint(store, {s: b"v2" for s in store.placement()})  # subsumes the rest
        assert testing.check_invariants(store) == []


def test_threads_write_for_different_subtasks_at_once(tmp_path: Path) -> None:
    job = JobSpec((VertexSpec("w", 8),), num_tms=2)
    config = Config.for_mode(MergingMode.ACROSS_CHECKPOINT, max_file_size=4096)
    with CheckpointStore(str(tmp_path), config, job, ids=CounterIds()) as store:
        errors: list[BaseException] = []
        for _ in range(5):
            cid = store.coordinator.trigger()

            def snapshot(sub: SubtaskId, tm: str, cid: int = cid) -> None:
                try:
                    mgr = store.task_manager(tm)
                    for k in range(4):
                        mgr.write(cid, sub, KS, f"{cid}-{k}", bytes([sub.index]) * (50 + k))
                    mgr.acknowledge(cid, sub)
                except BaseException as err:  # pragma: no cover - reported below
                    errors.append(err)

            threads = [
                threading.Thread(target=snapshot, args=(s, t)) for s, t in store.placement().items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            store.coordinator.complete(cid)
            store.deliver_notifications()
            for r in store.coordinator.retained():
                for e in r.entries:
                    assert store.read(e) == bytes([e.subtask.index]) * len(store.read(e))
        assert testing.check_invariants(store) == []


def test_rescale_restores_every_key_group_once(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = _checkpoint(store, {s: f"state of {s.index}".encode() for s in store.placement()})
        store.coordinator.rescale(cid, {"w": 3}, mode=RestoreMode.CLAIM)
        covered: list[int] = []
        for sub, tm in store.placement().items():
            for entry, data in store.task_manager(tm).restore(sub):
                assert entry.subtask == sub and entry.key_groups is not None
                lo, hi = entry.key_groups  # the old subtask's range; its bytes are its own
                assert data == f"state of {lo * 4 // 128}".encode()
                covered += [g for g in range(lo, hi + 1) if g * 3 // 128 == sub.index]
        assert sorted(covered) == list(range(128))


def test_a_restore_may_ask_for_max_tms_tms_and_no_more(tmp_path: Path) -> None:
    """R70: a restore may ask for one TM per slot of the largest parallelism (``MAX_TMS``,
    Spark runs one per subtask), not one more: that is refused as a bad argument naming
    the bound, and the job runs on; the largest count is accepted and the new job
    checkpoints."""
    with _store(tmp_path, MergingMode.NONE) as store:
        cid = _checkpoint(store, {s: bytes([s.index]) for s in store.placement()})
        with pytest.raises(CommandError) as err:
            store._engine.restore(cid, num_tms=MAX_TMS + 1)
        assert err.value.reason is Reason.BAD_ARGUMENT and str(MAX_TMS) in str(err.value)
        assert store.job_id == "job-0"
        assert store._engine.restore(cid, num_tms=MAX_TMS) == "job-1"
        _checkpoint(store, {s: bytes([s.index]) for s in store.placement()})
        assert [r.job for r in store.coordinator.retained()] == ["job-1"]
        assert testing.check_invariants(store) == []


@pytest.mark.parametrize("mode", list(RestoreMode), ids=lambda m: m.name)
def test_the_published_state_after_a_restore_names_only_what_the_new_job_holds(
    tmp_path: Path, mode: RestoreMode
) -> None:
    """R72, R73: the writer state the new job publishes at its restore names as its
    latest completed and retained checkpoint the claimed one after a CLAIM, and none
    after a NO_CLAIM: that source is the user's, never the new job's (its abort notices
    carry the same latest completed checkpoint, R30)."""
    with _store(tmp_path, MergingMode.NONE) as store:
        first = _checkpoint(store, {s: bytes([s.index]) for s in store.placement()})
        publish_state(store)
        assert store.coordinator.restore(first, mode=mode) == "job-1"
        doc = json.loads((tmp_path / "ckpt" / "job-1" / WRITER_STATE).read_bytes())
        claimed = mode is RestoreMode.CLAIM
        assert (doc["latest_completed"], doc["retained"]) == (
            (first, [first]) if claimed else (0, [])
        ), doc


def test_failover_restores_the_latest_checkpoint(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.ACROSS_CHECKPOINT) as store:
        _checkpoint(store, {s: b"one" for s in store.placement()})
        _checkpoint(store, {s: b"two" for s in store.placement()})
        lost = store.task_managers()[0]
        testing.crash(store, lost)
        store.coordinator.failover()
        testing.stopped(store, lost)
        assert lost not in store.task_managers()
        for sub, tm in store.placement().items():
            assert [d for _, d in store.task_manager(tm).restore(sub)] == [b"two"]
        _checkpoint(store, {s: b"three" for s in store.placement()})
        assert testing.check_invariants(store) == []


def test_across_merging_is_refused_on_an_object_store() -> None:
    config = Config.for_mode(MergingMode.ACROSS_CHECKPOINT)
    with pytest.raises(ValueError, match="across-checkpoint-boundary"):
        CheckpointStore("s3://bucket/prefix", config, JOB, storage_options={"anon": True})


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_a_failed_metadata_write_is_raised_and_leaves_nothing_of_the_checkpoint(
    tmp_path: Path, mode: MergingMode
) -> None:
    """R51: when writing ``_metadata`` fails the checkpoint is aborted, and ``complete``
    says so by raising ``CompletionFailed`` (never a value a caller could take for a
    completion); once the abort's notices are delivered nothing of it is on storage."""
    with _store(tmp_path, mode) as store:
        coord = store.coordinator
        first = _checkpoint(store, {s: b"one" for s in store.placement()})
        store.flush()
        before = set(testing.observe(store).files)
        cid = coord.trigger()
        for sub, tm in store.placement().items():
            mgr = store.task_manager(tm)
            mgr.write(cid, sub, KS, f"sst-{cid}", b"two" * 50)
            mgr.write(cid, sub, OP, "offsets", b"offsets")
            mgr.acknowledge(cid, sub)
        testing.fail_next(store, StorageOp.METADATA)
        with pytest.raises(CompletionFailed) as failed:
            coord.complete(cid)
        err = failed.value
        assert isinstance(err, CkptError)
        assert err.checkpoint == cid and f"checkpoint {cid}" in str(err)
        assert isinstance(err.cause, StorageFault) and err.__cause__ is err.cause
        assert err.cause.op is StorageOp.METADATA and f"chk-{cid}" in err.cause.path
        assert cid not in coord.pending()
        assert [r.checkpoint for r in coord.retained()] == [first]
        store.deliver_notifications()
        store.flush()
        after = testing.observe(store).files
        assert not [p for p in after if f"chk-{cid}" in p]
        assert set(after) <= before  # every file it wrote went (or was there before)
        assert testing.check_invariants(store) == []
        with pytest.raises(CommandError) as gone:  # not pending any more
            coord.complete(cid)
        assert gone.value.reason is Reason.CHECKPOINT_NOT_PENDING
        _checkpoint(store, {s: b"three" for s in store.placement()})  # the job goes on


def test_coordinator_restart_keeps_retained_checkpoints(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT, num_retained=2) as store:
        _checkpoint(store, {s: b"a" for s in store.placement()})
        _checkpoint(store, {s: b"b" for s in store.placement()})
        before = store.coordinator.retained()
        store.coordinator.restart()
        assert store.coordinator.retained() == before
        _checkpoint(store, {s: b"c" for s in store.placement()})
        store.flush()
        assert testing.check_invariants(store) == []


# ------------------------------------------------------------------ closing a manager


def _closed(tm: str, what: str) -> str:
    """The start of ``ManagerClosedError``'s message: the call refused and the TM."""
    return re.escape(f"{what}: the file-merging manager of TM {tm!r} is closed")


def _bytes_on_disk(root: Path) -> dict[str, int]:
    """Checkpoint bytes on disk (the store's lease, ``WRITER_LEASE``, is none of them)."""
    return {
        os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(root)
        for f in files
        if os.path.join(d, f) != os.path.join(root, WRITER_LEASE)
    }


_CALLS: dict[str, Callable[[FileMergingManager, int, SubtaskId], object]] = {
    "open_stream": lambda m, cid, sub: m.open_stream(cid, sub, OP, "s"),
    "stream": lambda m, cid, sub: m.stream(cid, sub, OP, "s").__enter__(),
    "write": lambda m, cid, sub: m.write(cid, sub, OP, "s", b"data"),
    "reuse_shared": lambda m, cid, sub: m.reuse_shared(cid, sub, "sst-1"),
    "acknowledge": lambda m, cid, sub: m.acknowledge(cid, sub),
    "receive_notifications": lambda m, cid, sub: m.receive_notifications(),
    "state_to_restore": lambda m, cid, sub: m.state_to_restore(sub),
    "restore": lambda m, cid, sub: m.restore(sub),
    "subtasks": lambda m, cid, sub: m.subtasks(),
    "__enter__": lambda m, cid, sub: m.__enter__(),
}


@pytest.mark.parametrize("call", sorted(_CALLS))
def test_a_closed_manager_refuses_every_call(tmp_path: Path, call: str) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        _checkpoint(store, {s: b"v1" for s in store.placement()})  # "sst-1" to reuse
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        mgr = store.task_manager(tm)
        mgr.close()
        assert mgr.closed
        before = testing.observe(store)
        with pytest.raises(ManagerClosedError, match=_closed(tm, call)) as refused:
            _CALLS[call](mgr, cid, sub)
        assert refused.value.tm == tm
        assert isinstance(refused.value, ValueError)  # as for a closed stream
        assert testing.observe(store) == before  # nothing changed
        assert tm in store.task_managers()  # closing is not the TM leaving


def test_closing_a_manager_discards_its_open_streams(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        tm = store.task_managers()[0]
        mgr = store.task_manager(tm)
        s0, s1 = mgr.subtasks()
        kept = mgr.open_stream(cid, s0, OP, "kept")
        kept.write(b"k" * 10)
        entry = kept.close_and_get_handle()
        assert entry is not None
        dropped = mgr.open_stream(cid, s0, KS, "dropped")
        dropped_name = f"'dropped' of {s0}"  # as the error message names it
        dropped.write(b"d" * 1000)
        files = testing.observe(store).files
        disk = _bytes_on_disk(root)
        assert sum(disk.values()) == 10
        refused = _closed(tm, f"close of stream 'ctx' of {s1}")
        with (
            pytest.raises(ManagerClosedError, match=refused),
            mgr.stream(cid, s1, OP, "ctx") as out,
        ):
            out.write(b"c" * 100)
            mgr.close()
        store.flush()
        assert testing.observe(store).files == files  # neither stream's bytes reached storage
        assert _bytes_on_disk(root) == disk
        assert dropped.handle is None and out.handle is None
        with pytest.raises(
            ManagerClosedError, match=_closed(tm, f"write of stream {dropped_name}")
        ):
            dropped.write(b"more")
        with pytest.raises(
            ManagerClosedError, match=_closed(tm, f"close of stream {dropped_name}")
        ):
            dropped.close_and_get_handle()
        dropped.discard()  # allowed: there is nothing left to drop
        assert kept.close_and_get_handle() is entry  # a closed stream keeps its handle
        with pytest.raises(ValueError, match="closed"):
            kept.write(b"more")
        assert testing.observe(store).files == files
        # The checkpoint goes on with a fresh manager of the same TM.
        fresh = store.task_manager(tm)
        assert fresh is not mgr and not fresh.closed
        assert fresh.write(cid, s0, KS, "dropped", b"again") is not None
        for sub, t in store.placement().items():
            store.task_manager(t).acknowledge(cid, sub)
        done = store.coordinator.complete(cid)
        assert done is not None
        mine = {e.name: store.read(e) for e in done.entries if e.subtask == s0}
        assert mine == {"kept": b"k" * 10, "dropped": b"again"}
        assert not any(e.name == "ctx" for e in done.entries)
        store.deliver_notifications()
        store.flush()
        assert testing.check_invariants(store) == []


def test_closing_a_manager_twice_does_nothing(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.ACROSS_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        mgr = store.task_manager(tm)
        out = mgr.open_stream(cid, sub, OP, "s")
        out.write(b"x")
        mgr.close()
        before = testing.observe(store)
        mgr.close()
        mgr.close()
        assert mgr.closed and out.handle is None
        assert testing.observe(store) == before
        assert testing.observe(store).files == {}


def test_a_manager_is_a_context_manager(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        with store.task_manager(tm) as mgr:
            entry = mgr.write(cid, sub, OP, "written", b"w" * 5)
            left_open = mgr.open_stream(cid, sub, OP, "left open")
            left_open.write(b"o" * 50)
        assert mgr.closed and left_open.handle is None
        assert entry is not None and store.read(entry) == b"w" * 5
        assert sum(testing.observe(store).files.values()) == 5
        with (
            pytest.raises(RuntimeError, match="snapshot failed"),
            store.task_manager(tm) as failing,
        ):
            half = failing.open_stream(cid, sub, OP, "half")
            half.write(b"h" * 7)
            raise RuntimeError("snapshot failed")
        assert failing.closed and half.handle is None
        assert sum(testing.observe(store).files.values()) == 5
        with pytest.raises(ManagerClosedError, match=_closed(tm, "__enter__")), mgr:
            pass  # pragma: no cover - a closed manager is not entered again
        assert testing.check_invariants(store) == []


def test_the_store_works_after_a_manager_closed(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.ACROSS_CHECKPOINT, num_retained=2) as store:
        _checkpoint(store, {s: b"one" for s in store.placement()})
        cid = store.coordinator.trigger()
        tm, other = store.task_managers()
        first, second = store.task_manager(tm), store.task_manager(tm)
        s0 = first.subtasks()[0]
        from_first = first.open_stream(cid, s0, OP, "from first")
        from_first.write(b"1" * 10)
        from_second = second.open_stream(cid, s0, OP, "from second")
        from_second.write(b"2" * 20)
        first.close()
        # Other managers of the same TM, and their streams, are not affected.
        assert not second.closed and second.subtasks() == [
            s for s, t in sorted(store.placement().items()) if t == tm
        ]
        entry = from_second.close_and_get_handle()
        assert entry is not None and store.read(entry) == b"2" * 20
        assert from_first.handle is None
        # A fresh manager for the same TM, from either accessor, is open.
        assert not store.task_manager(tm).closed and not store.manager_for(s0).closed
        for sub, t in store.placement().items():
            m = store.task_manager(t)
            m.write(cid, sub, KS, f"sst-{cid}", b"two")
            assert m.reuse_shared(cid, sub, "sst-1") is not None
            m.acknowledge(cid, sub)
        assert store.coordinator.complete(cid) is not None
        with store.task_manager(tm) as again, store.task_manager(other) as theirs:
            assert again.receive_notifications() + theirs.receive_notifications() > 0
        _checkpoint(store, {s: b"three" for s in store.placement()})
        for sub, t in store.placement().items():
            assert [d for _, d in store.task_manager(t).restore(sub)] == [b"three"]
        store.flush()
        assert testing.check_invariants(store) == []
        assert testing.check_invariants(store, quiet=True) == []


def _traced_job(root: Path, *, close_managers: bool) -> list[str]:
    """Three checkpoints through the API; with ``close_managers`` each TM's manager is
    closed at the end of each checkpoint with a stream still open, and refused after."""
    out = io.StringIO()
    config = Config.for_mode(MergingMode.ACROSS_CHECKPOINT, num_retained=2)
    trace = CommandTrace(out, observations=True)
    with CheckpointStore(
        str(root), config, JOB, ids=CounterIds(), background_deletes=False, trace=trace
    ) as store:
        for n in range(1, 4):
            cid = store.coordinator.trigger()
            for tm in store.task_managers():
                mgr = store.task_manager(tm)
                for sub in mgr.subtasks():
                    mgr.write(cid, sub, KS, f"{n}.sst", b"x" * (10 * n))
                    mgr.acknowledge(cid, sub)
                if close_managers:
                    unfinished = mgr.open_stream(cid, mgr.subtasks()[0], OP, "unfinished")
                    unfinished.write(b"u" * 99)
                    mgr.close()
                    assert unfinished.handle is None
                    with pytest.raises(ManagerClosedError):
                        mgr.write(cid, sub, OP, "late", b"late")
            store.coordinator.complete(cid)
            for tm in store.task_managers():
                with store.task_manager(tm) as mgr:
                    mgr.receive_notifications()
        assert testing.check_invariants(store) == []
    return out.getvalue().splitlines()


def test_closing_managers_adds_no_command_and_replays_through_the_model(
    tmp_path: Path,
) -> None:
    plain = _traced_job(tmp_path / "plain", close_managers=False)
    closing = _traced_job(tmp_path / "closing", close_managers=True)
    assert closing == plain  # close() and the streams it discarded left no trace
    report = replay(closing)
    assert report.agrees, report.summary()
    assert report.stopped is None


def test_closing_a_manager_while_threads_write_through_it(tmp_path: Path) -> None:
    job = JobSpec((VertexSpec("w", 8),), num_tms=2)
    config = Config.for_mode(MergingMode.ACROSS_CHECKPOINT, max_file_size=4096)
    with CheckpointStore(str(tmp_path), config, job, ids=CounterIds()) as store:
        cid = store.coordinator.trigger()
        tm = store.task_managers()[0]
        mgr = store.task_manager(tm)
        written: list[StateEntry] = []
        refused: list[ManagerClosedError] = []
        errors: list[BaseException] = []
        started = [threading.Event() for _ in mgr.subtasks()]
        closed = threading.Event()

        def snapshot(sub: SubtaskId, started: threading.Event) -> None:
            # Subtasks of even index hold a half-written stream until the manager closed
            # (it is then refused for sure); the others write as fast as they can.
            try:
                for k in range(100_000):  # until refused
                    with mgr.open_stream(cid, sub, OP, f"{sub.index}-{k}") as out:
                        out.write(bytes([sub.index]) * 7)
                        started.set()
                        if sub.index % 2 == 0:
                            closed.wait()
                        out.write(bytes([sub.index]) * 7)
                    assert out.handle is not None
                    written.append(out.handle)
            except ManagerClosedError as err:
                refused.append(err)
            except BaseException as err:  # pragma: no cover - reported below
                errors.append(err)
            finally:
                started.set()

        threads = [
            threading.Thread(target=snapshot, args=(s, e))
            for s, e in zip(mgr.subtasks(), started, strict=True)
        ]
        for thread in threads:
            thread.start()
        for event in started:
            event.wait()
        mgr.close()
        closed.set()
        for thread in threads:
            thread.join()
        assert errors == []
        assert all(err.tm == tm for err in refused)
        assert len(refused) == len(threads)  # each one stopped at the refusal
        for entry in written:  # every handle returned names exactly its bytes
            assert store.read(entry) == bytes([entry.subtask.index]) * 14
        # Every byte on storage belongs to a returned handle: a refused stream wrote none.
        assert sum(testing.observe(store).files.values()) == 14 * len(written)
        for sub, t in store.placement().items():
            store.task_manager(t).acknowledge(cid, sub)
        done = store.coordinator.complete(cid)
        assert done is not None and len(done.entries) == len(written)
        store.deliver_notifications()
        store.flush()
        assert testing.check_invariants(store) == []


@pytest.mark.parametrize("mode", [MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT])
def test_pool_blocking_writes_the_same_files_either_way(tmp_path: Path, mode: MergingMode) -> None:
    """Flink's non-blocking pool opens another physical file when the pooled one is busy
    with another stream. Here a stream holds its bytes until it closes and appends them
    under the store's lock, so a pooled file is never busy: with many streams of one TM
    open at once, written from threads, both values of ``pool_blocking`` write one
    EXCLUSIVE file per TM (and per checkpoint in WITHIN mode), the blocking pool's count."""
    listings = []
    for blocking in (False, True):
        store = CheckpointStore(
            str(tmp_path / f"blocking-{blocking}"),
            Config.for_mode(mode, pool_blocking=blocking),
            JobSpec((VertexSpec("w", 8),), num_tms=1),
            ids=CounterIds(),
            background_deletes=False,
        )
        tm = store.task_managers()[0]
        for _ in range(3):
            cid = store.coordinator.trigger()
            subtasks = store.task_manager(tm).subtasks()
            streams = [
                store.task_manager(tm).open_stream(cid, s, StateKind.OPERATOR_LIST, "op")
                for s in subtasks
            ]  # all open at once

            def fill(i: int, streams: list[CheckpointStream] = streams) -> None:
                for _ in range(50):
                    streams[i].write(b"x" * 100)
                streams[i].close()

            threads = [threading.Thread(target=fill, args=(i,)) for i in range(len(streams))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for s in subtasks:
                store.task_manager(tm).acknowledge(cid, s)
            assert store.coordinator.complete(cid) is not None
            store.deliver_notifications()
        files = testing.observe(store).files
        exclusive = sorted(p for p in files if "/taskowned/" in p)
        assert len(exclusive) == 1, exclusive  # the retained checkpoint's one file
        assert files[exclusive[0]] >= 8 * 50 * 100
        assert testing.check_invariants(store) == []
        listings.append(sorted(files.items()))
        store.close()
    assert listings[0] == listings[1]


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_a_savepoint_is_written_after_a_later_checkpoint_completed(
    tmp_path: Path, mode: MergingMode
) -> None:
    """R53, R56, R66: completing a later checkpoint does not end a pending savepoint, and a
    TM started by a task-level failover after that completion starts past it (its
    finished mark is the later checkpoint) without being told of the pending savepoint.
    Its write for the savepoint is not late: the engine tells it the checkpoint is a
    savepoint with the barrier (without the type the write would be refused as late, and
    the savepoint would never complete)."""
    with _store(tmp_path, mode, num_retained=1) as store:
        coord = store.coordinator
        payload = {s: b"c" * (50 + s.index) for s in store.placement()}
        sp = coord.trigger(savepoint=True)
        assert _checkpoint(store, payload) > sp
        lost = store.task_managers()[0]
        new = store._engine.replace_tm(lost)
        store.deliver_notifications()
        assert new in store.placement().values()
        for sub, tm in sorted(store.placement().items()):
            mgr = store.task_manager(tm)
            mgr.write(sp, sub, KS, f"sst-{sp}", b"s" * (60 + sub.index))
            mgr.acknowledge(sp, sub)
        assert coord.complete(sp) is not None
        store.deliver_notifications()
        assert sp in coord.savepoints()
        testing.stopped(store, lost)
        assert testing.check_invariants(store) == []
