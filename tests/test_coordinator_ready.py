"""The coordinator's ``Ready`` (``fastimpl.parties``): its calls send nothing themselves;
the notices they decide and the deletes they hand to storage wait until the host takes
``ready()``, in the order decided, so a host batches and orders them (raft's ``Ready``).

Driven on the in-process engine's parties, whose TMs write and acknowledge, with the
coordinator's calls made directly (the engine's own calls take ``ready()`` after each).
"""

from __future__ import annotations

from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.engine import InProcessEngine
from fastimpl.parties import CompletionFailed, Ready, decode_metadata
from spec.commands import StorageOp
from spec.config import Config, JobSpec, StateKind, VertexSpec
from spec.errors import UsageError
from spec.handles import stream_of
from spec.layout import METADATA, checkpoint_dir, metadata_path
from spec.messages import CheckpointAborted, CheckpointComplete

VERTICES = (VertexSpec("map", 2),)


def _engine(tmp_path: Path) -> InProcessEngine:
    fs = fsspec.filesystem("file")
    (tmp_path / "root").mkdir()
    return InProcessEngine(
        Config(num_retained=1),
        JobSpec(VERTICES, num_tms=2),
        fs,
        str(tmp_path / "root"),
        background_deletes=False,
    )


def _written(engine: InProcessEngine) -> tuple[int, set[str]]:
    """A checkpoint every subtask wrote and acknowledged, through the engine, and the
    files it wrote."""
    cid = engine.trigger()
    files: set[str] = set()
    for s in sorted(engine.placement, key=str):
        entry = engine.write(cid, s, StateKind.KEYED_SHARED, f"sst-{cid}", b"x" * 100)
        assert entry is not None
        stream = stream_of(entry.handle)
        assert stream is not None
        files.add(stream.path)
        engine.acknowledge(cid, s)
    return cid, files


def _acknowledged(engine: InProcessEngine) -> int:
    return _written(engine)[0]


def test_a_call_sends_nothing_and_ready_gives_its_notices_once(tmp_path: Path) -> None:
    """R31: a completion's notices go to every TM, but only through ``ready()``: the
    transport holds nothing new after the call, and a second ``ready()`` is empty."""
    engine = _engine(tmp_path)
    co = engine.coord
    cid = _acknowledged(engine)
    in_flight = len(engine.channel)
    done = co.complete(cid)
    assert len(engine.channel) == in_flight
    ready = co.ready()
    tms = sorted(set(engine.placement.values()))
    assert [(tm, type(n), n.checkpoint) for tm, n in ready.notices] == [
        (tm, CheckpointComplete, cid) for tm in tms
    ]
    assert done.metadata == metadata_path(engine.job, cid)
    assert ready.deleted == ()  # nothing subsumed yet
    assert co.ready() == Ready() and not co.ready()


def test_a_batch_of_calls_gives_one_ready_in_the_order_decided(tmp_path: Path) -> None:
    """R53, R54: completing a later checkpoint aborts the older pending one and subsumes
    the retained one; one ``ready()`` after both completions holds every notice in the
    order decided and every delete handed to storage: the subsumed checkpoint's
    ``_metadata`` and files, and the aborted one's files (R43)."""
    engine = _engine(tmp_path)
    co = engine.coord
    (first, first_files), (skipped, skipped_files), (latest, _) = (
        _written(engine) for _ in range(3)
    )
    co.complete(first)
    co.complete(latest)  # R53: ``skipped`` aborts; R54: ``first`` is subsumed
    ready = co.ready()
    tms = sorted(set(engine.placement.values()))
    assert [(tm, type(n), n.checkpoint) for tm, n in ready.notices] == [
        *((tm, CheckpointComplete, first) for tm in tms),
        *((tm, CheckpointComplete, latest) for tm in tms),
        *((tm, CheckpointAborted, skipped) for tm in tms),
    ]
    # no merging: each state handle is a whole file, the coordinator's once handed over
    assert sorted(ready.deleted) == sorted(
        {metadata_path(engine.job, first)} | first_files | skipped_files
    )
    engine.storage.drain()
    on_storage = engine.storage.list_files()
    assert not [p for p in ready.deleted if p in on_storage]
    assert f"{checkpoint_dir(engine.job, latest)}/{METADATA}" in on_storage


def test_a_reset_drops_the_notices_for_its_tm_still_waiting(tmp_path: Path) -> None:
    """R57, R60: a TM lost with a checkpoint pending aborts it, which decides abort
    notices for the TMs; the failover then resets the survivor, whose old attempt's
    notices go with the redeploy, here as in the engine's transport."""
    engine = _engine(tmp_path)
    co = engine.coord
    co.complete(_acknowledged(engine))
    co.ready()
    pending = _acknowledged(engine)
    lost, survivor = sorted(set(engine.placement.values()))
    co.lose(lost)
    assert (survivor, pending) in [(tm, n.checkpoint) for tm, n in co.run.outbox]
    co.failover()
    ready = co.ready()
    assert not [n for tm, n in ready.notices if tm == survivor]
    assert engine.parties[survivor].reset_epoch == co.epoch  # it got the ResetTm


def test_an_aborted_completion_raises_with_its_abort_notices_in_ready(
    tmp_path: Path,
) -> None:
    """R51: a ``_metadata`` write that fails aborts the checkpoint; ``complete`` raises
    ``CompletionFailed`` (never a value a caller could take for a completion) naming the
    checkpoint and the storage fault, and the abort's notices are in ``ready()``."""
    engine = _engine(tmp_path)
    co = engine.coord
    cid = _acknowledged(engine)
    engine.storage.arm(StorageOp.METADATA)
    with pytest.raises(CompletionFailed) as failed:
        co.complete(cid)
    assert failed.value.checkpoint == cid and failed.value.cause is not None
    ready = co.ready()
    assert {(type(n), n.checkpoint) for _, n in ready.notices} == {(CheckpointAborted, cid)}
    assert cid not in co.pending_checkpoints()


def test_a_completions_metadata_is_the_hosts_to_write_before_any_notice(
    tmp_path: Path,
) -> None:
    """R51 as raft's ``Ready``: ``prepare_completion`` changes nothing (the checkpoint
    is pending, no ``_metadata`` on storage, no notice); the host writes the bytes it was
    given, and only ``metadata_written`` completes the checkpoint and gives its notices.
    What the host wrote is what a reader of the base decodes."""
    engine = _engine(tmp_path)
    co = engine.coord
    cid = _acknowledged(engine)
    write = co.prepare_completion(cid)
    assert write.checkpoint == cid and write.path == metadata_path(engine.job, cid)
    assert cid in co.pending_checkpoints() and not co.ready()
    assert write.path not in engine.storage.list_files()
    engine.storage.write_metadata(write.path, write.data)
    done = co.metadata_written(cid)
    assert done.metadata == write.path and cid not in co.pending_checkpoints()
    assert {(type(n), n.checkpoint) for _, n in co.ready().notices} == {(CheckpointComplete, cid)}
    back = decode_metadata(engine.storage.read_range(write.path, 0, len(write.data)))
    assert back.checkpoint == cid and back.job == engine.job
    with pytest.raises(UsageError):
        co.metadata_written(cid)  # nothing prepared any more


def test_a_checkpoint_aborted_while_its_metadata_was_written_does_not_complete(
    tmp_path: Path,
) -> None:
    """R57 between the steps: a TM is lost while the host writes the ``_metadata``; the
    checkpoint aborted, so ``metadata_written`` raises ``CompletionFailed``, the file the
    host wrote is deleted (R95: nothing unreferenced is kept), no ``CheckpointComplete``
    goes out, and nothing is retained."""
    engine = _engine(tmp_path)
    co = engine.coord
    cid = _acknowledged(engine)
    write = co.prepare_completion(cid)
    co.lose(sorted(set(engine.placement.values()))[0])
    engine.storage.write_metadata(write.path, write.data)
    with pytest.raises(CompletionFailed) as failed:
        co.metadata_written(cid)
    assert failed.value.checkpoint == cid and "aborted while" in failed.value.reason
    engine.storage.drain()
    assert write.path not in engine.storage.list_files()
    ready = co.ready()
    assert {type(n) for _, n in ready.notices} == {CheckpointAborted}
    assert write.path in ready.deleted and co.retained_checkpoints() == ()


def test_a_failed_metadata_write_reported_by_the_host_aborts(tmp_path: Path) -> None:
    """R51: the host's write failed; ``metadata_write_failed`` aborts the checkpoint and
    returns the ``CompletionFailed`` to raise, naming the path and the fault."""
    engine = _engine(tmp_path)
    co = engine.coord
    cid = _acknowledged(engine)
    write = co.prepare_completion(cid)
    fault = OSError("the disk is full")
    err = co.metadata_write_failed(cid, fault)
    assert isinstance(err, CompletionFailed) and err.cause is fault
    assert write.path in err.reason and cid not in co.pending_checkpoints()
    assert {(type(n), n.checkpoint) for _, n in co.ready().notices} == {(CheckpointAborted, cid)}
