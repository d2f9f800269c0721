"""Bad input end to end: corrupt, truncated, foreign or out-of-bounds ``_metadata`` files and
damaged data files, met by ``coordinator.restart()`` (which reads the retained metadata
back), ``coordinator.restore()``/``rescale()`` and ``CheckpointStore.recover()``.

Each refusal raises a clear error (its type, and a message naming the file, the field and
the problem) and leaves storage exactly as it was: the full listing (every file and
directory, each file's listed size and its bytes) is compared before and after (with
queued background deletes drained). Once the good bytes are back, the same call succeeds
and the store works on. ``tests/test_metadata.py`` covers the decoder itself.

Storages and merging modes (``SETTINGS``): local files and ``memory://`` in all three
modes; S3 (s3fs against moto's server on 127.0.0.1, the ``s3_endpoint`` fixture of
``test_lockstep``) in WITHIN_CHECKPOINT only. ACROSS_CHECKPOINT is refused on S3 by
design (R16), and NONE differs from WITHIN only in how the data files are cut (a whole
file per handle instead of segments of pooled files): what is S3's own here (listing,
reading ``_metadata`` and ranges back, the object-store delete path that must not run)
is the same in both. Every S3 request costs moto tens of milliseconds of this process's
CPU (a store of three checkpoints about a second, a listing with every object's bytes
about half a second), so on S3 each ``_metadata`` case is one test that meets every
reader in turn on one store (``test_s3_refuses_bad_metadata``), with the full listing
compared after each refusal; the data-file cases run on S3 as they are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from fastimpl import (
    CheckpointStore,
    MetadataError,
    RecoveryError,
    RecoveryReport,
    StorageFault,
    testing,
)
from fastimpl.metadata import _canonical, encode
from spec.config import MergingMode
from spec.handles import Extent, StateEntry, extent_of, stream_of
from tests.faultyfs import Ledger, Place, payload
from tests.storage_settings import (
    JOB,
    KS,
    META,
    OP,
    Listing,
    _config,
    _listing,
    _options,
    _reseal,
    _unchanged,
    on_file_systems,
    on_s3,
)
from tests.storage_settings import (
    mode as mode,
)
from tests.storage_settings import (
    place as place,
)
from tests.storage_settings import (
    setting as setting,
)


def _store(place: Place, mode: MergingMode) -> tuple[CheckpointStore, Ledger]:
    """Three checkpoints, two retained (2 and 3), written through the public API."""
    store = CheckpointStore(place.url, _config(mode), JOB, storage_options=_options(place))
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
    assert place.inner.isfile(f"{place.root}/{META}")
    return store, ledger


def _recover(place: Place, mode: MergingMode) -> tuple[CheckpointStore, RecoveryReport]:
    return CheckpointStore.recover(place.url, _config(mode), JOB, storage_options=_options(place))


# --------------------------------------------------------------------------- the cases


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


def _first_handle_as(handle: dict[str, Any]) -> Callable[[bytes], bytes]:
    """The first entry's handle replaced by one a subtask acknowledges but a completed
    checkpoint never holds (the coordinator resolves placeholders, R22, and lists
    directories apart): accepted, it restored as state nobody can read (I1)."""

    def edit(doc: dict[str, Any]) -> None:
        first = doc["payload"]["entries"][0]
        if handle["type"] == "placeholder":  # the id of state the checkpoint does hold
            handle["id"] = doc["payload"]["entries"][-1]["handle"]["id"]
        first["handle"] = handle

    return lambda data: _reseal(data, edit)


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
        lambda b: _reseal(b, lambda d: d.update(version=5)),
        ("version", "unsupported version 5"),
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
    "placeholder-handle": (
        _first_handle_as({"type": "placeholder"}),
        ("entries[0].handle.type", "placeholder handle is no state of a completed checkpoint"),
    ),
    "directory-handle": (
        _first_handle_as({"type": "directory", "path": "job-0/shared/src-0-2"}),
        ("entries[0].handle.type", "directory handle is no state of a completed checkpoint"),
    ),
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


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize("case", list(CASES))
@on_file_systems
def test_restart_refuses_bad_metadata(place: Place, mode: MergingMode, case: str) -> None:
    """R95: a coordinator restart reads the retained ``_metadata`` back; a bad one fails
    the restart before anything changes."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    before = _listing(place)
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
@on_file_systems
def test_restore_refuses_bad_metadata(
    place: Place, mode: MergingMode, case: str, rescale: bool
) -> None:
    """R70: the restored checkpoint's ``_metadata`` is read back and validated before the
    running job ends or anything is deleted."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    before = _listing(place)
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
@on_file_systems
def test_recover_refuses_bad_metadata(place: Place, mode: MergingMode, case: str) -> None:
    """Recovery reads every ``_metadata`` of the crashed job before it changes anything."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    store.close()  # the process dies
    _recovery_refuses_then_succeeds(place, mode, case, good, ledger, _listing(place))


def _recovery_refuses_then_succeeds(
    place: Place, mode: MergingMode, case: str, good: bytes, ledger: Ledger, before: Listing
) -> None:
    """Recovery refuses the damaged ``_metadata`` with the case's error and changes
    nothing; with the good bytes back it recovers and every retained byte reads back."""
    with pytest.raises(MetadataError) as info:
        _recover(place, mode)
    _expect(info.value, case)
    _unchanged(place, None, before)
    place.write(META, good)
    new, report = _recover(place, mode)
    assert report.checkpoints == (2, 3)
    assert ledger.problems(new) == []
    assert testing.check_invariants(new) == []


@pytest.mark.parametrize("case", list(CASES))
@on_s3
def test_s3_refuses_bad_metadata(place: Place, mode: MergingMode, case: str) -> None:
    """The three tests above on S3, on one store per case: a coordinator restart, a
    restore and a rescale of the running job, then recovery once the process died. Each
    refuses with the same error and leaves every object (listed size and bytes) as it was;
    with the good bytes back, recovery succeeds and reads every retained byte back."""
    store, ledger = _store(place, mode)
    good = _damage(place, case)
    before = _listing(place)
    coord = store.coordinator
    readers: dict[str, Callable[[], object]] = {
        "restart": coord.restart,
        "restore": lambda: coord.restore(3),
        "rescale": lambda: coord.rescale(3, {"win": 3}),
    }
    for reader, call in readers.items():
        with pytest.raises(MetadataError) as info:
            call()
        _expect(info.value, case)
        _unchanged(place, store, before)
        assert store.job_id == "job-0", reader
        assert [r.checkpoint for r in coord.retained()] == [2, 3], reader
    store.close()  # the process dies (every file was uploaded already: nothing changes)
    _recovery_refuses_then_succeeds(place, mode, case, good, ledger, before)


@on_s3
def test_across_checkpoint_on_s3_is_refused_before_any_io(place: Place, mode: MergingMode) -> None:
    """R16: ACROSS_CHECKPOINT merging on S3 is a configuration error, for a new store and
    for the recovery of a job whose checkpoints are there; the objects stay as they were."""
    store, _ = _store(place, mode)
    store.close()
    before = _listing(place)
    across = MergingMode.ACROSS_CHECKPOINT
    with pytest.raises(ValueError, match=r"across-checkpoint-boundary .* \(R16\)"):
        CheckpointStore(place.url, _config(across), JOB, storage_options=_options(place))
    with pytest.raises(ValueError, match=r"across-checkpoint-boundary .* \(R16\)"):
        _recover(place, across)
    _unchanged(place, None, before)


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
    assert testing.check_invariants(store) == []


# --------------------------------------------------------------------------- data files


def _an_entry(store: CheckpointStore) -> StateEntry:
    latest = store.coordinator.retained()[-1]
    return next(e for e in latest.entries if e.name == "sst-3")


def _extent(entry: StateEntry) -> Extent:
    s = stream_of(entry.handle)
    assert s is not None
    return extent_of(s)


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
    before = _listing(place)
    with pytest.raises(RecoveryError) as rec:
        _recover(place, mode)
    msg = str(rec.value)
    assert path in msg and str(offset + length) in msg and str(offset + length - 3) in msg
    assert "chk-3" in msg or "checkpoint 3" in msg
    _unchanged(place, None, before)


def test_reading_a_handle_whose_file_is_missing(place: Place, mode: MergingMode) -> None:
    store, _ = _store(place, mode)
    entry = _an_entry(store)
    path, _, _ = _extent(entry)
    place.inner.rm_file(f"{place.root}/{path}")
    before = _listing(place)
    with pytest.raises(StorageFault) as info:
        store.read(entry)
    assert str(info.value).startswith(f"reading {path} failed: FileNotFoundError")
    assert isinstance(info.value.cause, FileNotFoundError)
    _unchanged(place, store, before)
    with pytest.raises(RecoveryError, match="missing"):
        _recover(place, mode)
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
    store.close()  # the notices' deletes done before the place is removed
