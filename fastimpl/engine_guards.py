"""The in-process engine's guards (``spec/refusals.py``): for each command, the product's
predicate for each of its guards, asked where the records are. The coordinator's
records decide most (``fastimpl.guards``); the acting TM attempt's own records whether a
checkpoint is over for it (R56), what it acknowledged, wrote (R20) and its database uses
(R102); the transport which notices are in flight (R34). ``InProcessEngine.check`` walks
them in the table's order before a call changes anything.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastimpl.coordinator import CheckpointCoordinator
from fastimpl.taskmanager import TaskManager
from spec import commands as c
from spec.ids import SubtaskId, TmId
from spec.refusals import Check


def checks(
    coord: CheckpointCoordinator,
    parties: Mapping[TmId, TaskManager],
    in_flight: int,
    cmd: c.Command,
) -> dict[str, Check]:
    """The product's predicate for each guard of ``cmd``, by name: the coordinator's
    records decide most (``fastimpl.guards``), the acting TM's own records whether a
    checkpoint is over for it, what it acknowledged, wrote and uses, the transport
    which notices are in flight. Trigger, Complete, AttemptStopped and Restore are
    checked by the coordinator itself, which other engines drive directly; the rest
    here, before the call. ``parties``: each TM attempt's own side; ``in_flight``: the
    notices the transport holds."""
    g = coord.guards
    match cmd:
        case c.Trigger() | c.Failover() | c.Cancel() | c.CollectWorking():
            return g.running_checks()
        case c.RestartCoordinator():
            return g.restart_checks()
        case c.WriteState() | c.Acknowledge() | c.SnapshotWorking():
            return _writer_checks(coord, parties, cmd.checkpoint, cmd.subtask, cmd.attempt)
        case c.ReuseShared():
            return _writer_checks(coord, parties, cmd.checkpoint, cmd.subtask, cmd.attempt) | {
                "state_exists": lambda: _no_state(coord, parties, cmd)
            }
        case c.Decline():
            return _writer_checks(coord, parties, cmd.checkpoint, cmd.subtask, None, zombie=False)
        case c.CrashDuringWrite():
            return _writer_checks(
                coord, parties, cmd.checkpoint, cmd.subtask, None, zombie=False
            ) | {
                "partial_write": lambda: (
                    None
                    if 0 < cmd.written < cmd.size
                    else "a crash mid-write needs 0 < written < size"
                )
            }
        case c.Complete():
            return g.complete_checks(cmd.checkpoint)
        case c.Abort():
            return g.abort_checks(cmd.checkpoint)
        case c.DeliverNotification() | c.DropNotification() | c.DuplicateNotification():
            return {"notification_exists": lambda: _no_notice(in_flight, cmd.index)}
        case c.CrashTm() | c.ReplaceTm():
            return g.live_tm_checks(cmd.tm)
        case c.AttemptStopped():
            return g.stopped_checks(cmd.tm)
        case c.Restore():
            return coord.restores.checks(cmd).table()
        case c.FailNextCall() | c.RetryDeletes():
            return {}
        case c.WriteWorking():
            return g.database_checks(cmd.subtask, cmd.attempt) | {
                "working_bytes": lambda: (
                    None if cmd.size > 0 else "a working file has at least one byte"
                )
            }
        case c.DropWorking():
            return g.database_checks(cmd.subtask, cmd.attempt) | {
                "database_uses": lambda: _not_used(coord, parties, cmd)
            }


def _writer_checks(
    coord: CheckpointCoordinator,
    parties: Mapping[TmId, TaskManager],
    checkpoint: int,
    subtask: SubtaskId,
    attempt: TmId | None,
    *,
    zombie: bool = True,
) -> dict[str, Check]:
    """The TM a write or acknowledgement comes from (R10, R56, R64): the coordinator's
    checks of the acting attempt and the checkpoint, then the attempt's own records:
    the checkpoint is not over for it, it has not acknowledged it yet."""
    g = coord.guards

    def finished() -> str | None:
        tm = g.acting_tm(subtask, attempt)
        if not parties[tm].finished(checkpoint, coord._is_savepoint(checkpoint)):
            return None
        return f"{tm} already knows checkpoint {checkpoint} is finished"

    def acknowledged() -> str | None:
        if not parties[g.acting_tm(subtask, attempt)].acknowledged(subtask, checkpoint):
            return None
        return f"{subtask} already acknowledged {checkpoint}"

    return g.database_checks(subtask, attempt, zombie=zombie) | {
        "checkpoint_triggered": lambda: g.checkpoint_triggered(checkpoint),
        "not_finished_for_tm": finished,
        "not_acknowledged": acknowledged,
    }


def _no_state(
    coord: CheckpointCoordinator, parties: Mapping[TmId, TaskManager], cmd: c.ReuseShared
) -> str | None:
    """R20: only shared state the acting TM's backend remembers uploading is reused."""
    tm = coord.guards.acting_tm(cmd.subtask, cmd.attempt)
    if parties[tm].remembered(cmd.subtask, cmd.name) is not None:
        return None
    return f"{cmd.subtask} on {tm} has no shared state {cmd.name!r}"


def _not_used(
    coord: CheckpointCoordinator, parties: Mapping[TmId, TaskManager], cmd: c.DropWorking
) -> str | None:
    """R102: a database stops using only a file it uses."""
    tm = coord.guards.acting_tm(cmd.subtask, cmd.attempt)
    if cmd.path in parties[tm].working.uses.get(cmd.subtask, ()):
        return None
    return f"the database of {cmd.subtask} on {tm} uses no {cmd.path}"


def _no_notice(in_flight: int, index: int) -> str | None:
    if 0 <= index < in_flight:
        return None
    return f"no notification {index} of {in_flight}"
