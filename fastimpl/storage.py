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
import shutil
import stat
import threading
import time
from collections import deque
from typing import IO, Any

from fastimpl.metadata import Metadata, MetadataError, check_named, decode
from spec.commands import StorageOp
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


class UnknownWrapperError(ValueError):
    """A file system wraps another one in a way the store does not know (issue 14): where
    its bytes end up, and when, cannot be told, so it is refused rather than guessed."""


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
    that never reached the store, and a wrong guess either way is not ours to make.
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


log = logging.getLogger("fastimpl.storage")


class StorageFault(Exception):
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


class UnsafePathError(OSError):
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


class LocalOS:
    """The operating-system calls of :class:`Storage` on a local file system.

    Storage's local path (builtin ``open``, ``os.fsync``, ``os.replace``, ``os.remove``,
    ``os.scandir``, ...) makes every OS call through one object of this class and nowhere
    else. By default it is the real OS; a file system object with a ``local_os``
    attribute (a ``LocalOS``, e.g. a fault-injecting wrapper) supplies its own. Each call
    looks its function up when it is made (``os.fsync``, not a reference taken at import),
    so that pyfakefs and a patched ``os.fsync`` are seen.
    """

    def open(self, path: str) -> IO[bytes]:
        """A new file opened for writing (truncated if it exists)."""
        return open(path, "wb")

    def fsync(self, f: IO[bytes]) -> None:
        """Make the bytes written to ``f`` (already flushed) durable."""
        os.fsync(f.fileno())

    def fsync_dir(self, path: str) -> None:
        """Make the names in directory ``path`` durable: files created, renamed or
        directories made in it survive a power loss only once this returns."""
        if os.name == "nt":
            return  # a directory cannot be opened on Windows; NTFS journals its names
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        except OSError as err:
            # A file system that cannot sync a directory says so (some network and FUSE
            # file systems): there is nothing more to do there. Any other error is real.
            if err.errno not in (errno.EINVAL, errno.ENOTSUP):
                raise
        finally:
            os.close(fd)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data`` (synced), failing with ``FileExistsError``
        if it exists: ``O_EXCL`` makes the check and the creation one step."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def lstat(self, path: str) -> os.stat_result:
        """The status of ``path`` itself: a symbolic link is not followed."""
        return os.lstat(path)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path)

    def scandir(self, path: str) -> list[os.DirEntry[str]]:
        with os.scandir(path) as it:
            return list(it)


def _through_local_dirfs(fs: Any, root: str) -> tuple[Any, str]:
    """``dir::`` over a local disk is that disk under a longer root: unwrapped, so that
    its calls take the local path (its syncs, and its refusal of links, issue 14)."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

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

    # ------------------------------------------------------------------ links (issue 14)

    def _check_tree(self, path: str, leaf: str) -> None:
        """On a local disk, refuse (``UnsafePathError``) a symbolic link among the
        components of ``path`` below the root; ``leaf`` says what ``path`` itself may be:

        - ``"file"``: a regular file (a read: a FIFO, device or socket is refused before
          anything opens it, so nothing blocks on one);
        - ``"dir"``: a directory or nothing yet, never a link (a directory made or reused);
        - ``"any"``: anything (a create or rename replaces it; a delete removes a link
          itself, never its target): only the directories above it are checked.

        Every link is refused, one whose target is inside the base too: the store never
        makes one, so a link is a hand-made change, and one inside would give a file two
        names (two owners, a double delete). The root and the directories above it are
        the user's choice of where the base lives, and may be links. A component that
        does not exist ends the check: nothing below it exists to be followed.
        """
        if not self._local or not path:
            return
        parts = path.split("/")
        last = len(parts) - 1
        checked = len(parts) if leaf in ("file", "dir") else last
        for i in range(checked):
            rel = "/".join(parts[: i + 1])
            full = self.full(rel)
            try:
                mode = self.os.lstat(full).st_mode
            except FileNotFoundError:
                if leaf == "file":
                    raise
                return
            if stat.S_ISLNK(mode):
                try:
                    target = f" to {self.os.readlink(full)!r}"
                except OSError:
                    target = ""
                raise UnsafePathError(
                    path,
                    f"{path}: {rel} is a symbolic link{target}; the store never follows a"
                    " link in its tree (nothing was read, written or deleted through it)",
                )
            if i == last and leaf == "file" and not stat.S_ISREG(mode):
                raise UnsafePathError(
                    path, f"{path} is {_kind_of(mode)} where a regular file belongs: not opened"
                )

    # ------------------------------------------------------------------ the base's owner

    def existing(self) -> tuple[list[int], list[int], bool]:
        """What the base holds already: the numbers of its ``job-<n>`` entries, of its
        ``savepoints/savepoint-<n>`` entries, and whether a writer lease is there."""
        jobs: list[int] = []
        sps: list[int] = []
        names = self._names(self.root)
        for name in names:
            m = _JOB_NAME.fullmatch(name)
            if m:
                jobs.append(int(m.group(1)))
        if SAVEPOINTS in names:
            for name in self._names(self.full(SAVEPOINTS)):
                m = _SAVEPOINT_NAME.fullmatch(name)
                if m:
                    sps.append(int(m.group(1)))
        return sorted(jobs), sorted(sps), WRITER_LEASE in names

    def _names(self, full: str) -> set[str]:
        try:
            if self._local:
                return {e.name for e in self.os.scandir(full or "/")}
            listed = self.fs.ls(full or "/", detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed}

    def take_lease(self, token: bytes, *, exclusive: bool) -> bool:
        """Write this store's token into ``WRITER_LEASE``; ``exclusive``: only if no lease
        is there (atomically where the store can: ``O_EXCL`` on a local disk, a
        conditional PUT on S3). False if ``exclusive`` and a lease was there."""
        full = self.full(WRITER_LEASE)
        try:
            if self._local:
                self._makedirs(self.root or "/")
                self._check_tree(WRITER_LEASE, "any")
                if exclusive:
                    self.os.create_exclusive(full, token)
                else:
                    self._write_replace(full, token)
                self.os.fsync_dir(self.root or "/")
            else:
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
        self._wait_for_deletes_under(path)
        try:
            self._check_tree(path, "dir")
            self._makedirs(self.full(path))
        except Exception as err:
            raise self._failed(StorageFault(StorageOp.CREATE, path, err)) from err

    def _makedirs(self, full: str) -> None:
        """Make directory ``full`` and its missing parents. On a local disk each parent
        of a directory made here is synced afterwards (once), so the new names survive a
        power loss; a directory that existed already costs one ``isdir``. A parent whose
        sync failed (or was never reached) stays owed, and is synced before any later
        directory is made or file created: the next call would find the directory there
        and not know that its name is not durable yet."""
        if not self._local:
            self.fs.makedirs(full, exist_ok=True)
            return
        osl = self.os
        if self._unsynced_dirs:
            for p in sorted(self._unsynced_dirs, key=len, reverse=True):
                try:
                    osl.fsync_dir(p)
                except FileNotFoundError:
                    pass  # deleted since: no name in it is owed any more
                self._unsynced_dirs.discard(p)
        made: list[str] = []
        d = full
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
                osl.mkdir(d)
            except FileExistsError:
                if not osl.isdir(d):
                    raise  # a file of that name
        for p in sorted(owed, key=len, reverse=True):
            osl.fsync_dir(p)
            self._unsynced_dirs.discard(p)

    def create(self, path: str) -> None:
        self.fire(StorageOp.CREATE, path)
        self._wait_for_deletes_under(path)
        full = self.full(path)
        parent = full.rsplit("/", 1)[0]
        f: IO[bytes] | None = None
        try:
            self._check_tree(path, "any")
            self._makedirs(parent)
            if self._local:
                f = self.os.open(full)
                self.os.fsync_dir(parent)  # the new name survives a power loss (R12)
            else:
                f = self.fs.open(full, "wb")
        except Exception as err:
            if f is not None:
                self._close_quietly(path, f)
            self._remove_after_failure(path)
            raise self._failed(StorageFault(StorageOp.CREATE, path, err)) from err
        assert f is not None
        self._open[path] = f

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
        self._check_tree(path, "file")
        self._open[path] = open(self.full(path), "ab")  # noqa: SIM115 (closed by close)

    def abandon(self, path: str) -> None:
        """Forget an open file without finishing it (its process is gone)."""
        f = self._open.pop(path, None)
        if f is not None:
            try:
                f.close()
            except Exception as err:  # a dead writer's upload may fail: nothing to keep
                log.debug("closing abandoned %s: %r", path, err)

    def _write_replace(self, full: str, data: bytes) -> None:
        """Write ``data`` to ``full`` whole or not at all on a local disk: a synced
        ``.inprogress`` twin, then a rename (the caller syncs the directory)."""
        tmp = full + ".inprogress"
        with self.os.open(tmp) as f:
            f.write(data)
            f.flush()
            self.os.fsync(f)
        self.os.replace(tmp, full)

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
        full = self.full(path)
        parent = full.rsplit("/", 1)[0]
        try:
            self._check_tree(path, "any")
            self._makedirs(parent)
            if self._local:
                self._write_replace(full, data)
                self.os.fsync_dir(parent)
            else:
                self.fs.pipe_file(full, data)
        except Exception as err:
            self._remove_after_failure(path)
            if self._local:
                self._remove_after_failure(path + ".inprogress")
                # The removal must not come back at a power loss either: recovery would
                # take the aborted checkpoint for a completed one whose files are deleted.
                try:
                    self.os.fsync_dir(parent)
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
        full = self.full(path)
        try:
            if self._local:
                self._check_tree(path, "any")
                self.os.remove(full)
            else:
                self.fs.rm_file(full)
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
            self._check_tree(path, "file")
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
            self._check_tree(path, "file")
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
        stack = [("", self.root or "/")]
        while stack:
            rel, full = stack.pop()
            try:
                entries = self.os.scandir(full)
            except (FileNotFoundError, NotADirectoryError):
                continue  # the root not made yet, or a directory deleted meanwhile
            for e in entries:
                name = f"{rel}{e.name}"
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append((name + "/", e.path))
                    elif e.is_file(follow_symlinks=False):
                        out[name] = e.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
        out.pop(WRITER_LEASE, None)  # the store's own lease, not checkpoint data
        return out

    def files_under(self, path: str) -> set[str]:
        """Every file below directory ``path`` now (queued deletes done first), by path
        relative to the root; links and what they point at are not followed."""
        self.drain()
        if self._local:
            out: set[str] = set()
            stack = [path]
            while stack:
                d = stack.pop()
                try:
                    entries = self.os.scandir(self.full(d))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for e in entries:
                    rel = f"{d}/{e.name}"
                    if e.is_dir(follow_symlinks=False):
                        stack.append(rel)
                    else:
                        out.add(rel)  # a file, a link or a special file: not ours to delete
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
        return int(self.fs.size(self.full(path)))

    def exists_dir(self, path: str) -> bool:
        self.drain()
        return bool(self.fs.isdir(self.full(path)))

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
                self._check_tree(d, "dir")
                self.os.rmdir(self.full(d))
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
                full = self.full(path)
                try:
                    self._check_tree(path, "any")
                    if is_dir and stat.S_ISLNK(self.os.lstat(full).st_mode):
                        # A managed directory replaced by a link: its name goes, the
                        # link's target is not the store's and is never descended into.
                        log.warning("%s is a symbolic link: removing the link only", path)
                        self.os.remove(full)
                    elif is_dir:
                        self.os.rmtree(full)
                    else:
                        self.os.remove(full)
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
            for d in dirs:
                if self.fs.exists(d):
                    self.fs.rm(d, recursive=True)
        finally:
            if lock is not None:
                lock.release()
        self.deletes_done += len(batch)

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
