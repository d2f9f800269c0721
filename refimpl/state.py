"""The model's state: frozen records in frozen mappings. Nothing here mutates.

Bookkeeping is split the way the real system splits it: the coordinator's (pending and
retained checkpoints, the registry), each TM's memory (segments, physical files, pools,
unacknowledged outputs, what its backend uploaded), the notification channel, and the
storage itself (files with size, open flag, owner and creator).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from attrs import field, frozen

from spec.commands import StorageOp
from spec.config import Config, JobSpec, Scope, VertexSpec, check_parallelism
from spec.handles import Handle, StateEntry
from spec.ids import SubtaskId, TmId
from spec.layout import SAVEPOINTS, job_base
from spec.observation import DeletionRecord


class TmStatus(enum.Enum):
    ALIVE = "alive"
    LOST = "lost"
    """Given up by the coordinator; may still run (a zombie) until known stopped."""
    STOPPED = "stopped"


@frozen
class TmRec:
    id: TmId
    status: TmStatus
    known_completed: int = 0
    """Highest checkpoint this TM knows completed."""
    finished_mark: int = 0
    """Every non-savepoint checkpoint <= this id is finished, as far as this TM knows."""
    known_aborted: frozenset[int] = frozenset()
    known_watermark: int = 0
    first_checkpoint: int = 1
    """The first checkpoint this attempt was started for: it never writes for older ones."""
    finished_savepoints: frozenset[int] = frozenset()
    hosted: frozenset[SubtaskId] = frozenset()
    """The subtasks a lost TM hosted when it was given up: what a zombie may still write."""


@frozen
class Seg:
    """A live logical file in one TM's segment table."""

    logical_id: str
    tm: TmId
    path: str
    offset: int
    length: int
    subtask: SubtaskId
    scope: Scope
    created_for: int
    last_used: int
    confirmed: bool


@frozen
class PFile:
    """A physical file tracked by one TM's file-merging manager."""

    path: str
    tm: TmId
    scope: Scope
    pool_key: tuple[str, ...]
    checkpoint: int | None
    open: bool
    size: int
    ref_count: int
    live_bytes: int
    reusable: bool = True


@frozen
class BackendRef:
    """What a subtask's backend remembers having uploaded under a local name."""

    entry: StateEntry
    checkpoint: int
    confirmed: bool


@frozen
class ManagedDir:
    path: str
    creator: TmId
    used_by: frozenset[int] = frozenset()
    """Checkpoints whose acknowledgement reported this directory (a set, not a counter)."""
    handed_over: bool = False


@frozen
class Pending:
    id: int
    savepoint: bool
    acks: Mapping[SubtaskId, tuple[StateEntry, ...]] = field(factory=dict)
    received: frozenset[str] = frozenset()
    """Files whose ownership the acknowledgements handed to the coordinator."""
    working: Mapping[SubtaskId, tuple[str, ...]] = field(factory=dict)
    """R103: the working files each acknowledgement referred to in place."""


@frozen
class Completed:
    id: int
    job: str
    savepoint: bool
    entries: tuple[StateEntry, ...]
    directories: tuple[str, ...]
    metadata: str
    max_parallelism: int | None = None
    """R77: the max parallelism the checkpoint was taken with (``None``: not recorded)."""
    working: tuple[tuple[SubtaskId, str], ...] = ()
    """R103: the working files it refers to in place, with the subtask that referred."""


@frozen
class RegEntry:
    key: str
    path: str
    handle: Handle | None
    refs: frozenset[int]
    owned: bool
    pins: frozenset[int] = frozenset()
    """Pending checkpoints whose placeholders refer to this entry (R22): it stays."""


class NoticeKind(enum.Enum):
    COMPLETE = "complete"
    ABORT = "abort"


@frozen
class Notice:
    """``complete(c, subsumed watermark)`` or ``abort(c, latest completed)`` for one TM."""

    tm: TmId
    kind: NoticeKind
    checkpoint: int
    mark: int
    savepoint: bool = False
    pending_savepoints: frozenset[int] = frozenset()
    """Savepoints still pending when a checkpoint completed: every other one is finished."""


@frozen
class StoredFile:
    size: int
    open: bool
    owner: str
    creator: TmId | None


@frozen
class Deferred:
    """A delete that waits: for a lost attempt to stop, or for a retry after a failure."""

    actor: str
    path: str
    is_dir: bool
    waits_for: TmId | None


@frozen
class WFile:
    """A working file of disaggregated state (R100): immutable once written."""

    path: str
    key_groups: tuple[int, int]
    """The key groups of the subtask whose database wrote it (R105 projects by them)."""
    shared: bool = False
    """An acknowledgement referred to it: the coordinator's for good (R103)."""


@frozen
class ModelState:
    config: Config
    job: str
    job_seq: int
    running: bool
    vertices: tuple[VertexSpec, ...]
    num_tms: int
    placement: Mapping[SubtaskId, TmId] = field()
    tms: Mapping[TmId, TmRec] = field()
    next_checkpoint: int = 1
    pending: Mapping[int, Pending] = field(factory=dict)
    aborted: frozenset[int] = frozenset()
    retained: tuple[Completed, ...] = ()
    savepoints: Mapping[int, Completed] = field(factory=dict)
    savepoint_ids: frozenset[int] = frozenset()
    latest_completed: int = 0
    watermark: int = 0
    registry: Mapping[str, RegEntry] = field(factory=dict)
    segs: Mapping[tuple[TmId, str], Seg] = field(factory=dict)
    pfiles: Mapping[tuple[TmId, str], PFile] = field(factory=dict)
    pools: Mapping[tuple[str, ...], str] = field(factory=dict)
    outputs: Mapping[tuple[TmId, SubtaskId, int], tuple[StateEntry, ...]] = field(factory=dict)
    acked: Mapping[tuple[TmId, SubtaskId, int], tuple[StateEntry, ...]] = field(factory=dict)
    backend: Mapping[tuple[TmId, SubtaskId, str], BackendRef] = field(factory=dict)
    dirs: Mapping[str, ManagedDir] = field(factory=dict)
    dir_owner: Mapping[str, str] = field(factory=dict)
    files: Mapping[str, StoredFile] = field(factory=dict)
    deletions: tuple[DeletionRecord, ...] = ()
    deferred: tuple[Deferred, ...] = ()
    channel: tuple[Notice, ...] = ()
    armed: tuple[StorageOp, ...] = ()
    restoring: tuple[StateEntry, ...] = ()
    bases: frozenset[str] = frozenset()
    next_file: int = 1
    next_segment: int = 1
    next_tm: int = 1
    wfiles: Mapping[str, WFile] = field(factory=dict)
    dbs: Mapping[tuple[TmId, SubtaskId], frozenset[str]] = field(factory=dict)
    """R100: each open database (an attempt's, for one subtask) -> the files it uses."""
    wout: Mapping[tuple[TmId, SubtaskId, int], tuple[str, ...]] = field(factory=dict)
    """R103: what an unacknowledged snapshot refers to in place: pins of its attempt."""


def subtasks_of(vertices: tuple[VertexSpec, ...]) -> list[SubtaskId]:
    return [SubtaskId(v.name, i, v.parallelism) for v in vertices for i in range(v.parallelism)]


def place(subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
    """Round-robin placement of subtasks over TMs, in a fixed order."""
    return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}


def initial_state(config: Config, job: JobSpec, job_id: str = "job-0") -> ModelState:
    """A running job with ``job.num_tms`` live TMs and no checkpoint yet."""
    check_parallelism(config, job.vertices)  # R78: before anything is built
    tm_ids = [f"tm-{i}" for i in range(1, job.num_tms + 1)]
    return ModelState(
        config=config,
        job=job_id,
        job_seq=0,
        running=True,
        vertices=job.vertices,
        num_tms=job.num_tms,
        placement=place(subtasks_of(job.vertices), tm_ids),
        tms={t: TmRec(t, TmStatus.ALIVE) for t in tm_ids},
        bases=frozenset({job_base(job_id), SAVEPOINTS}),
        next_tm=job.num_tms + 1,
    )
