"""R64 for whole-directory deletes: a managed directory is deleted only once neither its
creator nor the creator of any file in it is a lost attempt that may still write.

The corpus and the rule tests only ever build directories whose files the zombie created
itself, so a mutation that drops either half of the wait in ``Catalog.delete_dir``
passes them: each half covers for the other. Here the creators differ both ways, on fastimpl in
lockstep with the model, on memory and on local disk."""

from __future__ import annotations

import itertools
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from conformance.harness import DEFAULT_JOB, KS, MERGING
from fastimpl.catalog import Catalog
from fastimpl.engine import InProcessEngine
from fastimpl.records import FOUND, ManagedDir, StoredFile
from model_tests.targets import FastimplTarget
from spec import commands as c
from spec.config import Config, MergingMode
from spec.effects import Effect
from spec.errors import CommandError, Reason
from spec.ids import SubtaskId
from tests.lockstep import Backend, LockstepHarness

_runs = itertools.count()


def _harness(mode: MergingMode, storage: str, tmp_path: Path) -> LockstepHarness:
    if storage == "memory":
        backend = Backend("memory", fsspec.filesystem("memory"), f"/zombie-dirs-{next(_runs)}")
    else:
        backend = Backend("local", LocalFileSystem(), str(tmp_path))
    cfg = Config.for_mode(mode, max_file_size=100)
    return LockstepHarness(cfg, DEFAULT_JOB, backend, backend.new_root(), FastimplTarget)


def _cluster(h: LockstepHarness) -> InProcessEngine:
    assert isinstance(h.target, FastimplTarget)
    return h.target.engine


def _catalogs(cl: InProcessEngine) -> list[Catalog]:
    """Each party's records: the coordinator's, then each TM attempt's."""
    return [cl.catalog, *(cl.parties[tm].catalog for tm in sorted(cl.parties))]


def _files(cl: InProcessEngine) -> dict[str, StoredFile]:
    """Every party's records of files, merged (each party keeps its own)."""
    out: dict[str, StoredFile] = {}
    for cat in _catalogs(cl):
        for path, f in cat.files.items():
            out.setdefault(path, f)
    return out


def _dirs(cl: InProcessEngine) -> dict[str, ManagedDir]:
    """Every party's records of the directories it made or was given (not those it
    only found made by another party and writes in), merged."""
    out: dict[str, ManagedDir] = {}
    for cat in _catalogs(cl):
        for path, d in cat.dirs.items():
            if d.creator != FOUND:
                out.setdefault(path, d)
    return out


def _on_storage(h: LockstepHarness, path: str) -> bool:
    return bool(_cluster(h).storage.exists_dir(path))


def _zombie_writes_beside_its_replacement(
    h: LockstepHarness,
) -> tuple[int, SubtaskId, tuple[Effect, ...]]:
    """``tm-2`` crashes before any shared directory exists; after the failover its
    replacement ``tm-3`` writes for a new checkpoint, creating a subtask's shared
    directory, and the zombie ``tm-2`` writes into it too. Returns the checkpoint, the
    subtask and what the zombie's write returned."""
    h.checkpoint(shared=())
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.run(c.Trigger())
    cp = h.last_checkpoint
    s = next(s for s in h.subtasks if h.tm_of(s) == "tm-3")
    h.run(c.WriteState(cp, s, KS, "live", 10))
    return cp, s, h.run(c.WriteState(cp, s, KS, "zombie", 10, attempt="tm-2"))


@pytest.mark.parametrize("storage", ["memory", "local"])
@pytest.mark.parametrize("mode", MERGING)
def test_a_zombies_file_keeps_the_live_attempts_directory(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """The replacement creates the shared directory, the zombie then writes a file into
    it: ending the job must not delete the directory (and the zombie's file with it)
    until the zombie has stopped."""
    h = _harness(mode, storage, tmp_path)
    _, _, zombie = _zombie_writes_beside_its_replacement(h)
    cl = _cluster(h)
    zombie_files = [
        p for p, f in _files(cl).items() if f.creator == "tm-2" and "/shared/" in p
    ]
    assert len(zombie_files) == 1 and zombie, "the zombie wrote one shared file"
    directory = zombie_files[0].rsplit("/", 1)[0]
    assert _dirs(cl)[directory].creator == "tm-3", "the live replacement made the directory"

    h.run(c.Cancel(retain=False))
    obs = h.target.observe()
    assert directory in obs.pending_deletes and _on_storage(h, directory)
    assert zombie_files[0] in obs.files
    assert not any(d.path == zombie_files[0] for d in obs.deletions)

    h.run(c.AttemptStopped("tm-2"))
    obs = h.target.observe()
    assert obs.pending_deletes == () and not _on_storage(h, directory)
    assert zombie_files[0] not in obs.files


@pytest.mark.parametrize("storage", ["memory", "local"])
@pytest.mark.parametrize("mode", MERGING)
def test_a_zombies_directory_waits_though_it_holds_only_live_files(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """The zombie created a shared directory whose files of its own are long subsumed; the
    replacement writes there after the failover. Ending the job deletes the replacement's
    files, but the directory waits: the zombie may still write into it."""
    h = _harness(mode, storage, tmp_path)
    h.checkpoint()
    h.checkpoint(shared=())
    h.checkpoint(shared=())  # tm-2's shared files are subsumed and deleted while it lives
    cl = _cluster(h)
    made = sorted(p for p, d in _dirs(cl).items() if d.creator == "tm-2" and "/shared/" in p)
    assert made and not any(p.startswith(f"{d}/") for d in made for p in _files(cl))
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.checkpoint()
    live = sorted(p for p in _files(cl) if any(p.startswith(f"{d}/") for d in made))
    assert live and all(_files(cl)[p].creator == "tm-3" for p in live)

    h.run(c.Cancel(retain=False))
    obs = h.target.observe()
    assert not set(live) & set(obs.files), "the replacement's files go at once"
    assert set(made) <= set(obs.pending_deletes)
    assert all(_on_storage(h, d) for d in made)

    h.run(c.AttemptStopped("tm-2"))
    obs = h.target.observe()
    assert obs.pending_deletes == () and not any(_on_storage(h, d) for d in made)


@pytest.mark.parametrize("storage", ["memory", "local"])
@pytest.mark.parametrize("mode", MERGING)
def test_a_stopped_zombie_lets_go_of_its_open_files_and_stops_only_once(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R64: once a lost attempt is known to have stopped, the file it was writing is no
    longer open anywhere (its handle is dropped, not left to leak), and a second
    ``AttemptStopped`` is refused as the model refuses it: the TM is no longer lost."""
    h = _harness(mode, storage, tmp_path)
    h.checkpoint()
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    h.run(c.Trigger())
    s = next(s for s in h.subtasks if h.tm_of(s) == "tm-3")
    h.run(c.WriteState(h.last_checkpoint, s, KS, "zombie", 10, attempt="tm-2"))
    cl = _cluster(h)
    writing = sorted(p for p, f in _files(cl).items() if f.creator == "tm-2" and f.open)
    assert writing and all(p in cl.storage._open for p in writing)

    h.run(c.AttemptStopped("tm-2"))
    assert not any(p in cl.storage._open for p in writing)
    assert not set(writing) & h.target.observe().open_files
    with pytest.raises(CommandError) as refused:
        h.run(c.AttemptStopped("tm-2"))
    assert refused.value.reason is Reason.TM_NOT_LOST


@pytest.mark.parametrize("storage", ["memory", "local"])
@pytest.mark.parametrize("mode", MERGING)
def test_a_directory_delete_that_waited_for_a_zombie_is_decided_again_when_it_stops(
    mode: MergingMode, storage: str, tmp_path: Path
) -> None:
    """R42, R64 (seeds 1028-across-local and 1027-within-local of the long soak): the
    replacement ``tm-3`` creates a subtask's shared directory, the zombie ``tm-2`` writes
    into it, and ``tm-3`` is lost and stops before any checkpoint refers to it. The
    coordinator takes the directory and would collect it, but the delete waits for the
    zombie. The next attempt ``tm-4`` writes into the same directory and a checkpoint
    refers to it; when the zombie stops, the delete that waited is decided again (R42
    says no: a retained checkpoint refers to it) instead of deleting the directory with
    ``tm-4``'s file that the checkpoint uses."""
    h = _harness(mode, storage, tmp_path)
    cp, s, _ = _zombie_writes_beside_its_replacement(h)
    h.run(c.Acknowledge(cp, s))
    directory = next(
        p for p, d in _dirs(_cluster(h)).items() if d.creator == "tm-3" and "/shared/" in p
    )
    h.run(c.CrashTm("tm-3"))
    h.run(c.AttemptStopped("tm-3"))
    assert directory in h.target.observe().pending_deletes, "the delete waits for tm-2"
    h.run(c.Failover())
    assert h.tm_of(s) == "tm-4"
    h.checkpoint()
    assert any(directory in r.directories for r in h.state.retained)

    h.run(c.AttemptStopped("tm-2"))
    obs = h.target.observe()
    assert directory in obs.directories and _on_storage(h, directory)
    assert directory not in obs.pending_deletes
    assert not h.quiesce()
