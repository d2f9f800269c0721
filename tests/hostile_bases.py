"""A corpus of hostile checkpoint bases (issue 15): one function per case, each writing a
small valid base (one checkpoint referencing one file, one old stray) under a temporary
directory, then the hostility, and returning what the audit must say about it.

Every case goes through both engines (``test_audit_hostile``): same tables, no hang, no
traceback, and the hostile part reported as a row (an unreadable ``_metadata`` or a path
not listed), never read, followed, or deleted.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attrs import define, field

from fastimpl.metadata import encode
from pipeline.names import shown
from pipeline.result import ORPHAN, Tables
from pipeline.safe_read import LIMIT
from spec.config import Scope, StateKind
from spec.handles import SegmentHandle, StateEntry
from spec.ids import SubtaskId

DAY = 86400.0
JOB = "j"


@define
class Hostile:
    base: Path
    corrupt: set[str] = field(factory=set)
    """_metadata paths the audit must report unreadable."""
    unreadable: set[str] = field(factory=set)
    """Paths (shown) the audit must report not listed or not examined."""
    orphans: set[str] = field(factory=set)
    """Unreferenced old files the audit must report (and may delete)."""
    dangling: dict[str, str] = field(factory=dict)
    """Referenced paths a restore cannot read -> what the dangling row's reason says."""
    refuses: bool = False
    """``--delete-orphans`` must refuse and delete nothing (a place where a ``_metadata``
    may lie could not be examined)."""


def _old(p: Path, data: bytes = b"s" * 10) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    t = time.time() - 3 * DAY
    os.utime(p, (t, t))


def _meta(cp: int, path: str, job: str = JOB) -> bytes:
    e = StateEntry(
        SubtaskId("v", 0, 1),
        StateKind.KEYED_SHARED,
        "s",
        SegmentHandle(path, 0, 10, f"l{cp}", Scope.SHARED),
        1,
        (0, 127),
    )
    return encode(cp, job, False, (e,), ())


def valid(tmp: Path) -> Hostile:
    root = tmp / "root"
    _old(root / JOB / "shared/v-0-1/f", b"x" * 10)
    (root / JOB / "chk-1").mkdir(parents=True)
    (root / JOB / "chk-1/_metadata").write_bytes(_meta(1, f"{JOB}/shared/v-0-1/f"))
    _old(root / JOB / "shared/v-0-1/stray")
    return Hostile(root / JOB, orphans={f"{JOB}/shared/v-0-1/stray"})


def fifo_metadata_in_job(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base / "chk-2").mkdir()
    os.mkfifo(h.base / "chk-2/_metadata")
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h


def fifo_metadata_in_sibling_job(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base.parent / "other/chk-1").mkdir(parents=True)
    os.mkfifo(h.base.parent / "other/chk-1/_metadata")
    h.corrupt.add("other/chk-1/_metadata")
    return h


def fifo_metadata_in_savepoint(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base.parent / "savepoints/savepoint-3").mkdir(parents=True)
    os.mkfifo(h.base.parent / "savepoints/savepoint-3/_metadata")
    h.corrupt.add("savepoints/savepoint-3/_metadata")
    return h


def metadata_link_to_dev_zero(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base / "chk-2").mkdir()
    (h.base / "chk-2/_metadata").symlink_to("/dev/zero")
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h


def metadata_link_out_of_the_base(tmp: Path) -> Hostile:
    h = valid(tmp)
    outside = tmp / "outside/_metadata"
    outside.parent.mkdir()
    outside.write_bytes(_meta(2, f"{JOB}/shared/v-0-1/stray"))
    (h.base / "chk-2").mkdir()
    (h.base / "chk-2/_metadata").symlink_to(outside)
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h  # the stray stays an orphan: a link's content is never trusted


def metadata_link_loop(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base / "chk-2").mkdir()
    (h.base / "chk-2/_metadata").symlink_to("_metadata")
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h


def metadata_is_a_directory(tmp: Path) -> Hostile:
    h = valid(tmp)
    _old(h.base / "chk-2/_metadata/inside")
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h


def metadata_nested_too_deeply(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base / "chk-2").mkdir()
    (h.base / "chk-2/_metadata").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h


def metadata_too_large(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base / "chk-2").mkdir()
    with open(h.base / "chk-2/_metadata", "wb") as f:
        f.truncate(LIMIT + 1)  # sparse: no disk used
    h.corrupt.add(f"{JOB}/chk-2/_metadata")
    return h


def checkpoint_id_beyond_64_bits(tmp: Path) -> Hostile:
    h = valid(tmp)
    cp = 2**70
    (h.base / f"chk-{cp}").mkdir()
    (h.base / f"chk-{cp}/_metadata").write_bytes(_meta(cp, f"{JOB}/shared/v-0-1/f"))
    h.corrupt.add(f"{JOB}/chk-{cp}/_metadata")
    return h


def deeper_than_path_max(tmp: Path) -> Hostile:
    """A tree whose paths pass PATH_MAX (4096): made with directory descriptors."""
    h = valid(tmp)
    name = "d" * 250
    fd = os.open(h.base / "shared", os.O_RDONLY | os.O_DIRECTORY)
    rel = f"{JOB}/shared"
    try:
        for _ in range(20):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            rel += "/" + name
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    h.unreadable.add(f"{JOB}/shared/{name}")  # a prefix of the path reported
    return h


def symlink_loops_among_the_files(tmp: Path) -> Hostile:
    h = valid(tmp)
    (h.base / "shared/v-0-1/loop").symlink_to("loop")
    (h.base / "shared/v-0-1/a").symlink_to("b")
    (h.base / "shared/v-0-1/b").symlink_to("a")
    (h.base / "shared/dirloop").symlink_to(".", target_is_directory=True)
    return h  # links are listed, never followed, never deleted


def names_that_are_not_utf8(tmp: Path) -> Hostile:
    h = valid(tmp)
    raw = os.fsencode(h.base / "shared/v-0-1") + b"/stray-\xff.sst"
    with open(raw, "wb") as f:
        f.write(b"s" * 10)
    d = os.fsencode(h.base / "shared") + b"/sub-\xfe"
    os.mkdir(d)
    with open(d + b"/inside", "wb") as f:
        f.write(b"s" * 10)
    h.unreadable |= {
        shown(os.fsdecode(raw)[len(str(h.base.parent)) + 1 :]),
        shown(os.fsdecode(d)[len(str(h.base.parent)) + 1 :]),
    }
    return h


def _linked_in(place: Path, away: Path) -> None:
    """Move ``place`` to ``away`` and put a symbolic link to it where it was."""
    away.parent.mkdir(parents=True, exist_ok=True)
    place.rename(away)
    place.symlink_to(away, target_is_directory=True)


def _refused_link(h: Hostile, place: Path, away: Path, row: str) -> Hostile:
    """``place`` moved to ``away`` and linked back: an unreadable row ``row``, and the
    deletion refused (what the link holds is unknown)."""
    _linked_in(place, away)
    h.unreadable.add(row)
    h.refuses = True
    return h


def sibling_job_is_a_link(tmp: Path) -> Hostile:
    """A job restored from this one (its checkpoint names the stray), moved elsewhere and
    linked back: the link is not followed, so what it holds is unknown; a row, and the
    deletion refused (it would delete the file the restored job needs)."""
    h = valid(tmp)
    other = h.base.parent / "job-restored"
    (other / "chk-1").mkdir(parents=True)
    (other / "chk-1/_metadata").write_bytes(
        _meta(1, f"{JOB}/shared/v-0-1/stray", job="job-restored"))
    return _refused_link(h, other, tmp / "moved/job-restored", "job-restored")


def savepoints_is_a_link(tmp: Path) -> Hostile:
    """``savepoints/`` linked to a folder holding a FIFO ``_metadata``."""
    h = valid(tmp)
    sp = h.base.parent / "savepoints"
    (sp / "savepoint-3").mkdir(parents=True)
    os.mkfifo(sp / "savepoint-3/_metadata")
    return _refused_link(h, sp, tmp / "moved/savepoints", "savepoints")


def savepoint_is_a_link(tmp: Path) -> Hostile:
    h = valid(tmp)
    sp = h.base.parent / "savepoints/savepoint-4"
    sp.mkdir(parents=True)
    (sp / "_metadata").write_bytes(_meta(4, f"{JOB}/shared/v-0-1/stray"))
    return _refused_link(h, sp, tmp / "moved/savepoint-4", "savepoints/savepoint-4")


def checkpoint_dir_is_a_link(tmp: Path) -> Hostile:
    """The job's own ``chk-2`` linked to a directory whose ``_metadata`` names the stray."""
    h = valid(tmp)
    (h.base / "chk-2").mkdir()
    (h.base / "chk-2/_metadata").write_bytes(_meta(2, f"{JOB}/shared/v-0-1/stray"))
    return _refused_link(h, h.base / "chk-2", tmp / "moved/chk-2", f"{JOB}/chk-2")


def fifo_in_place_of_a_sibling(tmp: Path) -> Hostile:
    h = valid(tmp)
    os.mkfifo(h.base.parent / "job-other")
    h.unreadable.add("job-other")
    h.refuses = True
    return h


def _referenced_replaced(tmp: Path, make: Callable[[Path], None], reason: str) -> Hostile:
    """The file the checkpoint references replaced by something a restore cannot read."""
    h = valid(tmp)
    f = h.base / "shared/v-0-1/f"
    f.unlink()
    make(f)
    h.dangling[f"{JOB}/shared/v-0-1/f"] = reason
    return h


def referenced_file_is_a_link(tmp: Path) -> Hostile:
    """A link to a file of the right size outside the base: its size is no restorable byte
    (the store refuses to read through a link)."""
    outside = tmp / "outside/f"
    _old(outside, b"x" * 64)
    return _referenced_replaced(tmp, lambda f: f.symlink_to(outside), "symbolic link")


def referenced_file_is_a_directory(tmp: Path) -> Hostile:
    return _referenced_replaced(tmp, lambda f: f.mkdir(), "directory")


def referenced_file_is_a_fifo(tmp: Path) -> Hostile:
    h = _referenced_replaced(tmp, os.mkfifo, "FIFO")
    h.unreadable.add(f"{JOB}/shared/v-0-1/f")  # listed as what it is, never opened
    return h


MARKUP_NAMES = (
    "[bold]innocent[/bold]",
    "[/]",
    "[hidden]secret",
    "esc\x1b[31mred",
    "new\nline",
    "back\\slash",
    "sp ace",
)


def names_with_markup_and_control_characters(tmp: Path) -> Hostile:
    h = valid(tmp)
    for n in MARKUP_NAMES:
        _old(h.base / "shared/v-0-1" / n)
        h.orphans.add(f"{JOB}/shared/v-0-1/{n}")
    return h


CASES: dict[str, Callable[[Path], Hostile]] = {
    f.__name__: f
    for f in (
        valid,
        fifo_metadata_in_job,
        fifo_metadata_in_sibling_job,
        fifo_metadata_in_savepoint,
        metadata_link_to_dev_zero,
        metadata_link_out_of_the_base,
        metadata_link_loop,
        metadata_is_a_directory,
        metadata_nested_too_deeply,
        metadata_too_large,
        checkpoint_id_beyond_64_bits,
        deeper_than_path_max,
        symlink_loops_among_the_files,
        names_that_are_not_utf8,
        names_with_markup_and_control_characters,
        sibling_job_is_a_link,
        savepoints_is_a_link,
        savepoint_is_a_link,
        checkpoint_dir_is_a_link,
        fifo_in_place_of_a_sibling,
        referenced_file_is_a_link,
        referenced_file_is_a_directory,
        referenced_file_is_a_fifo,
    )
}


# --------------------------------------------------------------------------- object stores

ON_OBJECT_STORES = (
    "valid",
    "metadata_is_a_directory",
    "metadata_nested_too_deeply",
    "metadata_too_large",
    "checkpoint_id_beyond_64_bits",
    "names_with_markup_and_control_characters",
)
"""The cases an object store can hold: uploaded as they are (``upload``)."""

NOT_ON_OBJECT_STORES = {
    "fifo_metadata_in_job": "an object store has no FIFOs",
    "fifo_metadata_in_sibling_job": "an object store has no FIFOs",
    "fifo_metadata_in_savepoint": "an object store has no FIFOs",
    "metadata_link_to_dev_zero": "an object store has no links (nor devices)",
    "metadata_link_out_of_the_base": "an object store has no links",
    "metadata_link_loop": "an object store has no links",
    "symlink_loops_among_the_files": "an object store has no links",
    "deeper_than_path_max": "an S3 key has at most 1024 bytes and no PATH_MAX: no such tree",
    "names_that_are_not_utf8": "an S3 key is UTF-8: no such name",
    "sibling_job_is_a_link": "an object store has no links",
    "savepoints_is_a_link": "an object store has no links",
    "savepoint_is_a_link": "an object store has no links",
    "checkpoint_dir_is_a_link": "an object store has no links",
    "fifo_in_place_of_a_sibling": "an object store has no links nor FIFOs",
    "referenced_file_is_a_link": "an object store has no links",
    "referenced_file_is_a_directory": "an S3 key is a file or a prefix, never both: no such key",
    "referenced_file_is_a_fifo": "an object store has no FIFOs",
}


def upload(h: Hostile, fs: Any, container: str, rename: Callable[[str], str] = str) -> list[str]:
    """Copy a case's tree (regular files; directories are implied by their keys) under
    ``container`` on an object store; the job base is ``container/<JOB>`` and every
    container-relative path the case names stays the same (or becomes ``rename(path)``).
    Returns the keys written."""
    root = h.base.parent
    keys = []
    for d, _dirs, files in os.walk(root):
        for n in files:
            p = Path(d) / n
            st = p.lstat()
            assert stat.S_ISREG(st.st_mode), f"{p}: only regular files go to an object store"
            key = f"{container}/{rename(p.relative_to(root).as_posix())}"
            if st.st_size > 1 << 20:
                # metadata_too_large, sparse on disk: the same size, streamed as zeros
                with p.open("rb") as src:
                    assert not src.read(1 << 20).strip(b"\0"), f"{p}: a large file of data"
                with fs.open(key, "wb") as f:
                    for _ in range(st.st_size >> 20):
                        f.write(bytes(1 << 20))
                    f.write(bytes(st.st_size & ((1 << 20) - 1)))
            else:
                fs.pipe_file(key, p.read_bytes())
            keys.append(key)
    return keys


# --------------------------------------------------------------------------- checking a report


@contextmanager
def deadline(seconds: int, what: str) -> Iterator[None]:
    """A hang fails the test instead of stopping the run."""

    def fire(_sig: int, _frame: Any) -> None:
        raise TimeoutError(f"{what} still running after {seconds} s: it hangs")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check(h: Hostile, t: Tables) -> None:
    assert {c["metadata"] for c in t["corrupt"]} == h.corrupt, t["corrupt"]
    got = {u["path"] for u in t["unreadable"]}
    for u in h.unreadable:
        assert any(g.startswith(u) for g in got), (u, got)
    if not h.unreadable:
        assert got == set(), got
    orphans = {f["path"] for f in t["files"] if f["status"] == ORPHAN}
    assert h.orphans <= orphans
    assert t.summary.checkpoints == 1
    reasons = {d["path"]: d["reason"] for d in t["dangling"]}
    assert reasons.keys() == h.dangling.keys(), t["dangling"]
    for path, why in h.dangling.items():
        assert why in reasons[path], (path, reasons[path])
