"""The job's end (R90, R91) as the coordinator carries it out, on local files and memory.

- R90: each TM deletes the directories it created that no completed checkpoint used.
  When the TM's own delete of a file in such a directory fails at the end, the file goes
  with the directory, and the TM that wrote it deletes it. It is not handed to the
  coordinator and deleted later. In process the TM's discards empty the directory first,
  so only a failed delete leaves a file in it for the directory delete to find, which is
  what this test sets up.
- The writer state an outside collector reads (``fastimpl.writer_state``) says, after the
  job's end, that the job no longer runs, as a boolean the audit's reader accepts
  (``pipeline.fence``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastimpl import testing
from fastimpl.api import publish_state
from fastimpl.writer_state import WRITER_STATE
from pipeline import fence
from pipeline.location import Location
from spec.commands import StorageOp
from spec.config import Config, MergingMode, StateKind
from spec.layout import job_base
from tests.faultyfs import Place, payload
from tests.storage_settings import JOB

KS = StateKind.KEYED_SHARED
KINDS = ("local", "memory")
MANAGED_MODES = (MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT)
"""The modes whose TMs write into managed directories (NONE writes whole files)."""


@pytest.mark.parametrize("retain", [False, True], ids=["discard", "retain"])
@pytest.mark.parametrize("mode", MANAGED_MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("kind", KINDS)
def test_r90_a_file_its_tm_failed_to_delete_goes_with_the_tms_directory(
    tmp_path: Path, kind: str, mode: MergingMode, retain: bool
) -> None:
    place = Place.make(kind, tmp_path)
    store, fs = place.store(Config.for_mode(mode), JOB, background_deletes=False)
    coord = store.coordinator
    cid = coord.trigger()  # no checkpoint completes: no directory is handed over
    for sub, tm in sorted(store.placement().items()):
        store.task_manager(tm).write(cid, sub, KS, "sst", payload(sub, "sst"))
    src0 = f"{job_base(store.job_id)}/shared/src-0-2/"
    owners = testing.observe(store).owners
    ((stuck, writer),) = [(p, o) for p, o in owners.items() if p.startswith(src0)]
    assert writer.startswith("tm:"), writer
    fs.fail("rm_file", path_contains=stuck)  # the TM's own delete of it fails once
    coord.cancel(retain=retain)
    assert fs.faults_fired == 1
    obs = testing.observe(store)
    assert obs.files == {} and obs.directories == {}, (obs.files, obs.directories)
    assert not place.inner.exists(f"{place.root}/{stuck}")
    # R90: deleted by the TM that wrote it, with its directory; once, as its owner
    assert [(d.actor, d.owner, d.existed) for d in obs.deletions if d.path == stuck] == [
        (writer, writer, True)
    ]
    assert testing.check_invariants(store) == []
    store.close()
    place.cleanup()


@pytest.mark.parametrize("retain", [False, True], ids=["discard", "retain"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_published_writer_state_says_the_job_ended(
    tmp_path: Path, kind: str, retain: bool
) -> None:
    place = Place.make(kind, tmp_path)
    store, _ = place.store(Config.for_mode(MergingMode.WITHIN_CHECKPOINT), JOB)
    publish_state(store)
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        store.task_manager(tm).write(cid, sub, KS, "sst", payload(sub, "sst"))
        store.task_manager(tm).acknowledge(cid, sub)
    assert coord.complete(cid) is not None
    coord.cancel(retain=retain)
    base = job_base(store.job_id)
    doc = json.loads(place.inner.cat_file(f"{place.root}/{base}/{WRITER_STATE}"))
    assert doc["running"] is False, doc
    assert doc["pending"] == [] and doc["open_files"] == [], doc
    if kind == "local":  # what the audit reads before it deletes (it reads no memory://)
        state = fence.read_state(Location.parse(f"{place.root}/{base}"))
        assert state is not None and state.running is False
    store.close()
    place.cleanup()


@pytest.mark.parametrize("mode", MANAGED_MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("kind", KINDS)
def test_r90_files_whose_background_delete_keeps_failing_stay_their_deleters(
    tmp_path: Path, kind: str, mode: MergingMode
) -> None:
    """R45 with R90: while a background delete keeps failing, what it was to delete is
    still on storage and is reported as its deleter's (``observe().owners``), whether it
    was a file deleted on its own or one inside a directory deleted whole; a retry that
    succeeds removes both. The TM's first delete fails before it is queued, so that file
    stays in the TM's records and goes with its directory (R90)."""
    place = Place.make(kind, tmp_path)
    store, fs = place.store(Config.for_mode(mode), JOB)
    coord = store.coordinator
    cid = coord.trigger()  # no checkpoint completes: no directory is handed over
    for sub, tm in sorted(store.placement().items()):
        store.task_manager(tm).write(cid, sub, KS, "sst", payload(sub, "sst"))
    written = dict(testing.observe(store).owners)
    assert written and all(o.startswith("tm:") for o in written.values()), written
    store._engine.storage.arm(StorageOp.DELETE)
    removals = ("remove", "rmtree") if kind == "local" else ("rm_file", "rm")
    for method in removals:
        fs.fail(method, path_contains=job_base(store.job_id), times=10_000)
    coord.cancel(retain=False)
    store.flush()
    seen = testing.observe(store)
    assert set(written) <= set(seen.files), sorted(set(written) - set(seen.files))
    whole = [f for f in store.delete_failures() if f.is_dir and f.deleted_by]
    assert whole, "no directory holding a file of the store failed to go whole"
    for p, writer in sorted(written.items()):
        assert seen.owners.get(p) == writer, (p, seen.owners.get(p), writer)
    fs.heal()
    assert store.retry_deletes() == []
    store.flush()
    seen = testing.observe(store)
    assert seen.files == {} and seen.owners == {}, (seen.files, seen.owners)
    assert testing.check_invariants(store) == []
    store.close()
    place.cleanup()
