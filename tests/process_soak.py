"""The multi-process soak (issue 16): the coordinator in this process, every TM attempt a
spawned OS process (``tests.tm_cluster.ProcessEngine``), meeting only through encoded
``spec.messages`` over pipes, on a local directory (NONE, WITHIN, ACROSS) and on S3
(moto's server; NONE, WITHIN: R16 refuses ACROSS on an object store).

Each sequence is drawn from a seeded ``random.Random``: checkpoints written and
acknowledged subtask by subtask, completes, aborts, notices delivered late, out of
order, twice or never, TM processes killed with SIGKILL at a random point (during a
write: the process kills itself at its next append, after half the bytes; between a
write and its acknowledgement: killed from outside; while deleting: it kills itself at
its first or second delete while applying a notice), each followed by the engine's
notices that the TM is lost and stopped and a failover onto a new process (a new TM id),
failovers without a loss (the survivors reset), a rescale (a restore with another
parallelism, CLAIM or NO_CLAIM, onto new processes), and the coordinator killed: its
object is dropped without any cleanup (its deletes are synchronous, so nothing of it
runs on) and a new one is built from storage and the HA state the host persisted after
the last call (``fastimpl.resume``), between two calls or while its host carries out a
completion's ``Ready`` (the HA state persisted, the deletes not performed, the notices
not sent).
Besides: savepoints (triggered, written, completed or not; the user deletes a completed
one later, outside the store), ReuseShared (the old handle, a placeholder, or the bytes
uploaded again), zombies (a TM lost to the coordinator whose process runs on with its
tables, and writes and acknowledges late, R56, R43, until the
engine learns it stopped, R64), and storage faults through the parties' fault seam (a
TM's append, the coordinator's ``_metadata`` write, a TM's or the coordinator's delete:
the step declines, aborts or defers the delete, and ``RetryDeletes`` retries; the trace
holds ``FailNextCall`` only when the armed call was reached, since the model arms the
next call of the whole system).

After every step I1-I5 hold on the real files, with both parties' records merged and
no disagreement between them; at the end the sequence quiesces (every notice delivered,
pending checkpoints aborted, ``num_retained + 1`` checkpoints completed) and nothing
leaks (I6), or the job is cancelled and nothing of it is left. Every sequence's command
trace (``fastimpl.trace``, the spec's commands: a kill during a write is
``CrashDuringWrite``, another kill ``CrashTm``) is replayed through the model
(``model_tests.replay``): every outcome and refusal reason must agree, and the model must
stay safe. After each step the real files and their owners are compared with the
model's after the same command (``tests.file_compare``, which says what cannot be
compared: file names, drawn at random by each process).

``make test`` runs one sequence per setting. The soak mode runs many:
``CKPT_SOAK_SEQUENCES=200 CKPT_SOAK_STEPS=60 pytest tests/test_process_soak.py`` (per
setting; ``CKPT_SOAK_LOG=<file>`` appends each passed sequence's figures there as a
JSON line; ``CKPT_SOAK_SEED`` moves the seeds: sequence n of a setting uses the seed string
"<CKPT_SOAK_SEED + n>-<mode>-<where>"). A failure names the seed and prints the steps
taken; ``CKPT_SOAK_SEED=n CKPT_SOAK_SEQUENCES=1 pytest -k <mode>-<where>`` runs it again.
"""

from __future__ import annotations

import io
import os
import random
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.checkpoint_lifecycle import CompletionFailed
from fastimpl.coordinator import CheckpointCoordinator, subtasks_of
from fastimpl.ids import IdSource, RandomIds
from fastimpl.records import Completed, Status
from fastimpl.resume import HaState, ha_state, resume
from fastimpl.storage import Storage, StorageFault
from fastimpl.trace import CommandTrace
from model_tests.replay import replay
from spec import commands as c
from spec.commands import StorageOp
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.errors import CommandError, Reason
from spec.ids import SubtaskId, TmId
from spec.layout import is_under, job_base
from spec.messages import Acknowledgement, AttemptStopped, Decline, decode_message
from tests.file_compare import Summary, compare_with_model, summary
from tests.lockstep import S3_BUCKET, s3
from tests.tm_cluster import ProcessEngine, TmDied, checked

SEQUENCES = int(os.environ.get("CKPT_SOAK_SEQUENCES") or 1)
STEPS = int(os.environ.get("CKPT_SOAK_STEPS") or 24)
SEED = int(os.environ.get("CKPT_SOAK_SEED") or 0)
LOG = os.environ.get("CKPT_SOAK_LOG")
COMPARE_FILES = os.environ.get("CKPT_SOAK_FILES", "1") != "0"
"""``CKPT_SOAK_FILES=0`` leaves the file comparison out (to count what else a long soak
finds while a known difference of the files is open); ``make test`` always compares."""
JOB = "job-0"
VERTICES = (VertexSpec("map", 2), VertexSpec("sink", 1))
SETTINGS = [
    (MergingMode.NONE, "local"),
    (MergingMode.WITHIN_CHECKPOINT, "local"),
    (MergingMode.ACROSS_CHECKPOINT, "local"),
    (MergingMode.NONE, "s3"),
    (MergingMode.WITHIN_CHECKPOINT, "s3"),
]
TOTALS: Counter[str] = Counter()
"""What the soak did, over every sequence of the run (printed at the end of each)."""


class SoakFailure(AssertionError):
    pass


class Soak:
    """One seeded sequence against a coordinator and TM processes."""

    def __init__(
        self,
        seed: str,
        config: Config,
        fs: Any,
        root: str,
        target: Any,
        *,
        engine: ProcessEngine | None = None,
        ids: Callable[[], IdSource] = RandomIds,
    ) -> None:
        """``engine``: the TMs' engine (spawned processes unless given); ``ids``: the
        coordinator's id source, drawn anew for each coordinator."""
        self.rng = random.Random(seed)
        self.seed = seed
        self.cfg = config
        self.fs = fs
        self.root = root
        self.new_ids = ids
        self.engine = (
            engine
            if engine is not None
            else ProcessEngine(target, root if target is fs else "", config, immediate=False)
        )
        self.coord = self._new_coordinator()
        tms = [self.engine.start_tm(JOB, 1, None) for _ in range(2)]
        self.coord.deploy(self.engine.place(subtasks_of(VERTICES), tms))
        self.ha = ha_state(self.coord)
        """The HA state the host persisted after the last call (``post``)."""
        self.out = io.StringIO()
        self.trace = CommandTrace(self.out)
        self.trace.header(config, JobSpec(VERTICES, 2), "random")
        self.steps: list[str] = []
        self.counts: Counter[str] = Counter()
        self.rescales = 0
        self.restarts = 0
        self.dies_handing_out = False
        """The host dies in its next ``post``, once it persisted the HA state."""
        self.held: list[tuple[c.Command, BaseException | None]] | None = None
        """Outcomes waiting for the trace while a fault is armed (``fault``)."""
        self.zombies: set[TmId] = set()
        """Attempts lost to the coordinator whose processes still run (R64)."""
        self.user_deleted: set[str] = set()
        """Files of savepoints the user deleted (outside the store, so outside the trace)."""
        self.lines = 0
        """Commands in the trace so far."""
        self.snapshots: list[tuple[int, Summary]] = []
        """After each check, the real files and owners (``tests.file_compare``)."""

    def _new_coordinator(self) -> CheckpointCoordinator:
        storage = Storage(self.fs, self.root, background_deletes=False)
        return CheckpointCoordinator(
            self.cfg, VERTICES, 2, storage, self.new_ids(), self.engine, JOB, deletion_log=True
        )

    # ------------------------------------------------------------------ recording

    def record(self, cmd: c.Command, error: BaseException | None) -> None:
        if self.held is not None:
            self.held.append((cmd, error))
        else:
            self.emit(cmd, error)

    def emit(self, cmd: c.Command, error: BaseException | None) -> None:
        self.trace.record(cmd, error, 0, None)
        self.lines += 1

    def run(self, cmd: c.Command, action: Callable[[], Any]) -> Any:
        """Do ``action`` as ``cmd``: its outcome goes to the trace (a ``CommandError``
        is a refusal, as the in-process engine records it)."""
        self.steps.append(repr(cmd))
        try:
            result = action()
        except CommandError as err:
            self.record(cmd, err)
            self.steps[-1] += f"  # refused: {err.reason.value}"
            return None
        except CompletionFailed:
            result = None  # R51: it aborted instead, as the model's Complete does
        finally:
            self.post()
        self.record(cmd, None)
        return result

    def post(self) -> None:
        """What a host does after each call, in the order its ``Ready`` asks: the HA
        state persisted (``ha``: what a restart resumes from), the deletes performed, the
        notices to the engine (nothing while a restart has no coordinator yet)."""
        if self.coord is not None:
            ready = self.coord.ready()
            self.ha = ha_state(self.coord)
            if self.dies_handing_out:  # the process dies here (``die_completing``)
                return
            self.coord.storage.perform(ready.deletes)
            self.engine.post(ready)

    def refused(self, cmd: c.Command, reason: str) -> None:
        self.steps.append(f"{cmd!r}  # refused by the TM: {reason}")
        self.record(cmd, CommandError(Reason(reason), reason))

    def faulted(self, cmd: c.Command, reply: tuple[Any, ...]) -> None:
        """The TM's storage call failed: it declined (R17); the command's outcome is the
        fault, as the in-process engine records it."""
        msg = decode_message(reply[1])
        assert isinstance(msg, Decline), self.failure(f"a fault answered {msg}")
        self.steps.append(f"{cmd!r}  # storage fault: {reply[2]}")
        self.coord.receive_decline(msg)
        self.post()
        self.record(cmd, StorageFault(StorageOp(reply[2]), "<tm>"))

    def check(self, *, quiet: bool = False) -> None:
        found, obs = checked(self.coord, self.engine, quiet=quiet)
        if found:
            raise SoakFailure(self.failure(f"invariants broken: {found}"))
        if self.held is None:
            real = summary(obs, hide_open=False, skip=self.user_deleted)
            self.snapshots.append((self.lines, real))

    def failure(self, what: str) -> str:
        steps = "\n".join(f"    {s}" for s in self.steps)
        return f"seed {self.seed!r}: {what}\nsteps:\n{steps}"

    # ------------------------------------------------------------------ the TM side

    def host(self, s: SubtaskId) -> TmId:
        return self.coord.placement[s]

    def is_savepoint(self, cid: int) -> bool:
        """The checkpoint's type, as the engine passes it with the barrier."""
        return cid in self.coord.savepoint_ids

    def write(
        self,
        cid: int,
        s: SubtaskId,
        *,
        die: bool = False,
        savepoint: bool = False,
        attempt: TmId | None = None,
    ) -> str:
        """A write of one state handle by the subtask's TM (or by the lost ``attempt``);
        "died" if it was killed."""
        savepoint = savepoint or self.is_savepoint(cid)
        kind = self.rng.choice([StateKind.KEYED_SHARED, StateKind.OPERATOR_LIST])
        name = self.rng.choice(["a", "b"]) if kind is StateKind.KEYED_SHARED else "ops"
        size = self.rng.randint(2, 1500)
        data = bytes([self.rng.randrange(256)]) * size
        tm = self.host(s) if attempt is None else attempt
        sub = (s.vertex, s.index, s.parallelism)
        if die:
            self.engine.call(tm, ("die", 1, "append"))
        try:
            reply = self.engine.call(tm, ("write", sub, cid, kind.value, name, data, savepoint))
        except TmDied:
            crash = c.CrashDuringWrite(cid, s, kind, name, size, size // 2)
            self.run(crash, lambda: self.coord.lose(tm))
            self.counts["tm kills during a write"] += 1
            self.stopped(tm)
            return "died"
        if die:
            self.engine.call(tm, ("die", None))
        cmd = c.WriteState(cid, s, kind, name, size, 1, attempt)
        if reply[0] == "refused":
            self.refused(cmd, reply[1])
            return "refused"
        if reply[0] == "decline":
            self.faulted(cmd, reply)
            return "declined"
        assert reply == ("ok",), self.failure(f"write answered {reply}")
        self.run(cmd, lambda: None)
        return "ok"

    def ack(
        self, cid: int, s: SubtaskId, *, savepoint: bool = False, attempt: TmId | None = None
    ) -> None:
        tm = self.host(s) if attempt is None else attempt
        sub = (s.vertex, s.index, s.parallelism)
        reply = self.engine.call(tm, ("ack", sub, cid, savepoint or self.is_savepoint(cid)))
        cmd = c.Acknowledge(cid, s, attempt)
        if reply[0] == "refused":
            self.refused(cmd, reply[1])
            return
        if reply[0] == "decline":
            self.faulted(cmd, reply)
            return
        msg = decode_message(reply[1])
        assert isinstance(msg, Acknowledgement), self.failure(f"ack answered {msg}")
        self.run(cmd, lambda: self.coord.receive_ack(msg))

    def stopped(self, tm: TmId) -> None:
        """The engine saw the process die: the attempt is known stopped (R64), and the
        job fails over onto a new process."""
        stop = AttemptStopped(self.coord.job, tm)
        self.run(c.AttemptStopped(tm), lambda: self.coord.receive_stopped(stop))
        self.check()
        self.run(c.Failover(), self.coord.failover)
        self.counts["failovers"] += 1

    # ------------------------------------------------------------------ steps

    def pending(self) -> list[int]:
        return sorted(self.coord.pending)

    def step(self) -> None:
        co = self.coord
        actions: list[tuple[int, Callable[[], None]]] = [
            (10, self.round),
            (3, self.trigger),
            (6, self.write_some),
            (4, self.ack_some),
            (3, self.complete_some),
            (1, self.abort_some),
            (10, self.notice),
            (1, self.kill_between),
            (1, self.kill_in_write),
            (1, self.kill_deleting),
            (1, self.failover),
            (2, self.savepoint_round),
            (1, self.delete_savepoint),
            (2, self.reuse_some),
            (1, self.zombie),
            (2, self.fault),
            (1, self.retry_deletes),
        ]
        if self.zombies:
            actions += [(3, self.zombie_acts), (1, self.zombie_stops)]
        if co.retained and self.rescales < 1:
            actions.append((2, self.rescale))
        if self.can_restart():
            actions += [(2, self.restart), (1, self.die_completing)]
        weights = [w for w, _ in actions]
        self.rng.choices([a for _, a in actions], weights)[0]()

    def round(self, savepoint: bool = False) -> None:
        """A checkpoint (or savepoint, one write per subtask) from trigger to complete,
        each part skipped now and then (the rest is left to later steps)."""
        cid = self.run(c.Trigger(savepoint), lambda: self.coord.trigger(savepoint))
        for s in sorted(self.coord.placement, key=str):
            for _ in range(1 if savepoint else self.rng.randint(1, 2)):
                if self.write(cid, s) != "ok":
                    return
            if self.rng.random() < 0.9:
                self.ack(cid, s)
        if cid in self.coord.pending and self.rng.random() < 0.85:
            done = self.run(c.Complete(cid), lambda: self.coord.complete(cid))
            if done is not None:
                kind = "savepoints" if savepoint else "checkpoints"
                self.counts[f"{kind} completed"] += 1

    def trigger(self) -> None:
        if len(self.coord.pending) < 3:
            self.run(c.Trigger(False), self.coord.trigger)

    def write_some(self) -> None:
        if self.pending():
            cid = self.rng.choice(self.pending())
            self.write(cid, self.rng.choice(sorted(self.coord.placement, key=str)))

    def ack_some(self) -> None:
        if self.pending():
            cid = self.rng.choice(self.pending())
            for s in sorted(self.coord.placement, key=str):
                if s not in self.coord.pending[cid].acks and self.rng.random() < 0.7:
                    self.ack(cid, s)
                    if cid not in self.coord.pending:
                        return

    def complete_some(self) -> None:
        if self.pending():
            cid = self.rng.choice(self.pending())
            self.run(c.Complete(cid), lambda: self.coord.complete(cid))

    def abort(self, cid: int) -> None:
        self.run(c.Abort(cid), lambda: self.coord.abort(cid))

    def complete(self, cid: int) -> object:
        return self.run(c.Complete(cid), lambda: self.coord.complete(cid))

    def abort_some(self) -> None:
        if self.pending():
            cid = self.rng.choice(self.pending())
            self.run(c.Abort(cid), lambda: self.coord.abort(cid))

    def notice(self) -> None:
        for _ in range(self.rng.randint(1, 4)):
            self.one_notice()

    def one_notice(self) -> None:
        box = self.engine.outbox
        if not box:
            return
        i = self.rng.randrange(len(box))
        how = self.rng.choices(["deliver", "drop", "duplicate"], [10, 1, 1])[0]
        if how == "deliver":
            self.run(c.DeliverNotification(i), lambda: self.engine.deliver(i))
        elif how == "drop":
            self.run(c.DropNotification(i), lambda: self.engine.drop(i))
        else:
            self.run(c.DuplicateNotification(i), lambda: self.engine.duplicate(i))
        self.counts[f"notices {how}"] += 1

    def victim(self) -> TmId:
        return self.rng.choice(self.coord.current_tms())

    def kill_between(self) -> None:
        """Killed from outside, between two calls (after a write, before its ack)."""
        tm = self.victim()
        mine = [s for s, t in self.coord.placement.items() if t == tm]
        if self.pending() and self.rng.random() < 0.8:
            self.write(self.pending()[-1], self.rng.choice(sorted(mine, key=str)))
        self.engine.kill(tm)
        self.run(c.CrashTm(tm), lambda: self.coord.lose(tm))
        self.counts["tm kills between calls"] += 1
        self.stopped(tm)

    def kill_in_write(self) -> None:
        if not self.pending():
            self.run(c.Trigger(False), self.coord.trigger)
        tm = self.victim()
        s = self.rng.choice(
            sorted((s for s, t in self.coord.placement.items() if t == tm), key=str)
        )
        self.write(self.pending()[-1], s, die=True)

    def kill_deleting(self) -> None:
        """The TM kills itself at its first or second delete while applying a notice;
        if the notice deletes nothing it lives on."""
        box = self.engine.outbox
        live = set(self.coord.current_tms())
        mine = [i for i, (t, _) in enumerate(box) if t in live]
        if not mine:
            return
        i = self.rng.choice(mine)
        tm = box[i][0]
        self.engine.call(tm, ("die", self.rng.randint(1, 2), "delete"))
        try:
            self.engine.call(tm, ("notice", box[i][1]))
        except TmDied:
            del box[i]  # it reached the process, which died applying it
            self.run(c.CrashTm(tm), lambda: self.coord.lose(tm))
            self.counts["tm kills while deleting"] += 1
            self.stopped(tm)
            return
        self.engine.call(tm, ("die", None))
        del box[i]
        self.run(c.DeliverNotification(i), lambda: None)

    def failover(self) -> None:
        self.run(c.Failover(), self.coord.failover)
        self.counts["failovers"] += 1

    def rescale(self) -> None:
        cid = self.coord.retained[-1].id
        par = self.rng.choice([1, 3, 2])
        mode = self.rng.choice([RestoreMode.CLAIM, RestoreMode.NO_CLAIM])
        cmd = c.Restore(cid, (("map", par),), mode)
        self.run(cmd, lambda: self.coord.restore(cmd))
        self.rescales += 1
        self.counts["rescales"] += 1

    def can_restart(self) -> bool:
        """R95: a restart waits until no lost attempt may run (none here is a zombie)."""
        if self.restarts >= 2 or self.zombies:
            return False
        return all(self.coord.tms[t].status is Status.ALIVE for t in self.coord.placement.values())

    def die_completing(self) -> None:
        """The coordinator's process dies while its host carries out a completion's
        ``Ready``: the HA state persisted (naming the new checkpoint), the deletes of
        what the completion subsumed not performed, its notices never sent. The new
        coordinator finds those files as the dead one's garbage and deletes them (R95):
        nothing is lost, nothing leaks (the comparison with the model after the
        restart)."""
        if not self.pending():
            return
        cid = self.rng.choice(self.pending())
        self.dies_handing_out = True
        try:
            self.run(c.Complete(cid), lambda: self.coord.complete(cid))
        finally:
            self.dies_handing_out = False
        self.counts["deaths while handing out"] += 1
        self.restart()

    def restart(self, edit_ha: Callable[[HaState], HaState] | None = None) -> None:
        """The coordinator's process dies between two calls: the object is dropped as
        it is, and a new one resumes from storage and the HA state (``edit_ha``: what
        HA services that lost or changed part of it hand over instead)."""
        ha = self.ha
        assert ha == ha_state(self.coord), "the host persists the HA state after every call"
        if edit_ha is not None:
            ha = edit_ha(ha)
        placement = dict(self.coord.placement)
        vertices = self.coord.vertices  # the job graph: the engine's
        if any(self.coord.tms[t].status is not Status.ALIVE for t in placement.values()):
            return
        self.coord = None  # type: ignore[assignment]  # nothing of it survives
        storage = Storage(self.fs, self.root, background_deletes=False)

        def resumed() -> None:
            self.coord = resume(
                self.cfg,
                vertices,
                storage,
                self.new_ids(),
                self.engine,
                ha,
                placement,
                deletion_log=True,
            )

        self.run(c.RestartCoordinator(), resumed)
        self.restarts += 1
        self.counts["coordinator kills"] += 1

    # ------------------------------------------------------------------ savepoints, reuse

    def savepoint_round(self) -> None:
        self.round(savepoint=True)

    def delete_savepoint(self) -> None:
        """The user deletes a completed savepoint (theirs, R55): outside the store, so
        outside the trace; the store never touches it again."""
        done = self.coord.stored_savepoints()
        if not done:
            return
        sp = self.rng.choice(done)
        top = f"savepoints/savepoint-{sp}"
        files = {p for p in self.coord.storage.list_files() if is_under(p, top)}
        self.fs.rm(f"{self.root}/{top}", recursive=True)
        self.user_deleted |= files | {top}
        for path in files:  # the user tells the store's engine, which drops its records
            self.coord.catalog.files.pop(path, None)
        self.ha = ha_state(self.coord)  # and persists the HA state again
        self.steps.append(f"# the user deletes {top}")
        self.counts["savepoints deleted by the user"] += 1

    def reuse(self, cid: int, s: SubtaskId, attempt: TmId | None = None) -> None:
        tm = self.host(s) if attempt is None else attempt
        name = self.rng.choice(["a", "b"])
        sub = (s.vertex, s.index, s.parallelism)
        reply = self.engine.call(tm, ("reuse", sub, cid, name, self.is_savepoint(cid)))
        cmd = c.ReuseShared(cid, s, name, attempt)
        if reply[0] == "refused":
            self.refused(cmd, reply[1])
        elif reply[0] == "decline":
            self.faulted(cmd, reply)
        else:
            self.run(cmd, lambda: None)
            self.counts["reuses"] += 1

    def reuse_some(self) -> None:
        """ReuseShared: the subtask refers to keyed state it uploaded for an earlier
        checkpoint (R20-R23: the old handle, a placeholder, or the bytes again)."""
        if self.pending():
            cid = self.rng.choice(self.pending())
            self.reuse(cid, self.rng.choice(sorted(self.coord.placement, key=str)))

    # ------------------------------------------------------------------ zombies

    def zombie(self) -> None:
        """A TM is lost to the coordinator, but its process runs on (R64): the job fails
        over onto a new attempt while the old one may still write and acknowledge."""
        tm = self.victim()
        self.run(c.CrashTm(tm), lambda: self.coord.lose(tm))
        self.zombies.add(tm)
        self.counts["zombies"] += 1
        self.run(c.Failover(), self.coord.failover)
        self.counts["failovers"] += 1

    def zombie_acts(self) -> None:
        """The zombie writes and acknowledges late, for a checkpoint it may know of: its
        files stay its own, its acknowledgement is ignored (R56, R43)."""
        tm = self.rng.choice(sorted(self.zombies))
        hosted = sorted(self.coord.tms[tm].hosted, key=str)
        if not hosted:
            return
        s = self.rng.choice(hosted)
        last = self.coord.next_checkpoint - 1
        if last < 1:
            return
        cid = self.rng.randint(max(1, last - 2), last)
        if self.rng.random() < 0.6:
            if self.write(cid, s, attempt=tm) == "ok":
                self.counts["zombie writes"] += 1
        else:
            before = len(self.steps)
            self.ack(cid, s, attempt=tm)
            if "refused" not in self.steps[before] and "fault" not in self.steps[before]:
                self.counts["zombie acks"] += 1

    def zombie_stops(self) -> None:
        """The engine learns the zombie stopped (its lease expired, R64): its process is
        gone, and the coordinator takes what it left."""
        tm = self.rng.choice(sorted(self.zombies))
        self.engine.kill(tm)
        self.zombies.discard(tm)
        stop = AttemptStopped(self.coord.job, tm)
        self.run(c.AttemptStopped(tm), lambda: self.coord.receive_stopped(stop))

    # ------------------------------------------------------------------ storage faults

    def fault(self) -> None:
        """One storage call fails during a step (the storage's fault seam, armed in the
        party that makes the call): a TM's append (the write declines, R17), the
        coordinator's ``_metadata`` write (the checkpoint aborts, R51), a TM's or the
        coordinator's delete (retried later, R45). The trace holds ``FailNextCall`` only
        if the armed call was reached (the model arms one call of the whole system: it
        must be this one); otherwise nothing failed and the step stands alone."""
        kind = self.rng.choice(["append", "metadata", "delete-tm", "delete-coordinator"])
        box = self.engine.outbox
        live = set(self.coord.current_tms())
        acked = [
            k
            for k, p in self.coord.pending.items()
            if all(s in p.acks for s in self.coord.placement)
        ]
        op: StorageOp
        self.held = []
        if kind == "append" and self.pending():
            op = StorageOp.APPEND
            cid = self.rng.choice(self.pending())
            s = self.rng.choice(sorted(self.coord.placement, key=str))
            self.engine.call(self.host(s), ("arm", op.value))
            self.write(cid, s)
            reached = op.value not in self.engine.call(self.host(s), ("disarm",))[1]
        elif kind == "metadata" and acked:
            op = StorageOp.METADATA
            self.coord.storage.arm(op)
            cid = acked[0]
            self.complete(cid)
            reached = op not in self.coord.storage.armed
            self.coord.storage.armed.clear()
        elif kind == "delete-coordinator" and acked and self.coord.retained:
            op = StorageOp.DELETE
            self.coord.storage.arm(op)
            self.complete(acked[0])
            reached = op not in self.coord.storage.armed
            self.coord.storage.armed.clear()
        elif kind == "delete-tm" and any(t in live for t, _ in box):
            op = StorageOp.DELETE
            i = self.rng.choice([i for i, (t, _) in enumerate(box) if t in live])
            tm = box[i][0]
            self.engine.call(tm, ("arm", op.value))
            self.run(c.DeliverNotification(i), lambda: self.engine.deliver(i))
            reached = op.value not in self.engine.call(tm, ("disarm",))[1]
        else:
            self.held = None
            return
        held, self.held = self.held, None
        if reached:
            self.steps.insert(len(self.steps) - len(held), f"{c.FailNextCall(op)!r}")
            self.emit(c.FailNextCall(op), None)
            self.counts[f"faults {op.value}"] += 1
        for cmd, error in held:
            self.emit(cmd, error)

    def retry_deletes(self) -> None:
        """R45: every party retries the deletes that failed."""

        def retry() -> None:
            self.coord.catalog.retry_deletes()
            for tm in self.engine.live():
                self.engine.call(tm, ("retry",))

        self.run(c.RetryDeletes(), retry)

    # ------------------------------------------------------------------ scripted steps

    def run_trigger(self, *, savepoint: bool = False) -> int:
        cid = self.run(c.Trigger(savepoint), lambda: self.coord.trigger(savepoint))
        assert isinstance(cid, int), self.failure("the trigger was refused")
        return cid

    def full_checkpoint(self, *, savepoint: bool = False) -> Completed:
        """A checkpoint (or savepoint) every subtask writes and acknowledges, completed,
        its notices delivered."""
        cid = self.run_trigger(savepoint=savepoint)
        for s in sorted(self.coord.placement, key=str):
            assert self.write(cid, s, savepoint=savepoint) == "ok", self.failure("refused")
            self.ack(cid, s, savepoint=savepoint)
        done = self.complete(cid)
        assert isinstance(done, Completed), self.failure(f"{cid} did not complete")
        self.drain_notices()
        return done

    def restore(self, cid: int, mode: RestoreMode, par: int | None = None) -> None:
        cmd = c.Restore(cid, () if par is None else (("map", par),), mode)
        self.run(cmd, lambda: self.coord.restore(cmd))

    # ------------------------------------------------------------------ the end

    def drain_notices(self) -> None:
        while self.engine.outbox:
            self.run(c.DeliverNotification(0), lambda: self.engine.deliver(0))

    def quiesce(self) -> None:
        """Quiet (SPEC.md section 11): notices delivered, pending aborted, then
        ``num_retained + 1`` checkpoints complete."""
        self.drain_notices()
        self.retry_deletes()
        for pending in self.pending():
            self.abort(pending)
        self.drain_notices()
        for _ in range(self.cfg.num_retained + 1):
            cid = self.run(c.Trigger(False), self.coord.trigger)
            for s in sorted(self.coord.placement, key=str):
                assert self.write(cid, s) == "ok", self.failure("a quiet write was refused")
                self.ack(cid, s)
            done = self.complete(cid)
            assert done is not None, self.failure(f"checkpoint {cid} did not complete")
            self.drain_notices()

    def finish(self) -> None:
        while self.zombies:
            self.zombie_stops()
        if self.rng.random() < 0.25:
            retain = self.rng.random() < 0.5
            self.drain_notices()
            self.run(c.Cancel(retain), lambda: self.coord.end_job(retain=retain))
            self.retry_deletes()  # quiet: every failed delete retried (SPEC.md section 11)
            self.counts["cancels"] += 1
        else:
            self.quiesce()
        self.check(quiet=True)
        if not self.coord.running and not self.coord.retained:
            base = job_base(self.coord.job)
            left = [p for p in Storage(self.fs, self.root).list_files() if is_under(p, base)]
            if left:
                raise SoakFailure(self.failure(f"a cancelled job left {sorted(left)}"))
        lines = self.out.getvalue().splitlines()
        report = replay(lines)
        if not report.agrees or report.stopped is not None:
            raise SoakFailure(self.failure(f"the model disagrees: {report.summary()}"))
        self.counts["commands replayed"] += report.commands
        if not COMPARE_FILES:
            return
        compared, diff = compare_with_model(lines, self.snapshots, self.user_deleted)
        if diff is not None:
            raise SoakFailure(self.failure(f"the model's files differ: {diff}"))
        self.counts["file comparisons"] += compared


def make_setting(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Config, Any, str, Any]:
    config = Config(
        file_merging_enabled=mode is not MergingMode.NONE,
        across_checkpoint_boundary=mode is MergingMode.ACROSS_CHECKPOINT,
        max_file_size=4096,
        num_retained=1,
    )
    if where == "s3":
        fs = s3(request.getfixturevalue("s3_endpoint"))
        root = f"{S3_BUCKET}/{uuid.uuid4().hex}"
        return attrs.evolve(config, open_files_readable=False), fs, root, fs
    path = tmp_path / uuid.uuid4().hex
    path.mkdir()
    target = f"file://{path}"
    fs, root = fsspec.core.url_to_fs(target)
    return config, fs, root, target
