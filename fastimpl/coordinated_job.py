"""What every part of the coordinator (``fastimpl.coordinator``) reads of the job it
coordinates: the configuration, the storage, the engine that runs the TMs, the catalog of
paths, the running job's id and shape, the next checkpoint id (R50) and the bases the
store may write and delete in (I5). The parts keep the rest, each its own.

One object, shared by the parts, so that what a restore (a new job, R70) or a recovery
changes here every part sees at once.
"""

from __future__ import annotations

from typing import Protocol

from attrs import frozen

from fastimpl.catalog import Catalog
from fastimpl.storage import Storage
from spec.config import Config, MergingMode, VertexSpec
from spec.ids import SubtaskId, TmId
from spec.layout import SAVEPOINTS, job_base
from spec.messages import Answer, CheckpointAborted, CheckpointComplete, Duty, ResetTm

Notice = CheckpointComplete | CheckpointAborted


@frozen
class Ready:
    """What the coordinator produced since the host last asked (raft's ``Ready``). The
    host carries it out in this order: what it persists first (its HA state, Flink's
    pointer to the latest checkpoint), then ``deletes``, then ``notices``; it may batch
    several calls before it asks.

    ``deletes``: the files and directories (a directory with all it holds) the
    coordinator decided to delete, in order. Its storage holds them until the host
    performs them (``Storage.perform``); until then it lists what it holds as if they
    were done. A delete that waits (R45, R64) is here once it runs. A host that dies
    before performing them leaves their files to the next coordinator's rebuild (R64,
    R95), as a delete cut off by a crash is.
    ``notices``: ``(tm, notice)`` in the order the coordinator decided them (R31-R34 let
    the transport lose, repeat or reorder them; the coordinator never waits for one).
    A notice for a TM that a later call of the same batch reset (``ResetTm``) or forgot
    is no longer here: its old attempt's notices go with the redeploy."""

    notices: tuple[tuple[TmId, Notice], ...] = ()
    deletes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.notices or self.deletes)


def subtasks_of(vertices: tuple[VertexSpec, ...]) -> list[SubtaskId]:
    return [SubtaskId(v.name, i, v.parallelism) for v in vertices for i in range(v.parallelism)]


class CoordinatorEngine(Protocol):
    """What the coordinator asks of the engine that runs the job's TMs (in process:
    ``fastimpl.engine.InProcessEngine``; across processes, messages to TM processes).

    Starting, placing and stopping TM processes is the engine's (Flink's scheduler
    deploys TaskManagers, a Spark driver its executors); everything else a TM must do for
    the coordinator is a message (``spec.messages``): duties through ``duty``, the
    engine's reliable call to one TM (Flink's task deployment and TaskExecutor RPCs), and
    notices, which the host takes from ``CheckpointCoordinator.ready`` after its calls and
    sends (they may be lost, repeated or reordered)."""

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        """Start a new TM attempt for ``job``; its id."""

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        """Where each subtask runs (the engine's choice)."""

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        """Where the subtasks run now (each TM learns which are its own)."""

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        """Hand ``msg`` to ``tm`` and return its answer (``TmEnded`` for ``EndJob``,
        ``Held`` for ``Holdings``). A
        ``ResetTm`` also drops the notices still queued for ``tm`` (its old attempt's
        connections go with the redeploy)."""

    def forget_tm(self, tm: TmId) -> None:
        """The TM is gone: its process stops, the notices queued for it go."""


class CoordinatedJob:
    """The running job as every part of the coordinator sees it."""

    def __init__(
        self,
        config: Config,
        vertices: tuple[VertexSpec, ...],
        num_tms: int,
        storage: Storage,
        engine: CoordinatorEngine,
        job_id: str,
    ) -> None:
        self.cfg = config
        self.mode: MergingMode = config.merging_mode
        self.storage = storage
        self.engine = engine
        self.catalog: Catalog
        """Every path on storage, who owns it, and the guarded deletes (``fastimpl.catalog``);
        set by the coordinator, which the catalog asks what its guards need."""
        self.num_tms = num_tms
        self.job = job_id
        self.job_seq = 0
        self.running = True
        self.vertices = vertices
        self.next_checkpoint = 1
        """The next checkpoint id (R50): ids are never reused across the coordinator's jobs."""
        self.bases: set[str] = {job_base(job_id), SAVEPOINTS}
        self.lineage: set[str] = {job_base(job_id)}
        """Bases whose files a CLAIM may give the coordinator (R72, I5): the running job's
        own and those its predecessors held when claimed; a NO_CLAIM restore starts a
        lineage of its own (R73). Never a savepoint's, never what a file merely names."""
        self.outbox: list[tuple[TmId, Notice]] = []
        """The notices decided since the host last took them (``take_ready``)."""

    def notify(self, tm: TmId, msg: Notice) -> None:
        """A notice for ``tm``, sent by the host once it takes the ``Ready``."""
        self.outbox.append((tm, msg))

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        """The engine's ``duty``; a ``ResetTm`` drops the notices for ``tm`` that wait
        here, as the engine drops those it queued (the old attempt's go with the
        redeploy)."""
        if isinstance(msg, ResetTm):
            self.outbox = [(t, n) for t, n in self.outbox if t != tm]
        return self.engine.duty(tm, msg)

    def forget_tm(self, tm: TmId) -> None:
        """The engine's ``forget_tm``; the notices for ``tm`` that wait here go too."""
        self.outbox = [(t, n) for t, n in self.outbox if t != tm]
        self.engine.forget_tm(tm)

    def take_ready(self) -> Ready:
        """What was produced since the last call: the notices to send and the deletes
        the storage holds for the host (``Ready``); both are cleared."""
        handed = self.catalog.handed or []
        ready = Ready(tuple(self.outbox), tuple(dict.fromkeys(handed)))
        self.outbox = []
        handed.clear()
        return ready
