"""The coordinator's side of the store (Flink's CheckpointCoordinator): it triggers,
receives acknowledgements and declines (``spec.messages``), completes a checkpoint once
the host wrote the ``_metadata`` it prepared, aborts, keeps ``num_retained`` checkpoints
and subsumes the rest, holds the shared-state registry, deletes what it owns (R42-R45,
R54), plans restores and rescales, fails over and ends the job. A restart is a new
coordinator rebuilt from storage (``fastimpl.resume``, R95).

It knows TMs from what it is told: acknowledgements name their attempt, and the engine
(``CoordinatorEngine``) tells it where subtasks run and starts, resets, restores and
stops the TMs. Calls return what they produced, in the manner of raft's ``Ready``:
``trigger`` the id, ``prepare_completion`` the ``_metadata`` to write and
``metadata_written`` the completed checkpoint (``CompletionFailed`` when it aborted
instead; ``complete`` is the steps in a row), and ``ready`` the deletes to perform and
the notices to send since the host last asked, so that a host batches them and orders
them after what it persists (its HA state).

``CheckpointCoordinator`` is the party the engine, the recovery and the observation
talk to; each concern is a part that keeps its own state:

- ``fastimpl.coordinated_job``: the running job every part reads (id, shape, bases);
- ``fastimpl.tm_book``: where subtasks run and what is known of each TM attempt;
- ``fastimpl.checkpoint_lifecycle``: trigger, acknowledgements, declines, complete, abort;
- ``fastimpl.retention``: the retained checkpoints, the shared-state registry, subsume;
- ``fastimpl.failover``: lost, replaced and stopped attempts, failovers;
- ``fastimpl.job_end``: the job's end (R90, R91);
- ``fastimpl.restore_planning``: restores and rescales (R70-R77).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar, cast, overload

from fastimpl.catalog import Catalog, DeletionLog
from fastimpl.checkpoint_lifecycle import CheckpointLifecycle, CompletionFailed, MetadataWrite
from fastimpl.completion import complete_through
from fastimpl.coordinated_job import (
    CoordinatedJob,
    CoordinatorEngine,
    Notice,
    Ready,
    subtasks_of,
)
from fastimpl.failover import Failover
from fastimpl.ids import IdSource
from fastimpl.job_end import JobEnd
from fastimpl.records import Completed, Pending, Status, Tm
from fastimpl.restore_planning import RestorePlanner
from fastimpl.retention import Retention
from fastimpl.shared_registry import SharedStateRegistry
from fastimpl.storage import Storage
from fastimpl.tm_book import TmBook
from fastimpl.working import SharedWorking
from spec import commands as c
from spec.config import Config, MergingMode, VertexSpec, check_parallelism
from spec.effects import COORDINATOR
from spec.handles import StateEntry
from spec.ids import SubtaskId, TmId
from spec.messages import Acknowledgement, AttemptStopped, Decline

__all__ = ["CheckpointCoordinator", "CoordinatorEngine", "Notice", "Ready", "subtasks_of"]

T = TypeVar("T")


class _Kept(Generic[T]):
    """An attribute of the coordinator that one of its parts keeps: read and written
    there, under the same name, so that code outside sees one party."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Kept[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> T | _Kept[T]:
        if obj is None:
            return self
        return cast(T, getattr(getattr(obj, self.part), self.name))

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class CheckpointCoordinator:
    """One job's checkpoint coordinator, across restores (each restore starts a new job)."""

    # the running job (``CoordinatedJob``)
    cfg: _Kept[Config] = _Kept("run")
    mode: _Kept[MergingMode] = _Kept("run")
    storage: _Kept[Storage] = _Kept("run")
    engine: _Kept[CoordinatorEngine] = _Kept("run")
    catalog: _Kept[Catalog] = _Kept("run")
    num_tms: _Kept[int] = _Kept("run")
    job: _Kept[str] = _Kept("run")
    job_seq: _Kept[int] = _Kept("run")
    running: _Kept[bool] = _Kept("run")
    vertices: _Kept[tuple[VertexSpec, ...]] = _Kept("run")
    next_checkpoint: _Kept[int] = _Kept("run")
    bases: _Kept[set[str]] = _Kept("run")
    lineage: _Kept[set[str]] = _Kept("run")
    # TM attempts (``TmBook``)
    placement: _Kept[dict[SubtaskId, TmId]] = _Kept("tm_book")
    tms: _Kept[dict[TmId, Tm]] = _Kept("tm_book")
    started: _Kept[dict[TmId, tuple[str, int]]] = _Kept("tm_book")
    hosted_before: _Kept[dict[TmId, frozenset[SubtaskId]]] = _Kept("tm_book")
    assigned_from: _Kept[int] = _Kept("tm_book")
    # checkpoints in flight and triggered savepoints (``CheckpointLifecycle``)
    pending: _Kept[dict[int, Pending]] = _Kept("lifecycle")
    savepoint_ids: _Kept[set[int]] = _Kept("lifecycle")
    triggered_savepoints: _Kept[set[int]] = _Kept("lifecycle")
    # what is kept (``Retention``)
    retained: _Kept[list[Completed]] = _Kept("retention")
    registry: _Kept[SharedStateRegistry] = _Kept("retention")
    latest_completed: _Kept[int] = _Kept("retention")
    watermark: _Kept[int] = _Kept("retention")
    restoring: _Kept[tuple[StateEntry, ...]] = _Kept("retention")
    # failovers (``Failover``)
    epoch: _Kept[int] = _Kept("failures")
    handed_to: _Kept[dict[str, TmId]] = _Kept("failures")
    told_lost: _Kept[dict[TmId, frozenset[TmId]]] = _Kept("failures")
    # restores (``RestorePlanner``)
    assignment: _Kept[dict[SubtaskId, tuple[StateEntry, ...]]] = _Kept("restores")
    restored_from: _Kept[str | None] = _Kept("restores")

    def __init__(
        self,
        config: Config,
        vertices: tuple[VertexSpec, ...],
        num_tms: int,
        storage: Storage,
        ids: IdSource,
        engine: CoordinatorEngine,
        job_id: str = "job-0",
        *,
        deletion_log: bool = False,
        log: DeletionLog | None = None,
    ) -> None:
        check_parallelism(config, vertices)  # R78: before anything is built or written
        self.run = CoordinatedJob(config, vertices, num_tms, storage, engine, job_id)
        # the catalog's guards ask this party (``CatalogHost``), which answers from its
        # parts; ``log``: one deletion log shared with the host's TMs in this process
        self.run.catalog = Catalog(storage, ids, self, deletion_log=deletion_log, log=log)
        self.run.catalog.handed = []  # told to the host in ``ready``
        self.tm_book = TmBook(self.run)
        self.working = SharedWorking(self)
        """Working files handed over in place, and their collection (§11, R103-R105)."""
        self.retention = Retention(self.run, self.tm_book, self.working)
        self.lifecycle = CheckpointLifecycle(self.run, self.tm_book, self.retention, self.working)
        self.guards = self.lifecycle.guards
        """The guards of ``spec/refusals.py`` its records decide (``fastimpl.guards``)."""
        self.failures = Failover(
            self.run, self.tm_book, self.lifecycle, self.retention, self.working
        )
        self.job_end = JobEnd(
            self.run, self.tm_book, self.lifecycle, self.retention, self.failures, self.working
        )
        self.restores = RestorePlanner(
            self.run,
            self.tm_book,
            self.lifecycle,
            self.retention,
            self.failures,
            self.job_end,
            self.working,
        )
        self.catalog.dir_rules[COORDINATOR] = self.retention.collectable  # R42

    # the running job and its TMs

    def deploy(self, placement: dict[SubtaskId, TmId]) -> None:
        """The engine runs the job's subtasks on these TMs (all alive)."""
        self.tm_book.deploy(placement)

    def _add_tm(self, tm: TmId) -> None:
        self.tm_book.add_tm(tm)

    def current_tms(self) -> list[TmId]:
        return self.tm_book.current_tms()

    def hot_dirs(self) -> frozenset[str]:
        return self.tm_book.hot_dirs()

    def ready(self) -> Ready:
        """What the calls since the last ``ready`` produced (raft's ``Ready``): the
        deletes the storage holds until the host performs them, and the notices it
        sends, in order (``Ready`` says in which order the host carries them out). A
        host takes it after each call, or after a batch of calls; a notice it never takes
        is never sent (a lost notice: R34 allows it, and the TM learns at the next), a
        delete it never performs leaves its file to the next coordinator (R95)."""
        return self.run.take_ready()

    # a checkpoint's life

    def _is_savepoint(self, checkpoint: int) -> bool:
        return self.lifecycle.is_savepoint(checkpoint)

    def trigger(self, savepoint: bool = False) -> int:
        """R50: a new checkpoint (or savepoint); its id."""
        return self.lifecycle.trigger(savepoint)

    def receive_decline(self, msg: Decline) -> None:
        self.lifecycle.receive_decline(msg)

    def receive_ack(self, ack: Acknowledgement) -> None:
        self.lifecycle.receive_ack(ack)

    def _writes_in(self, path: str, attempt: TmId) -> bool:
        return self.lifecycle.writes_in(path, attempt)

    def claimed(self) -> set[str]:
        return self.lifecycle.claimed()

    def abort(self, checkpoint: int) -> None:
        self.lifecycle.abort(checkpoint)

    def prepare_completion(self, checkpoint: int) -> MetadataWrite:
        """R51-R54: the ``_metadata`` that completes ``checkpoint``, for the host to write
        (raft's ``Ready``: persisted before the notices go); nothing changes until
        ``metadata_written`` or ``metadata_write_failed``. ``CompletionFailed`` if it
        cannot be registered (R54) and was aborted instead."""
        return self.lifecycle.prepare(checkpoint)

    def metadata_written(self, checkpoint: int) -> Completed:
        """R51-R55: the prepared ``_metadata`` is on storage: the completed checkpoint
        (the notices in the next ``ready``); ``CompletionFailed`` if the checkpoint was
        aborted since it was prepared (the written file is deleted)."""
        return self.lifecycle.written(checkpoint)

    def metadata_write_failed(self, checkpoint: int, fault: BaseException) -> CompletionFailed:
        """R51: writing the prepared ``_metadata`` failed: the checkpoint aborts (its
        notices in the next ``ready``); the ``CompletionFailed`` for the host to raise."""
        return self.lifecycle.write_failed(checkpoint, fault)

    def complete(self, checkpoint: int) -> Completed:
        """The three steps of a completion for a host that orders nothing between them,
        with the ``_metadata`` written through the storage given at construction:
        ``prepare_completion``, the write, ``metadata_written`` (or
        ``metadata_write_failed``, whose ``CompletionFailed`` is raised)."""
        return complete_through(self, self.run.storage, checkpoint)

    # what is kept

    def _register(self, done: Completed, recorded: Completed | None = None) -> None:
        self.retention.register(done, recorded)

    def referenced(self, path: str) -> bool:
        return self.retention.referenced(path)

    def collect_dirs(self) -> None:
        self.retention.collect_dirs()

    def load_completed(self, metadata: str, job: str | None = None) -> Completed:
        return self.retention.load_completed(metadata, job)

    # failures

    def lose(self, tm: TmId) -> None:
        self.failures.lose(tm)

    def replace(self, tm: TmId, new: TmId | None = None) -> TmId:
        return self.failures.replace(tm, new)

    def receive_stopped(self, msg: AttemptStopped) -> None:
        self.failures.receive_stopped(msg)

    def attempt_stopped(self, tm: TmId) -> None:
        self.failures.attempt_stopped(tm)

    def failover(self) -> None:
        self.failures.failover()

    # the job's end and restores

    def end_job(self, *, retain: bool) -> None:
        self.job_end.end_job(retain=retain)

    def restore(self, cmd: c.Restore) -> None:
        self.restores.restore(cmd)

    def stored_savepoint(self, checkpoint: int) -> Completed | None:
        return self.restores.stored_savepoint(checkpoint)

    def stored_savepoints(self) -> list[int]:
        return self.restores.stored_savepoints()

    def state_to_restore(self, subtask: SubtaskId) -> tuple[StateEntry, ...]:
        return self.restores.state_to_restore(subtask)

    # what a host reads of the coordinator, and its word on attempts it started itself
    # (``fastimpl.parties``: values, never the records themselves)

    def is_running(self) -> bool:
        """Whether the job runs: false once ``end_job`` ended it (R90) until a
        ``restore`` starts the next (R70)."""
        return self.run.running

    def pending_checkpoints(self) -> tuple[int, ...]:
        """The checkpoints triggered and neither completed nor aborted yet (R50-R53), in
        id order."""
        return tuple(sorted(self.lifecycle.pending))

    def attempt_status(self, tm: TmId) -> Status | None:
        """What the coordinator knows of attempt ``tm``: ``ALIVE``; ``LOST`` (given up on,
        it may still run and write: R57, R66); ``STOPPED`` (known stopped, R64, or ended
        with its job, R90); ``None`` if it never heard of it."""
        rec = self.tm_book.tms.get(tm)
        return None if rec is None else rec.status

    def attempts(self) -> Mapping[TmId, Status]:
        """Every attempt alive or lost, with its status (a stopped one is forgotten,
        ``attempt_status`` still answers for it)."""
        return MappingProxyType({t: r.status for t, r in self.tm_book.tms.items()})

    def file_owners(self) -> Mapping[str, str]:
        """Who the coordinator's records say owns each file they hold (I3): the
        coordinator's own, handed over to it (R43, R64), or recorded as a TM's or the
        user's; a file whose background delete keeps failing is still its deleter's."""
        return MappingProxyType(self.catalog.owners())

    def open_files(self) -> frozenset[str]:
        """The files the coordinator holds open (R16)."""
        return frozenset(p for p, f in self.catalog.files.items() if f.open)

    def adopt_attempt(self, subtask: SubtaskId, tm: TmId, first_checkpoint: int) -> TmId:
        """The engine started attempt ``tm`` for ``subtask`` itself, in place of the one
        placed there, which never ran (Spark starts a task's TM in the task): ``tm`` runs
        ``subtask`` from now on, alive, and may have written for checkpoints from
        ``first_checkpoint`` on, which is where its files may lie once it stops (R64).
        The attempt it took the place of stays known until the engine gives it up
        (``lose``, then ``attempt_ended``). Returns that attempt."""
        return self.tm_book.adopt(subtask, tm, first_checkpoint)

    def attempt_ended(
        self, tm: TmId, hosted: Iterable[SubtaskId] = (), first_checkpoint: int = 1
    ) -> None:
        """R64, R65, from the engine: attempt ``tm``, given up on (lost), has stopped, and
        it ran the subtasks ``hosted`` (besides those the coordinator knows it hosted): the
        shared directories of each are where its files may lie. One the coordinator never
        heard of (the engine started it, and it died before any acknowledgement of it
        arrived, R66) is taken as a lost attempt of the running job that could write
        from ``first_checkpoint`` on. Then as ``receive_stopped``: what waited for its
        stop runs, and the coordinator takes and deletes what it left that no retained
        checkpoint refers to. Raises ``CommandError`` for an attempt not lost."""
        self.failures.attempt_ended(tm, frozenset(hosted), first_checkpoint)

    def collect_working(self) -> None:
        """R104: the coordinator deletes each shared working file it owns that no retained
        checkpoint, no pending acknowledgement and no live database refers to (a lost
        attempt's wait for it to stop, R64). Its deletes run on the storage's deleter
        (``Storage.drain`` waits for them)."""
        self.working.collect()

    def working_needed(self) -> frozenset[str]:
        """The working files (§11) still needed: those a retained checkpoint or a pending
        acknowledgement refers to in place (R103) and those the live databases use, as
        their TMs answer ``DatabaseFiles`` (R104)."""
        return frozenset(self.working.referred() | self.working.in_use())

    def running_job(self) -> str:
        """The id of the coordinator's current job: the one it was built for, or the new
        job of its latest restore (R70) or recovery (R95)."""
        return self.run.job

    def retained_checkpoints(self) -> tuple[Completed, ...]:
        """The retained checkpoints, oldest first (R54): what a restore or a failover
        starts from."""
        return tuple(self.retention.retained)

    def latest_checkpoint(self) -> int:
        """The id of the latest checkpoint the current job completed or restored from
        (R70), 0 if none."""
        return self.retention.latest_completed

    def lineage_bases(self) -> frozenset[str]:
        """The job bases the coordinator may delete in (I5, R72): its current job's and
        those a CLAIM restore or a recovery gave it; never a NO_CLAIM source's (R73)."""
        return frozenset(self.run.lineage)
