"""Deletes bound to what the plan saw, on a local disk (issue 32, finding 1).

A delete by full path (``os.remove(BASE/shared/d/f)``) resolves every directory on the way
when it runs: whoever can write under the base can rename ``d`` away after the plan and
put a link to an outside directory holding the same names in its place, and the delete
follows it. So nothing here is looked up by a path below the base: the base is opened,
then each component from its parent's descriptor with ``O_NOFOLLOW`` (a link there fails),
and the file is removed relative to the directory holding it (``unlink(name,
dir_fd=...)``), which removes a name, never what a link points at.

A walk that only refuses links is not enough: a real directory renamed into place (or the
base itself replaced, the base's path being the user's and allowed to be a link) is no
link. So the plan records each directory's device and inode as it walked it
(:func:`identify`), and the delete compares every directory it opens with them
(:func:`unlink_planned`): another directory in the same place is :class:`Changed`, and the
deletion refuses that file and the rest of that directory.

Object stores have no links and no directories to swap: a key names its object, and this
module is for local disks only (``pipeline.deletion`` says where the paths differ).

Every OS call goes through :data:`CALLS` (an :class:`OsCalls`), the one seam a test wraps
to swap a directory between any two calls.
"""

from __future__ import annotations

import errno
import os
import stat

from spec.errors import CkptError

Ident = tuple[int, int]
"""(st_dev, st_ino) of a directory or file as the plan saw it."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class Changed(CkptError):
    """A directory on the path is not the one the plan saw: a link, not a directory,
    gone, or another directory in its place. ``directory``: its container-relative path."""

    def __init__(self, directory: str, why: str) -> None:
        super().__init__(f"{directory}: {why}")
        self.directory = directory
        self.why = why


class OsCalls:
    """The OS calls of the walk; each looks its function up when made (a patched ``os``
    is seen)."""

    def open_base(self, path: str) -> int:
        """The base itself, by the path the user gave (it may be a link: their choice);
        its identity is what binds it to the plan."""
        return os.open(path, _DIR_FLAGS)

    def open_dir(self, fd: int, name: str) -> int:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def lstat_at(self, fd: int, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def unlink_at(self, fd: int, name: str) -> None:
        os.unlink(name, dir_fd=fd)

    def close(self, fd: int) -> None:
        os.close(fd)


CALLS = OsCalls()


def _ident(st: os.stat_result) -> Ident:
    return (st.st_dev, st.st_ino)


def _open_why(err: OSError) -> str:
    if err.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symbolic link or not a directory"
    if err.errno == errno.ENOENT:
        return "gone"
    return f"cannot be opened: {err.strerror or err}"


def _open_parent(
    base_path: str, job_dir: str, rel_dir: str, dirs: dict[str, Ident], *, record: bool
) -> int:
    """A descriptor of ``rel_dir`` (``job_dir`` or below it), opened from the base down.
    ``record``: note each directory's identity in ``dirs`` (the plan); otherwise each must
    be the one noted there (the delete), else :class:`Changed`."""
    fd = CALLS.open_base(base_path)
    here = job_dir
    try:
        _check(fd, here, dirs, record=record)
        rest = rel_dir[len(job_dir) + 1:]
        for name in rest.split("/") if rest else ():
            here = f"{here}/{name}"
            try:
                child = CALLS.open_dir(fd, name)
            except OSError as err:
                raise Changed(here, _open_why(err)) from None
            CALLS.close(fd)
            fd = child
            _check(fd, here, dirs, record=record)
        return fd
    except BaseException:
        CALLS.close(fd)
        raise


def _check(fd: int, here: str, dirs: dict[str, Ident], *, record: bool) -> None:
    now = _ident(CALLS.fstat(fd))
    if record:
        dirs.setdefault(here, now)
    if dirs.get(here) != now:
        raise Changed(here, f"not the directory the plan saw (device, inode {dirs.get(here)} "
                            f"then, {now} now)")


def identify(base_path: str, job_dir: str, path: str, dirs: dict[str, Ident]) -> Ident:
    """The plan's walk to ``path``: records the identity of every directory on the way in
    ``dirs`` (one already recorded must still match, else :class:`Changed`) and returns
    the file's. A file that is not a regular file (a link, a FIFO) is :class:`Changed`
    too, under its own path."""
    parent, name = path.rsplit("/", 1)
    fd = _open_parent(base_path, job_dir, parent, dirs, record=True)
    try:
        st = CALLS.lstat_at(fd, name)
    except FileNotFoundError:
        raise Changed(path, "gone") from None
    finally:
        CALLS.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Changed(path, "not a regular file")
    return _ident(st)


GONE = "gone"
DELETED = "deleted"
OTHER_FILE = "other-file"


def unlink_planned(
    base_path: str, job_dir: str, path: str, dirs: dict[str, Ident], file: Ident
) -> str:
    """Delete ``path`` through the directories the plan saw: :data:`DELETED`, :data:`GONE`
    (nothing by that name now) or :data:`OTHER_FILE` (another file under its name: not the
    one judged an orphan, kept); a directory on the way that changed raises
    :class:`Changed`. The last check and the unlink act on one directory held open, so the
    only window left is within that directory: a file put in place of the orphan between
    the two, which is never a file outside the base."""
    parent, name = path.rsplit("/", 1)
    fd = _open_parent(base_path, job_dir, parent, dirs, record=False)
    try:
        try:
            st = CALLS.lstat_at(fd, name)
        except FileNotFoundError:
            return GONE
        if _ident(st) != file or not stat.S_ISREG(st.st_mode):
            return OTHER_FILE
        try:
            CALLS.unlink_at(fd, name)
        except FileNotFoundError:
            return GONE
        return DELETED
    finally:
        CALLS.close(fd)
