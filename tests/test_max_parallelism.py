"""R77 end to end (issue 14, defect 5): a checkpoint is restored, rescaled and recovered only
with the max parallelism it was taken with.

``recover(...)`` with max parallelism 256 or 64 on a job checkpointed with 128, if
accepted, would put key groups on the wrong subtasks or on none. The value is recorded in
the ``_metadata`` (version 2); a refusal names both values and leaves storage exactly as it
was; the same value is accepted and the job's bytes come back. A version-1 ``_metadata``
(no record) is judged by its key-group ranges; a version-2 file whose ranges exceed its
recorded value is bad metadata. Local files and ``memory://`` in every merging mode, S3
(moto) in WITHIN (ACROSS is refused there, R16; see ``test_bad_input``).
"""

# ruff: noqa: F811 (pytest fixtures imported above are test parameters of the same name)

from __future__ import annotations

import pytest

from fastimpl import CheckpointStore, MetadataError, RecoveryError, testing
from fastimpl.metadata import decode, encode
from spec.config import Config, MergingMode
from spec.errors import CommandError, Reason
from tests.faultyfs import Ledger, Place, payload
from tests.storage_settings import (
    JOB,
    KS,
    META,
    _listing,
    _options,
    _reseal,
    _unchanged,
    mode,  # noqa: F401
    place,  # noqa: F401
    setting,  # noqa: F401
)

TAKEN = 128


def _config(mode: MergingMode, max_parallelism: int = TAKEN) -> Config:
    return Config.for_mode(mode, num_retained=2, max_parallelism=max_parallelism)


def _store(
    place: Place, mode: MergingMode, max_parallelism: int = TAKEN, *, savepoint: bool = False
) -> tuple[CheckpointStore, Ledger]:
    """Three checkpoints (four and a savepoint, ``savepoint``) of a job that runs with
    ``max_parallelism``."""
    config = _config(mode, max_parallelism)
    store = CheckpointStore(place.url, config, JOB, storage_options=_options(place))
    ledger = Ledger()
    coord = store.coordinator
    kinds = [False] * 4 + [True] if savepoint else [False] * 3
    for is_savepoint in kinds:
        cid = coord.trigger(savepoint=is_savepoint)
        for sub, tm in sorted(store.placement().items()):
            data = payload(sub, f"sst-{cid}")
            ledger.record(store.job_id, cid, sub, f"sst-{cid}", data)
            store.task_manager(tm).write(cid, sub, KS, f"sst-{cid}", data)
            store.task_manager(tm).acknowledge(cid, sub)
        assert coord.complete(cid) is not None
        store.deliver_notifications()
    store.flush()
    return store, ledger


def _recover(place: Place, mode: MergingMode, max_parallelism: int) -> CheckpointStore:
    store, _ = CheckpointStore.recover(
        place.url, _config(mode, max_parallelism), JOB, storage_options=_options(place)
    )
    return store


@pytest.mark.parametrize("other", [64, 256])
def test_recover_refuses_a_changed_max_parallelism(
    place: Place, mode: MergingMode, other: int
) -> None:
    store, _ = _store(place, mode)
    store.close()
    before = _listing(place)
    with pytest.raises(RecoveryError) as err:
        _recover(place, mode, other)
    msg = str(err.value)
    assert f"max parallelism {TAKEN}" in msg and f"asks for {other}" in msg, msg
    assert "job-0/chk-2/_metadata" in msg, msg  # the oldest kept checkpoint, checked first
    _unchanged(place, None, before)
    again = _recover(place, mode, TAKEN)
    assert testing.check_invariants(again) == []
    again.close()


def test_restore_and_rescale_refuse_a_changed_max_parallelism(
    place: Place, mode: MergingMode
) -> None:
    store, _ = _store(place, mode)
    before = _listing(place)
    coord = store.coordinator
    for other in (64, 256):
        with pytest.raises(CommandError) as err:
            coord.restore(3, max_parallelism=other)
        assert err.value.reason is Reason.MAX_PARALLELISM_CHANGED
        assert str(TAKEN) in str(err.value) and str(other) in str(err.value)
        with pytest.raises(CommandError, match="max_parallelism_changed"):
            coord.rescale(3, {"win": 3}, max_parallelism=other)
    _unchanged(place, store, before)
    assert store.job_id == "job-0" and [r.checkpoint for r in coord.retained()] == [2, 3]
    coord.rescale(3, {"win": 3}, max_parallelism=TAKEN)
    assert store.job_id == "job-1"
    store.close()


def _beside(place: Place) -> Place:
    """Another storage root of the same kind, next to ``place``'s."""
    root = f"{place.root}-elsewhere"
    url = {"local": root, "memory": f"memory://{root}", "s3": f"s3://{root}"}[place.kind]
    return Place(place.kind, root, url, place.inner)


def test_a_savepoint_taken_with_another_max_parallelism_is_refused(
    place: Place, mode: MergingMode
) -> None:
    """R77 for a savepoint the user brings from a deployment that ran with max
    parallelism 64 into the savepoints of a job that runs with 128 (the one value a job
    has): restored with the job's value (the default) or with the savepoint's own, it is
    refused naming both values, before anything changes; the job goes on."""
    elsewhere = _beside(place)
    other, _ = _store(elsewhere, mode, 64, savepoint=True)
    sp = "savepoints/savepoint-5"
    brought = sorted(p for p in testing.observe(other).files if p.startswith(sp + "/"))
    assert f"{sp}/_metadata" in brought and decode(elsewhere.read(f"{sp}/_metadata")).savepoint
    other.close()
    store, _ = _store(place, mode)
    for rel in brought:
        place.inner.makedirs(f"{place.root}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
        place.write(rel, elsewhere.read(rel))
    before = _listing(place)
    coord = store.coordinator
    for asked, why in [
        (None, "the checkpoint was taken with max parallelism 64, the restore asks for 128"),
        (64, "the restore asks for max parallelism 64, the job runs with 128"),
    ]:
        with pytest.raises(CommandError) as err:
            coord.restore(5, max_parallelism=asked)
        assert err.value.reason is Reason.MAX_PARALLELISM_CHANGED
        assert f"{sp}/_metadata" in str(err.value) and why in str(err.value), str(err.value)
    _unchanged(place, store, before)
    assert store.job_id == "job-0" and [r.checkpoint for r in coord.retained()] == [2, 3]
    store.close()
    if place.kind == "memory":
        elsewhere.cleanup()


@pytest.mark.parametrize("setting", [("local", m) for m in MergingMode], ids=lambda s: s[1].name)
def test_version_1_metadata_is_judged_by_its_key_group_ranges(
    place: Place, mode: MergingMode
) -> None:
    """A ``_metadata`` written before the record existed (version 1) is still read; its
    ranges refuse 64 and 256 and accept 128."""
    store, _ = _store(place, mode)
    store.close()
    for rel in (META, META.replace("chk-3", "chk-2")):
        meta = decode(place.read(rel))
        assert meta.version == 2 and meta.max_parallelism == TAKEN
        old = encode(meta.checkpoint, meta.job, meta.savepoint, meta.entries, meta.directories)
        assert decode(old).version == 1
        place.write(rel, old)
    before = _listing(place)
    for other in (64, 256):
        with pytest.raises(RecoveryError, match=rf"another max parallelism than {other}"):
            _recover(place, mode, other)
    _unchanged(place, None, before)
    again = _recover(place, mode, TAKEN)
    assert testing.check_invariants(again) == []
    again.close()


@pytest.mark.parametrize("setting", [("local", m) for m in MergingMode], ids=lambda s: s[1].name)
def test_a_recorded_value_below_the_ranges_is_bad_metadata(place: Place, mode: MergingMode) -> None:
    store, _ = _store(place, mode)
    store.close()
    place.write(META, _reseal(place.read(META), lambda d: d["payload"].update(max_parallelism=64)))
    before = _listing(place)
    with pytest.raises(MetadataError, match=r"key_groups.*outside the key groups of max parall"):
        _recover(place, mode, 64)
    place.write(META, _reseal(place.read(META), lambda d: d["payload"].pop("max_parallelism")))
    with pytest.raises(MetadataError, match=r"payload.max_parallelism: missing field"):
        _recover(place, mode, TAKEN)
    _unchanged(place, None, {**before, **{k: v for k, v in _listing(place).items() if k == META}})
