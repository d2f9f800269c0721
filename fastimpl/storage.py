"""Storage: the store's every storage call, on an fsspec file system below a root path.

Every storage call the store makes is a method here, so that a fault injector (armed by
``FailNextCall``) can fail it, and so that any error the file system raises (``OSError``
and the like, e.g. from a failing wrapper file system) becomes a :class:`StorageFault`
naming the operation and the path. Paths are relative to the root and ``/``-separated,
as in ``spec.layout``.

:class:`Storage` composes the pieces, each in a module of its own:

* the files themselves: on a local disk :class:`~fastimpl.local_tree.LocalTree` (every
  name reached through descriptors, never through a link, and every new name synced,
  issue 14 and R12; its OS calls through one :class:`~fastimpl.descriptors.LocalOS`), on
  any other file system :class:`~fastimpl.fsspec_files.FsspecFiles`; which one, and
  whether an open file's bytes are readable there (R16), ``fastimpl.fs_wrappers`` tells;
* the fault seam (``fastimpl.faults``): armed faults, and the count of real ones;
* the writer lease (``fastimpl.lease``), checked before every ``_metadata`` write and
  every delete;
* the deleter (``fastimpl.deleter``): deletes off the write path, in a worker thread,
  retried, and reported while they keep failing (R45);
* the coordinator's decided deletes (``fastimpl.decided_deletes``): held until its host
  carries them out (``perform``), in the order the host chooses (raft's ``Ready``).

What stays here is what ties them together: the table of files open for writing, which
call fires which fault and checks the lease, how a failure is reported, and the removal
of what a failed write may have left.

Durability (R12): a file written through ``append`` is flushed, and on a local file
system ``os.fsync``-ed, before the call returns, so a handle built after it names bytes
that survive a crash. On other stores a file is durable once closed.
"""

from __future__ import annotations

import logging
import re
from typing import IO, Any

from fastimpl.decided_deletes import Decided, DecidedDeletes
from fastimpl.deleter import Batch, DeleteFailure, Deleter
from fastimpl.descriptors import Dir, LocalOS, NotRegularFile, path_of
from fastimpl.faults import FaultSeam, ReadFault, StorageFault
from fastimpl.fs_wrappers import (
    OBJECT_STORES,
    READABLE_STORES,
    CachedLocalDiskError,
    UnknownWrapperError,
    open_files_readable,
    through_local_dirfs,
)
from fastimpl.fsspec_files import FsspecFiles, full_path
from fastimpl.lease import WRITER_LEASE, FencedError, WriterLease
from fastimpl.local_tree import LocalTree, UnsafePathError
from fastimpl.metadata import Metadata, MetadataError, check_named, decode
from spec.commands import StorageOp
from spec.errors import UsageError
from spec.layout import SAVEPOINTS, is_under

__all__ = [
    "OBJECT_STORES",
    "READABLE_STORES",
    "WRITER_LEASE",
    "CachedLocalDiskError",
    "DeleteFailure",
    "Dir",
    "FencedError",
    "LocalOS",
    "NotRegularFile",
    "ReadFault",
    "Storage",
    "StorageFault",
    "UnknownWrapperError",
    "UnsafePathError",
    "open_files_readable",
    "path_of",
]

_JOB_NAME = re.compile(r"job-(\d+)")
_SAVEPOINT_NAME = re.compile(r"savepoint-(\d+)")

log = logging.getLogger("fastimpl.storage")


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
        fs, root = through_local_dirfs(fs, root)
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root else ""
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self._protocol = protocol
        self._local = protocol in ("file", "local")
        self.open_files_readable = open_files_readable(fs)
        """Whether flushed bytes of an open file are readable where they end up (not on
        object stores, nor through a cache that uploads at close, R16)."""
        local_os = getattr(fs, "local_os", None)
        self._tree = LocalTree(self.root, local_os if isinstance(local_os, LocalOS) else LocalOS())
        self._remote = FsspecFiles(
            fs, self.root, protocol, open_files_readable=self.open_files_readable
        )
        self._files: LocalTree | FsspecFiles = self._tree if self._local else self._remote
        self._open: dict[str, IO[bytes]] = {}
        self.faults = FaultSeam()
        self.writer_lease = WriterLease(self._files)
        self.deleter = Deleter(
            self._delete_now,
            self._tree.prune,
            background=background_deletes,
            attempts=delete_attempts,
            retry_backoff=retry_backoff,
        )
        self.decided = DecidedDeletes()
        """Deletes held (``hold``) until the host performs them (``perform``)."""
        self.deletes_done = 0
        """Paths deleted (a batch counts once it is all gone)."""
        self.delete_calls = 0
        """Attempts at deleting a batch (a bulk call is one)."""

    def full(self, path: str) -> str:
        return full_path(self.root, path)

    @property
    def protocol(self) -> str:
        """The kind of store (public, read-only): ``"file"`` for a local disk, else the
        fsspec protocol of the object store (``"s3"``, ``"memory"``)."""
        return self._protocol

    # ------------------------------------------------------------------ the pieces' state
    #
    # Callers (the catalog, the TM's saved state, the tests) read and set these on the
    # storage; each lives in the piece that uses it.

    @property
    def os(self) -> LocalOS:
        """The OS calls of the local path (the file system's ``local_os`` if it has one)."""
        return self._tree.os

    @os.setter
    def os(self, value: LocalOS) -> None:
        self._tree.os = value

    @property
    def armed(self) -> list[StorageOp]:
        """Faults armed by ``FailNextCall``: the next call of each kind fails."""
        return self.faults.armed

    @armed.setter
    def armed(self, value: list[StorageOp]) -> None:
        self.faults.armed = value

    @property
    def real_faults(self) -> int:
        """Write-path calls the file system itself failed (``FaultSeam.real_faults``)."""
        return self.faults.real_faults

    @property
    def lease(self) -> bytes | None:
        """This store's token in ``WRITER_LEASE`` (``None``: no lease is kept or checked,
        e.g. the model-driven ``InProcessEngine`` of the lockstep tests)."""
        return self.writer_lease.token

    @lease.setter
    def lease(self, value: bytes | None) -> None:
        self.writer_lease.token = value

    @property
    def failed_deletes(self) -> dict[str, DeleteFailure]:
        """Deletes that kept failing, by path: reported, and retried by ``retry_failed``."""
        return self.deleter.failed_deletes

    @failed_deletes.setter
    def failed_deletes(self, value: dict[str, DeleteFailure]) -> None:
        self.deleter.failed_deletes = value

    @property
    def retry_backoff(self) -> float:
        """Seconds before a failing delete's second call (``Deleter.retry_backoff``)."""
        return self.deleter.retry_backoff

    @retry_backoff.setter
    def retry_backoff(self, value: float) -> None:
        self.deleter.retry_backoff = value

    # ------------------------------------------------------------------ the base's owner

    def existing(self) -> tuple[list[int], list[int], bool]:
        """What the base holds already: the numbers of its ``job-<n>`` entries, of its
        ``savepoints/savepoint-<n>`` entries, and whether a writer lease is there."""
        jobs: list[int] = []
        sps: list[int] = []
        names = self._files.names("")
        for name in names:
            m = _JOB_NAME.fullmatch(name)
            if m:
                jobs.append(int(m.group(1)))
        if SAVEPOINTS in names:
            for name in self._files.names(SAVEPOINTS):
                m = _SAVEPOINT_NAME.fullmatch(name)
                if m:
                    sps.append(int(m.group(1)))
        return sorted(jobs), sorted(sps), WRITER_LEASE in names

    def take_lease(self, token: bytes, *, exclusive: bool) -> bool:
        """Write this store's token into ``WRITER_LEASE`` (``WriterLease.take``)."""
        return self.writer_lease.take(token, exclusive=exclusive)

    def check_lease(self, op: StorageOp, path: str) -> None:
        """Raise ``FencedError`` unless ``WRITER_LEASE`` still holds this store's token."""
        self.writer_lease.check(op, path)

    # ------------------------------------------------------------------ faults

    def arm(self, op: StorageOp) -> None:
        self.faults.arm(op)

    def fire(self, op: StorageOp, path: str) -> None:
        self.faults.fire(op, path)

    # ------------------------------------------------------------------ writing

    def mkdir(self, path: str) -> None:
        """Make directory ``path`` and its missing parents. On a local disk each parent
        of a directory made here is synced afterwards (once), so the new names survive a
        power loss. A parent whose sync failed (or was never reached) stays owed, and is
        synced before any later directory is made or file created: the next call would
        find the directory there and not know that its name is not durable yet."""
        self._wait_for_deletes_under(path)
        try:
            self._files.makedirs(path)
        except Exception as err:
            raise self.faults.failed(StorageFault(StorageOp.CREATE, path, err)) from err

    def create(self, path: str) -> None:
        self.fire(StorageOp.CREATE, path)
        self._wait_for_deletes_under(path)
        try:
            f = self._files.create(path)
        except Exception as err:
            self._remove_after_failure(path)
            raise self.faults.failed(StorageFault(StorageOp.CREATE, path, err)) from err
        self._open[path] = f

    def append(self, path: str, length: int, data: bytes | memoryview) -> None:
        """Append ``data`` (``length`` bytes) to an open file and make it durable."""
        if len(data) != length:
            raise UsageError(f"append to {path}: {len(data)} bytes given for {length}")
        if self.faults.armed:
            self.fire(StorageOp.APPEND, path)
        f = self._open[path]
        try:
            f.write(data)
            f.flush()
            self._files.sync(f)
        except Exception as err:
            raise self.faults.failed(StorageFault(StorageOp.APPEND, path, err)) from err

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
                raise self.faults.failed(StorageFault(StorageOp.APPEND, path, err)) from err

    def reopen(self, path: str) -> None:
        """Take up a file that an earlier process of the same TM attempt left open: its
        appends continue at its end. A TM whose records move between processes with its
        subtask (``pipeline.stream``: Spark gives a partition no fixed worker) gives up
        the handle in one (``abandon``, every append being durable already) and takes it
        up here in the next. Local disks only: elsewhere the bytes of an open file are
        its writer process's until it closes, so no other process can continue it."""
        if not self._local:
            raise UsageError(f"{path}: only a file on a local disk can be reopened")
        if path in self._open:
            return
        self._open[path] = self._tree.reopen(path)

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
            self._remote.drop_unclosed(path)

    def publish(self, path: str, data: bytes) -> None:
        """Write a small file for readers outside the store (``fastimpl.writer_state``)
        whole or not at all: on a local disk a synced twin named for this process, then
        a rename, both through the descriptor walk (never through a link, issue 14); a
        single PUT elsewhere. Not a checkpoint write: no armed fault fires and no lease
        is checked."""
        self._files.publish(path, data)

    def unpublish(self, path: str) -> None:
        """Delete a file :meth:`publish` wrote, if it is there; not a checkpoint delete
        either: no armed fault fires, no lease is checked, nothing is queued. On a local
        disk through the descriptor walk (a link there: the link itself)."""
        self._files.unpublish(path)

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
            self._files.write_atomic(path, data)
        except Exception as err:
            self._remove_after_failure(path)
            if self._local:
                self._remove_after_failure(path + ".inprogress")
                self._tree.sync_after_removal(path)
            raise self.faults.failed(StorageFault(StorageOp.METADATA, path, err)) from err

    def _remove_after_failure(self, path: str) -> None:
        """A create, upload or metadata write that failed may still have written the file
        (the store did it, the answer was lost): remove it, so that a checkpoint aborted by
        the failure leaves no ``_metadata`` that recovery would take for a completed one
        and no file that nobody owns. The path is new (R2): nobody else can have written
        it. A removal that fails too is kept in ``failed_deletes`` and retried."""
        try:
            self._files.remove(path)
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
            data = self._files.read(path)
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
            data = self._files.read(path, offset, length)
        except Exception as err:
            why = f"{type(err).__name__}: {err}"
            raise self.faults.failed(ReadFault(path, f"reading {path} failed: {why}", err)) from err
        if len(data) != length:
            held = len(data)
            raise self.faults.failed(
                ReadFault(
                    path, f"{path}: wanted {length} bytes at offset {offset}, the file holds {held}"
                )
            )
        return data

    def list_files(self) -> dict[str, int]:
        """Every file under the root, with its size, by path relative to the root."""
        self.drain()
        out = self._files.sizes()
        out.pop(WRITER_LEASE, None)  # the store's own lease, not checkpoint data
        if len(self.decided):
            out = {p: n for p, n in out.items() if not self.decided.gone(p)}
        return out

    def files_under(self, path: str) -> set[str]:
        """Every file below directory ``path`` now (queued deletes done first, held ones
        counted as done), by path relative to the root; links and what they point at are
        not followed."""
        self.drain()
        out = self._files.files_under(path)
        if len(self.decided):
            out = {p for p in out if not self.decided.gone(p)}
        return out

    def size(self, path: str) -> int:
        """The size of file ``path`` on storage now (queued deletes done first)."""
        self.drain()
        return self._files.size(path)

    def exists_dir(self, path: str) -> bool:
        """Whether directory ``path`` is there (queued deletes done first, a held one
        counted as done); on a local disk a link is no directory of the store's, nor is
        anything reached through one."""
        self.drain()
        if len(self.decided) and self.decided.gone(path):
            return False
        return self._files.is_dir(path)

    # ------------------------------------------------------------------ deleting

    def delete_file(
        self,
        path: str,
        prune: tuple[str, ...] = (),
        deleted_by: dict[str, str] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """Delete a file (queued when deleting in the background; with ``hold``, held
        until the host performs it, ``perform``).

        ``prune``: parent directories, innermost first, to remove afterwards if that left
        them empty (local disks only: object stores have no directories, and an empty
        ``chk-N/`` per checkpoint would otherwise pile up forever).
        """
        self.fire(StorageOp.DELETE, path)
        self.abandon(path)
        self._submit(Decided(path, False, prune if self._local else (), deleted_by), hold)

    def delete_dir(
        self,
        path: str,
        prune: tuple[str, ...] = (),
        deleted_by: dict[str, str] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """Delete a managed directory and everything in it (``prune``, ``hold``: as for
        files)."""
        self.fire(StorageOp.DELETE, path)
        for p in [p for p in self._open if is_under(p, path)]:
            self.abandon(p)
        self._submit(Decided(path, True, prune if self._local else (), deleted_by), hold)

    def _submit(self, d: Decided, hold: bool) -> None:
        if hold:
            self.decided.hold(d)
            return
        self.deleter.submit(d.path, d.is_dir, d.deleted_by)
        if d.prune:
            self.deleter.submit_prune(d.prune)

    def perform(self, deletes: tuple[str, ...] | list[str]) -> None:
        """Carry out the held deletes of ``deletes`` (a ``Ready``'s), in that order, as
        any delete is (queued when deleting in the background). A path no held delete
        names is refused (``UsageError``) before any is carried out: only what the
        coordinator decided is deleted. A delete that fails is kept in
        ``failed_deletes`` and retried (R45), as a background one is."""
        for p in deletes:
            if not self.decided.has(p):
                raise UsageError(f"perform: no delete of {p!r} was decided (or it was performed)")
        taken = self.decided.take(deletes)
        for d in taken:
            try:
                self._submit(d, False)
            except StorageFault as err:
                log.warning("delete of %s failed: %r", d.path, err)
                self.deleter.failed_deletes[d.path] = DeleteFailure(
                    d.path, d.is_dir, err, 1, d.deleted_by
                )

    def _delete_now(self, batch: Batch) -> None:
        """One attempt at deleting ``batch`` (the deleter's): the lease is checked first;
        a path already gone counts as deleted."""
        self.check_lease(StorageOp.DELETE, batch[0][0] if batch else "")
        self.delete_calls += 1
        self._files.delete(batch)
        self.deletes_done += len(batch)

    def forget_decided(self) -> None:
        """Drop the held deletes: the coordinator that decided them is gone and its host
        never performed them (their files are garbage the next coordinator finds, R95)."""
        if len(self.decided):
            log.info("dropping %d delete(s) a gone coordinator decided", len(self.decided))
            self.decided = DecidedDeletes()

    def _wait_for_deletes_under(self, path: str) -> None:
        blocking = self.decided.blocking(path) if len(self.decided) else []
        if blocking:  # a late delete never removes a newer file: these go first
            log.info("carrying out %d held delete(s) before making %s", len(blocking), path)
            self.perform(blocking)
        if self.deleter.queued_under(path):
            self.drain()

    def drain(self) -> None:
        """Wait until every queued delete has been carried out (or has failed for good)."""
        self.deleter.drain()

    def retry_failed(self) -> list[DeleteFailure]:
        """Try every delete that kept failing once more, now; return those that still fail."""
        self.drain()
        return self.deleter.retry_failed()

    def close_all(self) -> None:
        """Finish queued deletes and close every open file (closed even if the deletes
        cannot be finished). Held deletes the host never performed stay undone (said in
        the log): closing is no decision to delete."""
        if len(self.decided):
            log.warning("closing with %d decided delete(s) never performed", len(self.decided))
        try:
            self.drain()
        finally:
            for path in list(self._open):
                self.abandon(path)
