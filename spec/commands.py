"""The command vocabulary: every operation an implementation must accept.

Commands are frozen values whose repr is valid Python, so a failing test prints a
runnable reproduction. ``attempt`` names the TM a command comes from when it is not the
subtask's current host: that is how a zombie (a lost TM still running) acts.
"""

from __future__ import annotations

import enum

from attrs import field, frozen

from spec.config import RestoreMode, StateKind
from spec.errors import UsageError
from spec.ids import SubtaskId, TmId


def _non_negative(_inst: object, attribute: object, value: int) -> None:
    if value < 0:
        raise UsageError(f"{attribute} must be >= 0, got {value}")


@frozen
class Trigger:
    """The coordinator starts checkpoint ``next id`` (or a savepoint)."""

    savepoint: bool = False


@frozen
class WriteState:
    """A subtask writes ``size`` bytes of state for a checkpoint through a stream (R10)."""

    checkpoint: int
    subtask: SubtaskId
    kind: StateKind
    name: str
    size: int = field(validator=_non_negative)
    entries: int = field(default=1, validator=_non_negative)
    attempt: TmId | None = None


@frozen
class ReuseShared:
    """A subtask refers to shared state it uploaded before, instead of uploading it again."""

    checkpoint: int
    subtask: SubtaskId
    name: str
    attempt: TmId | None = None


@frozen
class Acknowledge:
    checkpoint: int
    subtask: SubtaskId
    attempt: TmId | None = None


@frozen
class Decline:
    checkpoint: int
    subtask: SubtaskId


@frozen
class Complete:
    """The coordinator finalizes a fully acknowledged checkpoint."""

    checkpoint: int


@frozen
class Abort:
    """The coordinator gives up a pending checkpoint (timeout, failure)."""

    checkpoint: int


@frozen
class DeliverNotification:
    """Deliver the in-flight notification at ``index`` (any index: reordering)."""

    index: int


@frozen
class DropNotification:
    index: int


@frozen
class DuplicateNotification:
    index: int


@frozen
class CrashTm:
    """A TM is lost to the coordinator. It may be dead or a zombie still running."""

    tm: TmId


@frozen
class AttemptStopped:
    """A lost TM is known to have stopped (its lease expired)."""

    tm: TmId


@frozen
class CrashDuringWrite:
    """A TM crashes after writing ``written`` of ``size`` bytes of a stream."""

    checkpoint: int
    subtask: SubtaskId
    kind: StateKind
    name: str
    size: int = field(validator=_non_negative)
    written: int = field(validator=_non_negative)


@frozen
class Failover:
    """Restart every subtask from the latest completed checkpoint, same job and parallelism.
    Lost TMs are replaced by new ones."""


@frozen
class ReplaceTm:
    """Task-level failover (R66): the live TM ``tm`` is replaced by a new attempt, with a
    new id, that runs the same subtasks, while pending checkpoints stay pending and the
    other TMs run on (Spark retrying a killed task or accepting a speculative copy). The
    replaced attempt is lost: it may still run as a zombie until ``AttemptStopped``."""

    tm: TmId


@frozen
class RestartCoordinator:
    """The coordinator process restarts: it rebuilds retained checkpoints and the registry
    from persisted metadata, and the job's subtasks restart as in a failover."""


@frozen
class Restore:
    """End the current job (keeping its retained checkpoints) and start a new job from a
    retained checkpoint or savepoint, with new parallelisms and a restore mode."""

    checkpoint: int
    parallelism: tuple[tuple[str, int], ...] = ()
    mode: RestoreMode = RestoreMode.NO_CLAIM
    max_parallelism: int | None = None
    """The new job's max parallelism; ``None``: the configured one. It must be the one
    the checkpoint was taken with (R77)."""
    num_tms: int | None = None
    """How many TMs the new job starts with (R70, R78: 1 .. 32768); ``None``: as many as
    the ended job started with. Spark runs one TM per subtask, so a rescale changes it."""


class StorageOp(enum.Enum):
    CREATE = "create"
    APPEND = "append"
    DELETE = "delete"
    METADATA = "metadata"


@frozen
class FailNextCall:
    """Arm a fault: the next storage call of this kind fails."""

    op: StorageOp


@frozen
class RetryDeletes:
    """Retry deletions that failed before."""


@frozen
class Cancel:
    """End the job. ``retain`` keeps the retained checkpoints for the user."""

    retain: bool = False


# ---------------------------------------------------------------------- working state (§11)
# The live database of a subtask keeps its files in its working directory on the
# checkpoint storage (R100-R106); checkpoints refer to them in place.


@frozen
class WriteWorking:
    """The live database of a subtask writes one working file of ``size`` bytes in its
    working directory and uses it from then on (R101). ``attempt``: a zombie's database."""

    subtask: SubtaskId
    size: int = field(validator=_non_negative)
    attempt: TmId | None = None


@frozen
class DropWorking:
    """A database stops using a working file (a compaction replaced it, R102)."""

    subtask: SubtaskId
    path: str
    attempt: TmId | None = None


@frozen
class SnapshotWorking:
    """A subtask snapshots its database for a checkpoint (R103): files smaller than
    ``inline_below`` bytes are uploaded as shared state (merged segments when file merging
    is on), the others are referred to in place."""

    checkpoint: int
    subtask: SubtaskId
    inline_below: int = field(default=0, validator=_non_negative)
    attempt: TmId | None = None


@frozen
class CollectWorking:
    """The coordinator's collection of working files (R104; SlateDB: its GC run)."""


Command = (
    Trigger
    | WriteState
    | ReuseShared
    | Acknowledge
    | Decline
    | Complete
    | Abort
    | DeliverNotification
    | DropNotification
    | DuplicateNotification
    | CrashTm
    | AttemptStopped
    | CrashDuringWrite
    | Failover
    | ReplaceTm
    | RestartCoordinator
    | Restore
    | FailNextCall
    | RetryDeletes
    | Cancel
    | WriteWorking
    | DropWorking
    | SnapshotWorking
    | CollectWorking
)


WorkingCommand = WriteWorking | DropWorking | SnapshotWorking | CollectWorking
"""The commands of disaggregated working state (§11)."""

AnyCommand = Command
"""Every command: the working ones joined ``Command`` with issue 18's stage 2 (kept as a
name for the code written against the model alone)."""
