"""Whole files an acknowledgement hands to the coordinator (R43) that a checkpoint still
needs, on local files and memory.

The acknowledgement comes from the subtask's current attempt (``receive_ack``, as a TM in
another process sends it) for a pending checkpoint. It names as a whole file
(``FileHandle``) a file that something else needs:
- a file of the retained checkpoint;
- the retained checkpoint's ``_metadata``;
- a file of the checkpoint a NO_CLAIM restore is starting from (the user's, R73).

A TM that lost its registry's knowledge re-sends an unchanged file whole. A hostile or
buggy TM can send anything. The end of the pending checkpoint must not take that file
with it (I1, I5):

- R95: a coordinator restart forgets the pending checkpoint and deletes what its
  acknowledgements handed over, except what a retained or restored checkpoint needs
  (``referenced``). Mutation run 12: without this test `restart` 16 and 17 and
  `referenced` 4, 13 and 14 survived;
- R43 with R57: an abort deletes every whole file the acknowledgements handed over. It
  deletes these three too. This is a bug in the product, found in mutation run 12 and
  not fixed here. The test is marked ``xfail(strict=True)`` until it is fixed; the
  restored case also breaks I5, since the acknowledgement made the user's file the
  coordinator's (``_take_over_files`` takes any record it holds);
- R43: an acknowledgement received again after its checkpoint completed (a retried
  message) has its whole files deleted as a late one's, though they are the completed
  checkpoint's own. The same bug, also ``xfail(strict=True)``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fastimpl import CheckpointStore
from spec.config import Config, MergingMode, RestoreMode, Scope, StateKind
from spec.handles import FileHandle, StateEntry
from spec.messages import Acknowledgement
from tests.faultyfs import Place
from tests.storage_settings import JOB, _checkpoint

KINDS = ("local", "memory")
NAMED = ("retained-file", "retained-metadata", "restored-file")


def _ack_naming(place: Place, named: str) -> tuple[CheckpointStore, str, int]:
    """NONE mode (whole files): checkpoint 1 retained (or restored from in NO_CLAIM
    mode); a later checkpoint pending, with an acknowledgement that names the ``named``
    file as its own. The store, that file's path and the pending checkpoint."""
    store, _ = place.store(Config.for_mode(MergingMode.NONE, num_retained=1), JOB)
    cid = _checkpoint(store)
    assert cid is not None
    if named == "restored-file":
        store.coordinator.restore(cid, mode=RestoreMode.NO_CLAIM)
    co = store._engine.coord
    if named == "restored-file":
        entry = next(e for e in co.restoring if isinstance(e.handle, FileHandle))
    else:
        (done,) = co.retained
        entry = next(e for e in done.entries if isinstance(e.handle, FileHandle))
        if named == "retained-metadata":
            size = co.catalog.files[done.metadata].size
            meta = FileHandle(done.metadata, size, "whole-metadata", Scope.EXCLUSIVE)
            entry = StateEntry(entry.subtask, StateKind.OPERATOR_LIST, "meta", meta)
    assert isinstance(entry.handle, FileHandle)
    pending = store.coordinator.trigger()
    attempt = store.placement()[entry.subtask]
    co.receive_ack(Acknowledgement(co.job, pending, entry.subtask, attempt, (entry,)))
    assert pending in co.pending  # the acknowledgement was taken
    return store, entry.handle.path, pending


def _still_there(store: CheckpointStore, path: str) -> None:
    store.flush()
    obs = store.observe()
    assert path in obs.files, f"{path}: deleted though a checkpoint needs it"
    assert [d for d in obs.deletions if d.path == path] == []
    assert [v for v in store.check_invariants() if v.invariant in ("I1", "I5")] == []
    views = store.coordinator.retained()
    entries = [e for v in views for e in v.entries] or list(store._engine.coord.restoring)
    assert entries and all(store.read(e) for e in entries)  # every byte still reads


@pytest.mark.parametrize("named", NAMED)
@pytest.mark.parametrize("kind", KINDS)
def test_r95_a_restart_keeps_a_needed_file_a_pending_acknowledgement_named(
    tmp_path: Path, kind: str, named: str
) -> None:
    place = Place.make(kind, tmp_path)
    store, path, _ = _ack_naming(place, named)
    try:
        store.coordinator.restart()
        _still_there(store, path)
    finally:
        store.close()
        place.cleanup()


@pytest.mark.xfail(
    strict=True,
    reason="bug: abort() deletes every whole file the pending acknowledgements handed over "
    "(R43), even one a retained or restored checkpoint needs; restart() checks "
    "referenced(), abort() does not (mutation run 12)",
)
@pytest.mark.parametrize("named", NAMED)
@pytest.mark.parametrize("kind", KINDS)
def test_r43_an_abort_keeps_a_needed_file_a_pending_acknowledgement_named(
    tmp_path: Path, kind: str, named: str
) -> None:
    place = Place.make(kind, tmp_path)
    store, path, pending = _ack_naming(place, named)
    try:
        store.coordinator.abort(pending)
        _still_there(store, path)
    finally:
        store.close()
        place.cleanup()


@pytest.mark.xfail(
    strict=True,
    reason="bug: receive_ack() deletes the whole files of an acknowledgement that comes "
    "after its checkpoint completed (R43), even those the completed checkpoint uses "
    "(mutation run 12)",
)
@pytest.mark.parametrize("kind", KINDS)
def test_r43_a_repeated_acknowledgement_keeps_the_files_its_completed_checkpoint_uses(
    tmp_path: Path, kind: str
) -> None:
    """The acknowledgement that completed checkpoint 1, received once more (a retried
    message) after the completion: a late acknowledgement's whole files are deleted
    (R43), but these are the retained checkpoint's own."""
    place = Place.make(kind, tmp_path)
    store, _ = place.store(Config.for_mode(MergingMode.NONE, num_retained=1), JOB)
    try:
        cid = _checkpoint(store)
        assert cid is not None
        co = store._engine.coord
        (done,) = co.retained
        entry = next(e for e in done.entries if isinstance(e.handle, FileHandle))
        assert isinstance(entry.handle, FileHandle)
        again = [e for e in done.entries if e.subtask == entry.subtask]
        attempt = store.placement()[entry.subtask]
        co.receive_ack(Acknowledgement(co.job, cid, entry.subtask, attempt, tuple(again)))
        _still_there(store, entry.handle.path)
    finally:
        store.close()
        place.cleanup()
