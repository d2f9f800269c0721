"""The failures a streaming task injects into itself (``--kill-worker-prob``, the demo's
kill, a straggler's stall) and the log of the kills, read back by the job and the tests.
Both backends' tasks (``subtask``, ``working_task``) die the same way, so this is
neither's."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import NoReturn

from attrs import frozen

from spec.errors import UsageError

KILL_POINTS = ("deleting", "before-snapshot", "mid-upload", "uploaded", "acknowledged", "put-back")
"""Where an injected failure kills a task: while its TM deletes (applying its mail, once
its first delete is done and before any other), before its snapshot, after its first
upload, after its last, after it acknowledged, after it left its DB for the next batch.
A task whose TM deletes nothing while applying its mail is never killed at ``deleting``
(without file merging a TM never does: its files are the coordinator's to delete)."""

KILL_LOG = "kills.log"
"""In the executors' work directory: a JSON line per injected kill, written by the task
just before it kills itself (``batch``, ``subtask``, ``attempt``, ``point``, ``pid``)."""


class Killed(BaseException):
    """A simulated SIGKILL (tests): like the real one, it runs no cleanup of the task."""


@frozen
class Failures:
    """Failures a task injects into itself (``--kill-worker-prob``)."""

    kill_prob: float = 0.0
    """The chance of dying at each of ``KILL_POINTS``."""
    seed: int = 0
    killed_attempts: int = 1
    """Attempts of a task that may be killed (the first ones): with Spark's
    ``spark.task.maxFailures`` above it, every task finishes in the end."""
    kill_at: tuple[int, int, str] | None = None
    """``(batch, subtask, point)``: one kill exactly there (the demo's), first attempt."""
    stall_at: tuple[tuple[int, int, str], ...] = ()
    """``(batch, subtask, point)``: the first attempt of that task stalls there for
    ``stall_s`` (a straggler: Spark's speculation then launches a copy of it)."""
    stall_s: float = 4.0

    @property
    def any(self) -> bool:
        return self.kill_prob > 0 or self.kill_at is not None

    def kills(self, point: str, batch: int, index: int, attempt_number: int) -> bool:
        """Whether attempt ``attempt_number`` of subtask ``index`` dies at ``point`` of
        batch ``batch``: the same answer in every process and on every run."""
        if self.kill_at == (batch, index, point) and attempt_number == 0:
            return True
        if self.kill_prob <= 0 or attempt_number >= self.killed_attempts:
            return False
        key = f"{self.seed}/{batch}/{index}/{attempt_number}/{point}"
        return random.Random(key).random() < self.kill_prob

    def stalls(self, point: str, batch: int, index: int, attempt_number: int) -> bool:
        return attempt_number == 0 and (batch, index, point) in self.stall_at


def log_kill(work_dir: str, batch: int, index: int, attempt_number: int, point: str) -> None:
    """Append the kill about to happen to ``KILL_LOG`` (one ``write`` of one line, so
    concurrent tasks do not interleave; the page cache keeps it past the SIGKILL)."""
    line = json.dumps(
        {
            "batch": batch,
            "subtask": index,
            "attempt": attempt_number,
            "point": point,
            "pid": os.getpid(),
        },
        sort_keys=True,
    )
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(work_dir) / KILL_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@frozen
class Kill:
    """An injected kill, as the task logged it just before (``log_kill``)."""

    batch: int
    subtask: int
    attempt: int
    """The task's attempt number (0: its first)."""
    point: str


def read_kills(work_dir: str) -> list[Kill]:
    """The kills ``log_kill`` recorded under ``work_dir``, oldest first."""
    try:
        text = (Path(work_dir) / KILL_LOG).read_text()
    except FileNotFoundError:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(Kill(int(d["batch"]), int(d["subtask"]), int(d["attempt"]), str(d["point"])))
        except (ValueError, KeyError, TypeError) as err:
            raise UsageError(
                f"{Path(work_dir) / KILL_LOG} line {n}: not a kill record: {err!r}"
            ) from None
    return out


def sigkill(point: str) -> NoReturn:
    """Die as a crashed worker does: no cleanup, no exception handler, no reply."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")  # pragma: no cover
