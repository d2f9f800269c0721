"""The local disk's OS calls, made on names in directories held open (issue 14).

On a local disk the store looks up no name below its root by a path: each directory is
opened from its parent's descriptor with ``O_NOFOLLOW``, and a file is created, read,
renamed or removed relative to the descriptor of the directory holding it (``dir_fd``),
so a link swapped in after the store last looked is never followed. :class:`LocalOS` is
the one object those calls go through (the real ``os`` by default), so that a wrapper can
fail or crash any of them; :class:`Dir` is a directory it holds open.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO

from spec.errors import CkptError


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words: an error names what the store refused."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class Dir:
    """A directory of the local tree, held open by its descriptor (issue 14).

    The store reaches every name below its root from the root, one component at a time,
    each opened with ``O_NOFOLLOW`` relative to its parent's descriptor, and creates,
    reads, renames and removes names relative to the descriptor of the directory holding
    them: a link swapped in after the store last looked is never followed, because
    nothing is looked up by a path that could pass through it. ``path`` is the full path
    the directory was reached as: errors and a wrapper's bookkeeping name it.
    """

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def __repr__(self) -> str:
        return f"Dir({self.path!r}, fd={self.fd})"


def path_of(d: Dir | None, name: str) -> str:
    """The full path of ``name`` in ``d`` (``name`` itself when ``d`` is ``None``)."""
    if d is None:
        return name
    return f"{d.path.rstrip('/')}/{name}"


class NotRegularFile(CkptError, OSError):
    """What was opened to be read or appended to is no regular file (a FIFO, device,
    socket or directory): refused without reading (``mode`` says what it is)."""

    def __init__(self, path: str, mode: int) -> None:
        super().__init__(errno.EINVAL, f"{path} is {kind_of(mode)}", path)
        self.mode = mode


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the store looked opens at once (and is refused by
# its ``fstat``) instead of blocking the reader; on a regular file it changes nothing.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LocalOS:
    """The operating-system calls of :class:`Storage` on a local file system.

    Storage's local path makes every OS call through one object of this class and nowhere
    else. By default it is the real OS; a file system object with a ``local_os``
    attribute (a ``LocalOS``, e.g. a fault-injecting wrapper) supplies its own. Each call
    looks its function up when it is made (``os.fsync``, not a reference taken at import),
    so that pyfakefs and a patched ``os.fsync`` are seen.

    Below the store's root every call acts on a name in a directory held open (a
    :class:`Dir`) and never follows a link (issue 14): ``open_dir`` and the file opens use
    ``O_NOFOLLOW`` (a link there fails with ``ELOOP``, or ``ENOTDIR`` for a directory),
    removals and renames use ``dir_fd``, which act on the name itself. ``d=None`` means
    ``name`` is a path outside the store's tree: the root and the directories above it,
    which are the user's choice of where the base lives and may be links.
    """

    # -------------------------------------------------------------- directories

    def open_dir(self, d: Dir | None, name: str) -> Dir:
        """Open directory ``name`` in ``d``, never through a link (``d=None``: ``name``
        is a path outside the tree, opened as given)."""
        if d is None:
            return Dir(os.open(name, _DIR_FLAGS), name)
        return Dir(os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=d.fd), path_of(d, name))

    def close_dir(self, d: Dir) -> None:
        os.close(d.fd)

    def isdir(self, path: str) -> bool:
        """Whether ``path``, outside the tree (the root or above), is a directory."""
        return os.path.isdir(path)

    def mkdir(self, d: Dir | None, name: str) -> None:
        os.mkdir(name, dir_fd=None if d is None else d.fd)

    def fsync_dir(self, d: Dir) -> None:
        """Make the names in directory ``d`` durable: files created, renamed or
        directories made in it survive a power loss only once this returns."""
        try:
            os.fsync(d.fd)
        except OSError as err:
            # A file system that cannot sync a directory says so (some network and FUSE
            # file systems): there is nothing more to do there. Any other error is real.
            if err.errno not in (errno.EINVAL, errno.ENOTSUP):
                raise

    def scandir(self, d: Dir) -> list[os.DirEntry[str]]:
        return self._entries(d)

    @staticmethod
    def _entries(d: Dir) -> list[os.DirEntry[str]]:
        with os.scandir(d.fd) as it:
            return list(it)

    def lstat(self, d: Dir | None, name: str) -> os.stat_result:
        """The status of ``name`` itself: a symbolic link is not followed."""
        return os.stat(name, dir_fd=None if d is None else d.fd, follow_symlinks=False)

    def readlink(self, d: Dir, name: str) -> str:
        return os.readlink(name, dir_fd=d.fd)

    # -------------------------------------------------------------- files

    @staticmethod
    def _create(d: Dir, name: str) -> int:
        return os.open(name, _NEW_FILE, 0o666, dir_fd=d.fd)

    def open(self, d: Dir, name: str) -> IO[bytes]:
        """A new file ``name`` in ``d`` opened for writing (truncated if it exists; a
        link there is refused, never followed to truncate its target)."""
        return os.fdopen(self._create(d, name), "wb")

    def open_append(self, d: Dir, name: str) -> IO[bytes]:
        """Regular file ``name`` in ``d`` opened for appending (``NotRegularFile``
        else)."""
        fd = os.open(name, _APPEND, dir_fd=d.fd)
        try:
            self._regular(fd, path_of(d, name))
            return os.fdopen(fd, "ab")
        except BaseException:
            os.close(fd)
            raise

    def read(self, d: Dir, name: str, start: int = 0, length: int | None = None) -> bytes:
        """Up to ``length`` bytes (all with ``None``) of regular file ``name`` in ``d``
        from ``start`` (``NotRegularFile`` for anything else: nothing is read)."""
        with os.fdopen(os.open(name, _READ, dir_fd=d.fd), "rb") as f:
            self._regular(f.fileno(), path_of(d, name))
            if start:
                f.seek(start)
            return f.read() if length is None else f.read(length)

    @staticmethod
    def _regular(fd: int, path: str) -> None:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)

    def fsync(self, f: IO[bytes]) -> None:
        """Make the bytes written to ``f`` (already flushed) durable."""
        os.fsync(f.fileno())

    def create_exclusive(self, d: Dir, name: str, data: bytes) -> None:
        """Create ``name`` in ``d`` holding ``data`` (synced), failing with
        ``FileExistsError`` if it exists: ``O_EXCL`` makes the check and the creation one
        step (and a link there exists: never followed)."""
        fd = os.open(name, _EXCLUSIVE, 0o666, dir_fd=d.fd)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, d: Dir, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, both in ``d`` (a link at ``dst`` is replaced, its
        target untouched)."""
        os.replace(src, dst, src_dir_fd=d.fd, dst_dir_fd=d.fd)

    # -------------------------------------------------------------- removing

    def remove(self, d: Dir, name: str) -> None:
        """Remove file ``name`` from ``d`` (a link: the link itself)."""
        self._unlink(d, name)

    def rmdir(self, d: Dir, name: str) -> None:
        """Remove the empty directory ``name`` from ``d`` (``ENOTDIR`` for a link)."""
        self._rmdir(d, name)

    def rmtree(self, d: Dir, name: str) -> None:
        """Remove directory ``name`` from ``d`` and everything in it, walking down by
        descriptors in sorted order: a link inside is removed as a name, never descended
        into, and so is a directory swapped for a link while the walk runs. ``name``
        itself a link: ``ENOTDIR`` (or ``ELOOP``), nothing removed."""
        self._rmtree(d, name)

    def _rmtree(self, d: Dir, name: str) -> None:
        # One descriptor per level of the directory being emptied, none for its siblings:
        # depth, not width, bounds the descriptors held.
        sub = self.open_dir(d, name)
        try:
            for e in sorted(self._entries(sub), key=lambda e: e.name):
                try:
                    if e.is_dir(follow_symlinks=False):
                        try:
                            self._rmtree(sub, e.name)
                            continue
                        except OSError as err:
                            if err.errno not in (errno.ENOTDIR, errno.ELOOP):
                                raise
                        # no directory any more (a link or a file swapped in): its name goes
                    self._unlink(sub, e.name)
                except FileNotFoundError:
                    continue  # removed meanwhile: what this call was to do
        finally:
            self.close_dir(sub)
        self._rmdir(d, name)

    def _unlink(self, d: Dir, name: str) -> None:
        os.unlink(name, dir_fd=d.fd)

    def _rmdir(self, d: Dir, name: str) -> None:
        os.rmdir(name, dir_fd=d.fd)
