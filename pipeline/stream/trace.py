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
- a rescale: ``Restore`` with ``num_tms``, one TM per subtask as Spark runs them (R70);
- a driver restart (the driver died with its application; the restarted one, a new
  process, recovers the store into a new job that claims the latest completed checkpoint,
  ``fastimpl.recovery``): the new driver reads the trace the dead one wrote (the model's
  TMs: which are live, which lost, the next one's number, ``_ModelTms``) and writes on it
  a ``CrashTm`` of each live TM of the crashed job (its pending checkpoints abort, R57),
  an ``AttemptStopped`` of every TM of it not known stopped (nothing of the application
  runs: what they owned that no retained checkpoint names is deleted, R64, as the
  recovery deletes it as the crashed job's garbage), and a ``Restore`` of that checkpoint
  in CLAIM mode with one TM per subtask (R70, R72: the new coordinator owns the claimed
  checkpoint, its files and its directories, and deletes it once subsumed, as the
  recovery's new job does). Checkpoint ids agree because the recovery goes past the
  pending ones the crashed job published (R50, ``fastimpl.writer_state``).

What is outside the model and left out, said in ``outside``: files no party records (an
attempt that started, wrote and died before the coordinator heard of it: its report died
with it), swept as a stopped attempt's files (R64, R66); an acknowledgement such an
attempt sent for a checkpoint already over, which the coordinator ignores. The model
never saw them written, so nothing it holds changes.

Where the model has no command for what the run does, the trace stops (``stopped`` says
why, and a ``.stopped`` file next to the trace tells a restarted driver not to write on
past the gap), and a replay checks what came before: an attempt acting after it was known
stopped; a given-up attempt's decline; a driver restart where the recovery and the
model's restore would own other files: with more than one checkpoint kept (the
recovery's new job retains and later deletes them all; the model's CLAIM restore retains
the claimed one and gives the older ones to the user, R91), or with none of the crashed
job's own (a new job from nothing, or from a checkpoint the crashed job had claimed
itself, which the recovery does not read: no model command starts either).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastimpl import CommandTrace
from fastimpl.parties import subtasks_of
from spec import codec
from spec import commands as c
from spec.config import Config, JobSpec, RestoreMode, VertexSpec
from spec.errors import CkptError
from spec.ids import SubtaskId, TmId


class StreamTrace:
    """Writes a run's trace to ``path`` (see the module docstring)."""

    def __init__(
        self, path: str, config: Config, job: JobSpec, placement: Mapping[SubtaskId, TmId]
    ) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(_stop_path(path)).unlink(missing_ok=True)  # an earlier run's
        self._setup(path, CommandTrace(path))
        self.out.header(config, job, "random")
        self._started(placement, job.num_tms)

    @classmethod
    def resume(cls, path: str, config: Config) -> StreamTrace:
        """The trace at ``path``, which a driver that died wrote, to be written on by the
        restarted one (``restarted``). ``NotResumable``: it cannot go on."""
        why = _stop_mark(path)
        if why is not None:
            raise NotResumable(f"the crashed driver's trace had stopped: {why}")
        try:
            with open(path, encoding="utf-8") as f:
                model = _ModelTms.of(f)
        except OSError as err:
            raise NotResumable(f"the crashed driver's trace cannot be read: {err}") from None
        if model.config != config:
            raise NotResumable("the restarted driver runs with another configuration")
        self = cls.__new__(cls)
        self._setup(path, CommandTrace(path, append=True))
        self._next_tm = model.next_tm
        self.crashed = model
        self.commands = self.out.numbered  # the whole trace's, as a replay counts them
        return self

    def _setup(self, path: str, out: CommandTrace) -> None:
        self.path = path
        self.out = out
        self.crashed: _ModelTms | None = None
        """Resumed: the crashed job's TMs as the model holds them (``restarted``)."""
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
            # a driver restarted in a new process must not go on past the gap
            Path(_stop_path(self.path)).write_text(why + "\n", encoding="utf-8")

    def restarted(
        self,
        vertices: tuple[VertexSpec, ...],
        kept: tuple[int, ...],
        placement: Mapping[SubtaskId, TmId],
        garbage: int = 0,
        mode: RestoreMode = RestoreMode.CLAIM,
    ) -> None:
        """The driver died with its application and the restarted one recovered the
        crashed job into a new job that claims the latest of the ``kept`` checkpoints
        (``fastimpl.recovery``), whose TMs are ``placement``'s placeholders. When the
        model's job is a newer incarnation that died before its first checkpoint (the
        recovery abandoned it), its restored checkpoint is the model's latest still, and
        the same commands hold: its TMs crash, and the checkpoint is claimed again. In the
        model: each live TM of the crashed job crashes (``CrashTm``: the pending
        checkpoints abort, R57), every attempt of it is known stopped (``AttemptStopped``:
        nothing of the application runs, R64, and what they owned that no retained
        checkpoint names is deleted, as the recovery deletes the crashed job's garbage),
        and a ``Restore`` in CLAIM mode starts the new job with one TM per subtask (R70,
        R72: the new coordinator owns the claimed checkpoint, deletes it once subsumed)."""
        model = self.crashed
        if model is None or self.stopped is not None:
            return
        self.crashed = None
        if mode is not RestoreMode.CLAIM:
            self.stop(
                "a driver restart after a NO_CLAIM restore that completed no checkpoint: the"
                " recovery restores the same checkpoint again, NO_CLAIM, which the model"
                " cannot (its NO_CLAIM restore left the checkpoint to the user, R73)"
            )
            return
        if not kept:
            self.stop(
                "a driver restart with no completed checkpoint in the crashed job's base:"
                " the recovery starts a new job from nothing (one the crashed job claimed"
                " lies in another base, which it does not read), which no model command does"
            )
            return
        if len(kept) > 1:
            self.stop(
                f"a driver restart keeping {len(kept)} checkpoints: the recovery's new job"
                " retains them all (the coordinator's, each deleted once subsumed), the"
                " model's CLAIM restore retains the one it claims and leaves the older ones"
                " to the user (R91)"
            )
            return
        if model.latest != kept[-1]:
            self.stop(
                f"a driver restart from checkpoint {kept[-1]}, the model's latest completed"
                f" is {model.latest}"
            )
            return
        for tm in model.live_placed():
            crash = c.CrashTm(tm)
            self.record(crash)
            model.apply(crash)
        for tm in model.lost():
            self.record(c.AttemptStopped(tm))
        if garbage:
            self.outside(
                f"the recovery deleted {garbage} path(s) of the crashed job as garbage: what"
                " the model deletes at the stop of its TMs, and what the pending checkpoint's"
                " tasks wrote whose reports died with the driver (the model never saw it"
                " written)"
            )
        p = {v.name: v.parallelism for v in vertices}
        tms = max(len(set(placement.values())), 1)
        self.record(c.Restore(kept[-1], tuple(sorted(p.items())), RestoreMode.CLAIM, num_tms=tms))
        self._started(placement, tms)

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
        self._replace(old, new, f"{new} replaced {old}, which the model does not know")

    def given_up(self, old: TmId, new: TmId) -> None:
        """The coordinator replaced ``old`` by a placeholder ``new`` that never runs
        (``ReplaceTm``, R66): the subtask's next TM takes ``new``'s model name."""
        if self._replace(old, new, f"{old} was given up, which the model does not know"):
            self.placeholders.add(new)

    def _replace(self, old: TmId, new: TmId, unknown: str) -> bool:
        """``ReplaceTm`` of ``old``'s model TM, ``new`` named as the model's next TM; the
        trace stops saying ``unknown`` when the model does not know ``old``."""
        name = self.model.get(old)
        if name is None or new in self.model:
            self.stop(unknown)
            return False
        self.record(c.ReplaceTm(name))
        self.model[new] = f"tm-{self._next_tm}"
        self._next_tm += 1
        return True

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


class NotResumable(CkptError):
    """A restarted driver cannot write on the crashed driver's trace (the reason)."""


def _stop_path(path: str) -> str:
    return path + ".stopped"


def _stop_mark(path: str) -> str | None:
    """Why the trace at ``path`` stopped, if a driver stopped it (``StreamTrace.stop``)."""
    try:
        return Path(_stop_path(path)).read_text(encoding="utf-8").strip() or "(no reason)"
    except FileNotFoundError:
        return None


class _ModelTms:
    """The model's TMs after a trace's accepted commands, as ``refimpl`` names, places
    and stops them (``state.place``; ``machine.replace_tm``, ``failover``, ``restore``,
    ``end_job``): what a restarted driver needs to name the crashed job's TMs in the
    model, and its next TM. Only the commands that start, lose or stop a TM move it."""

    def __init__(self, config: Config, job: JobSpec) -> None:
        self.config = config
        self.vertices = job.vertices
        self.num_tms = job.num_tms
        self.next_tm = 1
        self.status: dict[str, str] = {}
        """Each model TM's status: alive, lost or stopped."""
        self.placement: dict[SubtaskId, str] = {}
        self.latest = 0
        """The latest completed checkpoint (a ``Complete``, or a ``Restore``'s)."""
        self._start(job.num_tms)

    @classmethod
    def of(cls, lines: Iterable[str]) -> _ModelTms:
        it = (line for line in lines if line.strip())
        try:
            head = json.loads(next(it))
            config = codec.decode(Config, head.get("config"), "$.config")
            job = codec.decode(JobSpec, head.get("job"), "$.job")
            model = cls(config, job)
            for text in it:
                line = json.loads(text)
                if line.get("outcome") != "refused":
                    model.apply(codec.decode_command(line.get("command"), "$.command"))
        except (StopIteration, ValueError, codec.CodecError, AttributeError) as err:
            raise NotResumable(f"the crashed driver's trace is unreadable: {err!r}") from None
        return model

    def alive(self, tm: str) -> bool:
        return self.status.get(tm) == "alive"

    def live_placed(self) -> list[str]:
        """The live TMs that run subtasks, by name."""
        return sorted(t for t in set(self.placement.values()) if self.alive(t))

    def lost(self) -> list[str]:
        """The lost TMs not yet known stopped, by name."""
        return sorted(t for t, st in self.status.items() if st == "lost")

    def _new(self) -> str:
        tm = f"tm-{self.next_tm}"
        self.next_tm += 1
        self.status[tm] = "alive"
        return tm

    def _start(self, num_tms: int) -> None:
        tms = [self._new() for _ in range(num_tms)]
        self.placement = {s: tms[i % num_tms] for i, s in enumerate(subtasks_of(self.vertices))}

    def apply(self, cmd: c.Command) -> None:
        match cmd:
            case c.Complete():
                self.latest = cmd.checkpoint
            case c.CrashTm() | c.ReplaceTm() if self.alive(cmd.tm):
                self.status[cmd.tm] = "lost"
                if isinstance(cmd, c.ReplaceTm):
                    new = self._new()
                    self.placement = {
                        s: new if t == cmd.tm else t for s, t in self.placement.items()
                    }
            case c.CrashDuringWrite():
                self.status[self.placement[cmd.subtask]] = "lost"
            case c.AttemptStopped():
                self.status[cmd.tm] = "stopped"
            case c.Failover() | c.RestartCoordinator():
                gone = sorted(t for t in set(self.placement.values()) if not self.alive(t))
                fresh = {t: self._new() for t in gone}
                self.placement = {s: fresh.get(t, t) for s, t in self.placement.items()}
            case c.Cancel():
                self._end()
            case c.Restore():
                self._end()
                par = dict(cmd.parallelism)
                self.vertices = tuple(
                    VertexSpec(v.name, par.get(v.name, v.parallelism)) for v in self.vertices
                )
                self.num_tms = cmd.num_tms or self.num_tms
                # R72, R73: only a CLAIM restore retains its checkpoint in the new job
                self.latest = cmd.checkpoint if cmd.mode is RestoreMode.CLAIM else 0
                self._start(self.num_tms)

    def _end(self) -> None:
        """R90: the job's live TMs stop; a lost one stays lost (a zombie of its job)."""
        for t in set(self.placement.values()):
            if self.alive(t):
                self.status[t] = "stopped"
