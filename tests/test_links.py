"""Symbolic links and special files in the store's tree (issue 14, defect 2).

A store that followed links would restore a checkpoint file replaced by a link to a
file outside the base, returning its outside bytes from ``restore()``; and a subtask
directory replaced by a link to an outside directory would be emptied by the garbage
collection of a later checkpoint (NONE), or leave a delete failing for good (WITHIN).
The store never creates a link, so every link below the root is a hand-made change and
is refused (one pointing inside the base too: it would give a file two names): reading,
restoring, writing and deleting never go through one, with an error naming the path;
removing a link itself is not deleting its target, and a recursive delete never
descends into one. A FIFO, device or socket where a regular file belongs is refused
before anything opens it (a FIFO would block a reader).

Local disk only, in every merging mode: S3 and ``memory://`` have no links (a key is a
name, not a pointer) and no special files, so there is nothing to follow there. The
same checks run under ``dir::`` over a local disk, which the store unwraps to the disk.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastimpl import CheckpointStore, MetadataError, StorageFault
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.handles import FileHandle, SegmentHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.layout import metadata_path

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2),), num_tms=1)
SECRET = b"S" * 64
"""What an outside file holds: never to be returned as checkpoint bytes, nor deleted."""


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """A reader that opens a FIFO blocks forever: fail the test instead of hanging."""

    def boom(*_: Any) -> None:
        raise TimeoutError("blocked (opened a FIFO?)")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _write(store: CheckpointStore, cid: int, shared: bool) -> None:
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        if shared:
            mgr.write(cid, sub, KS, f"sst-{cid}", bytes([65 + sub.index]) * 64)
        mgr.write(cid, sub, OP, "offsets", b"o" * 8)
        mgr.acknowledge(cid, sub)


def _checkpoint(store: CheckpointStore, *, shared: bool = True) -> int:
    coord = store.coordinator
    cid = coord.trigger()
    _write(store, cid, shared)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    store.flush()
    return cid


def _setup(
    tmp_path: Path, mode: MergingMode, *, url_prefix: str = ""
) -> tuple[CheckpointStore, Path, Path]:
    base = tmp_path / "base"
    outside = tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    cfg = Config.for_mode(mode, num_retained=1)
    store = CheckpointStore(f"{url_prefix}{base}", cfg, JOB, background_deletes=False)
    _checkpoint(store)
    return store, base, outside


def _sst(store: CheckpointStore, sub: SubtaskId) -> StateEntry:
    latest = store.coordinator.retained()[-1]
    return next(e for e in latest.entries if e.subtask == sub and e.kind is KS)


def _path(e: StateEntry) -> str:
    s = stream_of(e.handle)
    assert isinstance(s, SegmentHandle | FileHandle)
    return s.path


def _tree(top: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(top)): p.read_bytes()
        for p in sorted(top.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


SUB0 = SubtaskId("src", 0, 2)


@pytest.mark.parametrize("mode", list(MergingMode))
@pytest.mark.parametrize("where", ["file", "directory"])
def test_restore_refuses_a_link_out_of_the_base(
    tmp_path: Path, mode: MergingMode, where: str
) -> None:
    """A data file, or the subtask directory holding it, replaced by a link to an outside
    copy holding other bytes: ``restore()`` refuses naming the path; nothing is read."""
    store, base, outside = _setup(tmp_path, mode)
    e = _sst(store, SUB0)
    rel = _path(e)
    victim = base / rel if where == "file" else (base / rel).parent
    if where == "file":
        (outside / "f").write_bytes(SECRET * 4)
        victim.unlink()
        victim.symlink_to(outside / "f")
    else:
        shutil.copytree(victim, outside / "d")
        for f in (outside / "d").iterdir():
            f.write_bytes(SECRET * 4)
        shutil.rmtree(victim)
        victim.symlink_to(outside / "d", target_is_directory=True)
    before = _tree(outside)
    mgr = store.manager_for(SUB0)
    with pytest.raises(StorageFault, match=r"symbolic link") as err:
        mgr.restore(SUB0)
    assert rel in str(err.value)
    with pytest.raises(StorageFault, match=r"symbolic link"):
        store.read(e)
    assert _tree(outside) == before
    store.close()


@pytest.mark.parametrize("mode", list(MergingMode))
def test_a_link_inside_the_base_is_refused_too(tmp_path: Path, mode: MergingMode) -> None:
    """A link whose target stays in the base is refused as well: a file with two names
    has two owners and can be deleted twice."""
    store, base, _ = _setup(tmp_path, mode)
    e = _sst(store, SUB0)
    other = _path(_sst(store, SubtaskId("src", 1, 2)))
    (base / _path(e)).unlink()
    (base / _path(e)).symlink_to(base / other)
    with pytest.raises(StorageFault, match="symbolic link"):
        store.manager_for(SUB0).restore(SUB0)
    store.close()


@pytest.mark.parametrize("mode", list(MergingMode))
def test_metadata_replaced_by_a_link_or_a_fifo_is_refused(
    tmp_path: Path, mode: MergingMode
) -> None:
    """``restart`` and ``restore`` read ``_metadata`` back: a link (to a valid copy outside)
    or a FIFO there is a ``MetadataError`` naming the file, and nothing blocks."""
    store, base, outside = _setup(tmp_path, mode)
    meta = base / metadata_path("job-0", 1)
    shutil.copy(meta, outside / "_metadata")
    meta.unlink()
    meta.symlink_to(outside / "_metadata")
    with pytest.raises(MetadataError, match=r"chk-1/_metadata.*symbolic link"):
        store.coordinator.restart()
    with pytest.raises(MetadataError, match=r"chk-1/_metadata.*symbolic link"):
        store.coordinator.restore(1)
    meta.unlink()
    os.mkfifo(meta)
    with pytest.raises(MetadataError, match=r"chk-1/_metadata.* is a FIFO"):
        store.coordinator.restart()
    assert (outside / "_metadata").exists()
    store.close()


@pytest.mark.parametrize("mode", list(MergingMode))
def test_a_special_file_in_place_of_a_data_file_is_not_opened(
    tmp_path: Path, mode: MergingMode
) -> None:
    store, base, _ = _setup(tmp_path, mode)
    e = _sst(store, SUB0)
    (base / _path(e)).unlink()
    os.mkfifo(base / _path(e))
    with pytest.raises(StorageFault, match=r"is a FIFO where a regular file belongs"):
        store.manager_for(SUB0).restore(SUB0)
    store.close()


@pytest.mark.parametrize("mode", list(MergingMode))
@pytest.mark.parametrize("url_prefix", ["", "dir::"], ids=["local", "dirfs"])
def test_collection_never_deletes_through_a_linked_directory(
    tmp_path: Path, mode: MergingMode, url_prefix: str
) -> None:
    """The issue's case: subtask 0's shared directory replaced by a link to an outside
    directory holding copies of its files. Later checkpoints subsume the first; nothing
    outside is deleted. A file the store wants gone behind the link stays a reported
    delete failure naming the link; a managed directory that is a link loses the link
    only. Writing into the linked directory is refused too (the write declines)."""
    store, base, outside = _setup(tmp_path, mode, url_prefix=url_prefix)
    if url_prefix:
        # fsspec's url_to_fs gives ``dir::P`` a DirFileSystem rooted at P *and* the path P
        # inside it: the files land under P/P, consistently for every call.
        base = base / str(base).lstrip("/")
    shared = (base / _path(_sst(store, SUB0))).parent
    shutil.copytree(shared, outside / "d")
    (outside / "d" / "precious").write_bytes(SECRET)
    shutil.rmtree(shared)
    shared.symlink_to(outside / "d", target_is_directory=True)
    before = _tree(outside)
    if mode is MergingMode.ACROSS_CHECKPOINT:
        # The pooled file is open already: its appends reach the file the store opened
        # (now nameless), never the link's target. Checked below: outside is unchanged.
        _checkpoint(store)
    else:
        with pytest.raises(StorageFault, match="symbolic link"):
            _checkpoint(store)  # subtask 0's new shared file would be made through it
    for cid in store.coordinator.pending():
        store.coordinator.abort(cid)
    for _ in range(3):  # no shared state: later checkpoints subsume the first one
        _checkpoint(store, shared=False)
    store.flush()
    assert _tree(outside) == before
    for failure in store.delete_failures():
        assert "symbolic link" in str(failure.error), failure
        assert failure.path.startswith(str(shared.relative_to(base))), failure
    if not shared.is_symlink():
        assert not shared.exists()  # the managed directory went: the link, not its target
    store.coordinator.cancel(retain=False)
    store.close()
    assert _tree(outside) == before


@pytest.mark.parametrize("mode", list(MergingMode))
def test_recover_and_cancel_keep_what_a_linked_job_directory_points_at(
    tmp_path: Path, mode: MergingMode
) -> None:
    """The whole ``taskowned`` directory a link: recovery refuses or keeps every outside
    file, and so does the recovered job's cancel."""
    store, base, outside = _setup(tmp_path, mode)
    _checkpoint(store)
    store.close()
    owned = base / "job-0" / ("chk-2" if mode is MergingMode.NONE else "taskowned")
    shutil.copytree(owned, outside / "t")
    (outside / "t" / "precious").write_bytes(SECRET)
    shutil.rmtree(owned)
    owned.symlink_to(outside / "t", target_is_directory=True)
    before = _tree(outside)
    cfg = Config.for_mode(mode, num_retained=1)
    try:
        again, _ = CheckpointStore.recover(str(base), cfg, JOB)
    except Exception as err:  # refused: it names what it could not find or follow
        assert "job-0" in str(err), err
    else:
        _checkpoint(again, shared=False)
        again.coordinator.cancel(retain=False)
        again.close()
    assert _tree(outside) == before
