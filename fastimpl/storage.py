"""Storage: a thin layer over an fsspec file system and a root path.

Every storage call the store makes is a method here, so that a fault injector (armed by
``FailNextCall``) can fail it, and so that any error the file system raises (``OSError``
and the like, e.g. from a failing wrapper file system) becomes a :class:`StorageFault`
naming the operation and the path. Paths are relative to the root and ``/``-separated,
as in ``spec.layout``.

Durability (R12): a file written through ``append`` is flushed, and on a local file
system ``os.fsync``-ed, before the call returns, so a handle built after it names bytes
that survive a crash. On other stores a file is durable once closed. On a local file
system a name is durable only once its directory is synced too, so the parent directory
is ``fsync``-ed after a file is created (once per file, not per append), after the rename
that puts a ``_metadata`` in place, and after each directory that ``makedirs`` newly
creates. The local path makes its OS calls through one :class:`LocalOS` object (the real
``os`` by default), so that a wrapper can fail or crash any of them.

Links (issue 14): on a local disk no name below the root is looked up by a path. The
store opens the root, then each component from its parent's descriptor with
``O_NOFOLLOW``, and creates, reads, renames and removes a name relative to the directory
holding it (``dir_fd``); a recursive delete walks down the same way. A link met anywhere
below the root is refused (``UnsafePathError`` naming the path and the link), and a check
and a use are one call, so a link swapped in between is never followed either.

Deletions (issue 3) run off the write path: with ``background_deletes`` (the default) a
delete is decided and recorded by the caller, and carried out by a worker thread that
batches what is queued (one bulk call on stores that have one), retries a failing call
with backoff, and reports a delete that keeps failing in :attr:`Storage.failed_deletes`
until :meth:`Storage.retry_failed` succeeds: a delete is never forgotten. A create or a
directory creation under a path whose deletion is still queued waits for the queue first,
so a late delete never removes a newer file. ``drain()`` waits for the queue to empty.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from fastimpl.metadata import Metadata, MetadataError, check_named, decode
from spec.commands import StorageOp
from spec.errors import CkptError
from spec.layout import SAVEPOINTS, is_under

_JOB_NAME = re.compile(r"job-(\d+)")
_SAVEPOINT_NAME = re.compile(r"savepoint-(\d+)")
"""Zero bytes for appends given as a length: slices of one buffer, no copies."""
_BATCH = 1000
"""At most this many paths per bulk delete (S3's DeleteObjects limit)."""
_LINGER = 1.0
"""Seconds the deleter thread waits for more work before it ends: a job that checkpoints
more often than this keeps one thread, instead of starting one per checkpoint, whose
start the caller waits for (a wake-up of the new thread: a millisecond and more on a
busy machine, on the path of every complete and every notice)."""

OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "adl", "oss"})
"""Protocols whose objects appear only once closed: ACROSS merging is refused there."""
READABLE_STORES = frozenset({"file", "local", "memory", "hdfs", "arrow_hdfs"})
"""Protocols whose flushed bytes of an open file are readable (and durable) at once.
A store named in neither set is taken to hide open files: the safe guess (R16)."""


class UnknownWrapperError(CkptError, ValueError):
    """A file system wraps another one in a way the store does not know (issue 14): where
    its bytes end up, and when, cannot be told, so it is refused rather than guessed."""


class CachedLocalDiskError(CkptError, ValueError):
    """A caching wrapper (``simplecache::``, ``filecache::``, ``blockcache::``) over a
    local disk (issue 14): through the cache the store's calls go through fsspec, which
    follows links, so the store's refusal of links below its root (``UnsafePathError``)
    could not run; and a cache of a disk on the same machine buys nothing. Refused before
    any I/O: open the local path (or ``dir::`` over it) without the cache."""


def _protocol_names(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _wrapped(fs: Any) -> list[Any]:
    """The file systems ``fs`` holds as attributes: a wrapper passes calls on to them."""
    from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

    held = [v for v in vars(fs).values() if isinstance(v, AbstractFileSystem) and v is not fs]
    options = getattr(fs, "storage_options", None) or {}
    if not held and isinstance(options, dict) and "target_protocol" in options:
        held.append(options["target_protocol"])  # a target named but not held
    return held


def open_files_readable(fs: Any) -> bool:
    """R16, decided by the storage that finally holds the bytes (issue 14): whether the
    flushed bytes of a file still open for writing are readable and durable there.

    Walks a chain of fsspec wrappers (chained URLs such as ``simplecache::s3://``,
    ``DirFileSystem.fs``, a cache's ``fs``/``target_protocol``). A file system may state
    the answer itself with a boolean ``open_files_readable`` attribute (a wrapper that
    knows what it does); a wrapper that does not, and that the store does not know,
    raises ``UnknownWrapperError``: a wrong "readable" would let ACROSS merging name bytes
    that never reached the store, and a wrong guess either way is not ours to make. A
    cache whose chain ends in a local disk raises ``CachedLocalDiskError`` (issue 14):
    the same walk, so every store and recovery asks it once, before any I/O.
    """
    from fsspec.implementations.cached import CachingFileSystem  # type: ignore[import-untyped]
    from fsspec.implementations.dirfs import DirFileSystem  # type: ignore[import-untyped]

    declared = getattr(fs, "open_files_readable", None)
    if isinstance(declared, bool):
        return declared
    names = _protocol_names(fs)
    if OBJECT_STORES.intersection(names):
        return False
    if isinstance(fs, CachingFileSystem):
        _refuse_a_cache_of_a_local_disk(fs)
        # simplecache/filecache write to a local copy and upload it at close; blockcache
        # writes through but serves reads from cached blocks, stale while a file grows.
        # Either way a reader does not see an open file's flushed bytes where they end up.
        return False
    if isinstance(fs, DirFileSystem):
        return open_files_readable(fs.fs)
    inner = _wrapped(fs)
    if inner:
        kind = f"{type(fs).__module__}.{type(fs).__qualname__}"
        raise UnknownWrapperError(
            f"file system {kind} (protocol {'/'.join(names)}) wraps another one the store"
            " cannot see through: whether an open file's flushed bytes reach the storage"
            " that holds them is unknown (R16); unwrap it, or give its class a boolean"
            " open_files_readable attribute saying so"
        )
    return bool(READABLE_STORES.intersection(names))


def _refuse_a_cache_of_a_local_disk(cache: Any) -> None:
    """Follow ``cache``'s target through ``dir::`` and further caches; raise
    ``CachedLocalDiskError`` if it ends in a local disk."""
    from fsspec.implementations.cached import CachingFileSystem
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

    chain = [cache]
    inner = cache.fs
    while isinstance(inner, CachingFileSystem | DirFileSystem):
        chain.append(inner)
        inner = inner.fs
    if isinstance(inner, LocalFileSystem) or {"file", "local"} & set(_protocol_names(inner)):
        url = "".join(f"{_protocol_names(c)[0]}::" for c in chain) + "file://"
        raise CachedLocalDiskError(
            f"{url}: a cache over a local disk is refused. Through the cache the store"
            " cannot refuse symbolic links in its tree (issue 14), and a cache of a disk"
            " on this machine buys nothing: give the local path (or dir:: over it)"
            " without the cache"
        )


log = logging.getLogger("fastimpl.storage")


class StorageFault(CkptError):
    """A storage call failed (an armed fault, or an error of the file system)."""

    def __init__(self, op: StorageOp, path: str, cause: BaseException | None = None) -> None:
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{op.value} {path} failed{detail}")
        self.op = op
        self.path = path
        self.cause = cause


class ReadFault(StorageFault, ValueError):
    """Reading bytes back failed: the file is missing or unreadable, or shorter than a
    handle says (a ``ValueError`` too, as a short read was before)."""

    def __init__(self, path: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(StorageOp.APPEND, path, cause)
        self.args = (message,)


class UnsafePathError(CkptError, OSError):
    """A path of the store's tree leads through a symbolic link, or names a special file
    (FIFO, device, socket) where a regular file belongs (issue 14). The store never
    creates either, so one is a hand-made change: it is refused, never followed, read
    or deleted through. An ``OSError``, so that every caller handles it as the failed
    storage call it is (a ``ReadFault``, a ``MetadataError``, a delete kept failing)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(errno.ELOOP, message, path)
        self.args = (message,)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


def _kind_of(mode: int) -> str:
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


WRITER_LEASE = "_writer"
"""The file at the root naming the one store that may write there (issue 14): written
when a store opens a base, checked before every ``_metadata`` write and every delete, so a
store another one has taken the base from (a recovery, a second run) stops changing it."""


class FencedError(StorageFault):
    """Another store has taken this base over (its lease replaced ours): this store may no
    longer write metadata or delete anything there."""

    def __init__(self, op: StorageOp, path: str, detail: str) -> None:
        super().__init__(op, path)
        self.args = (f"{op.value} {path} refused: {detail}",)


class DeleteFailure:
    """A delete that failed ``attempts`` times in a row; kept until a retry succeeds."""

    __slots__ = ("attempts", "deleted_by", "error", "is_dir", "path")

    def __init__(
        self,
        path: str,
        is_dir: bool,
        error: BaseException,
        attempts: int,
        deleted_by: dict[str, str] | None = None,
    ) -> None:
        self.path = path
        self.is_dir = is_dir
        self.error = error
        self.attempts = attempts
        self.deleted_by: dict[str, str] = deleted_by or {}
        """Who decided to delete each file the failed delete was to remove: they stay
        that party's until a retry succeeds (the store's bookkeeping has let them go)."""

    def __repr__(self) -> str:
        kind = "directory" if self.is_dir else "file"
        return f"DeleteFailure({kind} {self.path!r}, {self.attempts} attempts: {self.error!r})"


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
        super().__init__(errno.EINVAL, f"{path} is {_kind_of(mode)}", path)
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


def _through_local_dirfs(fs: Any, root: str) -> tuple[Any, str]:
    """``dir::`` over a local disk is that disk under a longer root: unwrapped, so that
    its calls take the local path (its syncs, and its refusal of links, issue 14)."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    inner = fs
    while isinstance(inner, DirFileSystem):
        inner = inner.fs
    if inner is fs or not isinstance(inner, LocalFileSystem):
        return fs, root
    while isinstance(fs, DirFileSystem):
        root = fs._join(root) if root else fs.path
        fs = fs.fs
    return fs, root


class Storage:
    """Performs the effects of the store on a real file system."""

    def __init__(
        self,
        fs: Any,
        root: str,
        *,
        background_deletes: bool = True,
        delete_attempts: int = 3,
        retry_backoff: float = 0.05,
    ) -> None:
        fs, root = _through_local_dirfs(fs, root)
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root else ""
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.protocol = protocol
        self._local = protocol in ("file", "local")
        local_os = getattr(fs, "local_os", None)
        self.os: LocalOS = local_os if isinstance(local_os, LocalOS) else LocalOS()
        """The OS calls of the local path (the file system's ``local_os`` if it has one)."""
        self.open_files_readable = open_files_readable(fs)
        """Whether flushed bytes of an open file are readable where they end up (not on
        object stores, nor through a cache that uploads at close, R16)."""
        # fsspec's memory file system iterates a shared dict when it lists or deletes
        # recursively; a lock keeps the deleter thread from racing the writer there.
        self._fs_lock: threading.Lock | None = threading.Lock() if protocol == "memory" else None
        self._open: dict[str, IO[bytes]] = {}
        self.armed: list[StorageOp] = []
        """Faults armed by ``FailNextCall``: the next call of each kind fails."""
        self.real_faults = 0
        """Write-path calls (create, append, close, metadata, read back) the file system
        itself failed; background deletes report theirs in ``failed_deletes``."""
        self.background = background_deletes
        self.delete_attempts = max(1, delete_attempts)
        self.retry_backoff = retry_backoff
        self._queue: deque[tuple[str, bool]] = deque()
        self._queued_dirs: set[str] = set()
        """Directories a queued delete or prune will remove: a create under one waits."""
        self._prunes: list[tuple[str, ...]] = []
        self._cv = threading.Condition()
        self._busy = False
        self._worker: threading.Thread | None = None
        self._idle = True
        """Whether the deleter has done everything queued (prunes too) and waits for more."""
        self.failed_deletes: dict[str, DeleteFailure] = {}
        self._deleters: dict[str, dict[str, str]] = {}
        """Who asked for each queued delete (``deleted_by``), until it is done or fails."""
        """Deletes that kept failing, by path: reported, and retried by ``retry_failed``."""
        self.deletes_done = 0
        self.delete_calls = 0
        self._unsynced_dirs: set[str] = set()
        """Local disk: directories holding a name made here whose sync has not succeeded."""
        self.lease: bytes | None = None
        """This store's token in ``WRITER_LEASE`` (``None``: no lease is kept or checked,
        e.g. the model-driven ``InProcessEngine`` of the lockstep tests)."""
        self.deleter_died: BaseException | None = None
        """What ended the deleter thread abnormally (not an ``Exception``: those are
        retried and reported), e.g. the process dying: ``drain`` raises it."""

    def full(self, path: str) -> str:
        if not path:
            return self.root
        return f"{self.root}/{path}" if self.root else path

    # ------------------------------------------------------------------ the local tree (issue 14)
    #
    # On a local disk nothing below the root is looked up by a path: the store opens the
    # root, then each component from its parent with O_NOFOLLOW, and acts on the last name
    # relative to the directory holding it (``LocalOS``). A link is refused wherever it is
    # met, whenever it was put there (a check and a use are one call), one whose target is
    # inside the base too: the store never makes one, so a link is a hand-made change, and
    # one inside would give a file two names (two owners, a double delete). The root and
    # the directories above it are the user's choice of where the base lives, and may be
    # links.

    @contextmanager
    def _dir(self, rel: str, path: str, *, make: bool = False) -> Iterator[Dir]:
        """Directory ``rel`` (below the root; ``""``: the root) held open while the body
        runs, reached without following a link: a link on the way is refused with
        ``UnsafePathError`` naming ``path`` (what the caller acts on) and the link.
        ``make``: missing directories are made, and each new name is synced in its parent
        (innermost first) before the body runs (R12)."""
        osl = self.os
        if make and self._unsynced_dirs:
            self._pay_sync_debts()
        top = self.root or "/"
        try:
            d = osl.open_dir(None, top)
        except FileNotFoundError:
            if not make:
                raise
            self._makedirs_outside(top)
            d = osl.open_dir(None, top)
        opened = [d]
        try:
            owed: list[Dir] = []
            parts = rel.split("/") if rel else []
            for i, name in enumerate(parts):
                try:
                    sub = self._open_sub(d, parts, i, path)
                except FileNotFoundError:
                    if not make:
                        raise
                    self._unsynced_dirs.add(d.path)  # owed until the sync below succeeds
                    try:
                        osl.mkdir(d, name)
                    except FileExistsError:
                        pass  # made meanwhile: opened below like any other
                    owed.append(d)
                    sub = self._open_sub(d, parts, i, path)
                opened.append(sub)
                d = sub
            for parent in reversed(owed):
                osl.fsync_dir(parent)
                self._unsynced_dirs.discard(parent.path)
            yield d
        finally:
            for x in reversed(opened):
                osl.close_dir(x)

    @contextmanager
    def _at(self, path: str, *, make: bool = False) -> Iterator[tuple[Dir, str]]:
        """The directory holding ``path`` (held open, as ``_dir``) and ``path``'s name."""
        parent, _, name = path.rpartition("/")
        with self._dir(parent, path, make=make) as d:
            yield d, name

    def _open_sub(self, d: Dir, parts: list[str], i: int, path: str) -> Dir:
        try:
            return self.os.open_dir(d, parts[i])
        except OSError as err:
            if err.errno in (errno.ENOTDIR, errno.ELOOP):
                unsafe = self._unsafe(d, parts[i], path, "/".join(parts[: i + 1]), leaf=False)
                if unsafe is not None:
                    raise unsafe from err
            raise

    def _unsafe(
        self, d: Dir, name: str, path: str, rel: str, *, leaf: bool
    ) -> UnsafePathError | None:
        """What ``name`` in ``d`` is, if that is a reason to refuse ``path``: a link
        (anywhere), or a special file where a regular ``leaf`` file belongs. Asked after
        a call failed, or before a read opens anything (so nothing blocks on a FIFO)."""
        try:
            mode = self.os.lstat(d, name).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            try:
                target = f" to {self.os.readlink(d, name)!r}"
            except OSError:
                target = ""
            return UnsafePathError(
                path,
                f"{path}: {rel} is a symbolic link{target}; the store never follows a"
                " link in its tree (nothing was read, written or deleted through it)",
            )
        if leaf and not stat.S_ISREG(mode):
            return self._special(path, mode)
        return None

    @staticmethod
    def _special(path: str, mode: int) -> UnsafePathError:
        return UnsafePathError(
            path, f"{path} is {_kind_of(mode)} where a regular file belongs: not read"
        )

    def _leaf_failed(self, err: OSError, d: Dir, name: str, path: str) -> OSError:
        """The error to raise for a failed call on ``path`` (``name`` in ``d``): a link
        or a special file there is said so; any other error is itself."""
        if isinstance(err, NotRegularFile):
            return self._special(path, err.mode)
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EISDIR):
            return self._unsafe(d, name, path, path, leaf=True) or err
        return err

    def _read_local(self, path: str, start: int = 0, length: int | None = None) -> bytes:
        """Read regular file ``path`` through descriptors: its type is checked before it
        is opened (a FIFO, device or socket is never opened) and again on the descriptor
        (something swapped in since is refused unread)."""
        with self._at(path) as (d, name):
            unsafe = self._unsafe(d, name, path, path, leaf=True)
            if unsafe is not None:
                raise unsafe
            try:
                return self.os.read(d, name, start, length)
            except FileNotFoundError:
                raise
            except OSError as err:
                failed = self._leaf_failed(err, d, name, path)
                if failed is err:
                    raise
                raise failed from err

    def _pay_sync_debts(self) -> None:
        """Sync every directory still owed a sync (one failed, or was never reached),
        innermost first: a later call would find the names there and not know that
        they are not durable yet."""
        for p in sorted(self._unsynced_dirs, key=len, reverse=True):
            try:
                with self._open_full(p) as d:
                    self.os.fsync_dir(d)
            except FileNotFoundError:
                pass  # deleted since: no name in it is owed any more
            except UnsafePathError as err:
                log.warning("not syncing %s: %s", p, err)  # no longer the store's
            self._unsynced_dirs.discard(p)

    @contextmanager
    def _open_full(self, full: str) -> Iterator[Dir]:
        """Directory ``full`` (a full path) held open: through the tree below the root,
        as given at the root and above it."""
        prefix = (self.root or "") + "/"
        if full.startswith(prefix) and full != prefix:
            rel = full[len(prefix) :]
            with self._dir(rel, rel) as d:
                yield d
            return
        d = self.os.open_dir(None, full)
        try:
            yield d
        finally:
            self.os.close_dir(d)

    def _makedirs_outside(self, top: str) -> None:
        """Make the root ``top`` and its missing parents (outside the tree: by path), and
        sync the parent of each directory made here, once."""
        osl = self.os
        made: list[str] = []
        d = top
        while not osl.isdir(d):
            made.append(d)
            parent = os.path.dirname(d)
            if not parent or parent == d:
                break
            d = parent
        owed = {os.path.dirname(d) or "." for d in made}
        self._unsynced_dirs |= owed
        for d in reversed(made):
            try:
                osl.mkdir(None, d)
            except FileExistsError:
                if not osl.isdir(d):
                    raise  # a file of that name
        for p in sorted(owed, key=len, reverse=True):
            with self._open_full(p) as held:
                osl.fsync_dir(held)
            self._unsynced_dirs.discard(p)

    def _local_tree(self, top: str) -> Iterator[tuple[str, Dir, list[os.DirEntry[str]]]]:
        """Every directory from ``top`` (below the root; ``""``: the root) down, depth
        first: its path relative to the root, the directory held open while the caller
        looks at it, and its entries (whose ``stat`` needs it open). Each is opened from
        its parent without following a link; descriptors are held along one path only
        (the depth of the tree, not its width). A directory missing (not made yet,
        deleted meanwhile), or no longer a directory, is skipped; ``top`` a link raises
        ``UnsafePathError``."""
        osl = self.os
        try:
            root = osl.open_dir(None, self.root or "/")
        except (FileNotFoundError, NotADirectoryError):
            return
        held: list[tuple[str, Dir]] = [("", root)]
        stack: list[list[str]] = [top.split("/") if top else []]
        depth = len(stack[0])
        try:
            while stack:
                parts = stack.pop()
                keep = 0
                while (
                    keep < len(parts) and keep + 1 < len(held) and held[keep + 1][0] == parts[keep]
                ):
                    keep += 1
                while len(held) > keep + 1:
                    osl.close_dir(held.pop()[1])
                try:
                    for i in range(keep, len(parts)):
                        held.append((parts[i], self._open_sub(held[-1][1], parts, i, top)))
                except UnsafePathError:
                    if len(parts) == depth:
                        raise  # ``top`` itself, or a directory above it
                    continue  # swapped for a link since it was listed: not descended into
                except (FileNotFoundError, NotADirectoryError):
                    continue
                rel = "/".join(parts)
                d = held[-1][1]
                entries = osl.scandir(d)
                yield rel, d, entries
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append([*parts, e.name])
                    except FileNotFoundError:
                        continue
        finally:
            while held:
                osl.close_dir(held.pop()[1])

    # ------------------------------------------------------------------ the base's owner

    def existing(self) -> tuple[list[int], list[int], bool]:
        """What the base holds already: the numbers of its ``job-<n>`` entries, of its
        ``savepoints/savepoint-<n>`` entries, and whether a writer lease is there."""
        jobs: list[int] = []
        sps: list[int] = []
        names = self._names("")
        for name in names:
            m = _JOB_NAME.fullmatch(name)
            if m:
                jobs.append(int(m.group(1)))
        if SAVEPOINTS in names:
            for name in self._names(SAVEPOINTS):
                m = _SAVEPOINT_NAME.fullmatch(name)
                if m:
                    sps.append(int(m.group(1)))
        return sorted(jobs), sorted(sps), WRITER_LEASE in names

    def _names(self, path: str) -> set[str]:
        """The names in directory ``path`` (below the root; ``""``: the root)."""
        try:
            if self._local:
                with self._dir(path, path) as d:
                    return {e.name for e in self.os.scandir(d)}
            listed = self.fs.ls(self.full(path) or "/", detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed}

    def take_lease(self, token: bytes, *, exclusive: bool) -> bool:
        """Write this store's token into ``WRITER_LEASE``; ``exclusive``: only if no lease
        is there (atomically where the store can: ``O_EXCL`` on a local disk, a
        conditional PUT on S3). False if ``exclusive`` and a lease was there."""
        try:
            if self._local:
                with self._dir("", WRITER_LEASE, make=True) as d:
                    if exclusive:
                        self.os.create_exclusive(d, WRITER_LEASE, token)
                    else:
                        self._write_replace(d, WRITER_LEASE, token)
                    self.os.fsync_dir(d)
            else:
                full = self.full(WRITER_LEASE)
                self.fs.pipe_file(full, token, mode="create" if exclusive else "overwrite")
        except FileExistsError:
            return False
        self.lease = token
        return True

    def check_lease(self, op: StorageOp, path: str) -> None:
        """Raise ``FencedError`` unless ``WRITER_LEASE`` still holds this store's token."""
        if self.lease is None:
            return
        try:
            if self._local:
                held = self._read_local(WRITER_LEASE)
            else:
                held = bytes(self.fs.cat_file(self.full(WRITER_LEASE)))
        except FileNotFoundError:
            held = b""
        except Exception as err:
            raise StorageFault(op, path, err) from err
        if held != self.lease:
            raise FencedError(
                op,
                path,
                f"another store has taken the base over ({WRITER_LEASE} holds"
                f" {held[:80]!r}, this store's lease was {self.lease[:80]!r})",
            )

    # ------------------------------------------------------------------ faults

    def arm(self, op: StorageOp) -> None:
        self.armed.append(op)

    def fire(self, op: StorageOp, path: str) -> None:
        if op in self.armed:
            self.armed.remove(op)
            raise StorageFault(op, path)

    def _failed(self, fault: StorageFault) -> StorageFault:
        """Count an error of the file system itself (not an armed fault): a command trace
        says where one happened, since the model can replay only armed faults."""
        self.real_faults += 1
        return fault

    # ------------------------------------------------------------------ writing

    def mkdir(self, path: str) -> None:
        """Make directory ``path`` and its missing parents. On a local disk each parent
        of a directory made here is synced afterwards (once), so the new names survive a
        power loss. A parent whose sync failed (or was never reached) stays owed, and is
        synced before any later directory is made or file created: the next call would
        find the directory there and not know that its name is not durable yet."""
        self._wait_for_deletes_under(path)
        try:
            if self._local:
                with self._dir(path, path, make=True):
                    pass
            else:
                self.fs.makedirs(self.full(path), exist_ok=True)
        except Exception as err:
            raise self._failed(StorageFault(StorageOp.CREATE, path, err)) from err

    def create(self, path: str) -> None:
        self.fire(StorageOp.CREATE, path)
        self._wait_for_deletes_under(path)
        f: IO[bytes] | None = None
        try:
            if self._local:
                with self._at(path, make=True) as (d, name):
                    f = self._create_in(d, name, path)
                    self.os.fsync_dir(d)  # the new name survives a power loss (R12)
            else:
                full = self.full(path)
                self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
                f = self.fs.open(full, "wb")
        except Exception as err:
            if f is not None:
                self._close_quietly(path, f)
            self._remove_after_failure(path)
            raise self._failed(StorageFault(StorageOp.CREATE, path, err)) from err
        assert f is not None
        self._open[path] = f

    def _create_in(self, d: Dir, name: str, path: str) -> IO[bytes]:
        try:
            return self.os.open(d, name)
        except OSError as err:
            failed = self._leaf_failed(err, d, name, path)
            if failed is err:
                raise
            raise failed from err

    @staticmethod
    def _close_quietly(path: str, f: IO[bytes]) -> None:
        try:
            f.close()
        except Exception as err:
            log.debug("closing %s after a failure: %r", path, err)

    def append(self, path: str, length: int, data: bytes | memoryview) -> None:
        """Append ``data`` (``length`` bytes) to an open file and make it durable."""
        if len(data) != length:
            raise ValueError(f"append to {path}: {len(data)} bytes given for {length}")
        if self.armed:
            self.fire(StorageOp.APPEND, path)
        f = self._open[path]
        try:
            f.write(data)
            f.flush()
            if self._local:
                self.os.fsync(f)
        except Exception as err:
            raise self._failed(StorageFault(StorageOp.APPEND, path, err)) from err

    def close(self, path: str) -> None:
        """Close an open file. On an object store this is the upload: it can fail.

        A failed upload leaves the file's bytes dead (R17); it may still have reached the
        store (the answer was lost), so it is removed: no handle can name it yet (R12).
        Elsewhere every ``append`` flushed (and synced) its bytes already, so an error from
        closing loses nothing: it is logged, and the file counts as closed.
        """
        f = self._open.pop(path, None)
        if f is not None:
            try:
                f.close()
            except Exception as err:
                if self.open_files_readable:
                    log.warning("closing %s failed after its bytes were flushed: %r", path, err)
                    return
                self._remove_after_failure(path)
                raise self._failed(StorageFault(StorageOp.APPEND, path, err)) from err

    def reopen(self, path: str) -> None:
        """Take up a file that an earlier process of the same TM attempt left open: its
        appends continue at its end. A TM whose records move between processes with its
        subtask (``pipeline.stream``: Spark gives a partition no fixed worker) gives up
        the handle in one (``abandon``, every append being durable already) and takes it
        up here in the next. Local disks only: elsewhere the bytes of an open file are
        its writer process's until it closes, so no other process can continue it."""
        if not self._local:
            raise ValueError(f"{path}: only a file on a local disk can be reopened")
        if path in self._open:
            return
        with self._at(path) as (d, name):
            unsafe = self._unsafe(d, name, path, path, leaf=True)
            if unsafe is not None:
                raise unsafe
            try:
                self._open[path] = self.os.open_append(d, name)
            except FileNotFoundError:
                raise
            except OSError as err:
                failed = self._leaf_failed(err, d, name, path)
                if failed is err:
                    raise
                raise failed from err

    def abandon(self, path: str) -> None:
        """Forget an open file without finishing it (its process is gone)."""
        f = self._open.pop(path, None)
        if f is not None:
            try:
                f.close()
            except Exception as err:  # a dead writer's upload may fail: nothing to keep
                log.debug("closing abandoned %s: %r", path, err)

    def discard(self, path: str) -> None:
        """Forget an open file whose writer died, on a store that writes an object only
        when its file is closed (R12, R65): nothing is uploaded, so it never exists."""
        f = self._open.pop(path, None)
        if f is None:
            return
        try:
            throw_away = getattr(f, "discard", None)  # fsspec: drop the buffer, abort parts
            if callable(throw_away):
                throw_away()
            f.closed = True  # type: ignore[misc]  # a later close (or __del__) uploads nothing
        except Exception as err:
            log.debug("discarding %s: %r", path, err)
        if not self._local:
            # a file system that shows a file from its creation (memory://, standing in
            # for an object store in tests) keeps what no object store would have
            full = self.full(path)
            try:
                if self.fs.exists(full):
                    self.fs.rm_file(full)
            except Exception as err:
                log.debug("removing discarded %s: %r", path, err)

    def _write_replace(self, d: Dir, name: str, data: bytes, suffix: str = ".inprogress") -> None:
        """Write ``data`` to ``name`` in ``d`` whole or not at all on a local disk: a
        synced twin (``name`` + ``suffix``), then a rename (the caller syncs the
        directory)."""
        tmp = name + suffix
        with self._create_in(d, tmp, path_of(d, tmp)) as f:
            f.write(data)
            f.flush()
            self.os.fsync(f)
        self.os.replace(d, tmp, name)

    def publish(self, path: str, data: bytes) -> None:
        """Write a small file for readers outside the store (``fastimpl.writer_state``)
        whole or not at all: on a local disk a synced twin named for this process, then
        a rename, both through the descriptor walk (never through a link, issue 14); a
        single PUT elsewhere. Not a checkpoint write: no armed fault fires and no lease
        is checked."""
        if not self._local:
            self.fs.pipe_file(self.full(path), data)
            return
        with self._at(path, make=True) as (d, name):
            self._write_replace(d, name, data, f".tmp-{os.getpid()}")

    def unpublish(self, path: str) -> None:
        """Delete a file :meth:`publish` wrote, if it is there; not a checkpoint delete
        either: no armed fault fires, no lease is checked, nothing is queued. On a local
        disk through the descriptor walk (a link there: the link itself)."""
        if not self._local:
            try:
                self.fs.rm_file(self.full(path))
            except FileNotFoundError:
                pass
            return
        try:
            with self._at(path) as (d, name):
                self.os.remove(d, name)
        except FileNotFoundError:
            pass

    def write_metadata(self, path: str, data: bytes) -> None:
        """Write a checkpoint's metadata atomically: a temporary file, then a rename.

        On a local disk the temporary file is synced before the rename and its directory
        after it, so a ``_metadata`` that this call put in place survives a power loss.
        A crash before the rename leaves ``_metadata.inprogress``: never read as a
        ``_metadata``, it is garbage that recovery deletes. On object stores a single PUT
        is atomic already: the object appears whole or not.
        """
        self.fire(StorageOp.METADATA, path)
        self.check_lease(StorageOp.METADATA, path)
        try:
            if self._local:
                with self._at(path, make=True) as (d, name):
                    self._write_replace(d, name, data)
                    self.os.fsync_dir(d)
            else:
                full = self.full(path)
                self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
                self.fs.pipe_file(full, data)
        except Exception as err:
            self._remove_after_failure(path)
            if self._local:
                self._remove_after_failure(path + ".inprogress")
                # The removal must not come back at a power loss either: recovery would
                # take the aborted checkpoint for a completed one whose files are deleted.
                parent = path.rpartition("/")[0]
                try:
                    with self._dir(parent, path) as d:
                        self.os.fsync_dir(d)
                except FileNotFoundError:
                    pass  # the directory was never made: nothing was put in it
                except Exception as sync_err:
                    log.warning("syncing %s after removing %s failed: %r", parent, path, sync_err)
            raise self._failed(StorageFault(StorageOp.METADATA, path, err)) from err

    def _remove_after_failure(self, path: str) -> None:
        """A create, upload or metadata write that failed may still have written the file
        (the store did it, the answer was lost): remove it, so that a checkpoint aborted by
        the failure leaves no ``_metadata`` that recovery would take for a completed one
        and no file that nobody owns. The path is new (R2): nobody else can have written
        it. A removal that fails too is kept in ``failed_deletes`` and retried."""
        try:
            if self._local:
                with self._at(path) as (d, name):
                    self.os.remove(d, name)
            else:
                self.fs.rm_file(self.full(path))
        except FileNotFoundError:
            pass
        except UnsafePathError as err:
            log.warning("not removing %s after a failed write: %s", path, err)
        except Exception as err:
            log.warning("removing %s after a failed write failed: %r", path, err)
            self.failed_deletes[path] = DeleteFailure(path, False, err, 1)

    # ------------------------------------------------------------------ reading

    def read_metadata(self, path: str, *, expected_job: str | None = None) -> Metadata:
        """Read and validate a ``_metadata`` file (``MetadataError`` if it is bad).

        Only reads: a corrupt, truncated, missing or foreign file is reported, never deleted.
        """
        try:
            if self._local:
                data = self._read_local(path)
            else:
                data = bytes(self.fs.cat_file(self.full(path)))
        except FileNotFoundError as err:
            raise MetadataError(path, "file", "does not exist") from err
        except UnsafePathError as err:
            raise MetadataError(path, "file", f"refused: {err}") from err
        except Exception as err:
            raise MetadataError(path, "file", f"cannot be read: {err!r}") from err
        meta = decode(data, expected_job=expected_job, source=path)
        check_named(meta, path)
        return meta

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """The bytes ``[offset, offset + length)`` of a file; a missing, unreadable or
        short file raises ``ReadFault`` (a ``StorageFault``: a re-upload that cannot read
        the old bytes declines, R17)."""
        try:
            if self._local:
                data = self._read_local(path, offset, length)
            else:
                data = bytes(self.fs.cat_file(self.full(path), start=offset, end=offset + length))
        except Exception as err:
            why = f"{type(err).__name__}: {err}"
            raise self._failed(ReadFault(path, f"reading {path} failed: {why}", err)) from err
        if len(data) != length:
            held = len(data)
            raise self._failed(
                ReadFault(
                    path, f"{path}: wanted {length} bytes at offset {offset}, the file holds {held}"
                )
            )
        return data

    def list_files(self) -> dict[str, int]:
        """Every file under the root, with its size, by path relative to the root."""
        self.drain()
        if self._local:
            return self._list_local()
        top = self.root or "/"
        if self.open_files_readable:
            if not self.fs.exists(top):
                return {}
        # On an object store a prefix with no object under it is simply empty: one LIST
        # request answers, where ``exists`` would add a HEAD and another LIST per call.
        try:
            found = self.fs.find(top, detail=True)
        except FileNotFoundError:
            return {}
        prefix = self.root + "/"
        out: dict[str, int] = {}
        for p, info in found.items():
            if info.get("type") != "file":
                continue
            p = p if isinstance(p, str) else str(p)
            rel = p[len(prefix) :] if p.startswith(prefix) else p.lstrip("/")
            out[rel] = int(info["size"])
        out.pop(WRITER_LEASE, None)  # the store's own lease, not checkpoint data
        return out

    def _list_local(self) -> dict[str, int]:
        """``list_files`` on a local disk: one ``scandir`` per directory and the stat it
        already holds, where fsspec's ``find`` stats every entry again (a listing after
        every command is most of a lockstep run's time)."""
        out: dict[str, int] = {}
        for rel, _, entries in self._local_tree(""):
            prefix = f"{rel}/" if rel else ""
            for e in entries:
                try:
                    if e.is_file(follow_symlinks=False):
                        out[prefix + e.name] = e.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue  # deleted meanwhile
        out.pop(WRITER_LEASE, None)  # the store's own lease, not checkpoint data
        return out

    def files_under(self, path: str) -> set[str]:
        """Every file below directory ``path`` now (queued deletes done first), by path
        relative to the root; links and what they point at are not followed."""
        self.drain()
        if self._local:
            out: set[str] = set()
            try:
                for rel, _, entries in self._local_tree(path):
                    for e in entries:
                        if not e.is_dir(follow_symlinks=False):
                            out.add(f"{rel}/{e.name}")  # a file, a link or a special file
            except UnsafePathError:
                return {path}  # a link where the directory was: not the store's to empty
            return out
        prefix = self.root + "/" if self.root else ""
        try:
            found = self.fs.find(self.full(path))
        except FileNotFoundError:
            return set()
        return {str(p)[len(prefix) :] if str(p).startswith(prefix) else str(p) for p in found}

    def size(self, path: str) -> int:
        """The size of file ``path`` on storage now (queued deletes done first)."""
        self.drain()
        if not self._local:
            return int(self.fs.size(self.full(path)))
        with self._at(path) as (d, name):
            unsafe = self._unsafe(d, name, path, path, leaf=True)
            if unsafe is not None:
                raise unsafe
            return int(self.os.lstat(d, name).st_size)

    def exists_dir(self, path: str) -> bool:
        """Whether directory ``path`` is there (queued deletes done first); on a local
        disk a link is no directory of the store's, nor is anything reached through one."""
        self.drain()
        if not self._local:
            return bool(self.fs.isdir(self.full(path)))
        try:
            with self._dir(path, path):
                return True
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            return False

    # ------------------------------------------------------------------ deleting

    def delete_file(
        self, path: str, prune: tuple[str, ...] = (), deleted_by: dict[str, str] | None = None
    ) -> None:
        """Delete a file (queued when deleting in the background).

        ``prune``: parent directories, innermost first, to remove afterwards if that left
        them empty (local disks only: object stores have no directories, and an empty
        ``chk-N/`` per checkpoint would otherwise pile up forever).
        """
        self.fire(StorageOp.DELETE, path)
        self.abandon(path)
        self._submit(path, False, deleted_by)
        if prune and self._local:
            self._submit_prune(prune)

    def _submit_prune(self, dirs: tuple[str, ...]) -> None:
        if not self.background:
            self._prune(dirs)
            return
        with self._cv:
            self._queued_dirs.update(dirs)
            self._prunes.append(dirs)
            self._idle = False
            if not self._worker_alive():
                self._start_worker()
            self._cv.notify_all()

    def _prune(self, dirs: tuple[str, ...]) -> None:
        for d in dirs:
            try:
                with self._at(d) as (parent, name):
                    self.os.rmdir(parent, name)  # a link there: ENOTDIR, kept
            except OSError:
                return  # not empty (or already gone): its parents are not empty either

    def delete_dir(
        self, path: str, prune: tuple[str, ...] = (), deleted_by: dict[str, str] | None = None
    ) -> None:
        """Delete a managed directory and everything in it (``prune``: as for files)."""
        self.fire(StorageOp.DELETE, path)
        for p in [p for p in self._open if is_under(p, path)]:
            self.abandon(p)
        self._submit(path, True, deleted_by)
        if prune and self._local:
            self._submit_prune(prune)

    def _submit(self, path: str, is_dir: bool, deleted_by: dict[str, str] | None = None) -> None:
        if not self.background:
            try:
                self._delete_now([(path, is_dir)])
            except Exception as err:
                raise StorageFault(StorageOp.DELETE, path, err) from err
            return
        with self._cv:
            self._queue.append((path, is_dir))
            if deleted_by:
                self._deleters[path] = deleted_by
            if is_dir:
                self._queued_dirs.add(path)
            self._idle = False
            if not self._worker_alive():
                self._start_worker()
            self._cv.notify_all()

    def _worker_alive(self) -> bool:
        """Whether a deleter thread runs (in a child after ``fork`` the parent's does not)."""
        return self._worker is not None and self._worker.is_alive()

    def _start_worker(self) -> None:
        """Start the deleter thread; call it holding ``_cv``."""
        self.deleter_died = None
        self._idle = False
        self._worker = threading.Thread(target=self._work, name="fastimpl-deleter", daemon=True)
        self._worker.start()

    def _work(self) -> None:
        try:
            self._work_loop()
        except BaseException as err:
            # Not an error of a delete (those are retried and reported): the thread is
            # ending (e.g. the process dying). Say so, so that ``drain`` does not wait for
            # it forever; what it had not done is queued again, and ``drain`` or a later
            # delete starts a new thread for it.
            with self._cv:
                self.deleter_died = err
                self._worker = None
                self._busy = False
                self._cv.notify_all()

    def _work_loop(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    prunes, self._prunes = self._prunes, []
                    for n, dirs in enumerate(prunes):
                        try:
                            self._prune(dirs)  # after the deletes that emptied them
                        except BaseException:
                            self._prunes[:0] = prunes[n:]
                            raise
                    self._queued_dirs.clear()
                    self._idle = True
                    self._cv.notify_all()
                    self._cv.wait_for(lambda: self._queue or self._prunes, timeout=_LINGER)
                    if self._queue or self._prunes:
                        continue
                    self._worker = None
                    self._cv.notify_all()
                    return
                batch = [self._queue.popleft() for _ in range(min(_BATCH, len(self._queue)))]
                self._busy = True
            try:
                self._delete_with_retries(batch)
            except BaseException:
                with self._cv:
                    self._queue.extendleft(reversed(batch))
                raise
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _delete_with_retries(self, batch: list[tuple[str, bool]]) -> None:
        try:
            self._delete_now(batch)
        except Exception:
            pass  # the bulk call failed: retry path by path, to find which ones fail
        else:
            with self._cv:
                for path, _ in batch:
                    self._deleters.pop(path, None)
                self._release_deleters()
            return
        for path, is_dir in batch:
            error: BaseException | None = None
            for attempt in range(1, self.delete_attempts + 1):
                try:
                    self._delete_now([(path, is_dir)])
                    error = None
                    break
                except Exception as err:
                    error = err
                    if attempt < self.delete_attempts:
                        time.sleep(self.retry_backoff * 4 ** (attempt - 1))
            with self._cv:
                by = self._deleters.pop(path, None)
                self._release_deleters()
            if error is not None:
                log.warning("delete of %s failed %d times: %r", path, self.delete_attempts, error)
                self.failed_deletes[path] = DeleteFailure(
                    path, is_dir, error, self.delete_attempts, by
                )

    def _delete_now(self, batch: list[tuple[str, bool]]) -> None:
        """One attempt at deleting ``batch``; a path already gone counts as deleted."""
        self.check_lease(StorageOp.DELETE, batch[0][0] if batch else "")
        self.delete_calls += 1
        if self._local:
            for path, is_dir in batch:
                try:
                    with self._at(path) as (d, name):
                        if is_dir:
                            self._rmtree_local(d, name, path)
                        else:
                            self.os.remove(d, name)  # a link: the link itself
                except FileNotFoundError:
                    pass
            self.deletes_done += len(batch)
            return
        files = [self.full(p) for p, d in batch if not d]
        dirs = [self.full(p) for p, d in batch if d]
        lock = self._fs_lock
        if lock is not None:
            lock.acquire()
        try:
            if files:
                if len(files) == 1:
                    try:
                        self.fs.rm_file(files[0])
                    except FileNotFoundError:
                        pass
                else:
                    try:
                        self.fs.rm(files)  # one bulk call where the store has one
                    except FileNotFoundError:
                        for p in files:
                            try:
                                self.fs.rm_file(p)
                            except FileNotFoundError:
                                pass
            for top in dirs:
                if self.fs.exists(top):
                    self.fs.rm(top, recursive=True)
        finally:
            if lock is not None:
                lock.release()
        self.deletes_done += len(batch)

    def _rmtree_local(self, d: Dir, name: str, path: str) -> None:
        try:
            self.os.rmtree(d, name)
        except OSError as err:
            if err.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            if not stat.S_ISLNK(self.os.lstat(d, name).st_mode):
                raise
            # A managed directory replaced by a link: its name goes, the link's target is
            # not the store's and is never descended into.
            log.warning("%s is a symbolic link: removing the link only", path)
            self.os.remove(d, name)

    def _release_deleters(self) -> None:
        """A dict keeps the table of its largest size: once no delete is in flight, start
        a new one, so that a burst of queued deletes (a slow store) is not memory held
        for good. Call it holding ``_cv``."""
        if not self._deleters:
            self._deleters = {}

    def _wait_for_deletes_under(self, path: str) -> None:
        if self._queued_dirs and any(is_under(path, d) for d in list(self._queued_dirs)):
            self.drain()

    def drain(self) -> None:
        """Wait until every queued delete has been carried out (or has failed for good)."""
        if not self.background:
            return
        restarted = False
        with self._cv:
            while self._queue or self._prunes or self._busy or not self._idle:
                if not self._worker_alive():
                    # The deleter ended with work left (it died, or a delete was queued
                    # as it was dying, or it was the parent's, before a ``fork``): start
                    # one again, once; if that one dies too,
                    # say why rather than wait forever.
                    died = self.deleter_died
                    if restarted and died is not None:
                        raise died
                    restarted = True
                    self._start_worker()
                self._cv.wait()

    def retry_failed(self) -> list[DeleteFailure]:
        """Try every delete that kept failing once more, now; return those that still fail."""
        self.drain()
        for path, failure in sorted(self.failed_deletes.items()):
            try:
                self._delete_now([(path, failure.is_dir)])
            except Exception as err:
                failure.error = err
                failure.attempts += 1
                continue
            del self.failed_deletes[path]
        return list(self.failed_deletes.values())

    def close_all(self) -> None:
        """Finish queued deletes and close every open file (closed even if the deletes
        cannot be finished)."""
        try:
            self.drain()
        finally:
            for path in list(self._open):
                self.abandon(path)
