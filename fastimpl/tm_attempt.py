"""One TM attempt's identity and records, the one object every part of a ``TaskManager``
(``fastimpl.taskmanager``) reads and changes: what its subtasks wrote and acknowledged,
what their backends remember uploading (R20-R23), what it heard from the coordinator
(R30-R35) and of failovers (R60-R64, R90), and the guards a host asks before a write or
an acknowledgement: whether a checkpoint is already over for this attempt (R56, R66).
"""

from __future__ import annotations

from fastimpl.catalog import Catalog
from fastimpl.ids import IdSource
from fastimpl.manager import Manager
from fastimpl.records import BackendRef, PoolKey
from fastimpl.working import Databases
from spec.config import Config
from spec.effects import tm_actor
from spec.handles import StateEntry
from spec.ids import SubtaskId, TmId
from spec.keygroups import key_group_range
from spec.layout import shared_dir, taskowned_dir
from spec.messages import TmEnded

OutKey = tuple[SubtaskId, int]
BackendKey = tuple[SubtaskId, str]


class SubtaskFacts:
    """A subtask's shared directory, key groups and name (its pool key's owner, R13),
    and the key of the SHARED pool it last appended to, with that checkpoint."""

    __slots__ = ("directory", "key_groups", "name", "pool_checkpoint", "pool_key")

    def __init__(self, directory: str, key_groups: tuple[int, int], name: str) -> None:
        self.directory = directory
        self.key_groups = key_groups
        self.name = name
        self.pool_checkpoint = 0
        self.pool_key: PoolKey | None = None


class TmAttempt:
    """One TM attempt (``tm``) of job ``job``: its identity and records."""

    def __init__(
        self,
        tm: TmId,
        job: str,
        config: Config,
        catalog: Catalog,
        ids: IdSource,
        first_checkpoint: int = 1,
    ) -> None:
        self.tm = tm
        self.actor = tm_actor(tm)
        self.job = job
        self.cfg = config
        self.mode = config.merging_mode
        self.catalog = catalog
        self.ids = ids
        self.hosted: list[SubtaskId] = []
        """The subtasks the engine runs on this TM (none once it moved them away)."""
        self.savepoints: set[int] = set()
        """Checkpoints the TM was told are savepoints: by the call that writes for one
        (Flink's CheckpointOptions travel with the barrier) or by a notice."""
        self.m = Manager()
        self.outputs: dict[OutKey, list[StateEntry]] = {}
        """What each subtask wrote for a checkpoint and has not acknowledged yet."""
        self.acked: dict[OutKey, tuple[StateEntry, ...]] = {}
        """What each subtask acknowledged, until the TM hears how it ended (R23)."""
        self.backend: dict[BackendKey, BackendRef] = {}
        """What each subtask's backend remembers uploading, by local name (R20-R23)."""
        # What the TM heard from the coordinator (R30-R35)
        self.known_completed = 0
        self.finished_mark = 0
        self.known_aborted: set[int] = set()
        self.known_watermark = 0
        self.first_checkpoint = first_checkpoint
        self.finished_savepoints: set[int] = set()
        self.per_subtask: dict[SubtaskId, SubtaskFacts] = {}
        """What every append of a subtask needs and never changes: its shared directory,
        its key groups, its pool key's owner. Computed once per subtask, not per append;
        one entry per subtask the TM ever wrote for (cleared by ``forget``)."""
        self.taskowned = taskowned_dir(job, tm)
        self.reset_epoch = 0
        """The newest failover whose reset this TM applied (``ResetTm``, R60)."""
        self.assigned_epoch = 0
        """The newest failover whose ``TmAssignment`` this TM applied (R61, R62)."""
        self.lost: set[TmId] = set()
        """Attempts the TM was told may still run (``TmAssignment.lost``) and not yet told
        stopped (``LostAttemptStopped``): with records of its own, its deletes of files
        they created wait for them (R64)."""
        self.ended: TmEnded | None = None
        """Its answer to ``EndJob`` once the job ended for it (R90): given again if asked."""
        # working state (§11): the attempt's live databases (fastimpl.working)
        self.working = Databases(catalog, job, tm, config.max_parallelism)

    def host(self, subtasks: list[SubtaskId]) -> None:
        """The subtasks the engine runs on this TM now (the placement is the engine's)."""
        self.hosted = list(subtasks)

    def restart_knowledge(self, latest: int, mark: int, watermark: int, first: int) -> None:
        """R60: after a failover the TM starts from what the coordinator restores."""
        self.known_completed = latest
        self.finished_mark = mark
        self.known_watermark = watermark
        self.first_checkpoint = first

    def forget(self) -> None:
        """A TM that is gone keeps no memory: its tables go, its files stay on storage."""
        self.m = Manager()
        self.outputs = {}
        self.acked = {}
        self.backend = {}
        self.per_subtask = {}
        self.working.forget()  # working state (§11)

    # ------------------------------------------------------------------ guards

    def note(self, checkpoint: int, savepoint: bool) -> None:
        """The checkpoint's type, as the engine passes it with a barrier."""
        if savepoint:
            self.savepoints.add(checkpoint)

    def finished(self, checkpoint: int, savepoint: bool = False) -> bool:
        """Whether the TM already knows ``checkpoint`` is over (a write is late, R56)."""
        if checkpoint in self.known_aborted or checkpoint < self.first_checkpoint:
            return True
        if checkpoint in self.finished_savepoints:
            return True
        savepoint = savepoint or checkpoint in self.savepoints
        return not savepoint and checkpoint <= self.finished_mark

    def is_savepoint(self, checkpoint: int) -> bool:
        return checkpoint in self.savepoints

    def acknowledged(self, subtask: SubtaskId, checkpoint: int) -> bool:
        return (subtask, checkpoint) in self.acked

    def facts(self, subtask: SubtaskId) -> SubtaskFacts:
        facts = self.per_subtask.get(subtask)
        if facts is None:
            kg = key_group_range(self.cfg.max_parallelism, subtask.parallelism, subtask.index)
            facts = SubtaskFacts(shared_dir(self.job, subtask), kg, str(subtask))
            self.per_subtask[subtask] = facts
        return facts
