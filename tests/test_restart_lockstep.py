"""R95 in lockstep: the in-process restart builds a new coordinator from storage, the
running TMs' ``Holdings`` and the HA state (``fastimpl.resume.rebuild``), while the
model's ``RestartCoordinator`` keeps what its coordinator knew. After each command of
these sequences the two must agree, file by file and directory by directory, on what
the rebuilt coordinator can only learn from storage: whose an aborted savepoint's file
is, a claimed checkpoint's working files, the user's directories of a job a NO_CLAIM
restore ended, a working file an acknowledgement handed over for a checkpoint that
aborted. Each was a difference the lockstep machine found first."""

from __future__ import annotations

import itertools
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from conformance.harness import DEFAULT_JOB, MERGING, Harness
from model_tests.targets import FastimplTarget
from spec import commands as c
from spec.config import Config, MergingMode, RestoreMode, StateKind
from spec.effects import COORDINATOR, USER
from spec.errors import Reason
from spec.layout import working_dir
from tests.lockstep import Backend, LockstepHarness

_runs = itertools.count()
STORAGES = ["memory", "local"]


def _harness(mode: MergingMode, storage: str, tmp_path: Path) -> LockstepHarness:
    if storage == "memory":
        backend = Backend("memory", fsspec.filesystem("memory"), f"/restart-{next(_runs)}")
    else:
        backend = Backend("local", LocalFileSystem(), str(tmp_path))
    cfg = Config.for_mode(mode, num_retained=1, max_file_size=120, max_space_amplification=0.5)
    return LockstepHarness(cfg, DEFAULT_JOB, backend, backend.new_root(), FastimplTarget)


def _owners(h: LockstepHarness) -> dict[str, str]:
    return dict(h.impl_obs.owners)


def _goes_on(h: LockstepHarness) -> None:
    """The rebuilt coordinator takes a checkpoint, then the job goes quiet, both sides
    compared at each step, with every invariant holding (I1-I7)."""
    h.checkpoint()
    assert h.quiesce() == []


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("mode", list(MergingMode))
def test_a_restart_waits_for_every_lost_attempt_to_stop(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R64, R95: both refuse the restart while an attempt given up on may still write
    (``ATTEMPT_MAY_RUN``), and restart once it is known stopped."""
    h = _harness(mode, storage, tmp_path)
    h.checkpoint()
    h.run(c.CrashTm("tm-2"))
    err = h.try_run(c.RestartCoordinator())
    assert err is not None and err.reason is Reason.ATTEMPT_MAY_RUN
    h.run(c.AttemptStopped("tm-2"))
    h.run(c.RestartCoordinator())
    _goes_on(h)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("mode", MERGING)
def test_an_aborted_savepoints_file_stays_its_tms_across_the_restart(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R55, R95: a savepoint that aborted is not the user's: the file a TM wrote in its
    directory stays the TM's across the rebuild (the HA state names the savepoints that
    did not complete, and the TM answers ``Holdings``), and the TM deletes it when it
    drops what it kept of the abort; no record of it is left as the user's."""
    h = _harness(mode, storage, tmp_path)
    h.run(c.Trigger(savepoint=True))
    s = h.subtasks[0]
    h.run(c.WriteState(1, s, StateKind.OPERATOR_LIST, "offsets", 10))
    h.run(c.Abort(1))  # its notice not delivered: the TM still holds what it wrote
    h.run(c.RestartCoordinator())  # the TM drops what it kept of the abort at its reset
    assert not [p for p in _owners(h) if p.startswith("savepoints/")]  # no one's, not the user's
    gone = [d for d in h.impl_obs.deletions if d.path.startswith("savepoints/")]
    assert gone and all(d.actor == d.owner == "tm:tm-1" for d in gone)
    _goes_on(h)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("mode", list(MergingMode))
def test_a_claimed_checkpoints_working_files_stay_the_coordinators(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R72, R104, R105: after a CLAIM restore the claimed checkpoint's working files (in
    place, in the old job's base) are the coordinator's, and stay so once the new job's
    first checkpoint subsumed it while its databases use them; a restart keeps them the
    coordinator's (the HA state names them), not the user's."""
    h = _harness(mode, storage, tmp_path)
    s = h.subtasks[0]
    h.run(c.Trigger())
    h.run(c.WriteWorking(s, 1))
    h.run(c.SnapshotWorking(1, s, 0))
    for sub in h.subtasks:
        h.run(c.Acknowledge(1, sub))
    h.run(c.Complete(1))
    h.run(c.Restore(1, (("agg", 1),), RestoreMode.CLAIM))
    h.checkpoint()  # the claimed checkpoint is subsumed; the databases still use its files
    h.run(c.RestartCoordinator())
    old = working_dir("job-0", s)
    kept = {p: o for p, o in _owners(h).items() if p.startswith(old)}
    assert kept and set(kept.values()) == {COORDINATOR}
    _goes_on(h)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("mode", MERGING)
def test_the_users_directories_of_an_ended_job_stay_the_users(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R73, R91, R95: a NO_CLAIM restore ends the old job keeping its checkpoint, whose
    files and directories are the user's; the new job completes its own, then restarts:
    the rebuilt coordinator reads the old job's ``_metadata`` (a base this store made,
    in the HA state) and knows those directories as the user's still."""
    h = _harness(mode, storage, tmp_path)
    h.checkpoint()
    h.run(c.Restore(1, (), RestoreMode.NO_CLAIM))
    h.checkpoint()
    h.run(c.RestartCoordinator())
    users = {d for d, o in h.impl_obs.directories.items() if o == USER}
    assert users and all(d.startswith("job-0/") for d in users)
    _goes_on(h)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("mode", list(MergingMode))
def test_a_working_file_handed_over_for_an_aborted_checkpoint_waits_for_the_collection(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R100, R104, R95: an acknowledgement handed a working file over in place, then its
    checkpoint aborted and the database dropped it: the file is the coordinator's, and
    its collection decides, not the restart (the rebuilt coordinator keeps it shared)."""
    h = _harness(mode, storage, tmp_path)
    s = h.subtasks[0]
    h.run(c.Trigger())
    h.run(c.WriteWorking(s, 35))
    h.run(c.SnapshotWorking(1, s, 0))
    h.run(c.Acknowledge(1, s))
    h.run(c.Abort(1))
    handed = {p for p, o in _owners(h).items() if o == COORDINATOR and "/working/" in p}
    assert handed
    (name,) = (p for p in Harness.observe(h).owners if "/working/" in p)  # the model's name
    h.run(c.DropWorking(s, name))  # no database uses it now: only the collection decides
    h.run(c.RestartCoordinator())
    assert handed <= {p for p, o in _owners(h).items() if o == COORDINATOR}
    h.run(c.CollectWorking())
    _goes_on(h)
