"""Exhaustive breadth-first search of the reference model's state space within bounds.

Where the TLA+ model checker is not available, this is how design bugs are caught
offline: every command the bounds allow is applied to every reachable state, every
safety invariant is checked in every state reached, and "no leak once quiet" is checked by
quiescing each state at the frontier. The result is exhaustive *for the bounds given*,
never more: it says so in what it prints.

    python -m model_tests.explore --bound small
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator

from attrs import frozen

from conformance.harness import Harness
from model_tests.twins import TWINS, Twin, swapped_in
from refimpl import ModelState, initial_state, observe, step
from refimpl.state import TmStatus
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.errors import CommandError
from spec.invariants import Violation, check_safety


@frozen
class Bounds:
    """How far the search goes: the job, how many checkpoints may be triggered, how many
    notifications may be in flight, and which disruptive commands are in play."""

    name: str
    mode: MergingMode
    subtasks: int = 2
    tms: int = 2
    max_checkpoints: int = 3
    max_channel: int = 2
    crashes: bool = True
    restore: bool = False
    num_retained: int = 1
    max_depth: int = 12

    def describe(self) -> str:
        return (
            f"{self.name}: mode={self.mode.name} subtasks={self.subtasks} tms={self.tms} "
            f"checkpoints<={self.max_checkpoints} in-flight notices<={self.max_channel} "
            f"crashes={'on' if self.crashes else 'off'} restore={'on' if self.restore else 'off'} "
            f"num_retained={self.num_retained} moves<={self.max_depth}"
        )


BOUNDS = {
    # Two small bounds, each in every merging mode: two subtasks on two TMs (crashes,
    # failover, lost and duplicated notices), and one subtask that keeps two checkpoints
    # and may be restored (CLAIM) after a crash. tla/MCSmall.cfg has the same bounds.
    "small": [
        *[Bounds("small-a", m, max_checkpoints=2, max_depth=7) for m in MergingMode],
        *[
            Bounds(
                "small-b",
                m,
                subtasks=1,
                tms=1,
                max_checkpoints=3,
                num_retained=2,
                restore=True,
                max_depth=8,
            )
            for m in MergingMode
        ],
    ],
    "medium": [
        Bounds("medium", m, max_checkpoints=3, max_depth=8, restore=True) for m in MergingMode
    ],
}


Move = tuple[c.Command, ...]


def moves(s: ModelState, b: Bounds) -> Iterator[Move]:
    """Every move the bounds allow in state ``s``. A subtask's write (or reuse) and its
    acknowledgement form one move, so that the depth bound buys whole checkpoints."""
    if s.running and s.next_checkpoint <= b.max_checkpoints:
        yield (c.Trigger(),)
    for cp in sorted(s.pending):
        for sub in sorted(s.placement):
            tm = s.placement[sub]
            if (tm, sub, cp) in s.acked or s.tms[tm].status is not TmStatus.ALIVE:
                continue
            if (tm, sub, "sst") in s.backend:
                yield (c.ReuseShared(cp, sub, "sst"), c.Acknowledge(cp, sub))
            yield (c.WriteState(cp, sub, StateKind.KEYED_SHARED, "sst", 10), c.Acknowledge(cp, sub))
        if set(s.pending[cp].acks) >= set(s.placement):
            yield (c.Complete(cp),)
        yield (c.Abort(cp),)
    for i in range(len(s.channel)):
        yield (c.DeliverNotification(i),)
        yield (c.DropNotification(i),)
        if len(s.channel) < b.max_channel:
            yield (c.DuplicateNotification(i),)
    if b.crashes and s.running:
        alive = sorted({t for t in s.placement.values() if s.tms[t].status is TmStatus.ALIVE})
        lost = sorted(t for t, r in s.tms.items() if r.status is TmStatus.LOST)
        if not lost and alive:
            yield (c.CrashTm(alive[0]),)
            yield (c.ReplaceTm(alive[0]),)
        for t in lost:
            yield (c.AttemptStopped(t),)
        if lost:
            yield (c.Failover(),)
    if b.restore and s.retained and s.job_seq == 0:
        yield (c.Restore(s.retained[-1].id, (("v", 1),), RestoreMode.CLAIM),)


def _key(s: ModelState) -> str:
    return repr(s)


@frozen
class Result:
    bounds: Bounds
    states: int
    transitions: int
    depth: int
    seconds: float
    violations: tuple[tuple[str, tuple[c.Command, ...]], ...]


def explore(
    b: Bounds,
    *,
    stepper: Callable[[ModelState, c.Command], ModelState] | None = None,
    stop_at_first: bool = True,
) -> Result:
    """Breadth-first search from the initial state; ``stepper`` lets a test swap in a
    buggy rule (a must-fail twin) without touching refimpl."""
    run = stepper or (lambda st, cmd: step(st, cmd).state)
    cfg = Config.for_mode(b.mode, num_retained=b.num_retained, max_file_size=25)
    job = JobSpec((VertexSpec("v", b.subtasks),), num_tms=b.tms)
    start = initial_state(cfg, job)
    seen = {_key(start)}
    queue: deque[tuple[ModelState, tuple[c.Command, ...], int]] = deque([(start, (), 0)])
    transitions, depth, found = 0, 0, []
    t0 = time.perf_counter()
    while queue:
        state, path, level = queue.popleft()
        depth = max(depth, level)
        if level >= b.max_depth:
            continue
        for move in moves(state, b):
            try:
                nxt = state
                for cmd in move:
                    nxt = run(nxt, cmd)
            except CommandError:
                continue
            transitions += 1
            key = _key(nxt)
            if key in seen:
                continue
            seen.add(key)
            trail = (*path, *move)
            broken: list[Violation] = check_safety(observe(nxt))
            if not broken:
                broken = _quiet_violations(nxt, run)
            if broken:
                found.append(("; ".join(map(str, broken)), trail))
                if stop_at_first:
                    return Result(
                        b, len(seen), transitions, level + 1, time.perf_counter() - t0, tuple(found)
                    )
                continue
            queue.append((nxt, trail, level + 1))
    return Result(b, len(seen), transitions, depth, time.perf_counter() - t0, tuple(found))


def _quiet_violations(
    state: ModelState, run: Callable[[ModelState, c.Command], ModelState]
) -> list[Violation]:
    """I6: bring a copy of this state to quiet and check that nothing leaked."""
    h = _SteppedHarness(state, run)
    try:
        return h.quiesce()
    except AssertionError as err:
        return [Violation("I1-I5", str(err).splitlines()[0])]


class _SteppedHarness(Harness):
    def __init__(self, state: ModelState, run: Callable[[ModelState, c.Command], ModelState]):
        super().__init__(state=state)
        self._run = run

    def run(self, cmd: c.Command) -> tuple[()]:
        self.previous = self.state
        self.state = self._run(self.state, cmd)
        self.history.append(cmd)
        broken = check_safety(self.observe())
        if broken:
            raise AssertionError("; ".join(map(str, broken)))
        return ()


def report(r: Result) -> str:
    verdict = "no violation" if not r.violations else f"VIOLATION: {r.violations[0][0]}"
    lines = [
        f"exhaustive for bounds {r.bounds.describe()}",
        f"  states explored {r.states}, transitions {r.transitions}, depth {r.depth} moves, "
        f"time {r.seconds:.1f} s: {verdict}",
    ]
    if r.violations:
        lines += [f"    {cmd!r}" for cmd in r.violations[0][1]]
    return "\n".join(lines)


def twin_bounds(t: Twin) -> Bounds:
    """The bounds within which the search must catch twin ``t``."""
    return Bounds(
        f"twin {t.name}",
        t.mode,
        subtasks=t.subtasks,
        tms=t.tms,
        max_checkpoints=t.max_checkpoints,
        crashes=t.crashes,
        num_retained=t.num_retained,
        max_depth=t.max_depth,
    )


def run_twin(name: str) -> Result:
    with swapped_in(name) as t:
        return explore(twin_bounds(t))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="small")
    parser.add_argument(
        "--twin",
        choices=sorted(TWINS),
        help="swap in a must-fail twin (a known bug) and search its bounds: exits 1 when "
        "the search catches it, as it must",
    )
    args = parser.parse_args(argv)
    if args.twin:
        t = TWINS[args.twin]
        print(f"must-fail twin {t.name}: {t.bug}; expected: {t.breaks} broken", flush=True)
        r = run_twin(t.name)
        print(report(r))
        if r.violations:
            print(f"twin {t.name}: caught, as it must be (exit 1)")
            return 1
        print(f"twin {t.name}: NOT caught within its bounds: the search missed a known bug")
        return 0
    failed = False
    for b in BOUNDS[args.bound]:
        r = explore(b)
        print(report(r), flush=True)
        failed |= bool(r.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
