"""The public API (fastimpl.api): streams, handles, threads, restore, refusals."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fastimpl import CheckpointStore, CounterIds
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.handles import PlaceholderHandle, SegmentHandle
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
        assert store.check_invariants() == []


def test_an_empty_stream_gives_no_handle_and_no_file(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT) as store:
        cid = store.coordinator.trigger()
        sub, tm = next(iter(store.placement().items()))
        with store.task_manager(tm).open_stream(cid, sub, OP, "nothing") as out:
            pass
        assert out.handle is None  # R10
        assert store.observe().files == {}


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
        assert store.observe().files == {}


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
        assert store.check_invariants() == []


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


def test_failover_restores_the_latest_checkpoint(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.ACROSS_CHECKPOINT) as store:
        _checkpoint(store, {s: b"one" for s in store.placement()})
        _checkpoint(store, {s: b"two" for s in store.placement()})
        lost = store.task_managers()[0]
        store.task_manager(lost).crash()
        store.coordinator.failover()
        store.task_manager(lost).stopped()
        assert lost not in store.task_managers()
        for sub, tm in store.placement().items():
            assert [d for _, d in store.task_manager(tm).restore(sub)] == [b"two"]
        _checkpoint(store, {s: b"three" for s in store.placement()})
        assert store.check_invariants() == []


def test_across_merging_is_refused_on_an_object_store() -> None:
    config = Config.for_mode(MergingMode.ACROSS_CHECKPOINT)
    with pytest.raises(ValueError, match="across-checkpoint-boundary"):
        CheckpointStore("s3://bucket/prefix", config, JOB, storage_options={"anon": True})


def test_coordinator_restart_keeps_retained_checkpoints(tmp_path: Path) -> None:
    with _store(tmp_path, MergingMode.WITHIN_CHECKPOINT, num_retained=2) as store:
        _checkpoint(store, {s: b"a" for s in store.placement()})
        _checkpoint(store, {s: b"b" for s in store.placement()})
        before = store.coordinator.retained()
        store.coordinator.restart()
        assert store.coordinator.retained() == before
        _checkpoint(store, {s: b"c" for s in store.placement()})
        store.flush()
        assert store.check_invariants() == []
