"""The messages that cross a process boundary between a coordinator and its TMs.

A coordinator and a TM meet only through these values (issue 16): a TM acknowledges or
declines a checkpoint, the coordinator tells TMs that a checkpoint completed or aborted,
hands a restoring subtask what it starts from, gives a TM its duties (a reset and a
restart after a failover, the claimed files its backends may reuse, that a lost attempt
has stopped, the end of the job, which the TM answers with what it hands over), and the
engine tells the coordinator that an attempt it gave up on has stopped. Each is a frozen
attrs value, and each travels as bytes: ``encode_message`` / ``decode_message``, JSON
through ``spec.codec`` wrapped in an envelope that carries ``MESSAGE_VERSION``.

Decoding refuses, with a ``MessageError`` naming the field (``$.message.checkpoint``),
anything that is not exactly a message of this version: bytes that are not UTF-8 JSON,
a foreign version, an unknown message type, a missing or unknown field, a value of the
wrong type or out of range. Decoding builds a new value and touches nothing else, so a
refused message changes nothing anywhere.

A savepoint finishing is not a message of its own: it is a ``CheckpointComplete`` with
``savepoint=True`` (R35), and a complete of a checkpoint says which savepoints are still
pending (``pending_savepoints``), as the model's notification does.
"""

from __future__ import annotations

import json
from typing import Any, Union

from attrs import field, frozen

from spec import codec
from spec.errors import WrongTypeError
from spec.handles import InPlaceFile, StateEntry
from spec.ids import SubtaskId, TmId

MESSAGE_VERSION = 1
"""Bumped on any change a peer of the previous version would misread."""


class MessageError(codec.CodecError):
    """Bytes that are not a message of ``MESSAGE_VERSION``; ``where`` names the field."""


class _FieldError(ValueError):
    """A field's value out of range; ``field`` lets the decoder name it."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.field = name
        self.problem = problem


def _checkpoint_id(_inst: object, attribute: Any, value: int) -> None:
    if value < 1:
        raise _FieldError(attribute.name, f"a checkpoint id is >= 1, got {value}")


def _positive(_inst: object, attribute: Any, value: int) -> None:
    if value < 1:
        raise _FieldError(attribute.name, f"must be >= 1, got {value}")


def _non_negative(_inst: object, attribute: Any, value: int) -> None:
    if value < 0:
        raise _FieldError(attribute.name, f"must be >= 0, got {value}")


def _name(_inst: object, attribute: Any, value: str) -> None:
    if not value or any(ch in value for ch in "/\\\x00") or value in (".", ".."):
        raise _FieldError(attribute.name, f"{value!r} is not a name (empty, a path or a dot)")


def _names(_inst: object, attribute: Any, value: frozenset[str]) -> None:
    for v in sorted(value):
        _name(_inst, attribute, v)


# ---------------------------------------------------------------------------- TM -> coordinator


@frozen
class Acknowledgement:
    """A subtask's snapshot for ``checkpoint``, sent by the TM attempt ``attempt``."""

    job: str = field(validator=_name)
    checkpoint: int = field(validator=_checkpoint_id)
    subtask: SubtaskId
    attempt: TmId = field(validator=_name)
    entries: tuple[StateEntry, ...]
    in_place: tuple[InPlaceFile, ...] = ()
    """R103: the working files the subtask's snapshot refers to where they are: the
    coordinator's from this acknowledgement on (shared, R100), whether the checkpoint is
    still pending or not."""


@frozen
class Decline:
    """A subtask cannot finish ``checkpoint`` (a failed write, R17)."""

    job: str = field(validator=_name)
    checkpoint: int = field(validator=_checkpoint_id)
    subtask: SubtaskId
    attempt: TmId = field(validator=_name)


# ---------------------------------------------------------------------------- coordinator -> TMs


@frozen
class CheckpointComplete:
    """``checkpoint`` completed; every segment last used at or below ``subsumed`` may go
    (R31). With ``savepoint`` it finishes that savepoint only (R35)."""

    job: str = field(validator=_name)
    checkpoint: int = field(validator=_checkpoint_id)
    subsumed: int = field(validator=_non_negative)
    savepoint: bool
    pending_savepoints: frozenset[int] = frozenset()
    """Savepoints still pending when it was sent: the others up to ``checkpoint`` are
    finished (R35)."""


@frozen
class CheckpointAborted:
    """``checkpoint`` aborted; ``latest_completed`` is the newest completed one (R32)."""

    job: str = field(validator=_name)
    checkpoint: int = field(validator=_checkpoint_id)
    latest_completed: int = field(validator=_non_negative)
    savepoint: bool


# ---------------------------------------------------------------------------- coordinator -> one TM


@frozen
class RestoreAssignment:
    """What ``subtask`` (hosted by ``tm``) starts from after a failover, restore or
    rescale, and the files every retained checkpoint refers to: anything else in its
    directories that no live writer holds is garbage (R62)."""

    job: str = field(validator=_name)
    subtask: SubtaskId
    tm: TmId = field(validator=_name)
    entries: tuple[StateEntry, ...]
    referenced: frozenset[str]
    first_checkpoint: int = field(validator=_checkpoint_id)
    """The first checkpoint id the new attempt may write for (R60)."""
    latest_completed: int = field(validator=_non_negative)
    subsumed: int = field(validator=_non_negative)


# ------------------------------------------------------------ the coordinator's duties to one TM
# What the coordinator needs a TM to do besides hearing notices: after a failover or a
# restore (R60-R62, R64), when a claimed checkpoint's files may be reused (R72) and when
# the job ends (R90). Each names the TM it is for and an ``epoch`` (the coordinator's
# count of failovers and restores): a TM applies a duty once, ignores one older than what
# it applied, so a duty repeated or arriving late changes nothing.


@frozen
class RetainedCheckpoint:
    """A retained checkpoint as a restarting TM needs it: its id and entries (R61)."""

    checkpoint: int = field(validator=_checkpoint_id)
    entries: tuple[StateEntry, ...]


@frozen
class KeptFile:
    """A file handed between the parties with its record: what a TM still owned when its
    job ended (R90), or what the coordinator held of a retained checkpoint in a
    restarting TM's directories (R61)."""

    path: str
    size: int = field(validator=_non_negative)
    creator: TmId | None


@frozen
class WaitingDelete:
    """A delete a party decided and could not run yet: its call failed and waits for a
    retry (R45), or it waits for a lost attempt to stop (``waits_for``, R64)."""

    path: str
    directory: bool
    waits_for: TmId | None


@frozen
class ResetTm:
    """R60: a surviving TM drops what it wrote and never acknowledged, closes its open
    files and forgets its tables (no stale manager survives, FLINK-35400)."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    epoch: int = field(validator=_positive)


@frozen
class TmAssignment:
    """R60-R62, R64, R66: what ``tm`` runs after a failover (or a restore, or as the new
    attempt of a task-level failover) and starts from.

    ``hosted``: the subtasks it runs now; ``retained``: every retained checkpoint (oldest
    first), whose segments in its directories it takes over (R61) while every other file
    there that a TM owns is garbage (R62); ``latest``: the running job's latest completed
    checkpoint, what its subtasks start from and their backends may reuse; ``lost``:
    attempts that may still run, whose files wait for them (R64); ``taken_over``: the
    directories it manages that a TM owns, its own from now on (R61); ``handed_over``:
    those the coordinator owns (R42). It also carries what the
    TM knows of the job from then on (``latest_completed``, ``finished_mark``,
    ``subsumed``, ``first_checkpoint``). Applying it resets the TM first if the
    ``ResetTm`` of the same epoch has not arrived."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    epoch: int = field(validator=_positive)
    hosted: tuple[SubtaskId, ...]
    retained: tuple[RetainedCheckpoint, ...]
    latest: RetainedCheckpoint | None
    lost: frozenset[TmId] = field(validator=_names)
    taken_over: tuple[str, ...]
    """Directories it manages now that are not the coordinator's: its own (R61)."""
    handed_over: tuple[str, ...]
    """Directories it manages now that are the coordinator's (R42): it writes in them
    and never deletes them."""
    files: tuple[KeptFile, ...]
    """Files of the retained checkpoints in its directories that the coordinator held
    (taken from a stopped attempt, R64): the TM's from now on (R61)."""
    first_checkpoint: int = field(validator=_checkpoint_id)
    latest_completed: int = field(validator=_non_negative)
    finished_mark: int = field(validator=_non_negative)
    subsumed: int = field(validator=_non_negative)
    aborted: frozenset[int] = frozenset()
    """R66: checkpoints from ``first_checkpoint`` on that were aborted before the TM
    started (a replacement starts for the pending ones, which may have gaps)."""
    finished_savepoints: frozenset[int] = frozenset()
    """R66: savepoints from ``first_checkpoint`` on that were over before it started."""


@frozen
class LostAttemptStopped:
    """R64: ``stopped``, an attempt ``tm`` was told may still run (``TmAssignment.lost``),
    is known to have stopped: the deletes of files it created that wait in ``tm``'s
    records run now, as the coordinator's own waiting deletes do."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    stopped: TmId = field(validator=_name)


@frozen
class ReusableFiles:
    """R72: claimed whole files (``entries``, of checkpoint ``checkpoint``) the hosted
    subtasks' backends may reuse (NONE mode, unchanged parallelism)."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    epoch: int = field(validator=_non_negative)
    checkpoint: int = field(validator=_checkpoint_id)
    entries: tuple[StateEntry, ...]


@frozen
class EndJob:
    """R90: the job ends for ``tm``: it discards every segment whose logical id is not in
    ``keep`` (what retained checkpoints reference), closes its files, deletes the
    directories it created that no completed checkpoint used, and answers ``TmEnded``."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    keep: frozenset[str]


@frozen
class TmEnded:
    """A TM's answer to ``EndJob``: what it still owned (files, directories) after R90's
    discards and deletes, and the deletes of its that still wait (R45, R64), handed to
    the coordinator; the TM forgets it all."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    files: tuple[KeptFile, ...]
    directories: tuple[str, ...]
    waiting: tuple[WaitingDelete, ...] = ()


@frozen
class Holdings:
    """R64, R65: which files under ``directories`` this TM records (a stopped attempt's
    files died with its process's records: what no live party records there is its)."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    directories: tuple[str, ...]


@frozen
class Held:
    """A TM's answer to ``Holdings``: the files it records under the directories asked,
    and those of the directories asked that it owns (R40)."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    paths: tuple[str, ...]


@frozen
class OpenDatabase:
    """R105: after a failover or a restore, ``subtask``'s database on ``tm`` opens on
    ``in_place`` (the working files the restored checkpoint refers to for its key groups,
    used where they are: no copy) and on a new private copy of each small file, read from
    its segment in ``small`` (R103 merged it). Applied once per epoch and subtask."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    epoch: int = field(validator=_non_negative)
    subtask: SubtaskId
    in_place: tuple[InPlaceFile, ...]
    small: tuple[StateEntry, ...]
    users: bool = False
    """NO_CLAIM (R105): the files ``in_place`` are the user's; the database's snapshot
    copies each into a file of its own first, and it never deletes one."""


@frozen
class DatabasesOpened:
    """R62, R102: every database of the failover or restore of ``epoch`` is open: ``tm``
    deletes its private working files that none of its databases uses now."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    epoch: int = field(validator=_non_negative)


@frozen
class DatabaseFiles:
    """R104: which working files ``tm``'s live databases use: the coordinator's
    collection never deletes one of them."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)


@frozen
class InUse:
    """A TM's answer to ``DatabaseFiles``: the working files its databases use."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)
    paths: tuple[str, ...]


# ---------------------------------------------------------------------------- engine -> coordinator


@frozen
class AttemptStopped:
    """A TM attempt the coordinator gave up on is known to have stopped (R64)."""

    job: str = field(validator=_name)
    tm: TmId = field(validator=_name)


Message = Union[  # noqa: UP007 - the codec reads the union's members
    Acknowledgement,
    Decline,
    CheckpointComplete,
    CheckpointAborted,
    RestoreAssignment,
    AttemptStopped,
    ResetTm,
    TmAssignment,
    ReusableFiles,
    LostAttemptStopped,
    EndJob,
    TmEnded,
    Holdings,
    Held,
    OpenDatabase,
    DatabasesOpened,
    DatabaseFiles,
    InUse,
]
MESSAGE_TYPES: tuple[type, ...] = (
    Acknowledgement,
    Decline,
    CheckpointComplete,
    CheckpointAborted,
    RestoreAssignment,
    AttemptStopped,
    ResetTm,
    TmAssignment,
    ReusableFiles,
    LostAttemptStopped,
    EndJob,
    TmEnded,
    Holdings,
    Held,
    OpenDatabase,
    DatabasesOpened,
    DatabaseFiles,
    InUse,
)
Duty = (
    ResetTm
    | TmAssignment
    | ReusableFiles
    | LostAttemptStopped
    | EndJob
    | Holdings
    | OpenDatabase
    | DatabasesOpened
    | DatabaseFiles
)
"""What the coordinator asks of one TM besides notices."""
Answer = TmEnded | Held | InUse
"""What a TM answers to a duty (``EndJob``, ``Holdings``); the others have no answer."""


def encode_message(msg: Message) -> bytes:
    """``msg`` as bytes: ``{"version": MESSAGE_VERSION, "message": {...}}`` in UTF-8."""
    if not isinstance(msg, MESSAGE_TYPES):
        raise WrongTypeError(f"not a message: {type(msg).__name__}")
    envelope = {"version": MESSAGE_VERSION, "message": codec.encode(msg)}
    # codec.encode builds new lists and dicts, never a cycle: json need not look for one
    text = json.dumps(envelope, sort_keys=True, separators=(",", ":"), check_circular=False)
    return text.encode()


def decode_message(data: bytes) -> Message:
    """The message ``encode_message`` turned into ``data``; ``MessageError`` naming the
    field for anything else."""
    body = codec.open_envelope(data, MessageError, body="message", version=MESSAGE_VERSION)
    try:
        msg: Message = codec.decode(Message, body, "$.message")
    except MessageError:
        raise
    except codec.CodecError as err:
        cause = err.__cause__
        if isinstance(cause, _FieldError):  # a validator: name the field, not its object
            raise MessageError(f"{err.where}.{cause.field}", cause.problem) from None
        raise MessageError(err.where, err.problem) from None
    return msg
