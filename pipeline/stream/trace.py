"""The command trace of a streaming run, for ``model_tests.replay`` (issue 17): the spec
commands the coordinator carried out in the driver and those each TM carried out on a
worker (reported back with its acknowledgement, ``worker_tm.WorkerTaskManager.commands``),
in the format of ``fastimpl.trace``.

Linearized per batch, in the order the driver receives the results: for each task, the
notices its TM applied at the task's start (``DeliverNotification``, indexed as the
model's channel holds them), its writes and reuses, then its ``Acknowledge`` (or
``Decline``) with the coordinator's outcome; then ``Complete`` or ``Abort``. This order
is one the run could have had: a TM changes its own records and files only, and the
coordinator hears an acknowledgement only after ``collect``, when every task is done.

The model starts with ``num_tms`` TMs placed round-robin, as the coordinator places its
placeholders before it hears of a subtask's first TM (``coordination.SparkEngine``); the
TM that first acknowledges for a subtask takes its placeholder's model name (the
placeholder never ran, so this renames, and drops nothing). TM names appear in no
command of a traced run, and the trace says ``"ids": "random"``: observations are not
compared.

Where the model has no command for what the run does, the trace stops (``stopped`` says
why), and a replay checks what came before:

- a subtask's TM replaced within a pending checkpoint by a new attempt (a task retried
  after a kill, a speculative copy accepted, a local DB dropped): the model reaches a new
  TM only by a failover, which aborts every pending checkpoint;
- files no party records (an attempt the driver never heard of: a killed task's new TM, a
  speculative loser), swept as strays: the model never saw them written;
- a rescale: the model's job keeps ``num_tms`` TMs across a restore, the Spark job runs
  one TM per subtask;
- a driver restart: a recovery into a new job from storage (``fastimpl.recovery``), not a
  coordinator restart under running TMs (``RestartCoordinator``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastimpl.trace import CommandTrace
from spec import commands as c
from spec.config import Config, JobSpec, VertexSpec
from spec.ids import SubtaskId, TmId


class StreamTrace:
    """Writes a run's trace to ``path`` (see the module docstring)."""

    def __init__(
        self,
        path: str,
        config: Config,
        vertices: tuple[VertexSpec, ...],
        num_tms: int,
        placement: Mapping[SubtaskId, TmId],
        subtasks: list[SubtaskId],
    ) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.out = CommandTrace(path)
        self.out.header(config, JobSpec(vertices, num_tms), "random")
        self.stopped: str | None = None
        """Why the trace ends before the run does (None: it holds the whole run)."""
        self.commands = 0
        model_tms = [f"tm-{k}" for k in range(1, num_tms + 1)]
        # refimpl.state.place: round-robin over the subtasks in order
        self.model: dict[TmId, str] = {
            placement[s]: model_tms[i % num_tms] for i, s in enumerate(subtasks)
        }
        """Each TM's name in the model (a placeholder's, then its subtask's first TM's)."""
        self.placeholders = frozenset(self.model)
        """The TMs the coordinator placed before it heard of any (they never ran)."""
        self._renamed: set[TmId] = set()
        self.channel: list[tuple[int, str, TmId, int]] = []
        """The notices in flight as the model holds them: (notify, model TM, TM, seq)."""
        self._notify = 0
        self._last: object = None

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
            self.out.close()

    def record(self, cmd: c.Command, error: BaseException | None = None) -> None:
        if self.stopped is None:
            self.out.record(cmd, error, 0, None)
            self.commands += 1

    def lines(self, lines: Iterable[dict[str, Any]]) -> None:
        """Commands a TM logged on a worker (``command_line`` dicts)."""
        for line in lines:
            if self.stopped is None:
                self.out.record_line(line)
                self.commands += 1

    def sent(self, tm: TmId, seq: int, msg: object) -> None:
        """The coordinator queued notice ``msg`` for ``tm`` (one ``notify`` sends one
        message object to every live TM, in the order of their names: the model's
        names order the model's channel)."""
        if msg is not self._last:
            self._notify += 1
            self._last = msg
        name = self.model.get(tm)
        if name is None:
            self.stop(f"a notice for {tm}, a TM the model does not know")
            return
        self.channel.append((self._notify, name, tm, seq))

    def applied(self, tm: TmId, seqs: Iterable[int]) -> None:
        """``tm`` applied these notices (in this order): each a ``DeliverNotification``
        of its place in the model's channel."""
        for seq in seqs:
            order = sorted(self.channel, key=lambda n: (n[0], n[1]))
            at = next((i for i, n in enumerate(order) if n[2] == tm and n[3] == seq), None)
            if at is None:
                continue  # a duty (the model's are not in its channel), or not sent to it
            self.record(c.DeliverNotification(at))
            self.channel.remove(order[at])

    def placed(self, old: TmId, new: TmId) -> None:
        """``new`` acknowledged for a subtask ``old`` hosted."""
        if old in self.placeholders and old not in self._renamed and new not in self.model:
            self.model[new] = self.model[old]
            self._renamed.add(old)
        else:
            self.stop(
                f"{new}, a new attempt, replaced {old} within a pending checkpoint (a task"
                " retried or a speculative copy accepted): the model replaces a TM only by"
                " a failover, which aborts every pending checkpoint"
            )

    def close(self) -> None:
        if self.stopped is None:
            self.out.close()
