"""Durability of names on a local disk (R12): directory syncs, and the crash model of
``FaultyOS`` that checks them.

A file's bytes survive a power loss once the file is ``fsync``-ed; its name (or a rename)
only once its directory is ``fsync``-ed too. ``Storage`` syncs the parent directory after
creating a file (once per file, not per append), after the rename that puts a
``_metadata`` in place, and after each directory that ``makedirs`` newly creates; every
sync of a file and of its directory precedes the handle that names the file, and the
sync after the rename precedes the return of the metadata write.

These tests record the real ``os.fsync`` calls (Linux: the path of each descriptor from
``/proc/self/fd``); the crash sweeps of ``test_recovery.py`` check the same on
``FaultyOS``'s power-loss model. The model itself is tested here too (a power loss loses
what was not synced, a process death only what had not reached the OS), and so is the
pyfakefs case (the lockstep tests run the local path on pyfakefs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]
from pyfakefs.fake_filesystem_unittest import Patcher

from fastimpl import CheckpointStore, CompletionFailed, testing
from fastimpl.storage import Dir, LocalOS, Storage, StorageFault
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.handles import stream_of
from spec.layout import metadata_path
from tests.faultyfs import FaultyFileSystem, FaultyOS, Ledger, Place, SimulatedCrash, payload

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)

Event = tuple[str, ...]
"""("file", path) or ("dir", path, names...) for an ``os.fsync``; (marker, ...) else."""

needs_proc = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="reads the path of a descriptor from /proc"
)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Event]]:
    """Every ``os.fsync`` the store makes (through the ``os`` of ``fastimpl.descriptors``,
    which makes its local OS calls), in order: the path of the descriptor and, for a
    directory, the names it holds at that moment."""
    events: list[Event] = []
    real = os.fsync

    def recording(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            events.append(("dir", path, *sorted(os.listdir(path))))
        else:
            events.append(("file", path))
        real(fd)

    monkeypatch.setattr("fastimpl.descriptors.os.fsync", recording)
    yield events


@needs_proc
def test_create_append_and_metadata_sync_the_file_then_the_names(
    tmp_path: Path, syncs: list[Event]
) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    r = os.path.realpath(root)
    storage = Storage(fsspec.filesystem("file"), str(root), background_deletes=False)
    data = "job-0/shared/v-0-1/f1"
    storage.create(data)
    syncs.append(("created",))
    storage.append(data, 5, b"hello")
    syncs.append(("handle",))  # what the store builds once append returned
    storage.append(data, 3, b"abc")
    syncs.append(("handle",))
    storage.close(data)
    storage.write_metadata(metadata_path("job-0", 1), b"{}")
    syncs.append(("metadata written",))
    assert syncs == [
        # makedirs: the parent of each new directory, innermost first
        ("dir", f"{r}/job-0/shared", "v-0-1"),
        ("dir", f"{r}/job-0", "shared"),
        ("dir", r, "job-0"),
        # the new file's name
        ("dir", f"{r}/job-0/shared/v-0-1", "f1"),
        ("created",),
        ("file", f"{r}/{data}"),
        ("handle",),
        ("file", f"{r}/{data}"),  # an append syncs the file, never the directory again
        ("handle",),
        ("dir", f"{r}/job-0", "chk-1", "shared"),  # chk-1 is new
        ("file", f"{r}/job-0/chk-1/_metadata.inprogress"),
        ("dir", f"{r}/job-0/chk-1", "_metadata"),  # after the rename
        ("metadata written",),
    ]
    assert (root / "job-0/chk-1/_metadata").read_bytes() == b"{}"
    assert (root / data).read_bytes() == b"helloabc"


@needs_proc
def test_a_directory_sync_that_failed_is_owed_until_it_succeeds(
    tmp_path: Path, syncs: list[Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first create in a new directory fails at syncing the directory's parent: the
    directory is there, so the next create would not make it and, without the debt kept,
    would never sync its name; a completed checkpoint in it could vanish at a power loss."""
    root = tmp_path / "ckpt"
    root.mkdir()
    r = os.path.realpath(root)
    storage = Storage(fsspec.filesystem("file"), str(root), background_deletes=False)
    real = LocalOS.fsync_dir
    failing = {"left": 1}

    def fsync_dir(self: LocalOS, d: Dir) -> None:
        if failing["left"] and d.path.endswith("/shared"):
            failing["left"] -= 1
            raise OSError(5, "I/O error syncing", d.path)
        real(self, d)

    monkeypatch.setattr(LocalOS, "fsync_dir", fsync_dir)
    with pytest.raises(StorageFault):
        storage.create("job-0/shared/v-0-1/f1")
    assert (root / "job-0/shared/v-0-1").is_dir()
    syncs.clear()
    storage.create("job-0/shared/v-0-1/f2")
    assert syncs[:3] == [
        ("dir", f"{r}/job-0/shared", "v-0-1"),  # the debt, paid first
        ("dir", f"{r}/job-0", "shared"),
        ("dir", r, "job-0"),
    ]
    assert syncs[3][:2] == ("dir", f"{r}/job-0/shared/v-0-1")
    syncs.clear()
    storage.create("job-0/shared/v-0-1/f3")
    assert syncs == [("dir", f"{r}/job-0/shared/v-0-1", "f2", "f3")]  # nothing owed now


@needs_proc
def test_a_directory_that_exists_is_not_synced_again(tmp_path: Path, syncs: list[Event]) -> None:
    (tmp_path / "ckpt/job-0/shared/v-0-1").mkdir(parents=True)
    r = os.path.realpath(tmp_path / "ckpt")
    storage = Storage(fsspec.filesystem("file"), str(tmp_path / "ckpt"), background_deletes=False)
    storage.mkdir("job-0/shared/v-0-1")
    assert syncs == []
    storage.mkdir("job-0/shared/v-0-1/a/b")
    assert syncs == [
        ("dir", f"{r}/job-0/shared/v-0-1/a", "b"),
        ("dir", f"{r}/job-0/shared/v-0-1", "a"),
    ]


@needs_proc
@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_a_handle_is_returned_after_its_file_and_name_are_synced(
    tmp_path: Path, syncs: list[Event], mode: MergingMode
) -> None:
    """Through the public API: when ``close_and_get_handle`` returns, the file the handle
    names was synced after its last byte was written and its directory after it was
    created; when ``complete`` returns, the ``_metadata``'s directory was synced after
    the rename. Appends to a file that exists already sync no directory."""
    store = CheckpointStore(str(tmp_path), Config.for_mode(mode, num_retained=1), JOB)
    r = os.path.realpath(tmp_path)
    coord = store.coordinator
    for _ in range(2):
        cid = coord.trigger()
        for sub, tm in sorted(store.placement().items()):
            mgr = store.task_manager(tm)
            for name in ("a", "b"):
                start = len(syncs)
                with mgr.open_stream(cid, sub, KS, name) as out:
                    out.write(payload(sub, name, cid))
                assert out.handle is not None
                stream = stream_of(out.handle.handle)
                assert stream is not None
                path = f"{r}/{stream.path}"
                parent, file = path.rsplit("/", 1)
                mine = syncs[start:]
                assert mine[-1] == ("file", path), mine  # the last sync: the bytes
                made = [e for e in syncs if e[:2] == ("dir", parent) and file in e[2:]]
                assert made, f"{parent} never synced with {file} in it"
                # no directory sync for a file that existed before this stream
                if any(e == ("file", path) for e in syncs[:start]):
                    assert all(e[0] == "file" for e in mine), mine
            mgr.acknowledge(cid, sub)
        before = len(syncs)
        assert coord.complete(cid) is not None
        meta = f"{r}/{metadata_path(store.job_id, cid)}"
        chk = meta.rsplit("/", 1)[0]
        last = [e for e in syncs[before:] if e[:2] == ("dir", chk)]
        assert last and "_metadata" in last[-1][2:], syncs[before:]
        assert syncs[before:].index(("file", meta + ".inprogress")) < syncs[before:].index(last[-1])
        store.deliver_notifications()
    store.close()


def test_directory_syncs_work_on_pyfakefs() -> None:
    """pyfakefs fakes ``os.open`` of a directory and ``os.fsync`` of its descriptor: the
    local path runs there unchanged (the lockstep tests run it on pyfakefs)."""

    class Counting(LocalOS):
        def __init__(self) -> None:
            self.dirs: list[str] = []

        def fsync_dir(self, d: Dir) -> None:
            super().fsync_dir(d)
            self.dirs.append(d.path)

    with Patcher():
        os.makedirs("/ckpt")
        storage = Storage(LocalFileSystem(), "/ckpt", background_deletes=False)
        counting = Counting()
        storage.os = counting
        storage.create("job-0/shared/v-0-1/f1")
        storage.append("job-0/shared/v-0-1/f1", 3, b"abc")
        storage.append("job-0/shared/v-0-1/f1", 3, b"def")
        storage.close("job-0/shared/v-0-1/f1")
        storage.write_metadata(metadata_path("job-0", 1), b"{}")
        assert storage.list_files() == {"job-0/shared/v-0-1/f1": 6, "job-0/chk-1/_metadata": 2}
        assert counting.dirs == [
            "/ckpt/job-0/shared",
            "/ckpt/job-0",
            "/ckpt",
            "/ckpt/job-0/shared/v-0-1",
            "/ckpt/job-0",
            "/ckpt/job-0/chk-1",
        ]
        storage.delete_file("job-0/shared/v-0-1/f1", ("job-0/shared/v-0-1",))
        assert storage.list_files() == {"job-0/chk-1/_metadata": 2}


# --------------------------------------------------------------------------- the crash model


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under ``root``."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirs:
            out[os.path.normpath(f"{rel}/{d}")] = None
        for f in files:
            out[os.path.normpath(f"{rel}/{f}")] = Path(dirpath, f).read_bytes()
    return out


def _layer(tmp_path: Path) -> tuple[Path, FaultyFileSystem, FaultyOS]:
    root = tmp_path / "disk"
    (root / "old").mkdir(parents=True)
    (root / "old/kept").write_bytes(b"there before")
    fs = FaultyFileSystem(fsspec.filesystem("file"), local_root=str(root))
    assert fs.local_os is not None
    return root, fs, fs.local_os


def _scenario(root: Path, los: FaultyOS) -> tuple[Dir, Dir]:
    """Synced bytes and names, unsynced bytes, an unsynced new file, directory, rename
    and removal; the root and ``old`` held open."""
    top = los.open_dir(None, str(root))
    old = los.open_dir(top, "old")
    a = los.open(top, "a")
    a.write(b"1234")
    a.flush()
    los.fsync(a)
    a.write(b"56")
    a.flush()  # reached the OS, not synced
    los.fsync_dir(top)  # the name "a" is durable
    a.close()
    b = los.open(top, "b")  # its bytes synced, its name never
    b.write(b"b")
    b.flush()
    los.fsync(b)
    b.close()
    los.mkdir(top, "new")
    t = los.open(old, "t")
    t.write(b"renamed")
    t.flush()
    los.fsync(t)
    t.close()
    los.replace(old, "t", "final")  # the directory is never synced
    los.remove(old, "kept")
    c = los.open(top, "c")
    c.write(b"unflushed")  # still in the file's buffer
    return top, old


def test_a_power_loss_keeps_what_was_synced_and_nothing_else(tmp_path: Path) -> None:
    root, fs, los = _layer(tmp_path)
    top, _ = _scenario(root, los)
    fs.crash_after(1)
    with pytest.raises(SimulatedCrash):
        los.fsync_dir(top)
    assert _tree(root) == {"a": b"1234", "old": None, "old/kept": b"there before"}
    with pytest.raises(SimulatedCrash):
        los.scandir(top)  # every later call too


def test_a_process_death_keeps_what_reached_the_os(tmp_path: Path) -> None:
    root, fs, los = _layer(tmp_path)
    top, _ = _scenario(root, los)
    fs.crash_after(1, power_loss=False)
    with pytest.raises(SimulatedCrash):
        los.fsync_dir(top)
    assert _tree(root) == {
        "a": b"123456",
        "b": b"b",
        "c": b"",
        "new": None,
        "old": None,
        "old/final": b"renamed",
    }


def test_a_synced_rename_and_removal_survive_a_power_loss(tmp_path: Path) -> None:
    root, fs, los = _layer(tmp_path)
    top, old = _scenario(root, los)
    los.fsync_dir(old)
    fs.crash_after(1)
    with pytest.raises(SimulatedCrash):
        los.remove(top, "a")
    assert _tree(root) == {"a": b"1234", "old": None, "old/final": b"renamed"}


# --------------------------------------------------------------------------- an aborted _metadata


def test_an_aborted_metadata_does_not_come_back_after_a_power_loss(tmp_path: Path) -> None:
    """The rename of a ``_metadata`` and its directory's sync happened, but the sync's
    answer was lost: the write fails, the file is removed and the checkpoint aborted
    (R51), and the abort deletes its files. The removal is synced as well: else a power
    loss would bring back a ``_metadata`` naming deleted files, and recovery would take
    it for the latest completed checkpoint and refuse (a file is missing)."""
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    place = Place.make("local", tmp_path)
    store, fs = place.store(config, JOB, background_deletes=False)
    ledger = Ledger()
    coord = store.coordinator

    def write(cid: int) -> None:
        for sub, tm in sorted(store.placement().items()):
            data = payload(sub, "s", cid)
            ledger.record(store.job_id, cid, sub, "s", data)
            store.task_manager(tm).write(cid, sub, KS, "s", data)
            store.task_manager(tm).acknowledge(cid, sub)

    c1 = coord.trigger()
    write(c1)
    assert coord.complete(c1) is not None
    store.deliver_notifications()
    c2 = coord.trigger()
    write(c2)
    fs.fail("fsync_dir", path_contains=f"chk-{c2}", lost_reply=True)
    with pytest.raises(CompletionFailed):
        coord.complete(c2)
    store.deliver_notifications()  # the abort deleted c2's files
    c3 = coord.trigger()
    write(c3)  # new files in the same directories: their syncs make those deletes durable
    fs.crash_after(1)  # a power loss before c3 completes
    with pytest.raises(SimulatedCrash):
        coord.complete(c3)
    assert metadata_path("job-0", c2) not in place.snapshot()
    new, report = CheckpointStore.recover(place.url, config, JOB)
    assert report.checkpoints == (c1,)
    assert ledger.problems(new) == []
    assert testing.check_invariants(new) == []
    new.close()
