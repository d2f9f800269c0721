"""Documented errors. A command that raises leaves the state unchanged.

Every error the library raises derives from :class:`CkptError`, so a host catches the
library's errors with one clause; each keeps the built-in base its callers knew
(``ValueError`` for bad input, ``OSError`` for a path, ...) beside it."""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    """Why a command was refused; implementations must agree on the reason."""

    JOB_NOT_RUNNING = "job_not_running"
    UNKNOWN_CHECKPOINT = "unknown_checkpoint"
    CHECKPOINT_NOT_PENDING = "checkpoint_not_pending"
    CHECKPOINT_FINISHED_FOR_TM = "checkpoint_finished_for_tm"
    UNKNOWN_SUBTASK = "unknown_subtask"
    ALREADY_ACKNOWLEDGED = "already_acknowledged"
    NOT_ALL_ACKNOWLEDGED = "not_all_acknowledged"
    UNKNOWN_TM = "unknown_tm"
    TM_NOT_ALIVE = "tm_not_alive"
    TM_NOT_LOST = "tm_not_lost"
    NOT_HOSTED = "not_hosted"
    NO_SUCH_NOTIFICATION = "no_such_notification"
    NO_SUCH_STATE = "no_such_state"
    NOT_RETAINED = "not_retained"
    BAD_ARGUMENT = "bad_argument"
    MAX_PARALLELISM_CHANGED = "max_parallelism_changed"
    ATTEMPT_MAY_RUN = "attempt_may_run"


class CkptError(Exception):
    """The common base of every error ckpt-ownership raises."""


class CommandError(CkptError):
    """A command that is invalid in the current state. Nothing changed."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class UsageError(CkptError, ValueError):
    """A call given a value the library does not accept: a bad argument or option, an
    unknown name, a malformed file or message. Nothing changed."""


class WrongTypeError(CkptError, TypeError):
    """A call given a value of a type the library does not take."""


class NotFoundError(CkptError, KeyError):
    """A name the store does not know, such as a task manager's id."""


class OperationFailed(CkptError, RuntimeError):
    """Something the library ran could not finish: a streaming query that failed or
    stopped early, a package installed in a form it cannot read."""
