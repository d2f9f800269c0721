"""R12 on an object store: an acknowledged handle names bytes that are already stored.

On S3 an object is written when its file is closed; until then its bytes live only in the
writing process. So a subtask's acknowledgement first closes (uploads) every file holding
its segments, including its TM's EXCLUSIVE file that another subtask of the TM is still
writing to. These tests look from a second S3 client, while the writing store is alive
and holds its other files open: what it has acknowledged must be readable there, byte
for byte, as it would be after the writer's process died.
"""

from __future__ import annotations

from typing import Any

import pytest

from fastimpl import CheckpointStore, CounterIds, StorageFault, testing
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.handles import StateEntry, extent_of, stream_of
from tests.lockstep import S3_BUCKET, s3

JOB = JobSpec((VertexSpec("agg", 2),), num_tms=1)


def _store(endpoint: str, prefix: str) -> CheckpointStore:
    return CheckpointStore(
        f"s3://{S3_BUCKET}/{prefix}",
        Config.for_mode(MergingMode.WITHIN_CHECKPOINT),
        JOB,
        ids=CounterIds(),
        background_deletes=False,
        storage_options={
            "client_kwargs": {"endpoint_url": endpoint},
            "key": "testing",
            "secret": "testing",
            "use_listings_cache": False,
            "skip_instance_cache": True,
        },
    )


def _stored(other: Any, prefix: str, entry: StateEntry | None) -> bytes:
    assert entry is not None
    s = stream_of(entry.handle)
    assert s is not None
    full = f"{S3_BUCKET}/{prefix}/{s.path}"
    offset = extent_of(s).offset
    try:
        return bytes(other.cat_file(full, start=offset, end=offset + s.length))
    except FileNotFoundError:
        return b""


def test_an_acknowledged_handle_is_readable_from_another_client(s3_endpoint: str) -> None:
    prefix = "durability-ack"
    store = _store(s3_endpoint, prefix)
    other = s3(s3_endpoint)
    tm = store.task_managers()[0]
    manager = store.task_manager(tm)
    first, second = manager.subtasks()
    cp = store.coordinator.trigger()
    data = {
        (first, "op"): b"first-exclusive" * 7,
        (first, "sst"): b"first-shared" * 5,
        (second, "op"): b"second-exclusive" * 3,
    }
    kinds = {"op": StateKind.OPERATOR_LIST, "sst": StateKind.KEYED_SHARED}
    written = {
        key: manager.write(cp, key[0], kinds[key[1]], key[1], payload)
        for key, payload in data.items()
    }
    exclusive = {stream_of(written[(s, "op")].handle).path for s in (first, second)}  # type: ignore[union-attr]
    assert len(exclusive) == 1, "the TM's EXCLUSIVE segments share one merged file"

    manager.acknowledge(cp, first)
    for key in [(first, "op"), (first, "sst")]:
        assert _stored(other, prefix, written[key]) == data[key], f"{key} not stored at its ack"
    # The second subtask has not acknowledged: its segment in the closed file is stored
    # too, and what it writes from now on goes to a new file.
    assert _stored(other, prefix, written[(second, "op")]) == data[(second, "op")]
    later = manager.write(cp, second, StateKind.OPERATOR_UNION, "union", b"later" * 4)
    assert later is not None and stream_of(later.handle).path not in exclusive  # type: ignore[union-attr]
    manager.acknowledge(cp, second)
    assert _stored(other, prefix, later) == b"later" * 4
    assert store.coordinator.complete(cp) is not None
    assert testing.check_invariants(store) == []
    store.close()


def test_a_failed_upload_declines_every_subtask_whose_bytes_it_held(
    s3_endpoint: str,
) -> None:
    """The upload of the TM's EXCLUSIVE file fails at the first acknowledgement: that
    subtask declines (R17) and the checkpoint aborts; the second subtask's segment was in
    the same file, so its acknowledgement is refused too, and the retained checkpoint is
    untouched."""
    prefix = "durability-failed-upload"
    store = _store(s3_endpoint, prefix)
    tm = store.task_managers()[0]
    manager = store.task_manager(tm)
    first, second = manager.subtasks()
    done = store.coordinator.trigger()
    for sub in (first, second):
        manager.write(done, sub, StateKind.OPERATOR_LIST, "op", b"x" * 10)
        manager.acknowledge(done, sub)
    assert store.coordinator.complete(done) is not None
    cp = store.coordinator.trigger()
    entry = manager.write(cp, first, StateKind.OPERATOR_LIST, "op", b"y" * 10)
    manager.write(cp, second, StateKind.OPERATOR_LIST, "op", b"z" * 10)
    assert entry is not None
    path = stream_of(entry.handle).path  # type: ignore[union-attr]
    storage = store._engine.storage
    f: Any = storage._open[path]

    def failing_close() -> None:  # the upload is refused: the object never appears
        f.discard()
        f.closed = True
        raise OSError("upload refused")

    f.close = failing_close
    with pytest.raises(StorageFault, match=path):
        manager.acknowledge(cp, first)
    assert cp not in store.coordinator.pending()
    with pytest.raises(StorageFault, match=path):  # its segment was in the failed upload
        manager.acknowledge(cp, second)
    assert [r.checkpoint for r in store.coordinator.retained()] == [done]
    assert testing.check_invariants(store) == []
    store.close()
