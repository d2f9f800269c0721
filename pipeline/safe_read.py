"""Reading a ``_metadata`` without trusting what lies at its path.

A ``_metadata`` may be a FIFO (``open`` blocks forever), a link to ``/dev/zero`` (reads
without end), a directory, a link out of the base, or a huge file. Only a regular file,
not a link, of at most :data:`LIMIT` bytes is read: on a local disk it is opened with
``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens without waiting for a writer) and checked with
``fstat`` before one byte is read; on an object store its listed size is checked and at
most ``LIMIT + 1`` bytes are fetched.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from pipeline.location import Location
from spec.errors import CkptError

LIMIT = 128 * 1024 * 1024
"""Largest ``_metadata`` read: at about 150 bytes a reference, some 800,000 references."""


class Refused(CkptError):
    """The path is not a regular file of at most ``LIMIT`` bytes: what it is instead."""


def read_regular(loc: Location, rel: str, limit: int = LIMIT) -> bytes:
    """The bytes of ``rel``; ``FileNotFoundError`` if it is gone, :class:`Refused` if it
    is not a small regular file."""
    if loc.local:
        return _read_local(loc.full(rel), limit)
    fs: Any = loc.fs()
    info = fs.info(loc.full(rel))
    if info.get("type") != "file":
        raise Refused(f"not a regular file (a {info.get('type')})")
    size = int(info.get("size") or 0)
    if size > limit:
        raise Refused(f"{size} bytes, more than the {limit} a _metadata may have")
    data = bytes(fs.cat_file(loc.full(rel), start=0, end=limit + 1))
    if len(data) > limit:
        raise Refused(f"more than the {limit} bytes a _metadata may have")
    return data


def read_head(loc: Location, rel: str, n: int) -> bytes:
    """The first ``n`` bytes of a regular file (fewer if it is shorter), with the checks of
    :func:`read_regular` but no size limit: enough to tell a format by its magic without
    reading a large file whole."""
    if loc.local:
        full = loc.full(rel)
        st = os.lstat(full)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"not a regular file (a {kind_of(st.st_mode)})")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(full, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused("not a regular file")
            return os.read(fd, n)
        finally:
            os.close(fd)
    fs: Any = loc.fs()
    if fs.info(loc.full(rel)).get("type") != "file":
        raise Refused("not a regular file")
    return bytes(fs.cat_file(loc.full(rel), start=0, end=n))


def open_error(full: str) -> OSError | None:
    """Why a regular file cannot be opened for reading (``None``: it can). What a restore
    must do with every referenced file; a mode that root ignores is not trusted, the
    open is tried. ``O_NONBLOCK``: a FIFO swapped in meanwhile does not block it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        os.close(os.open(full, flags))
    except OSError as err:
        return err
    return None


def kind_of(mode: int) -> str:
    """What a file that is not regular is, in words (for reports)."""
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symbolic link"),
    ):
        if test(mode):
            return name
    return "special file"


def _read_local(full: str, limit: int) -> bytes:
    st = os.lstat(full)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"not a regular file (a {kind_of(st.st_mode)})")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(full, flags)
    except OSError as err:
        if os.path.islink(full):
            raise Refused("not a regular file (a symbolic link)") from err
        raise
    try:
        st = os.fstat(fd)  # what was opened, not what lstat saw a moment before
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"not a regular file (a {kind_of(st.st_mode)})")
        if st.st_size > limit:
            raise Refused(f"{st.st_size} bytes, more than the {limit} a _metadata may have")
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:
            raise Refused(f"more than the {limit} bytes a _metadata may have")
        return b"".join(chunks)
    finally:
        os.close(fd)
