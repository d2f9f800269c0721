"""Bad input end to end: corrupt, truncated, foreign or out-of-bounds ``_metadata`` files and
damaged data files, met by ``coordinator.restart()`` (which reads the retained metadata
back), ``coordinator.restore()``/``rescale()`` and ``CheckpointStore.recover()``.

Each refusal raises a clear error (its type, and a message naming the file, the field and
the problem) and leaves storage exactly as it was: the full listing with every size and a
hash of every file's contents is compared before and after (with queued background
deletes drained). Once the good bytes are back, the same call succeeds and the store
works on. ``model_tests/test_metadata.py`` covers the decoder itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastimpl import CheckpointStore, MetadataError, RecoveryError, StorageFault
from fastimpl.metadata import _canonical, encode
from model_tests.faultyfs import Ledger, Place, payload
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.handles import FileHandle, SegmentHandle, StateEntry, stream_of
from spec.layout import metadata_path

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)
META = metadata_path("job-0", 3)
"""The newest retained checkpoint's ``_metadata``, which every case damages."""


@pytest.fixture(params=[MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT], ids=lambda m: m.name)
def mode(request: pytest.FixtureRequest) -> MergingMode:
    mode: MergingMode = request.param
    return mode


@pytest.fixture(params=["local", "memory"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    p = Place.make(request.param, tmp_path)
    yield p
    p.cleanup()


def _store(place: Place, mode: MergingMode) -> tuple[CheckpointStore, Ledger]:
    """Three checkpoints, two retained (2 and 3), written through the public API."""
    store = CheckpointStore(place.url, Config.for_mode(mode, num_retained=2), JOB)
    ledger = Ledger()
    coord = store.coordinator
    for n in range(1, 4):
        cid = coord.trigger()
        for sub, tm in sorted(store.placement().items()):
            mgr = store.task_manager(tm)
            ledger.record(store.job_id, cid, sub, f"sst-{cid}", payload(sub, f"sst-{cid}"))
            mgr.write(cid, sub, KS, f"sst-{cid}", payload(sub, f"sst-{cid}"))
            if n > 1:
                ledger.record(store.job_id, cid, sub, "sst-1", payload(sub, "sst-1"))
                mgr.reuse_shared(cid, sub, "sst-1")
            ledger.record(store.job_id, cid, sub, "offsets", payload(sub, "offsets", cid))
            mgr.write(cid, sub, OP, "offsets", payload(sub, "offsets", cid))
            mgr.acknowledge(cid, sub)
        assert coord.complete(cid) is not None
        store.deliver_notifications()
    store.flush()
    assert [r.checkpoint for r in coord.retained()] == [2, 3]
    assert META in place.snapshot()
    return store, ledger


# --------------------------------------------------------------------------- the cases


def _reseal(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """Edit the document and give it a valid checksum again, to reach the later checks."""
    doc = json.loads(data)
    edit(doc)
    doc["sha256"] = hashlib.sha256(_canonical(doc["payload"])).hexdigest()
    return _canonical(doc) + b"\n"


def _flip_a_byte(data: bytes) -> bytes:
    i = data.index(b'"name":"sst-') + len(b'"name":"sst-')
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


def _set_path(path: str) -> Callable[[bytes], bytes]:
    def edit(doc: dict[str, Any]) -> None:
        doc["payload"]["entries"][0]["handle"]["path"] = path

    return lambda data: _reseal(data, edit)


def _foreign_job(data: bytes) -> bytes:
    """A well-formed checkpoint of another job (``job-7``) at the same path."""
    raw = json.loads(data)
    doc = raw["payload"]
    for e in doc["entries"]:
        if "path" in e["handle"]:
            e["handle"]["path"] = "job-7/" + e["handle"]["path"].split("/", 1)[1]
    doc["directories"] = ["job-7/" + d.split("/", 1)[1] for d in doc["directories"]]
    doc["job"] = "job-7"
    raw["sha256"] = hashlib.sha256(_canonical(doc)).hexdigest()
    return _canonical(raw) + b"\n"


def _misnamed(data: bytes) -> bytes:
    return _reseal(data, lambda d: d["payload"].update(checkpoint=2))


def _as_savepoint(data: bytes) -> bytes:
    return _reseal(data, lambda d: d["payload"].update(savepoint=True))


CASES: dict[str, tuple[Callable[[bytes], bytes], tuple[str, ...]]] = {
    "flipped-byte": (_flip_a_byte, ("sha256", "checksum mismatch")),
    "truncated": (lambda b: b[: len(b) // 2], ("file", "truncated or invalid JSON")),
    "empty": (lambda b: b"", ("file", "empty (truncated)")),
    "foreign-job": (_foreign_job, ("payload.job", "foreign job id 'job-7'")),
    "other-format": (
        lambda b: b'{"format": "flink/savepoint", "version": 1}',
        ("format", "bad magic 'flink/savepoint'", "not a metadata file"),
    ),
    "binary": (lambda b: b"\x89PNG\r\n\x1a\n\x00\xff", ("file", "not UTF-8")),
    "unsupported-version": (
        lambda b: _reseal(b, lambda d: d.update(version=2)),
        ("version", "unsupported version 2"),
    ),
    "dotdot-path": (
        _set_path("job-0/../elsewhere/f"),
        ("entries[0].handle.path", "'..' component"),
    ),
    "absolute-path": (_set_path("/etc/passwd"), ("entries[0].handle.path", "absolute path")),
    "other-job-base": (
        _set_path("job-9/shared/src-0-2/f"),
        ("entries[0].handle.path", "outside the job base"),
    ),
    "misnamed-checkpoint": (
        _misnamed,
        ("payload.checkpoint", "names checkpoint 2, not checkpoint 3"),
    ),
    "savepoint-flag": (_as_savepoint, ("payload.savepoint", "true in a checkpoint's file")),
}


def _damage(place: Place, case: str) -> bytes:
    good = place.read(META)
    bad = CASES[case][0](good)
    assert bad != good
    place.write(META, bad)
    return good


def _expect(err: BaseException, case: str, source: str = META) -> None:
    msg = str(err)
    assert source in msg, msg
    for word in CASES[case][1]:
        assert word in msg, (word, msg)


def _unchanged(place: Place, store: CheckpointStore | None, before: dict[str, Any]) -> None:
    if store is not None:
        store.flush()
    assert place.snapshot() == before


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize("case", list(CASES))
def test_restart_refuses_bad_metadata(place: Place, mode: MergingMode, case: str) -> None:
    """R95: a coordinator restart reads the retained ``_metadata`` back; a bad one fails
    the restart before anything changes."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    before = place.snapshot()
    with pytest.raises(MetadataError) as info:
        store.coordinator.restart()
    _expect(info.value, case)
    _unchanged(place, store, before)
    assert [r.checkpoint for r in store.coordinator.retained()] == [2, 3]
    # with the good bytes back the restart succeeds and the job goes on
    place.write(META, good)
    store.coordinator.restart()
    _works(store, ledger)


@pytest.mark.parametrize("rescale", [False, True], ids=["restore", "rescale"])
@pytest.mark.parametrize("case", list(CASES))
def test_restore_refuses_bad_metadata(
    place: Place, mode: MergingMode, case: str, rescale: bool
) -> None:
    """R70: the restored checkpoint's ``_metadata`` is read back and validated before the
    running job ends or anything is deleted."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    before = place.snapshot()
    coord = store.coordinator
    with pytest.raises(MetadataError) as info:
        if rescale:
            coord.rescale(3, {"win": 3})
        else:
            coord.restore(3)
    _expect(info.value, case)
    _unchanged(place, store, before)
    assert store.job_id == "job-0"
    _works(store, ledger)  # the running job was not ended
    place.write(META, good)
    assert coord.restore(3) == "job-1"
    for sub, tm in sorted(store.placement().items()):
        for e, data in store.task_manager(tm).restore(sub):
            assert data in {v for (_, c, _, n), v in ledger.data.items() if c == 3 and n == e.name}


@pytest.mark.parametrize("case", list(CASES))
def test_recover_refuses_bad_metadata(place: Place, mode: MergingMode, case: str) -> None:
    """Recovery reads every ``_metadata`` of the crashed job before it changes anything."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    store.close()  # the process dies
    before = place.snapshot()
    config = Config.for_mode(mode, num_retained=2)
    with pytest.raises(MetadataError) as info:
        CheckpointStore.recover(place.url, config, JOB)
    _expect(info.value, case)
    _unchanged(place, None, before)
    place.write(META, good)
    new, report = CheckpointStore.recover(place.url, config, JOB)
    assert report.checkpoints == (2, 3)
    assert ledger.problems(new) == []
    assert new.check_invariants() == []


def _works(store: CheckpointStore, ledger: Ledger) -> None:
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        ledger.record(store.job_id, cid, sub, "later", payload(sub, "later"))
        mgr.write(cid, sub, KS, "later", payload(sub, "later"))
        mgr.acknowledge(cid, sub)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    assert ledger.problems(store) == []
    assert store.check_invariants() == []


# --------------------------------------------------------------------------- data files


def _an_entry(store: CheckpointStore) -> StateEntry:
    latest = store.coordinator.retained()[-1]
    return next(e for e in latest.entries if e.name == "sst-3")


def _extent(entry: StateEntry) -> tuple[str, int, int]:
    s = stream_of(entry.handle)
    assert isinstance(s, SegmentHandle | FileHandle)
    offset = s.offset if isinstance(s, SegmentHandle) else 0
    return s.path, offset, s.length


def test_a_truncated_data_file(place: Place, mode: MergingMode) -> None:
    """A retained handle points past the end of its file: reading names the path and the
    sizes; recovery refuses (``RecoveryError``) and deletes nothing."""
    store, _ = _store(place, mode)
    entry = _an_entry(store)
    path, offset, length = _extent(entry)
    data = place.read(path)
    place.write(path, data[: offset + length - 3])
    with pytest.raises(StorageFault) as info:
        store.read(entry)
    msg = str(info.value)
    assert path in msg and f"wanted {length} bytes" in msg and f"holds {length - 3}" in msg
    assert isinstance(info.value, ValueError)  # what a short read raised before
    store.close()
    before = place.snapshot()
    with pytest.raises(RecoveryError) as rec:
        CheckpointStore.recover(place.url, Config.for_mode(mode, num_retained=2), JOB)
    msg = str(rec.value)
    assert path in msg and str(offset + length) in msg and str(offset + length - 3) in msg
    assert "chk-3" in msg or "checkpoint 3" in msg
    _unchanged(place, None, before)


def test_reading_a_handle_whose_file_is_missing(place: Place, mode: MergingMode) -> None:
    store, _ = _store(place, mode)
    entry = _an_entry(store)
    path, _, _ = _extent(entry)
    place.inner.rm_file(f"{place.root}/{path}")
    before = place.snapshot()
    with pytest.raises(StorageFault) as info:
        store.read(entry)
    assert str(info.value).startswith(f"reading {path} failed: FileNotFoundError")
    assert isinstance(info.value.cause, FileNotFoundError)
    _unchanged(place, store, before)
    with pytest.raises(RecoveryError, match="missing"):
        CheckpointStore.recover(place.url, Config.for_mode(mode, num_retained=2), JOB)
    _unchanged(place, store, before)


def test_encode_names_the_checkpoint_of_a_resealed_file() -> None:
    """The helpers above produce what they claim (a sanity check of the test itself)."""
    data = encode(3, "job-0", False, (), ())
    assert json.loads(_misnamed(data))["payload"]["checkpoint"] == 2
    assert json.loads(_foreign_job(data))["payload"]["job"] == "job-7"


def test_a_re_upload_from_a_truncated_file_declines(place: Place, mode: MergingMode) -> None:
    """R20: state reused before its TM learned the checkpoint completed is uploaded again
    from the old bytes; if the old file is short now, the subtask declines (R17) with an
    error naming the path and sizes, and the completed checkpoints stay as they were."""
    store, ledger = _store(place, mode)
    coord = store.coordinator
    cid = coord.trigger()
    sub, tm = sorted(store.placement().items())[0]
    mgr = store.task_manager(tm)
    mgr.write(cid, sub, KS, "fresh", b"state the next checkpoint reuses too early")
    for s, t in sorted(store.placement().items()):
        store.task_manager(t).acknowledge(cid, s)
    assert coord.complete(cid) is not None  # not delivered: the TM does not know yet
    entry = next(e for e in coord.retained()[-1].entries if e.name == "fresh")
    path, offset, length = _extent(entry)
    truncated = place.read(path)[: offset + length - 1]
    nxt = coord.trigger()
    place.write(path, truncated)
    with pytest.raises(StorageFault) as info:
        mgr.reuse_shared(nxt, sub, "fresh")
    assert path in str(info.value) and f"wanted {length} bytes" in str(info.value)
    assert nxt not in coord.pending()  # declined: aborted
    store.deliver_notifications()
    assert ledger.problems(store, views=coord.retained()[:1]) == []
