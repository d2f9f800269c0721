"""The coordinator's ``Ready`` (``fastimpl.parties``): its calls send and delete nothing
themselves; the notices they decide and the deletes they decide (held by its storage)
wait until the host takes ``ready()``, in the order decided, so a host batches them and
orders them after what it persists (raft's ``Ready``).

Driven on the in-process engine's parties, whose TMs write and acknowledge, with the
coordinator's calls made directly (the engine's own calls take ``ready()`` after each).
"""

from __future__ import annotations

from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.engine import InProcessEngine
from fastimpl.ids import CounterIds
from fastimpl.metadata import MetadataError
from fastimpl.parties import CompletionFailed, Ready, decode_metadata, ha_state, resume
from spec.commands import StorageOp
from spec.config import Config, JobSpec, StateKind, VertexSpec
from spec.errors import UsageError
from spec.handles import stream_of
from spec.invariants import check_all
from spec.layout import METADATA, checkpoint_dir, is_under, metadata_path
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
    assert ready.deletes == ()  # nothing subsumed yet
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
    assert sorted(ready.deletes) == sorted(
        {metadata_path(engine.job, first)} | first_files | skipped_files
    )
    engine.storage.drain()
    on_storage = engine.storage.list_files()
    assert not [p for p in ready.deletes if p in on_storage]
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
    assert write.path in ready.deletes and co.retained_checkpoints() == ()


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


def _subsumed(engine: InProcessEngine) -> tuple[int, set[str], Ready]:
    """Two checkpoints completed by the coordinator's calls (num_retained 1), the first
    subsumed by the second; its id, its files (``_metadata`` too), and the ``Ready``."""
    co = engine.coord
    first, first_files = _written(engine)
    co.complete(first)
    engine.storage.perform(co.ready().deletes)
    latest = _acknowledged(engine)
    co.complete(latest)
    return first, first_files | {metadata_path(engine.job, first)}, co.ready()


def _on_disk(engine: InProcessEngine, path: str) -> bool:
    return Path(engine.storage.full(path)).exists()


def test_the_deletes_wait_for_the_host_and_a_listing_counts_them_done(tmp_path: Path) -> None:
    """Raft's ``Ready``: the subsumed checkpoint's files stay on disk until the host
    performs the deletes; until then the storage lists them as gone (the coordinator's
    records already are), and once performed they are gone from disk, in one call."""
    engine = _engine(tmp_path)
    _, files, ready = _subsumed(engine)
    assert set(ready.deletes) == files
    assert all(_on_disk(engine, p) for p in files)
    listed = engine.storage.list_files()
    assert not files & set(listed)
    assert not files & engine.storage.files_under(engine.job)
    engine.storage.perform(ready.deletes)
    assert not any(_on_disk(engine, p) for p in files)
    assert engine.storage.list_files() == listed


def test_perform_refuses_a_delete_the_coordinator_did_not_decide(tmp_path: Path) -> None:
    """A host performs only what the coordinator decided: a path it did not (the latest
    checkpoint's ``_metadata``), or one already performed, is refused by name before any
    delete of the call is carried out."""
    engine = _engine(tmp_path)
    first, files, ready = _subsumed(engine)
    latest = metadata_path(engine.job, first + 1)
    with pytest.raises(UsageError, match="chk-2/_metadata"):
        engine.storage.perform((*ready.deletes, latest))
    assert all(_on_disk(engine, p) for p in (*files, latest))
    engine.storage.perform(ready.deletes)
    with pytest.raises(UsageError, match="was decided"):
        engine.storage.perform(ready.deletes[:1])
    assert _on_disk(engine, latest)


def test_a_delete_that_fails_when_performed_is_kept_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R45: a held delete whose call fails once the host performs it is not lost: it is
    listed in ``failed_deletes`` with who decided it (the file stays the coordinator's
    in the observation) until a retry succeeds."""
    engine = _engine(tmp_path)
    _, files, ready = _subsumed(engine)
    storage = engine.storage
    real = storage.deleter._delete_now
    failing = sorted(files)[0]

    def flaky(batch: list[tuple[str, bool]]) -> None:
        if any(p == failing for p, _ in batch):
            raise OSError("the store said no")
        real(batch)

    monkeypatch.setattr(storage.deleter, "_delete_now", flaky)
    storage.perform(ready.deletes)
    assert set(storage.failed_deletes) == {failing} and _on_disk(engine, failing)
    assert engine.observe().owners.get(failing) == "coordinator"
    monkeypatch.setattr(storage.deleter, "_delete_now", real)
    assert storage.retry_failed() == [] and not _on_disk(engine, failing)


def test_a_file_made_where_a_held_delete_would_remove_it_waits_for_that_delete(
    tmp_path: Path,
) -> None:
    """A late delete never removes a newer file: a file made in a directory a held
    delete removes has that delete carried out first, and only that one."""
    engine = _engine(tmp_path)
    storage = engine.storage
    for path in ("job-0/x/old", "job-0/y/kept"):
        storage.create(path)
        storage.close(path)
    storage.delete_dir("job-0/x", hold=True)
    storage.delete_file("job-0/y/kept", hold=True)
    storage.create("job-0/x/new")
    storage.close("job-0/x/new")
    assert not _on_disk(engine, "job-0/x/old") and _on_disk(engine, "job-0/x/new")
    assert _on_disk(engine, "job-0/y/kept") and storage.decided.has("job-0/y/kept")
    with pytest.raises(UsageError):
        storage.perform(("job-0/x",))  # carried out already


@pytest.mark.parametrize("cut", ["before the HA state", "after the HA state", "after the deletes"])
def test_a_coordinator_dying_while_its_host_carries_out_a_ready_resumes(
    tmp_path: Path, cut: str
) -> None:
    """The order ``Ready`` asks of a host (persist the HA state, then delete, then send)
    lets a coordinator die at any point of it: rebuilt from the HA state the host last
    persisted, it resumes from a checkpoint whose files are all there, and what the dead
    one decided to delete and never did goes as its garbage (R95). The other order loses
    the checkpoint the HA state names (the last test here)."""
    engine = _engine(tmp_path)
    co = engine.coord
    first, first_files = _written(engine)
    co.complete(first)
    engine.storage.perform(co.ready().deletes)
    persisted = ha_state(co)
    latest = _acknowledged(engine)
    co.complete(latest)
    ready = co.ready()
    if cut != "before the HA state":
        persisted = ha_state(co)
    if cut == "after the deletes":
        engine.storage.perform(ready.deletes)
    placement = dict(co.placement)
    new = resume(
        Config(num_retained=1), VERTICES, engine.storage, CounterIds(), engine, persisted, placement
    )
    engine.host(new)  # its Ready carried out: the garbage deleted, the notices sent
    kept = first if cut == "before the HA state" else latest
    assert [r.id for r in new.retained_checkpoints()] == [kept]
    on_storage = set(engine.storage.list_files())
    assert metadata_path(engine.job, kept) in on_storage
    gone = latest if kept == first else first
    assert not [p for p in on_storage if is_under(p, checkpoint_dir(engine.job, gone))]
    if kept == latest:
        assert not first_files & on_storage
    assert check_all(engine.observe(), quiet=False) == []


def test_deleting_before_the_ha_state_is_persisted_loses_what_it_names(tmp_path: Path) -> None:
    """Why the host persists first: the subsumed checkpoint's deletes performed, then
    the coordinator dies before its host persisted the new HA state; the HA state it
    resumes from names a ``_metadata`` that is gone, and the resume refuses by name."""
    engine = _engine(tmp_path)
    co = engine.coord
    first = _acknowledged(engine)
    co.complete(first)
    engine.storage.perform(co.ready().deletes)
    persisted = ha_state(co)
    co.complete(_acknowledged(engine))
    engine.storage.perform(co.ready().deletes)
    with pytest.raises(MetadataError, match=f"chk-{first}/_metadata"):
        resume(
            Config(num_retained=1),
            VERTICES,
            engine.storage,
            CounterIds(),
            engine,
            persisted,
            dict(co.placement),
        )
