"""The job's end (R90, R91) as the coordinator carries it out, on local files and memory.

- R90: each TM deletes the directories it created that no completed checkpoint used.
  When the TM's own delete of a file in such a directory fails at the end, the file goes
  with the directory, and the TM that wrote it deletes it. It is not handed to the
  coordinator and deleted later. In process the TM's discards empty the directory first,
  so only a failed delete leaves a file in it for the directory delete to find (issue 14,
  mutation run 12: `end_job` 23-40 survived without this test).
- The writer state an outside collector reads (``fastimpl.writer_state``) says, after the
  job's end, that the job no longer runs, as a boolean the audit's reader accepts
  (``pipeline.fence``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastimpl.writer_state import WRITER_STATE, publish_state
from pipeline import fence
from pipeline.location import Location
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
    ((stuck, writer),) = [(p, o) for p, o in store.observe().owners.items() if p.startswith(src0)]
    assert writer.startswith("tm:"), writer
    fs.fail("rm_file", path_contains=stuck)  # the TM's own delete of it fails once
    coord.cancel(retain=retain)
    assert fs.faults_fired == 1
    obs = store.observe()
    assert obs.files == {} and obs.directories == {}, (obs.files, obs.directories)
    assert not place.inner.exists(f"{place.root}/{stuck}")
    # R90: deleted by the TM that wrote it, with its directory; once, as its owner
    assert [(d.actor, d.owner, d.existed) for d in obs.deletions if d.path == stuck] == [
        (writer, writer, True)
    ]
    assert store.check_invariants() == []
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
