"""Where a test run keeps its scratch files (``tmp_path``, ``tempfile``): on a RAM file
system when the machine has one.

The tests write thousands of small bases and every one of them syncs what it writes, as
the store must (R45's durable deletes, the metadata's publication): on a disk each
``fsync`` and directory operation waits for the device, which is what most of a local
crash sweep's time went to. What the tests check does not depend on the device: no
test cuts the power, the crashes they inject are the process's (``tests.faultyfs``). So a
run puts its scratch on ``/dev/shm`` when that is a tmpfs with room to spare, says so in
its header, and removes it at the end. ``--basetemp=DIR`` picks a directory instead
(kept, as pytest keeps it), and ``CKPT_TEST_SCRATCH=disk`` keeps pytest's default."""

from __future__ import annotations

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


def ram_scratch() -> Path | None:
    """A fresh directory on the RAM file system, or None when there is none to use (no
    tmpfs at ``/dev/shm``, too little room, not writable, or ``CKPT_TEST_SCRATCH=disk``)."""
    if os.environ.get("CKPT_TEST_SCRATCH") == "disk" or not on_tmpfs(RAM):
        return None
    try:
        if shutil.disk_usage(RAM).free < MIN_FREE:
            return None
        return Path(tempfile.mkdtemp(prefix="ckpt-pytest-", dir=RAM))
    except OSError:
        return None


_SCRATCH = pytest.StashKey[Path]()
_TMPDIR = pytest.StashKey[str | None]()


def take(config: pytest.Config) -> None:
    """At the start of a run (not in an xdist worker, not when ``--basetemp`` names a
    directory): ``tmp_path`` and ``TMPDIR`` under a fresh RAM scratch, if there is one.
    The workers get their own directories under it, and inherit ``TMPDIR``."""
    if config.option.basetemp is not None or hasattr(config, "workerinput"):
        return
    scratch = ram_scratch()
    if scratch is None:
        return
    config.option.basetemp = str(scratch / "tmp_path")
    (scratch / "tempfile").mkdir()
    config.stash[_TMPDIR] = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch / "tempfile")
    tempfile.tempdir = None  # gettempdir() keeps its first answer otherwise
    config.stash[_SCRATCH] = scratch


def where(config: pytest.Config) -> str:
    """The line a run ends with: where its scratch was."""
    scratch = config.stash.get(_SCRATCH, None)
    if scratch is None:
        return f"scratch: {config.option.basetemp or 'pytest default tmp_path, on disk'}"
    return (
        f"scratch: {scratch}, a tmpfs (tests/scratch.py), removed now; --basetemp=DIR"
        " or CKPT_TEST_SCRATCH=disk puts it on a disk"
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
