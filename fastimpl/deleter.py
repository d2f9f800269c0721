"""Deletes off the write path (issue 3): a queue, a worker thread, retries, and the
deletes that kept failing.

With ``background`` (the default) a delete is decided and recorded by the caller, and
carried out by a worker thread that batches what is queued (one bulk call on stores that
have one), retries a failing call with backoff, and reports a delete that keeps failing
in :attr:`Deleter.failed_deletes` until :meth:`Deleter.retry_failed` succeeds: a delete is
never forgotten (R45). A create or a directory creation under a path whose deletion is
still queued waits for the queue first (:meth:`Deleter.queued_under`), so a late delete
never removes a newer file. :meth:`Deleter.drain` waits for the queue to empty.

The deleter decides when and how often; what one attempt does (the lease check, the
calls to the file system) is the ``delete_now`` it is given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from fastimpl.faults import StorageFault
from spec.commands import StorageOp
from spec.layout import is_under

log = logging.getLogger("fastimpl.storage")
"""The storage layer's one logger: a logging configuration for it covers every piece."""

_BATCH = 1000
"""At most this many paths per bulk delete (S3's DeleteObjects limit)."""
_LINGER = 1.0
"""Seconds the deleter thread waits for more work before it ends: a job that checkpoints
more often than this keeps one thread, instead of starting one per checkpoint, whose
start the caller waits for (a wake-up of the new thread: a millisecond and more on a
busy machine, on the path of every complete and every notice)."""

Batch = list[tuple[str, bool]]
"""Paths to delete, each with whether it is a directory (deleted with all it holds)."""


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


class Deleter:
    """Carries out the deletes a store decided: at once (``background`` false), or in a
    worker thread, each through ``delete_now`` (one attempt at a batch; a path already
    gone counts as deleted) and, for empty parent directories, ``prune``."""

    def __init__(
        self,
        delete_now: Callable[[Batch], None],
        prune: Callable[[tuple[str, ...]], None],
        *,
        background: bool,
        attempts: int,
        retry_backoff: float,
    ) -> None:
        self._delete_now = delete_now
        self._prune = prune
        self.background = background
        self.attempts = max(1, attempts)
        """Calls a delete gets before it is reported in ``failed_deletes``."""
        self.retry_backoff = retry_backoff
        """Seconds before the second call of a failing delete (4 times more each time)."""
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
        """Deletes that kept failing, by path: reported, and retried by ``retry_failed``."""
        self._deleters: dict[str, dict[str, str]] = {}
        """Who asked for each queued delete (``deleted_by``), until it is done or fails."""
        self.died: BaseException | None = None
        """What ended the deleter thread abnormally (not an ``Exception``: those are
        retried and reported), e.g. the process dying: ``drain`` raises it."""

    def at_rest(self) -> bool:
        """Whether nothing is left to delete: no thread runs, or it waits idle for more."""
        return self._worker is None or self._idle

    def submit(self, path: str, is_dir: bool, deleted_by: dict[str, str] | None = None) -> None:
        """Delete ``path`` (queued when deleting in the background); ``deleted_by``: who
        decided to delete each file it removes, kept with a delete that keeps failing."""
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

    def submit_prune(self, dirs: tuple[str, ...]) -> None:
        """Remove ``dirs`` (parents, innermost first) while they are empty, after the
        deletes queued before (which may empty them)."""
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

    def _worker_alive(self) -> bool:
        """Whether a deleter thread runs (in a child after ``fork`` the parent's does not)."""
        return self._worker is not None and self._worker.is_alive()

    def _start_worker(self) -> None:
        """Start the deleter thread; call it holding ``_cv``."""
        self.died = None
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
                self.died = err
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
            for attempt in range(1, self.attempts + 1):
                try:
                    self._delete_now([(path, is_dir)])
                    error = None
                    break
                except Exception as err:
                    error = err
                    if attempt < self.attempts:
                        time.sleep(self.retry_backoff * 4 ** (attempt - 1))
            with self._cv:
                by = self._deleters.pop(path, None)
                self._release_deleters()
            if error is not None:
                log.warning("delete of %s failed %d times: %r", path, self.attempts, error)
                self.failed_deletes[path] = DeleteFailure(path, is_dir, error, self.attempts, by)

    def _release_deleters(self) -> None:
        """A dict keeps the table of its largest size: once no delete is in flight, start
        a new one, so that a burst of queued deletes (a slow store) is not memory held
        for good. Call it holding ``_cv``."""
        if not self._deleters:
            self._deleters = {}

    def queued_under(self, path: str) -> bool:
        """Whether a queued delete or prune will remove a directory holding ``path``: a
        file or directory made there must wait for the queue first."""
        return bool(self._queued_dirs) and any(is_under(path, d) for d in list(self._queued_dirs))

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
                    died = self.died
                    if restarted and died is not None:
                        raise died
                    restarted = True
                    self._start_worker()
                self._cv.wait()

    def retry_failed(self) -> list[DeleteFailure]:
        """Try every delete that kept failing once more, now; return those that still fail
        (the caller drains the queue first)."""
        for path, failure in sorted(self.failed_deletes.items()):
            try:
                self._delete_now([(path, failure.is_dir)])
            except Exception as err:
                failure.error = err
                failure.attempts += 1
                continue
            del self.failed_deletes[path]
        return list(self.failed_deletes.values())
