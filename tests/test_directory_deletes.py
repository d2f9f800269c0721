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

Without these tests, mutations of ``Catalog.delete_dir`` that break either survive the
rest of the suite (``model_tests/mutation_survivors.md`` names those these tests kill).
"""

# ruff: noqa: F811 (pytest fixtures imported above are test parameters of the same name)

from __future__ import annotations

import os

import pytest

from fastimpl import CheckpointStore, testing
from fastimpl.ids import marked
from spec.config import Config, MergingMode, RestoreMode, StateKind
from spec.effects import COORDINATOR, USER, tm_actor
from spec.ids import TmId
from spec.layout import shared_dir, taskowned_dir
from tests.faultyfs import FaultyFileSystem, Place, payload
from tests.storage_settings import (
    JOB,
    KS,
    OP,
    _checkpoint,
    _options,
    mode,  # noqa: F401
    place,  # noqa: F401
    setting,  # noqa: F401
)

# Local disk and memory, in each mode that keeps directories (WITHIN, ACROSS).
_MERGING = pytest.mark.parametrize(
    "setting",
    [(k, m) for k in ("local", "memory") for m in MergingMode if m is not MergingMode.NONE],
    ids=lambda s: f"{s[0]}-{s[1].name}",
)


def _earlier_job(place: Place, mode: MergingMode) -> tuple[CheckpointStore, int]:
    store = CheckpointStore(
        place.url,
        Config.for_mode(mode, num_retained=1),
        JOB,
        storage_options=_options(place),
    )
    testing.keep_deletion_log(store)  # the tests read who deleted each file
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
        {p.rsplit("/", 1)[0] for p in testing.observe(store).files if p.startswith("job-0/")}
        - {f"job-0/chk-{cid}"}
    )
    assert held, "the earlier job wrote no shared or task-owned file"
    seen = testing.observe(store).files
    stores_files = {p for p in seen if any(p.startswith(d + "/") for d in held)}
    planted = [f"{place.root}/{d}/not-the-stores" for d in held]
    for p in planted:
        place.inner.pipe_file(p, b"precious")
    _claim_and_subsume(store, cid)
    for p in planted:
        assert place.inner.cat_file(p) == b"precious", p
    left = set(testing.observe(store).files)
    deletions = {d.path: d for d in testing.observe(store).deletions}
    for p in sorted(stores_files):
        assert p not in left, p
        assert p in deletions, p
        # the one-by-one deletes name who deleted, as a whole-directory delete does
        assert deletions[p].actor == COORDINATOR, deletions[p]
    assert [v for v in testing.check_invariants(store) if v.invariant == "I5"] == []
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
    assert testing.check_invariants(store) == []
    store.close()


def _operator_checkpoint(store: CheckpointStore) -> int:
    """A checkpoint of operator state only: it names the TMs' task-owned directories and
    no subtask's shared directory."""
    cid = _checkpoint(store, keyed=False)
    assert cid is not None
    return cid


@_MERGING
def test_a_claim_leaves_a_zombies_files_in_its_directories_to_the_zombies_stop(
    place: Place, mode: MergingMode
) -> None:
    """R72 with R64, for a lost TM that still runs in a process of its own: its files are
    planted here as it names them (``fastimpl.ids.marked``), and no record of this process
    holds them. It wrote one into its task-owned directory, which the claimed checkpoint
    names, and one into its subtask's shared directory, which that checkpoint does not.
    The CLAIM restore takes neither (the checkpoint refers to neither: the zombie may still
    delete them); the claimed checkpoint is subsumed and its directory's delete waits; a
    second restore follows while the zombie runs; when it stops, the sweep of where it
    could write (the directories of the subtask it ran, in the job it ran for) takes both."""
    store = CheckpointStore(
        place.url,
        Config.for_mode(mode, num_retained=1),
        JOB,
        storage_options=_options(place),
    )
    testing.keep_deletion_log(store)
    cid = _operator_checkpoint(store)
    sub, zombie = sorted(store.placement().items())[0]
    named = store.coordinator.retained()[-1].directories
    assert taskowned_dir("job-0", zombie) in named and shared_dir("job-0", sub) not in named
    testing.crash(store, zombie)
    store.coordinator.failover()
    claimed = f"{taskowned_dir('job-0', zombie)}/{marked('fzombie1', zombie)}"
    swept = f"{shared_dir('job-0', sub)}/{marked('fzombie2', zombie)}"
    for p in (claimed, swept):
        place.inner.makedirs(f"{place.root}/{p.rsplit('/', 1)[0]}", exist_ok=True)
        place.write(p, b"written by the zombie")
    assert store.coordinator.restore(cid, mode=RestoreMode.CLAIM) == "job-1"
    owners = testing.observe(store).owners
    assert claimed not in owners and swept not in owners, owners
    for _ in range(2):  # num_retained 1: the claimed checkpoint is subsumed
        latest = _operator_checkpoint(store)
    assert {claimed, swept} <= set(testing.observe(store).files)  # R64: the zombie may run
    assert store.coordinator.restore(latest, mode=RestoreMode.NO_CLAIM) == "job-2"
    testing.stopped(store, zombie)
    store.flush()
    left = set(testing.observe(store).files)
    assert claimed not in left and swept not in left
    assert testing.check_invariants(store) == []
    store.close()


def _abort_with_an_unlisted_directory(
    store: CheckpointStore, fs: FaultyFileSystem, place: Place, kinds: tuple[StateKind, ...]
) -> tuple[str, TmId]:
    """Every subtask writes ``kinds`` for a checkpoint and acknowledges; the listing of
    the first TM's task-owned directory is armed to fail once, and the checkpoint is
    aborted: that directory's delete is what meets the failed listing. Returns the
    directory and its TM."""
    cid = store.coordinator.trigger()
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        for kind in kinds:
            name = "sst" if kind is KS else "offsets"
            mgr.write(cid, sub, kind, name, payload(sub, name))
        mgr.acknowledge(cid, sub)
    tm = sorted(set(store.placement().values()))[0]
    d = taskowned_dir("job-0", tm)
    fs.fail("scandir" if place.kind == "local" else "find", path_contains=d)
    store.coordinator.abort(cid)
    store.deliver_notifications()
    store.flush()
    return d, tm


@_MERGING
def test_a_directory_that_cannot_be_listed_is_kept_and_deleted_by_a_retry(
    place: Place, mode: MergingMode
) -> None:
    """Before a recursive delete the store lists the directory (what it did not write
    must stay). If that listing fails it cannot tell, so the directory is not deleted:
    the delete waits (R45, ``pending_deletes``) and ``retry_deletes`` carries it out
    later, as the directory's owner. The directory here is a TM's task-owned one, which
    only its first checkpoint used: once that checkpoint aborts, the TM deletes the
    checkpoint's files one by one, then the directory whole (R41)."""
    store, fs = place.store(Config.for_mode(mode, num_retained=1), JOB, lease=True)
    d, tm = _abort_with_an_unlisted_directory(store, fs, place, (KS, OP))
    on_disk = os.path.join(place.root, d)
    assert fs.armed() == 0, "the directory was never listed"
    seen = testing.observe(store)
    assert seen.directories.get(d) == tm_actor(tm), seen.directories
    assert seen.pending_deletes == (d,), seen.pending_deletes
    assert place.kind != "local" or os.path.isdir(on_disk)
    others = {p for p in seen.directories if p != d}
    assert not others, f"only the unlisted directory stays: {sorted(others)}"
    assert store.retry_deletes() == []
    store.flush()
    seen = testing.observe(store)
    assert seen.directories == {} and seen.pending_deletes == (), seen
    assert not os.path.exists(on_disk)
    assert not seen.files, sorted(seen.files)
    assert testing.check_invariants(store) == []
    store.close()


@_MERGING
def test_a_zombies_unrecorded_file_holds_back_only_the_directory_it_is_in(
    place: Place, mode: MergingMode
) -> None:
    """R64 for a recursive delete, by the names of files no record holds: a lost TM that
    still runs in a process of its own writes a file (named as it names them,
    ``fastimpl.ids.marked``) into a claimed directory that a live TM made, after the
    claim. Once the claimed checkpoint is subsumed, that directory's delete waits until
    the zombie stops (its file stays); the claimed directories the live TM made that hold
    nothing of the zombie's go at once. No lease here: a directory delete that runs
    removes everything in it, the zombie's file too."""
    store, _ = place.store(Config.for_mode(mode, num_retained=1), JOB)
    cid = _checkpoint(store)
    assert cid is not None
    zombie, live = sorted(set(store.placement().values()))
    goes = sorted(shared_dir("job-0", s) for s, t in store.placement().items() if t == live)
    testing.crash(store, zombie)
    store.coordinator.failover()
    assert store.coordinator.restore(cid, mode=RestoreMode.CLAIM) == "job-1"
    waits = taskowned_dir("job-0", live)
    dirs = testing.observe(store).directories
    assert {waits, *goes} <= set(dirs), dirs
    late = f"{waits}/{marked('fzombie1', zombie)}"
    place.write(late, b"written by the zombie after the claim")
    for _ in range(2):  # num_retained 1: the claimed checkpoint is subsumed
        assert _checkpoint(store) is not None
    store.flush()
    seen = testing.observe(store)
    assert late in seen.files, "the zombie's file went while the zombie may run"
    assert waits in seen.pending_deletes and waits in seen.directories, seen.pending_deletes
    held = [d for d in goes if d in seen.directories or d in seen.pending_deletes]
    assert not held, f"held back though nothing of the zombie's is there: {held}"
    testing.stopped(store, zombie)
    store.flush()
    seen = testing.observe(store)
    assert late not in seen.files and waits not in seen.directories
    assert seen.pending_deletes == (), seen.pending_deletes
    assert testing.check_invariants(store) == []
    store.close()


@_MERGING
def test_a_directory_whose_delete_waited_stays_once_the_user_holds_it(
    place: Place, mode: MergingMode
) -> None:
    """R45, R42, R91: a TM's delete of its directory waits (its listing failed); the
    TM's next checkpoint writes into the same directory and completes, so the directory
    is the coordinator's and in use; the job is cancelled keeping its checkpoints, which
    are the user's from then on, directory included. The retry of the delete that waited
    leaves the directory and its files alone, and nothing even tries to delete them (a
    refused delete is an I5 violation)."""
    store, fs = place.store(Config.for_mode(mode, num_retained=1), JOB, lease=True)
    d, _ = _abort_with_an_unlisted_directory(store, fs, place, (OP,))
    assert testing.observe(store).pending_deletes == (d,)
    assert _operator_checkpoint(store) is not None
    assert d in store.coordinator.retained()[-1].directories
    kept = {p for p in testing.observe(store).files if p.startswith(d + "/")}
    assert kept, "the next checkpoint wrote nothing into the directory"
    store.coordinator.cancel(retain=True)
    store.flush()
    assert testing.observe(store).directories.get(d) == USER
    store.retry_deletes()
    store.flush()
    seen = testing.observe(store)
    assert seen.directories.get(d) == USER and kept <= set(seen.files)
    assert testing.check_invariants(store) == []
    store.close()
