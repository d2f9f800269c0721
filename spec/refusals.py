"""Which commands are refused, and why: for each command, its guards in the order they are
checked and the ``Reason`` each refuses with.

The refusals are data, as h11 states its state machine as tables, so that the rules, the
implementations and the documentation cannot drift apart: SPEC.md's refusal table is
generated from ``GUARDS`` (``python -m model_tests.refusal_table --write``), and both
implementations refuse through ``check``, which walks a command's guards in this order:
each implementation supplies only its own predicate per guard (``Checks``), computed from
its own records, so the order lives here alone. A test builds, for every guard, a state
that violates it and checks that the reference model and fastimpl refuse with exactly
the listed ``Reason`` and change nothing (``tests/test_refusals.py``).

The first guard that fails decides the reason; a command that passes every guard of its
list is accepted. Argument checks done when a command is built (a negative size raises
``ValueError`` in ``spec.commands``) are not refusals and are not listed.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping

from attrs import frozen

from spec import commands as c
from spec.errors import CkptError, CommandError, Reason


@frozen
class Guard:
    """One check a command must pass. ``name`` is stable: tests key their violations by it."""

    name: str
    reason: Reason
    refused_when: str
    """The state (or argument) that makes the command fail this guard, in words."""
    rules: tuple[str, ...] = ()
    """The SPEC.md rules the guard carries out."""


RUNNING = Guard("running", Reason.JOB_NOT_RUNNING, "the job has ended (Cancel)", ("R90",))
SUBTASK_KNOWN = Guard(
    "subtask_known", Reason.UNKNOWN_SUBTASK, "the subtask is not one of the running job's"
)
CHECKPOINT_TRIGGERED = Guard(
    "checkpoint_triggered",
    Reason.UNKNOWN_CHECKPOINT,
    "the checkpoint id was never triggered (not in 1 .. last triggered)",
    ("R10",),
)
WRITER_KNOWN = Guard(
    "writer_known", Reason.UNKNOWN_TM, "the `attempt` names a TM that never existed", ("R64",)
)
HOST_ALIVE = Guard(
    "host_alive",
    Reason.TM_NOT_ALIVE,
    "no `attempt` is given and the subtask's TM is lost (not yet failed over)",
    ("R57",),
)
ATTEMPT_LOST = Guard(
    "attempt_lost",
    Reason.TM_NOT_LOST,
    "an `attempt` is given and that TM is not lost (alive or stopped): only a zombie "
    "acts for a subtask it no longer hosts",
    ("R56", "R64"),
)
ATTEMPT_HOSTED = Guard(
    "attempt_hosted",
    Reason.NOT_HOSTED,
    "an `attempt` is given and that lost TM never hosted the subtask",
    ("R64",),
)
NOT_FINISHED_FOR_TM = Guard(
    "not_finished_for_tm",
    Reason.CHECKPOINT_FINISHED_FOR_TM,
    "the writing TM knows the checkpoint finished (it learned of its completion, "
    "subsumption or abort) or started after it",
    ("R10", "R35"),
)
NOT_ACKNOWLEDGED = Guard(
    "not_acknowledged",
    Reason.ALREADY_ACKNOWLEDGED,
    "the writing TM already acknowledged the checkpoint for the subtask",
    ("R10",),
)
STATE_EXISTS = Guard(
    "state_exists",
    Reason.NO_SUCH_STATE,
    "the writing TM never wrote (or restored) shared state of that name for the subtask",
    ("R20",),
)
CHECKPOINT_PENDING = Guard(
    "checkpoint_pending",
    Reason.CHECKPOINT_NOT_PENDING,
    "the checkpoint was triggered but is no longer pending (completed or aborted)",
    ("R51",),
)
ALL_ACKNOWLEDGED = Guard(
    "all_acknowledged",
    Reason.NOT_ALL_ACKNOWLEDGED,
    "a subtask of the running job has not acknowledged the checkpoint",
    ("R51",),
)
NOTIFICATION_EXISTS = Guard(
    "notification_exists",
    Reason.NO_SUCH_NOTIFICATION,
    "no notification is in flight at that index",
    ("R34",),
)
TM_KNOWN = Guard("tm_known", Reason.UNKNOWN_TM, "the TM never existed")
TM_ALIVE_IN_JOB = Guard(
    "tm_alive_in_job",
    Reason.TM_NOT_ALIVE,
    "the TM is lost or stopped, or hosts no subtask of the running job",
    ("R57", "R66"),
)
TM_LOST = Guard("tm_lost", Reason.TM_NOT_LOST, "the TM is alive or already stopped", ("R64",))
NONE_LOST = Guard(
    "none_lost",
    Reason.ATTEMPT_MAY_RUN,
    "an attempt the coordinator gave up on is not known stopped: it may still write, and "
    "a coordinator rebuilt from storage could not tell its files from garbage",
    ("R64", "R95"),
)
PARTIAL_WRITE = Guard(
    "partial_write",
    Reason.BAD_ARGUMENT,
    "`written` is not strictly between 0 and `size`",
    ("R65",),
)
SOURCE_RETAINED = Guard(
    "source_retained",
    Reason.NOT_RETAINED,
    "the checkpoint is neither retained by the current job (running, or ended with "
    "`Cancel(retain=True)`) nor a completed savepoint",
    ("R70",),
)
PARALLELISM_VALID = Guard(
    "parallelism_valid",
    Reason.BAD_ARGUMENT,
    "a parallelism names an unknown vertex or lies outside 1 .. max parallelism, or "
    "`num_tms` lies outside 1 .. 32768",
    ("R75", "R78"),
)
MAX_PARALLELISM_SAME = Guard(
    "max_parallelism_same",
    Reason.MAX_PARALLELISM_CHANGED,
    "the new job's max parallelism is not the one the checkpoint was taken with",
    ("R77",),
)

WORKING_BYTES = Guard(
    "working_bytes",
    Reason.BAD_ARGUMENT,
    "`size` is 0: a working file has at least one byte",
    ("R101",),
)
DATABASE_USES = Guard(
    "database_uses",
    Reason.NO_SUCH_STATE,
    "the acting attempt's database of the subtask does not use `path` (never wrote or "
    "opened it, or stopped using it)",
    ("R102",),
)

_WRITER = (
    RUNNING,
    SUBTASK_KNOWN,
    CHECKPOINT_TRIGGERED,
    WRITER_KNOWN,
    HOST_ALIVE,
    ATTEMPT_LOST,
    ATTEMPT_HOSTED,
    NOT_FINISHED_FOR_TM,
    NOT_ACKNOWLEDGED,
)
"""The checks on the TM a write or acknowledgement comes from (R10, R56, R64)."""
_HOST_WRITER = (
    RUNNING,
    SUBTASK_KNOWN,
    CHECKPOINT_TRIGGERED,
    HOST_ALIVE,
    NOT_FINISHED_FOR_TM,
    NOT_ACKNOWLEDGED,
)
"""The same for commands that carry no ``attempt``: they always come from the subtask's
current TM, which is always known, and never from a zombie."""
_DATABASE = (
    RUNNING,
    SUBTASK_KNOWN,
    WRITER_KNOWN,
    HOST_ALIVE,
    ATTEMPT_LOST,
    ATTEMPT_HOSTED,
)
"""The checks on the attempt whose live database acts (R100, R106): a writer's, without
a checkpoint (a database writes and compacts between checkpoints)."""

GUARDS: Mapping[type[c.Command], tuple[Guard, ...]] = {
    c.Trigger: (RUNNING,),
    c.WriteState: _WRITER,
    c.ReuseShared: (*_WRITER, STATE_EXISTS),
    c.Acknowledge: _WRITER,
    c.Decline: _HOST_WRITER,
    c.Complete: (RUNNING, CHECKPOINT_TRIGGERED, CHECKPOINT_PENDING, ALL_ACKNOWLEDGED),
    c.Abort: (RUNNING, CHECKPOINT_TRIGGERED, CHECKPOINT_PENDING),
    c.DeliverNotification: (NOTIFICATION_EXISTS,),
    c.DropNotification: (NOTIFICATION_EXISTS,),
    c.DuplicateNotification: (NOTIFICATION_EXISTS,),
    c.CrashTm: (RUNNING, TM_KNOWN, TM_ALIVE_IN_JOB),
    c.AttemptStopped: (TM_KNOWN, TM_LOST),
    c.CrashDuringWrite: (*_HOST_WRITER, PARTIAL_WRITE),
    c.Failover: (RUNNING,),
    c.ReplaceTm: (RUNNING, TM_KNOWN, TM_ALIVE_IN_JOB),
    c.RestartCoordinator: (RUNNING, NONE_LOST),
    c.Restore: (SOURCE_RETAINED, PARALLELISM_VALID, MAX_PARALLELISM_SAME),
    c.FailNextCall: (),
    c.RetryDeletes: (),
    c.Cancel: (RUNNING,),
    c.WriteWorking: (*_DATABASE, WORKING_BYTES),
    c.DropWorking: (*_DATABASE, DATABASE_USES),
    c.SnapshotWorking: _WRITER,
    c.CollectWorking: (RUNNING,),
}
"""Every command of ``spec.commands.Command``, in the order of that union."""

COMMANDS: tuple[type[c.Command], ...] = typing.get_args(c.Command)

_NAMES: Mapping[type[c.Command], frozenset[str]] = {
    kind: frozenset(g.name for g in guards) for kind, guards in GUARDS.items()
}


def guards_of(command: c.Command | type[c.Command]) -> tuple[Guard, ...]:
    kind = command if isinstance(command, type) else type(command)
    return GUARDS[kind]


# ---------------------------------------------------------------------------- the executor

Check = Callable[[], str | None]
"""One implementation's predicate for one guard: ``None`` while the guard holds, else the
refusal's detail (what failed, in the implementation's own terms). It is called only once
every earlier guard of the command held, so it may rely on them (the acting TM exists
once ``writer_known`` held)."""

Checks = Mapping[str, Check]
"""An implementation's predicates for one command's guards, keyed by ``Guard.name``."""


class GuardTableError(CkptError, LookupError):
    """An implementation's ``Checks`` do not name exactly the guards of the command: a
    guard left out would never refuse, a name not in the list would never run."""


@frozen
class Refusal:
    """The first guard a command failed, and the implementation's detail for it."""

    guard: Guard
    detail: str

    def error(self) -> CommandError:
        return CommandError(self.guard.reason, self.detail)


def first_failing(command: c.Command | type[c.Command], checks: Checks) -> Refusal | None:
    """Walk the command's guards in ``GUARDS`` order, calling each predicate of ``checks``
    only once the earlier ones held; the first that fails, or ``None`` if all hold.
    Raises ``GuardTableError`` (before calling any predicate) unless ``checks`` names
    exactly the command's guards."""
    kind = command if isinstance(command, type) else type(command)
    if checks.keys() != _NAMES[kind]:
        missing = sorted(_NAMES[kind] - checks.keys())
        unknown = sorted(checks.keys() - _NAMES[kind])
        raise GuardTableError(
            f"checks for {kind.__name__}: missing {missing}, not its guards {unknown}"
        )
    for guard in GUARDS[kind]:
        detail = checks[guard.name]()
        if detail is not None:
            return Refusal(guard, detail)
    return None


def check(command: c.Command | type[c.Command], checks: Checks) -> None:
    """Raise ``CommandError`` with the reason of the first guard of the command that
    ``checks`` finds failing (``first_failing``); return if every guard holds."""
    refusal = first_failing(command, checks)
    if refusal is not None:
        raise refusal.error()


def markdown() -> str:
    """SPEC.md's refusal table: one row per guard, in order; a command with no guard is
    never refused."""
    lines = [
        "| command | # | refused when | `Reason` | rules |",
        "|---|---|---|---|---|",
    ]
    for kind in COMMANDS:
        guards = GUARDS[kind]
        if not guards:
            lines.append(f"| `{kind.__name__}` | — | never refused | — | — |")
        for i, g in enumerate(guards, start=1):
            rules = ", ".join(g.rules) or "—"
            lines.append(
                f"| `{kind.__name__}` | {i} | {g.refused_when} | `{g.reason.name}` | {rules} |"
            )
    return "\n".join(lines)
