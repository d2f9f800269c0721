"""The reference model's random state machine: every command of the vocabulary drawn from
what the current state makes meaningful, all safety invariants checked after every step (by
``Harness.run``), and a teardown that brings the system to a quiet state where "no leak" must
hold too. The model's own test runs it alone (``tests/test_refimpl_machine.py``); live mode
(``conformance.live``) and the lockstep machine (``tests/lockstep.py``) subclass it to send
the same commands to an implementation as well.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conformance.harness import DEFAULT_JOB, Harness
from refimpl import ModelState, step
from refimpl.state import TmStatus
from spec import commands as c
from spec.commands import StorageOp
from spec.config import Config, MergingMode, RestoreMode, StateKind
from spec.errors import Reason
from spec.ids import SubtaskId

SHARED_NAMES = ("sst-1", "sst-2", "sst-3")
INLINE_BELOW = (0, 30, 80)
"""``SnapshotWorking.inline_below``: nothing merged, the small files, most files."""
EXCLUSIVE = (
    (StateKind.OPERATOR_LIST, "offsets"),
    (StateKind.OPERATOR_UNION, "watermarks"),
    (StateKind.CHANNEL, "inflight"),
    (StateKind.KEYED_FULL, "heap"),
)


class RefimplMachine(RuleBasedStateMachine):
    mode: MergingMode = MergingMode.NONE

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(Config())
        self.refusals: dict[Reason, int] = {}

    @initialize(
        num_retained=st.integers(1, 3),
        max_file_size=st.sampled_from([120, 400, 4096]),
        amplification=st.sampled_from([0.5, 1.5, 2.0]),
        inline_threshold=st.sampled_from([0, 0, 60]),
    )
    def setup(
        self, num_retained: int, max_file_size: int, amplification: float, inline_threshold: int
    ) -> None:
        cfg = Config.for_mode(
            self.mode,
            num_retained=num_retained,
            max_file_size=max_file_size,
            max_space_amplification=amplification,
            max_parallelism=8,
            inline_threshold=inline_threshold,  # R107 in every mode, beside files
        )
        self.h = self.make_harness(cfg)

    def make_harness(self, cfg: Config) -> Harness:
        """The driver for one sequence; the lockstep machine adds a real implementation."""
        return Harness(cfg, DEFAULT_JOB)

    # ------------------------------------------------------------------ helpers

    def do(self, cmd: c.Command) -> None:
        err = self.h.try_run(cmd)
        if err is not None:
            self.refusals[err.reason] = self.refusals.get(err.reason, 0) + 1
            event(f"refused {type(cmd).__name__}: {err.reason.value}")
        else:
            event(f"ran {type(cmd).__name__}")

    @property
    def s(self) -> ModelState:
        return self.h.state

    def open_checkpoints(self) -> list[int]:
        return sorted(self.s.pending)

    def rarely(self, data: st.DataObject, one_in: int) -> bool:
        """Disruptive commands run one time in ``one_in``; otherwise the step does
        productive checkpoint work, so that sequences reach deep states."""
        if data.draw(st.integers(0, one_in - 1), label="disrupt") == 0:
            return True
        self.checkpoint_work(data)
        return False

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data())
    def checkpoint_work(self, data: st.DataObject) -> None:
        """A macro step: start or continue a checkpoint; every subtask writes or reuses
        some state and usually acknowledges; the checkpoint usually completes."""
        if not self.s.pending or data.draw(st.integers(0, 3)) == 0:
            self.do(c.Trigger(savepoint=data.draw(st.integers(0, 9)) == 0))
        if not self.s.pending:
            return
        cp = data.draw(st.sampled_from(self.open_checkpoints()))
        for sub in self.h.subtasks:
            tm = self.s.placement[sub]
            if (tm, sub, cp) in self.s.acked:
                continue
            names = [k[2] for k in self.s.backend if k[0] == tm and k[1] == sub]
            if names:
                if data.draw(st.booleans()):
                    self.do(c.ReuseShared(cp, sub, data.draw(st.sampled_from(sorted(names)))))
            if data.draw(st.integers(0, 3)) > 0:
                name = data.draw(st.sampled_from(SHARED_NAMES))
                self.do(
                    c.WriteState(
                        cp, sub, StateKind.KEYED_SHARED, name, data.draw(st.integers(0, 150))
                    )
                )
            kind, name = data.draw(st.sampled_from(EXCLUSIVE))
            self.do(
                c.WriteState(
                    cp, sub, kind, name, data.draw(st.integers(0, 80)), data.draw(st.integers(0, 4))
                )
            )
            # working state (§11): the live database writes, and the snapshot refers to
            # its files in place or merges the small ones
            if data.draw(st.integers(0, 2)) == 0:
                self.do(c.WriteWorking(sub, data.draw(st.integers(1, 120))))
            if self.s.dbs.get((tm, sub)) and data.draw(st.booleans()):
                self.do(c.SnapshotWorking(cp, sub, data.draw(st.sampled_from(INLINE_BELOW))))
            if data.draw(st.integers(0, 7)) > 0:
                self.do(c.Acknowledge(cp, sub))
        if cp in self.s.pending and data.draw(st.integers(0, 4)) > 0:
            self.do(c.Complete(cp))
        if data.draw(st.booleans()):
            while self.s.channel and data.draw(st.integers(0, 5)) > 0:
                self.do(c.DeliverNotification(data.draw(st.integers(0, len(self.s.channel) - 1))))

    # ------------------------------------------------------------------ coordinator

    @precondition(lambda self: self.h.state.running and len(self.h.state.pending) < 3)
    @rule(savepoint=st.sampled_from([False, False, False, False, True]))
    def trigger(self, savepoint: bool) -> None:
        self.do(c.Trigger(savepoint=savepoint and len(self.s.savepoints) < 2))

    @precondition(lambda self: bool(self.h.state.pending))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        ready = [cp for cp, p in self.s.pending.items() if set(p.acks) >= set(self.s.placement)]
        if ready:
            self.do(c.Complete(data.draw(st.sampled_from(sorted(ready)))))
        else:
            self.do(c.Complete(data.draw(st.sampled_from(self.open_checkpoints()))))

    @precondition(lambda self: bool(self.h.state.pending))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        if not self.rarely(data, 3):
            return
        self.do(c.Abort(data.draw(st.sampled_from(self.open_checkpoints()))))

    # ------------------------------------------------------------------ subtasks

    def _checkpoint(self, data: st.DataObject) -> int:
        recent = list(range(max(1, self.s.next_checkpoint - 3), self.s.next_checkpoint))
        return data.draw(st.sampled_from(self.open_checkpoints() or recent or [1]))

    @precondition(lambda self: self.h.state.running and self.h.state.next_checkpoint > 1)
    @rule(data=st.data(), size=st.integers(0, 300), entries=st.integers(0, 4))
    def write(self, data: st.DataObject, size: int, entries: int) -> None:
        cp = self._checkpoint(data)
        sub = data.draw(st.sampled_from(self.h.subtasks))
        if data.draw(st.booleans()):
            kind, name = StateKind.KEYED_SHARED, data.draw(st.sampled_from(SHARED_NAMES))
        else:
            kind, name = data.draw(st.sampled_from(EXCLUSIVE))
        self.do(c.WriteState(cp, sub, kind, name, size, entries))

    @precondition(lambda self: self.h.state.running and bool(self.h.state.backend))
    @rule(data=st.data())
    def reuse(self, data: st.DataObject) -> None:
        tm, sub, name = data.draw(st.sampled_from(sorted(self.s.backend, key=str)))
        cp = self._checkpoint(data)
        attempt = tm if self.s.tms[tm].status is TmStatus.LOST else None
        self.do(c.ReuseShared(cp, sub, name, attempt))

    @precondition(lambda self: self.h.state.running and self.h.state.next_checkpoint > 1)
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        cp = self._checkpoint(data)
        waiting = [s for s in self.h.subtasks if (self.s.placement[s], s, cp) not in self.s.acked]
        sub = data.draw(st.sampled_from(waiting or self.h.subtasks))
        self.do(c.Acknowledge(cp, sub))

    @precondition(lambda self: bool(self.h.state.pending))
    @rule(data=st.data())
    def decline(self, data: st.DataObject) -> None:
        if not self.rarely(data, 4):
            return
        self.do(c.Decline(self._checkpoint(data), data.draw(st.sampled_from(self.h.subtasks))))

    @precondition(lambda self: self.h.state.running and bool(self.h.state.pending))
    @rule(data=st.data(), size=st.integers(2, 200))
    def crash_during_write(self, data: st.DataObject, size: int) -> None:
        if not self.rarely(data, 6):
            return
        written = data.draw(st.integers(1, size - 1))
        kind, name = data.draw(st.sampled_from([(StateKind.KEYED_SHARED, "sst-1"), *EXCLUSIVE]))
        sub = data.draw(st.sampled_from(self.h.subtasks))
        self.do(c.CrashDuringWrite(self._checkpoint(data), sub, kind, name, size, written))

    # ------------------------------------------------------------------ working state (§11)

    def _attempt_for(self, tm: str, sub: SubtaskId) -> str | None:
        """``attempt`` of a database command from ``tm``: none for the subtask's host."""
        return None if self.s.placement.get(sub) == tm else tm

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data(), size=st.integers(0, 150))
    def write_working(self, data: st.DataObject, size: int) -> None:
        sub = data.draw(st.sampled_from(self.h.subtasks))
        self.do(c.WriteWorking(sub, size))

    @precondition(lambda self: self.h.state.running and bool(self.h.state.dbs))
    @rule(data=st.data())
    def drop_working(self, data: st.DataObject) -> None:
        used = sorted((t, sub, p) for (t, sub), uses in self.s.dbs.items() for p in uses)
        if not used:
            return
        tm, sub, path = data.draw(st.sampled_from(used))
        self.do(c.DropWorking(sub, path, self._attempt_for(tm, sub)))

    @precondition(lambda self: self.h.state.running and self.h.state.next_checkpoint > 1)
    @rule(data=st.data(), inline_below=st.sampled_from(INLINE_BELOW))
    def snapshot_working(self, data: st.DataObject, inline_below: int) -> None:
        cp = self._checkpoint(data)
        sub = data.draw(st.sampled_from(self.h.subtasks))
        self.do(c.SnapshotWorking(cp, sub, inline_below))

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data())
    def collect_working(self, data: st.DataObject) -> None:
        if not self.rarely(data, 2):
            return
        self.do(c.CollectWorking())

    # ------------------------------------------------------------------ notifications

    @precondition(lambda self: bool(self.h.state.channel))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        self.do(c.DeliverNotification(data.draw(st.integers(0, len(self.s.channel) - 1))))

    @precondition(lambda self: bool(self.h.state.channel))
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        self.do(c.DropNotification(data.draw(st.integers(0, len(self.s.channel) - 1))))

    @precondition(lambda self: 0 < len(self.h.state.channel) < 12)
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        self.do(c.DuplicateNotification(data.draw(st.integers(0, len(self.s.channel) - 1))))

    # ------------------------------------------------------------------ failures

    @precondition(lambda self: self.h.state.running and len(self.h.live_tms()) > 0)
    @rule(data=st.data())
    def crash_tm(self, data: st.DataObject) -> None:
        if not self.rarely(data, 5):
            return
        self.do(c.CrashTm(data.draw(st.sampled_from(self.h.live_tms()))))

    @precondition(lambda self: self.h.state.running and len(self.h.live_tms()) > 0)
    @rule(data=st.data())
    def replace_tm(self, data: st.DataObject) -> None:
        """R66: a task-level failover, most often within a pending checkpoint that the
        replaced TM has already acknowledged (a Spark task retried after a kill, or a
        speculative copy accepted); the new attempt usually writes and acknowledges."""
        if not self.rarely(data, 4):
            return
        tm = data.draw(st.sampled_from(self.h.live_tms()))
        self.do(c.ReplaceTm(tm))
        if bool(self.s.pending) and data.draw(st.booleans()):
            self.checkpoint_work(data)

    @precondition(lambda self: any(self.h.state.tms[t].hosted for t in self.h.lost_tms()))
    @rule(data=st.data(), size=st.integers(1, 200), ack=st.booleans())
    def zombie_acts(self, data: st.DataObject, size: int, ack: bool) -> None:
        tm = data.draw(st.sampled_from([t for t in self.h.lost_tms() if self.s.tms[t].hosted]))
        sub = data.draw(st.sampled_from(sorted(self.s.tms[tm].hosted)))
        cp = self._checkpoint(data)
        working = data.draw(st.integers(0, 3), label="working")
        if working == 1:  # R106: a zombie's database goes on writing and snapshotting
            self.do(c.WriteWorking(sub, size, attempt=tm))
        elif working == 2:
            self.do(c.SnapshotWorking(cp, sub, data.draw(st.sampled_from(INLINE_BELOW)), tm))
        if ack:
            self.do(c.Acknowledge(cp, sub, attempt=tm))
        else:
            kind, name = data.draw(st.sampled_from([(StateKind.KEYED_SHARED, "sst-1"), *EXCLUSIVE]))
            self.do(c.WriteState(cp, sub, kind, name, size, attempt=tm))

    @precondition(lambda self: bool(self.h.lost_tms()))
    @rule(data=st.data())
    def attempt_stopped(self, data: st.DataObject) -> None:
        if not self.rarely(data, 2):
            return
        self.do(c.AttemptStopped(data.draw(st.sampled_from(self.h.lost_tms()))))

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data())
    def failover(self, data: st.DataObject) -> None:
        if not self.rarely(data, 6):
            return
        self.do(c.Failover())

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data())
    def restart_coordinator(self, data: st.DataObject) -> None:
        if not self.rarely(data, 8):
            return
        # R64, R95: an engine restarts its coordinator once the attempts it gave up on are
        # known stopped; now and then it tries before (a refusal both sides must give)
        if data.draw(st.integers(0, 3), label="stop the lost first") != 0:
            for tm in self.h.lost_tms():
                self.do(c.AttemptStopped(tm))
        self.do(c.RestartCoordinator())

    @rule(data=st.data(), op=st.sampled_from(list(StorageOp)))
    def fail_next_call(self, data: st.DataObject, op: StorageOp) -> None:
        if self.s.running and not self.rarely(data, 4):
            return
        if len(self.s.armed) < 2:
            self.do(c.FailNextCall(op))

    @precondition(lambda self: bool(self.h.state.deferred))
    @rule()
    def retry_deletes(self) -> None:
        self.do(c.RetryDeletes())

    # ------------------------------------------------------------------ job lifecycle

    @precondition(lambda self: bool(self.h.state.retained) or bool(self.h.state.savepoints))
    @rule(data=st.data(), agg=st.integers(1, 3), mode=st.sampled_from(list(RestoreMode)))
    def restore(self, data: st.DataObject, agg: int, mode: RestoreMode) -> None:
        if self.s.running and not self.rarely(data, 6):
            return
        ids = [r.id for r in self.s.retained] + sorted(self.s.savepoints)
        cp = data.draw(st.sampled_from(ids))
        self.do(c.Restore(cp, (("agg", agg),), mode))

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data(), retain=st.booleans())
    def cancel(self, data: st.DataObject, retain: bool) -> None:
        if not self.rarely(data, 12):
            return
        self.do(c.Cancel(retain))

    @precondition(lambda self: self.h.state.running)
    @rule(data=st.data())
    def quiesce_midway(self, data: st.DataObject) -> None:
        if not self.rarely(data, 6):
            return
        broken = self.h.quiesce()
        assert not broken, self.h._report(broken)

    # ------------------------------------------------------------------ checks

    @invariant()
    def transitions_are_pure(self) -> None:
        """The model is a function: replaying the last command on the previous state gives
        an equal state and the same effects (no clock, randomness or hidden state)."""
        if self.h.previous is None or not self.h.history:
            return
        again = step(self.h.previous, self.h.history[-1])
        assert again.state == self.h.state
        assert again.effects == self.h.last_effects

    def teardown(self) -> None:
        completed = sum(1 for cmd in self.h.history if isinstance(cmd, c.Complete))
        event(f"completed checkpoints before quiesce: {'5+' if completed >= 5 else completed}")
        broken = self.h.quiesce()
        assert not broken, self.h._report(broken)
