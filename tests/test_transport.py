"""fastimpl/transport.py: notices travel as ``spec.messages`` bytes; what a TM applies is
what decodes; bytes that do not decode are refused naming the field, queueing nothing."""

from __future__ import annotations

import pytest

from fastimpl import CheckpointStore, testing
from fastimpl.transport import InMemoryTransport
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.errors import CommandError, Reason
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    MessageError,
    decode_message,
    encode_message,
)

DONE = CheckpointComplete("job-0", 2, 1, False, frozenset({3}))
GONE = CheckpointAborted("job-0", 4, 2, False)


def test_messages_keep_their_order_and_decode_unchanged() -> None:
    t = InMemoryTransport()
    t.send("tm-1", DONE)
    t.send("tm-2", GONE)
    t.send("tm-1", GONE)
    assert len(t) == 3 and t.first_for("tm-2") == 1 and t.first_for("tm-9") is None
    assert list(t) == [("tm-1", DONE), ("tm-2", GONE), ("tm-1", GONE)]
    assert t.take(1) == ("tm-2", GONE)
    assert t.take(0) == ("tm-1", DONE)
    assert t.take(0) == ("tm-1", GONE)
    assert not t


def test_a_test_adapter_drops_and_duplicates() -> None:
    t = InMemoryTransport()
    t.send("tm-1", DONE)
    t.send("tm-2", GONE)
    t.duplicate(0)
    t.drop(1)
    assert list(t) == [("tm-1", DONE), ("tm-1", DONE)]
    t.forget("tm-1")
    assert not t


@pytest.mark.parametrize("index", [-1, 1, 5])
def test_no_such_notice_is_refused(index: int) -> None:
    t = InMemoryTransport()
    t.send("tm-1", DONE)
    for op in (t.take, t.drop, t.duplicate):
        with pytest.raises(CommandError) as err:
            op(index)
        assert err.value.reason is Reason.NO_SUCH_NOTIFICATION
    assert list(t) == [("tm-1", DONE)]


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (encode_message(DONE).replace(b'"version":1', b'"version":7'), "$.version"),
        (encode_message(DONE).replace(b'"subsumed":1', b'"subsumed":-1'), "$.message.subsumed"),
        (b"{not json", "$"),
    ],
)
def test_bytes_from_elsewhere_are_queued_only_if_they_decode(data: bytes, where: str) -> None:
    t = InMemoryTransport()
    t.send("tm-1", GONE)
    with pytest.raises(MessageError) as err:
        t.put("tm-1", data)
    assert err.value.where == where
    assert list(t) == [("tm-1", GONE)]
    assert t.put("tm-2", encode_message(DONE)) == DONE
    assert list(t) == [("tm-1", GONE), ("tm-2", DONE)]


@pytest.mark.parametrize("mode", list(MergingMode), ids=[m.name for m in MergingMode])
def test_the_store_sends_its_notices_as_messages(mode: MergingMode, tmp_path: object) -> None:
    """A completion reaches every live TM as a ``CheckpointComplete`` carrying the
    subsumed watermark (R31); an abort as ``CheckpointAborted`` with the latest completed
    id (R32); each one as bytes that decode to exactly it."""
    job = JobSpec((VertexSpec("v", 2),), num_tms=2)
    store = CheckpointStore(f"memory://{tmp_path}/t", Config.for_mode(mode), job)
    coord = store.coordinator

    def one(abort: bool) -> int:
        cid = coord.trigger()
        for sub, tm in sorted(store.placement().items()):
            m = store.task_manager(tm)
            m.write(cid, sub, StateKind.KEYED_SHARED, f"{cid}.sst", b"x" * 10)
            m.acknowledge(cid, sub)
        if abort:
            coord.abort(cid)
        else:
            coord.complete(cid)
        return cid

    one(False)
    store.deliver_notifications()
    second = one(False)
    third = one(True)
    channel = store._engine.channel  # the in-process engine's network
    got = list(channel)
    assert got == [
        ("tm-1", CheckpointComplete(store.job_id, second, 1, False, frozenset())),
        ("tm-2", CheckpointComplete(store.job_id, second, 1, False, frozenset())),
        ("tm-1", CheckpointAborted(store.job_id, third, second, False)),
        ("tm-2", CheckpointAborted(store.job_id, third, second, False)),
    ]
    for _tm, data in channel._queue:
        assert isinstance(data, bytes)
        assert encode_message(decode_message(data)) == data
    assert store.deliver_notifications() == 4
    assert testing.check_invariants(store) == []
    store.close()
