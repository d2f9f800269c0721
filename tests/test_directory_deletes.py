"""Whole-directory deletes of an earlier job's directories (R42, issue 14).

A CLAIM restore hands the new job's coordinator the directories of the earlier job's
checkpoint; once that checkpoint is subsumed, the coordinator deletes each of them whole
(WITHIN and ACROSS: the subtasks' shared directories and the TMs' task-owned ones; NONE
deletes the files one by one). Two things must hold there:

- a directory that holds a file the store did not write (planted by a user or another
  run) is not deleted whole: the store's own files in it go one by one, each with a
  deletion record naming the coordinator as who deleted it, and the planted file stays;
- once the earlier job's last directory goes, the folders that held them
  (``job-N/shared``, ``job-N/taskowned``) go too on a local disk: an emptied folder of a
  finished job would otherwise stay forever (object stores and ``memory://`` have no
  directories of their own to leave behind).

Both were survivors of issue 14's mutation run (``_delete_dir`` 45, 50 and 52 in
``model_tests/mutation_survivors.md``).
"""

# ruff: noqa: F811 (pytest fixtures imported above are test parameters of the same name)

from __future__ import annotations

import os

import pytest

from fastimpl import CheckpointStore
from spec.config import Config, MergingMode, RestoreMode
from spec.effects import COORDINATOR
from tests.faultyfs import Place
from tests.storage_settings import (
    JOB,
    _checkpoint,
    _options,
    mode,  # noqa: F401
    place,  # noqa: F401
    setting,  # noqa: F401
)


def _earlier_job(place: Place, mode: MergingMode) -> tuple[CheckpointStore, int]:
    store = CheckpointStore(
        place.url,
        Config.for_mode(mode, num_retained=1),
        JOB,
        storage_options=_options(place),
        deletion_log=True,  # the tests read who deleted each file
    )
    assert _checkpoint(store) is not None
    cid = _checkpoint(store)
    assert cid is not None
    return store, cid


def _claim_and_subsume(store: CheckpointStore, cid: int) -> None:
    """Restore the earlier job's checkpoint in CLAIM mode, then checkpoint until it is
    subsumed (one retained): its directories are the coordinator's to delete now."""
    assert store.coordinator.restore(cid, mode=RestoreMode.CLAIM) == "job-1"
    for _ in range(2):
        assert _checkpoint(store) is not None
    store.flush()
    assert [r.job for r in store.coordinator.retained()] == ["job-1"]


def test_a_claimed_directory_holding_a_planted_file_loses_only_the_stores_files(
    place: Place, mode: MergingMode
) -> None:
    store, cid = _earlier_job(place, mode)
    held = sorted(
        {p.rsplit("/", 1)[0] for p in store.observe().files if p.startswith("job-0/")}
        - {f"job-0/chk-{cid}"}
    )
    assert held, "the earlier job wrote no shared or task-owned file"
    stores_files = {p for p in store.observe().files if any(p.startswith(d + "/") for d in held)}
    planted = [f"{place.root}/{d}/not-the-stores" for d in held]
    for p in planted:
        place.inner.pipe_file(p, b"precious")
    _claim_and_subsume(store, cid)
    for p in planted:
        assert place.inner.cat_file(p) == b"precious", p
    left = set(store.observe().files)
    deletions = {d.path: d for d in store.observe().deletions}
    for p in sorted(stores_files):
        assert p not in left, p
        assert p in deletions, p
        # the one-by-one deletes name who deleted, as a whole-directory delete does
        assert deletions[p].actor == COORDINATOR, deletions[p]
    assert [v for v in store.check_invariants() if v.invariant == "I5"] == []
    store.close()


@pytest.mark.parametrize(
    "setting", [("local", m) for m in MergingMode], ids=lambda s: f"{s[0]}-{s[1].name}"
)
def test_the_folders_of_an_earlier_job_go_with_its_last_directory(
    place: Place, mode: MergingMode
) -> None:
    store, cid = _earlier_job(place, mode)
    base = os.path.join(place.root, "job-0")
    assert {"shared", f"chk-{cid}"} <= set(os.listdir(base))
    _claim_and_subsume(store, cid)
    left = [os.path.relpath(d, place.root) for d, _, _ in os.walk(base)]
    # the job's base itself stays (a base is never deleted, only what is below it)
    assert left == ["job-0"], left
    assert store.check_invariants() == []
    store.close()
