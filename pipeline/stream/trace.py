"""The command trace of a streaming run, for ``model_tests.replay`` (issue 17): the spec
commands the coordinator carried out in the driver and those each TM carried out on a
worker (reported back with its acknowledgement, ``worker_tm.WorkerTaskManager.commands``),
in the format of ``fastimpl.trace``.

Linearized per batch, in the order the driver receives the results: for each task, the
notices its TM applied at the task's start (``DeliverNotification``, indexed as the
model's channel holds them), its writes and reuses, then its ``Acknowledge`` (or
``Decline``) with the coordinator's outcome; then ``Complete`` or ``Abort``, and what the
coordinator does between batches (``AttemptStopped``, ``Failover``, ``Restore``). This
order is one the run could have had: a TM changes its own records and files only, and
the coordinator hears an acknowledgement only after ``collect``, when every task is done.

TM names. The model starts with ``num_tms`` TMs placed round-robin, as the coordinator
places its placeholders before it hears of a subtask's first TM (``coordination.
SparkEngine``); the TM that first acknowledges for a subtask takes its placeholder's model
name (the placeholder never ran, so this renames, and drops nothing). Every later TM is
named as the model names it: ``tm-<n>``, counting on. TM names appear in no command but
``ReplaceTm``, ``AttemptStopped`` and a zombie's ``attempt``; the trace says ``"ids":
"random"``: observations are not compared.

What the run does that the model has commands for:

- a subtask's TM replaced by a new attempt within a pending checkpoint (a task retried
  after a kill, a speculative copy accepted, a local DB dropped): ``ReplaceTm`` of the old
  TM before the new one's first command (R66); the old TM's stop, once no attempt of the
  job may still run, is ``AttemptStopped`` (R64); the failover that hands the files it
  left to the live TMs is ``Failover`` (R61);
- a TM that acts after it was replaced (its task ran on, a zombie): its writes and its
  acknowledgement carry ``attempt`` (R56, R64);
- a rescale: ``Restore`` with ``num_tms``, one TM per subtask as Spark runs them (R70).

What is outside the model and left out, said in ``outside``: files no party records (an
attempt that started, wrote and died before the coordinator heard of it: its report died
with it), swept as a stopped attempt's files (R64, R66); an acknowledgement such an
attempt sent for a checkpoint already over, which the coordinator ignores. The model
never saw them written, so nothing it holds changes.

Where the model has no command for what the run does, the trace stops (``stopped`` says
why), and a replay checks what came before: a driver restart (a recovery into a new job
from storage, ``fastimpl.recovery``, in a new process whose trace would start over); an
attempt acting after it was known stopped; a given-up attempt's decline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastimpl.trace import CommandTrace
from spec import commands as c
from spec.config import Config, JobSpec
from spec.ids import SubtaskId, TmId


class StreamTrace:
    """Writes a run's trace to ``path`` (see the module docstring)."""

    def __init__(
        self, path: str, config: Config, job: JobSpec, placement: Mapping[SubtaskId, TmId]
    ) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.out = CommandTrace(path)
        self.out.header(config, job, "random")
        self.stopped: str | None = None
        """Why the trace ends before the run (None: it holds the whole run)."""
        self.left_out: list[str] = []
        """What the run did outside the model (``outside``), in order."""
        self.commands = 0
        self.model: dict[TmId, str] = {}
        """Each TM's name in the model (a placeholder's, then its subtask's first TM's)."""
        self.placeholders: set[TmId] = set()
        """The TMs the coordinator placed before it heard of any (they never ran)."""
        self._next_tm = 1
        """The number of the model's next TM (``refimpl``'s ``next_tm``)."""
        self._started(placement, job.num_tms)
        self._renamed: set[TmId] = set()
        self.channel: list[tuple[int, str, TmId, int]] = []
        """The notices in flight as the model holds them: (notify, model TM, TM, seq)."""
        self._notify = 0
        self._last: object = None

    def _started(self, placement: Mapping[SubtaskId, TmId], num_tms: int) -> None:
        """A job's placeholders, named as the model names its TMs (``refimpl.state.place``:
        round-robin over the subtasks in order, ``num_tms`` new TMs)."""
        names = [f"tm-{self._next_tm + k}" for k in range(num_tms)]
        self._next_tm += num_tms
        for i, s in enumerate(sorted(placement)):
            self.model[placement[s]] = names[i % num_tms]
            self.placeholders.add(placement[s])

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
            self.out.close()

    def outside(self, what: str) -> None:
        """The run did something outside the model that changes nothing it holds."""
        if self.stopped is None:
            self.left_out.append(what)

    def record(self, cmd: c.Command, error: BaseException | None = None) -> None:
        if self.stopped is None:
            self.out.record(cmd, error, 0, None)
            self.commands += 1

    def lines(self, lines: Iterable[dict[str, Any]], attempt: str | None = None) -> None:
        """Commands a TM logged on a worker (``command_line`` dicts); ``attempt``: the
        TM's model name when it acted for a subtask it no longer hosts (a zombie)."""
        for line in lines:
            if self.stopped is None:
                if attempt is not None:
                    line = {**line, "command": {**line["command"], "attempt": attempt}}
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

    def forget(self, tm: TmId) -> None:
        """The notices queued for ``tm`` go (it stopped, a failover reset it, its job
        ended), as the model's ``_forget_tm`` drops them."""
        self.channel = [n for n in self.channel if n[2] != tm]

    def placed(self, old: TmId, new: TmId) -> None:
        """``new``, a subtask's first TM, acknowledged for a subtask its placeholder
        ``old`` held: it takes the placeholder's model name."""
        if old in self.placeholders and old not in self._renamed and new not in self.model:
            self.model[new] = self.model[old]
            self._renamed.add(old)
        else:
            self.stop(f"{new} took the place of {old}, which is no placeholder the model knows")

    def replaced(self, old: TmId, new: TmId) -> None:
        """``new`` replaced ``old`` within a pending checkpoint (R66): ``ReplaceTm``."""
        name = self.model.get(old)
        if name is None or new in self.model:
            self.stop(f"{new} replaced {old}, which the model does not know")
            return
        self.record(c.ReplaceTm(name))
        self.model[new] = f"tm-{self._next_tm}"
        self._next_tm += 1

    def failover(self, placed: Iterable[TmId]) -> None:
        """After a ``Failover`` with every placed TM alive: each was reset (R60)."""
        for tm in set(placed):
            self.forget(tm)

    def restored(
        self, ending: Iterable[TmId], placement: Mapping[SubtaskId, TmId], num_tms: int
    ) -> None:
        """After a ``Restore``: the ended job's TMs stopped (R90), the new job's
        placeholders are named as the model names its ``num_tms`` new TMs."""
        for tm in ending:
            self.forget(tm)
        self._started(placement, num_tms)

    def close(self) -> None:
        if self.stopped is None:
            self.out.close()
