"""Where a test run keeps its scratch files (``tmp_path``, ``tempfile``): on a RAM file
system when the machine has one.

The tests write thousands of small bases and every one of them syncs what it writes, as
the store must (R45's durable deletes, the metadata's publication): on a disk each
``fsync`` and directory operation waits for the device, which is what most of a local
crash sweep's time went to. What the tests check does not depend on the device: no
test cuts the power, the crashes they inject are the process's (``tests.faultyfs``). So a
run puts its scratch on ``/dev/shm`` when that is a tmpfs with room to spare, says so in
its last lines, and removes it at the end; a run also removes what killed runs left there
(``sweep_dead``). ``--basetemp=DIR`` picks a directory instead
(kept, as pytest keeps it), and ``CKPT_TEST_SCRATCH=disk`` keeps pytest's default."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

RAM = Path("/dev/shm")
MIN_FREE = 2 << 30
"""A full ``ci`` run writes well under 200 MB; this leaves the machine its memory."""


def on_tmpfs(path: Path) -> bool:
    """Whether ``path`` is the mount point of a tmpfs (``/proc/mounts``)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(
        len(f := line.split()) >= 3 and f[1] == str(path) and f[2] == "tmpfs" for line in mounts
    )


def ram_scratch() -> tuple[Path | None, list[Path]]:
    """A fresh directory on the RAM file system, or None when there is none to use (no
    tmpfs at ``/dev/shm``, too little room, not writable, or ``CKPT_TEST_SCRATCH=disk``);
    and the directories of killed runs it removed first (``sweep_dead``)."""
    if os.environ.get("CKPT_TEST_SCRATCH") == "disk" or not on_tmpfs(RAM):
        return None, []
    swept: list[Path] = []
    try:
        swept = sweep_dead(RAM)
        if shutil.disk_usage(RAM).free < MIN_FREE:
            return None, swept
        return Path(tempfile.mkdtemp(prefix=PREFIX, dir=RAM)), swept
    except OSError:
        return None, swept


PREFIX = "ckpt-pytest-"
LOCK = ".run.lock"
"""A run holds an exclusive ``flock`` on this file of its scratch for as long as it runs:
the kernel lets it go when the process ends, however it ends."""


def hold(scratch: Path) -> int:
    """The lock of a run's scratch, taken: the descriptor to keep open while it runs."""
    fd = os.open(scratch / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep_dead(ram: Path) -> list[Path]:
    """Removes the scratch directories of runs that were killed before their end (a
    SIGKILL, an OOM kill, a CI timeout), which would otherwise hold the machine's memory
    until it reboots. A directory is removed only when its name starts as this module
    names them, it is a directory and not a link, and its lock file (``LOCK``) can be
    locked: no process holds it any more. Which process made it is never asked (a pid may
    be reused, or belong to another PID namespace sharing ``/dev/shm``). A directory
    without a lock file is kept. Returns what it removed."""
    removed = []
    for entry in os.scandir(ram):
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(
                os.path.join(entry.path, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: that run is alive
        finally:
            os.close(fd)
        shutil.rmtree(entry.path, ignore_errors=True)  # fd-based: never follows a link
        removed.append(Path(entry.path))
    return removed


_SCRATCH = pytest.StashKey[Path]()
_TMPDIR = pytest.StashKey[str | None]()
_SWEPT = pytest.StashKey[list[Path]]()
_LOCK = pytest.StashKey[int]()


def take(config: pytest.Config) -> None:
    """At the start of a run (not in an xdist worker, not when ``--basetemp`` names a
    directory): ``tmp_path`` and ``TMPDIR`` under a fresh RAM scratch, if there is one.
    The workers get their own directories under it, and inherit ``TMPDIR``."""
    if config.option.basetemp is not None or hasattr(config, "workerinput"):
        return
    scratch, swept = ram_scratch()
    config.stash[_SWEPT] = swept
    if scratch is None:
        return
    config.stash[_LOCK] = hold(scratch)
    config.option.basetemp = str(scratch / "tmp_path")
    (scratch / "tempfile").mkdir()
    config.stash[_TMPDIR] = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch / "tempfile")
    tempfile.tempdir = None  # gettempdir() keeps its first answer otherwise
    config.stash[_SCRATCH] = scratch


def where(config: pytest.Config) -> str:
    """The line a run ends with: where its scratch was."""
    scratch = config.stash.get(_SCRATCH, None)
    swept = config.stash.get(_SWEPT, [])
    also = (
        f"; removed at the start, left by killed runs: {', '.join(map(str, swept))}"
        if swept else ""
    )
    if scratch is None:
        return f"scratch: {config.option.basetemp or 'pytest default tmp_path, on disk'}{also}"
    return (
        f"scratch: {scratch}, a tmpfs (tests/scratch.py), removed now; --basetemp=DIR"
        f" or CKPT_TEST_SCRATCH=disk puts it on a disk{also}"
    )


def give_back(config: pytest.Config) -> None:
    """At the end of the run: the scratch removed, and ``TMPDIR`` as it was, so that a
    process that runs pytest again (mutmut does, in forks of this one) keeps no
    directory that is gone."""
    scratch = config.stash.get(_SCRATCH, None)
    if scratch is None:
        return
    before = config.stash[_TMPDIR]
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
    shutil.rmtree(scratch, ignore_errors=True)
    os.close(config.stash[_LOCK])
