"""The public API: a checkpoint store with its coordinator and per-TM file-merging managers.

A stream processor embeds one :class:`CheckpointStore` per job. Its :attr:`coordinator`
triggers, completes and aborts checkpoints, keeps ``num_retained`` of them, restores and
rescales; each TM's :class:`FileMergingManager` opens checkpoint streams for the
subtasks it hosts, returns handles once their bytes are durable, reuses shared state,
and applies the notifications the coordinator sends. All of them share one lock: every
call is atomic, so threads may write for different subtasks at once.

A stream holds its bytes until it is closed, then appends them to a pooled physical
file in one call: a segment is contiguous even when many streams share a file, and the
handle comes back only after the bytes are flushed and (on local disks) synced (R12).
Deletions are decided under the lock and carried out by a background thread in
batches, retried, and reported by :meth:`CheckpointStore.delete_failures` if they keep
failing.
"""

from __future__ import annotations

import io
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import fsspec  # type: ignore[import-untyped]

from fastimpl.base_opening import (
    OnExisting,
    lease_token,
    refuse_unreadable_open_files,
    take_base,
)
from fastimpl.checkpoint_lifecycle import CompletionFailed
from fastimpl.engine import InProcessEngine
from fastimpl.ids import IdSource, RandomIds
from fastimpl.records import Status, StoredFile
from fastimpl.recovery import RecoveryReport, recover
from fastimpl.storage import DeleteFailure, Storage
from fastimpl.trace import CommandTrace
from fastimpl.writer_state import WriterStatePublisher
from spec.config import Config, JobSpec, RestoreMode, StateKind, check_parallelism
from spec.effects import USER
from spec.errors import CkptError, NotFoundError, UsageError
from spec.handles import InlineHandle, StateEntry, extent_of, stream_of
from spec.ids import SubtaskId, TmId
from spec.observation import RetainedView


class CheckpointStore:
    """One job's checkpoint files: a coordinator and the TMs' file-merging managers.

    ``url`` is any fsspec URL (a local path, ``memory://...``, ``s3://bucket/prefix``);
    ``storage_options`` go to the file system (e.g. ``client_kwargs``, ``key``).

    One store writes a base at a time. Opening one on a base that holds a job (a
    ``job-<n>`` or a savepoint) is refused unless ``on_existing="fresh-id"`` says to start
    a new job beside it (see ``OnExisting``); a silent continuation would overwrite the old
    job's ``_metadata`` and delete its retained checkpoints. The store writes a lease
    (``_writer`` at the root) when it opens the base and checks it before every
    ``_metadata`` write and every delete: once another store takes the base over (a
    ``fresh-id`` open, a ``recover``), this one fails those calls with ``FencedError``
    (a checkpoint it completes is aborted, R51) instead of destroying the other's files.

    What the store holds and whether the invariants hold are read, and faults are
    simulated, through ``fastimpl.testing`` (the test seam), not through this class.
    """

    def __init__(
        self,
        url: str,
        config: Config,
        job: JobSpec,
        *,
        ids: IdSource | None = None,
        background_deletes: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        trace: CommandTrace | None = None,
        on_existing: OnExisting = "refuse",
    ) -> None:
        check_parallelism(config, job.vertices)  # R78: before any I/O
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        refuse_unreadable_open_files(fs, config)
        engine = _open_base(
            url, config, job, fs, root, ids or RandomIds(), background_deletes, on_existing
        )
        self._attach(engine)
        if trace is not None:  # every command from here on, as NDJSON (fastimpl.trace)
            engine.start_trace(trace)

    def _attach(self, engine: InProcessEngine) -> None:
        self._lock = threading.RLock()
        self._engine = engine
        self.coordinator = Coordinator(self)

    @classmethod
    def _on_engine(cls, engine: InProcessEngine) -> CheckpointStore:
        """A store over an engine already built (by ``recover``, or by a test through
        ``fastimpl.testing.store_on_engine``): no base is opened and no lease taken."""
        store = cls.__new__(cls)
        store._attach(engine)
        return store

    @classmethod
    def recover(
        cls,
        url: str,
        config: Config,
        job: JobSpec,
        *,
        crashed_job: str = "job-0",
        ids: IdSource | None = None,
        storage_options: Mapping[str, Any] | None = None,
        abandoned: Sequence[str] = (),
        mode: RestoreMode = RestoreMode.CLAIM,
    ) -> tuple[CheckpointStore, RecoveryReport]:
        """Continue a job whose process died, from what storage holds (see ``recovery``;
        ``incarnation_to_recover`` says which job of a lineage, and which are
        ``abandoned``)."""
        check_parallelism(config, job.vertices)  # R78: before any I/O
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        refuse_unreadable_open_files(fs, config)
        # The recovery takes the base over (``lease``) before its first delete: a writer
        # still running there (a zombie of the crashed job) is fenced from then on.
        cluster, report = recover(
            config,
            job,
            fs,
            root,
            job=crashed_job,
            ids=ids or RandomIds(),
            lease=lease_token(),
            abandoned=abandoned,
            mode=mode,
        )
        return cls._on_engine(cluster), report

    # ------------------------------------------------------------------ the job

    @property
    def job_id(self) -> str:
        return self._engine.job

    @property
    def config(self) -> Config:
        return self._engine.cfg

    def placement(self) -> dict[SubtaskId, TmId]:
        """Which TM hosts each subtask now."""
        with self._lock:
            return dict(self._engine.placement)

    def task_managers(self) -> list[TmId]:
        """The live TMs of the running job."""
        with self._lock:
            cl = self._engine
            return sorted(
                {t for t in cl.placement.values() if cl.coord.tms[t].status is Status.ALIVE}
            )

    def task_manager(self, tm: TmId) -> FileMergingManager:
        with self._lock:
            if tm not in self._engine.coord.tms:
                raise NotFoundError(f"no TM {tm!r}; TMs: {sorted(self._engine.coord.tms)}")
        return FileMergingManager(self, tm)

    def manager_for(self, subtask: SubtaskId) -> FileMergingManager:
        """The manager of the TM that hosts ``subtask``."""
        with self._lock:
            return FileMergingManager(self, self._engine.placement[subtask])

    # ------------------------------------------------------------------ notifications

    def deliver_notifications(self) -> int:
        """Deliver every notification in flight, in order; return how many."""
        n = 0
        with self._lock:
            while self._engine.channel:
                self._engine.deliver(0)
                n += 1
        return n

    # ------------------------------------------------------------------ deletes

    def delete_failures(self) -> list[DeleteFailure]:
        """Deletes that kept failing: never forgotten, retried by ``retry_deletes``."""
        with self._lock:
            self._engine.storage.drain()
            return list(self._engine.storage.failed_deletes.values())

    def retry_deletes(self) -> list[DeleteFailure]:
        """Retry failed deletes now; return those that still fail."""
        with self._lock:
            self._engine.retry_deletes()
            self._engine.storage.drain()
            return list(self._engine.storage.failed_deletes.values())

    def flush(self) -> None:
        """Wait until every queued delete has been carried out."""
        self._engine.storage.drain()

    # ------------------------------------------------------------------ reading

    def read(self, entry: StateEntry) -> bytes:
        """The bytes a state handle names, read back from storage (an inline handle's
        are in the handle, R107)."""
        if isinstance(entry.handle, InlineHandle):
            return entry.handle.content()
        s = stream_of(entry.handle)
        if s is None:
            raise UsageError(f"{entry.handle!r} names no bytes of its own")
        return self._engine.storage.read_range(*extent_of(s))

    def close(self) -> None:
        """Finish queued deletes and close open files; checkpoints stay on storage."""
        with self._lock:
            self._engine.storage.close_all()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _locked(self, run: Callable[[], None]) -> None:
        with self._lock:
            run()


def publish_state(store: CheckpointStore) -> WriterStatePublisher:
    """Make ``store``'s coordinator publish its state for outside collectors (the audit's
    ``--delete-orphans`` at a short grace needs it); publishes once now. Here, beside the
    store whose engine and lock it uses, and not in ``fastimpl.writer_state``, which
    ``fastimpl.recovery`` (imported by this module) reads."""
    cluster = store._engine
    pub = WriterStatePublisher(cluster)
    with store._lock:
        cluster.on_applied = pub
        pub.publish()
    return pub


def _open_base(
    url: str,
    config: Config,
    job: JobSpec,
    fs: Any,
    root: str,
    ids: IdSource,
    background_deletes: bool,
    on_existing: OnExisting,
) -> InProcessEngine:
    """A new job's store on ``url``, after deciding what to do with what the base holds
    (``OnExisting``) and taking the base's lease."""
    probe = Storage(fs, root, background_deletes=False)
    token = lease_token()
    jobs, savepoints = take_base(
        probe,
        url,
        token,
        on_existing,
        ". Pass on_existing='fresh-id' to start a new job beside it, or use"
        " CheckpointStore.recover(...) to continue a job that was there",
    )
    seq = max(jobs, default=-1) + 1
    cluster = InProcessEngine(
        config, job, fs, root, ids, job_id=f"job-{seq}", background_deletes=background_deletes
    )
    cluster.coord.job_seq = seq
    # Savepoint directories are named by checkpoint id: a new job's ids start above them.
    cluster.coord.next_checkpoint = max(savepoints, default=0) + 1
    cluster.storage.lease = token
    if jobs or savepoints:
        # What the base held is the user's (another run's): recorded as such, so that the
        # new job's bookkeeping and invariants see it (I3), and a delete of it is caught
        # as one of a protected file (I5).
        for path, size in cluster.storage.list_files().items():
            cluster.catalog.files[path] = StoredFile(size, False, USER, None)
    return cluster


class Coordinator:
    """The job's checkpoint coordinator (Flink's CheckpointCoordinator)."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    @property
    def _cl(self) -> InProcessEngine:
        return self._store._engine

    def trigger(self, *, savepoint: bool = False) -> int:
        """Start a checkpoint (or a savepoint); return its id."""
        with self._store._lock:
            return self._cl.trigger(savepoint)

    def acknowledge(
        self, checkpoint: int, subtask: SubtaskId, *, attempt: TmId | None = None
    ) -> tuple[StateEntry, ...]:
        """A subtask reports the handles it wrote for ``checkpoint``; return them."""
        with self._store._lock:
            return self._cl.acknowledge(checkpoint, subtask, attempt)

    def decline(self, checkpoint: int, subtask: SubtaskId) -> None:
        self._store._locked(lambda: self._cl.decline(checkpoint, subtask))

    def complete(self, checkpoint: int) -> RetainedView:
        """Finalize ``checkpoint`` once every subtask acknowledged it: write its
        ``_metadata`` and subsume what retention lets go; return the retained view.

        Raises ``CompletionFailed`` if it could not be completed: writing ``_metadata``
        failed (R51) or its handles could not be registered (R54). The checkpoint was then
        aborted before the error is raised, so a failure can never pass for a completion.
        """
        with self._store._lock:
            done = self._cl.complete(checkpoint)
        return RetainedView(done.id, done.job, done.metadata, done.entries, done.directories)

    def abort(self, checkpoint: int) -> None:
        self._store._locked(lambda: self._cl.abort(checkpoint))

    def pending(self) -> list[int]:
        with self._store._lock:
            return list(self._cl.coord.pending_checkpoints())

    def retained(self) -> list[RetainedView]:
        """The retained completed checkpoints, oldest first."""
        with self._store._lock:
            return [
                RetainedView(r.id, r.job, r.metadata, r.entries, r.directories)
                for r in self._cl.coord.retained
            ]

    def savepoints(self) -> list[int]:
        """The completed savepoints on storage, by id: the user's (R55); the store keeps
        no record of one once complete, and one the user deleted is gone."""
        with self._store._lock:
            return self._cl.coord.stored_savepoints()

    def restore(
        self,
        checkpoint: int,
        *,
        mode: RestoreMode | None = None,
        parallelism: Mapping[str, int] | None = None,
        max_parallelism: int | None = None,
    ) -> str:
        """Start a new job from a retained checkpoint or a savepoint; return its id.

        ``parallelism`` rescales vertices (key groups and list state are redistributed);
        ``mode`` defaults to the configured restore mode. ``max_parallelism`` (default:
        the configured one) must be the one the checkpoint was taken with: any other is
        refused with ``Reason.MAX_PARALLELISM_CHANGED`` (R77).
        """
        with self._store._lock:
            chosen = mode if mode is not None else self._cl.cfg.restore_mode
            par = tuple(sorted((parallelism or {}).items()))
            return self._cl.restore(checkpoint, par, chosen, max_parallelism)

    def rescale(
        self,
        checkpoint: int,
        parallelism: Mapping[str, int],
        *,
        mode: RestoreMode | None = None,
        max_parallelism: int | None = None,
    ) -> str:
        """``restore`` with new parallelisms."""
        return self.restore(
            checkpoint, mode=mode, parallelism=parallelism, max_parallelism=max_parallelism
        )

    def failover(self) -> None:
        """Restart the job's subtasks from the latest retained checkpoint: pending
        checkpoints abort, every lost TM is replaced by a new attempt, the survivors drop
        what they kept of the aborted checkpoints, and each subtask's ``state_to_restore``
        names the handles to read back (R60-R63).

        Public because it is what an engine does on a task failure, as Flink's JobMaster
        does under its restart strategy: not a fault, the recovery from one.
        """
        self._store._locked(self._cl.failover)

    def restart(self) -> None:
        """A job-level restart from what storage holds: a new coordinator whose retention
        and shared-state registry are rebuilt from the retained checkpoints' ``_metadata``
        files, read back and validated (a corrupt one raises ``MetadataError`` and nothing
        changes), then the subtasks fail over to it (R95, ``fastimpl.resume``). Refused
        (``CommandError``, ``ATTEMPT_MAY_RUN``) while an attempt given up on may still
        run: an engine says it stopped first (``fastimpl.testing.stopped`` here).

        Public because it is what an engine does when its job master restarts, as
        Flink's does from its HA store: what the coordinator knew is trusted only as far
        as the files agree.
        """
        self._store._locked(self._cl.restart)

    def cancel(self, *, retain: bool = False) -> None:
        """End the job; ``retain`` gives the retained checkpoints to the user."""
        self._store._locked(lambda: self._cl.cancel(retain))


class ManagerClosedError(CkptError, ValueError):
    """A call on a :class:`FileMergingManager` after its ``close()``, or a write or close
    of a stream it discarded when it closed. Nothing changed: no byte was written.

    A ``ValueError``, as for a stream that is already closed. ``tm`` names the TM."""

    def __init__(self, tm: TmId, what: str) -> None:
        super().__init__(
            f"{what}: the file-merging manager of TM {tm!r} is closed"
            f" (store.task_manager({tm!r}) gives a new one)"
        )
        self.tm = tm


class FileMergingManager:
    """One TM's file-merging manager (FLIP-306's FileMergingSnapshotManager).

    A manager is a view of the TM for one user: ``store.task_manager(tm)`` returns a new
    one on every call, and closing one does not touch the others (see :meth:`close`).
    """

    def __init__(self, store: CheckpointStore, tm: TmId) -> None:
        self._store = store
        self.tm = tm
        self._closed = False
        # The streams opened here and not yet closed or discarded (weakly: a stream
        # dropped without closing writes nothing anyway).
        self._open: weakref.WeakSet[CheckpointStream] = weakref.WeakSet()

    @property
    def _cl(self) -> InProcessEngine:
        return self._store._engine

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, what: str) -> None:
        """Raise ``ManagerClosedError`` once closed; call it holding the store's lock."""
        if self._closed:
            raise ManagerClosedError(self.tm, what)

    def close(self) -> None:
        """Close this manager: every later call on it raises ``ManagerClosedError``.

        Streams opened here and still open are discarded, as ``CheckpointStream.discard``
        does: their bytes never reach storage, they give no handle, and a later
        ``write`` or ``close`` on them raises ``ManagerClosedError``. Streams already
        closed keep their handles. Closing again does nothing.

        What it does not do: it writes, closes and deletes no file, and it is not a TM
        leaving the job (the test seam simulates that: ``fastimpl.testing.crash`` then
        ``stopped``). The TM's files belong to
        its checkpoints and are deleted by the store's rules, on subsumption, abort or
        ``cancel``; its pooled files stay open for the TM's next writes. The TM itself
        stays alive and keeps its subtasks: ``store.task_manager(tm)`` gives a new, open
        manager for it, and other managers of the same TM are not affected.
        """
        with self._store._lock:
            if self._closed:
                return
            self._closed = True
            for s in list(self._open):
                s._discard_at_manager_close()
            self._open.clear()

    def __enter__(self) -> FileMergingManager:
        with self._store._lock:
            self._check_open("__enter__")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def subtasks(self) -> list[SubtaskId]:
        """The subtasks this TM hosts."""
        with self._store._lock:
            self._check_open("subtasks")
            return sorted(s for s, t in self._cl.placement.items() if t == self.tm)

    def _attempt(self, subtask: SubtaskId) -> TmId | None:
        return None if self._cl.placement.get(subtask) == self.tm else self.tm

    def open_stream(
        self,
        checkpoint: int,
        subtask: SubtaskId,
        kind: StateKind,
        name: str,
        *,
        entries: int = 1,
    ) -> CheckpointStream:
        """A stream for one state handle; its scope follows ``kind`` (SHARED for
        incremental keyed state, EXCLUSIVE otherwise)."""
        with self._store._lock:
            self._check_open("open_stream")
            s = CheckpointStream(self, checkpoint, subtask, kind, name, entries)
            self._open.add(s)
            return s

    @contextmanager
    def stream(
        self, checkpoint: int, subtask: SubtaskId, kind: StateKind, name: str
    ) -> Iterator[CheckpointStream]:
        s = self.open_stream(checkpoint, subtask, kind, name)
        try:
            yield s
        except BaseException:
            s.discard()
            raise
        s.close()

    def write(
        self, checkpoint: int, subtask: SubtaskId, kind: StateKind, name: str, data: bytes
    ) -> StateEntry | None:
        """Open, write and close a stream in one call."""
        with self._store._lock:
            self._check_open("write")
        s = self.open_stream(checkpoint, subtask, kind, name)
        s.write(data)
        return s.close_and_get_handle()

    def reuse_shared(self, checkpoint: int, subtask: SubtaskId, name: str) -> StateEntry | None:
        """Reuse shared state uploaded by an earlier checkpoint: the old handle (or a
        placeholder) when it may be reused (R20-R23), else a new upload of its bytes."""
        with self._store._lock:
            self._check_open("reuse_shared")
            return self._cl.reuse_shared(checkpoint, subtask, name, self._attempt(subtask))

    def acknowledge(self, checkpoint: int, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        """Send ``subtask``'s handles for ``checkpoint`` to the coordinator."""
        with self._store._lock:
            self._check_open("acknowledge")
            return self._store.coordinator.acknowledge(
                checkpoint, subtask, attempt=self._attempt(subtask)
            )

    def receive_notifications(self) -> int:
        """Apply every notification in flight for this TM, in order; return how many."""
        n = 0
        with self._store._lock:
            self._check_open("receive_notifications")
            while True:
                idx = self._cl.channel.first_for(self.tm)
                if idx is None:
                    return n
                self._cl.deliver(idx)
                n += 1

    def state_to_restore(self, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        """The handles ``subtask`` restores from (after a failover, restore or rescale)."""
        with self._store._lock:
            self._check_open("state_to_restore")
            return self._cl.coord.state_to_restore(subtask)

    def restore(self, subtask: SubtaskId) -> list[tuple[StateEntry, bytes]]:
        """Read back every handle ``subtask`` restores from. After a rescale one name may
        come from several old subtasks (their key-group ranges overlap the new one's)."""
        with self._store._lock:
            self._check_open("restore")
        return [(e, self._store.read(e)) for e in self.state_to_restore(subtask)]


class CheckpointStream:
    """The bytes of one state handle. Closing appends them and returns the handle."""

    def __init__(
        self,
        manager: FileMergingManager,
        checkpoint: int,
        subtask: SubtaskId,
        kind: StateKind,
        name: str,
        entries: int,
    ) -> None:
        self._manager = manager
        self.checkpoint = checkpoint
        self.subtask = subtask
        self.kind = kind
        self.name = name
        self.entries = entries
        self._buf: io.BytesIO | None = io.BytesIO()
        self.handle: StateEntry | None = None
        self._dropped_by_manager = False  # discarded when its manager closed

    def _refuse_if_dropped(self, what: str) -> None:
        if self._dropped_by_manager:
            raise ManagerClosedError(
                self._manager.tm, f"{what} of stream {self.name!r} of {self.subtask}"
            )

    def write(self, data: bytes | bytearray | memoryview) -> int:
        buf = self._buf  # read once: the manager's close may drop it from another thread
        if buf is None:
            self._refuse_if_dropped("write")
            raise UsageError(f"stream {self.name!r} of {self.subtask} is closed")
        return buf.write(data)

    def close_and_get_handle(self) -> StateEntry | None:
        """Append the bytes durably and return the state entry (``None`` if empty, R10).

        A failing storage call declines the checkpoint for this subtask (R17) and is
        raised as ``StorageFault``.
        """
        m = self._manager
        store = m._store
        with store._lock:  # one step with the manager's close: write all or nothing
            if self._buf is None:
                self._refuse_if_dropped("close")
                return self.handle
            data = self._buf.getvalue()
            self._buf = None
            m._open.discard(self)
            self.handle = store._engine.write(
                self.checkpoint,
                self.subtask,
                self.kind,
                self.name,
                data,
                self.entries,
                m._attempt(self.subtask),
            )
        return self.handle

    def close(self) -> None:
        self.close_and_get_handle()

    def discard(self) -> None:
        """Drop the bytes without writing anything (allowed after the manager closed)."""
        with self._manager._store._lock:
            self._buf = None
            self._manager._open.discard(self)

    def _discard_at_manager_close(self) -> None:
        if self._buf is not None:
            self._dropped_by_manager = True  # first: a write that sees no buffer says why
            self._buf = None

    def __enter__(self) -> CheckpointStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


__all__ = [
    "CheckpointStore",
    "CheckpointStream",
    "CompletionFailed",
    "Coordinator",
    "FileMergingManager",
    "ManagerClosedError",
]
