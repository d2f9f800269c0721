"""Replay a fastimpl command trace through the reference model (issue 4's trace check).

``fastimpl.trace.CommandTrace`` logs every command a store executed (NDJSON). Replaying
that log through ``refimpl`` checks, line by line:

* the model accepts what the store accepted and refuses what it refused, for the same
  ``Reason`` (a command that raised an armed ``StorageFault`` was accepted: the model
  declines inside the same command);
* the safety invariants I1-I5 hold on the model after every command;
* where the line carries the store's observation and the trace used counter ids (the
  model's own names), the observations are equal after the same normalization as the
  lockstep machine (``compare.py``). With random ids the files cannot be matched by
  name; the report says the observations were not compared, never that they agreed.

A line that records a failure of the file system itself (``real_faults``) cannot be
replayed: the model knows only armed faults. The replay stops there and says so.

    python -m model_tests.replay TRACE.ndjson     # exit 0: agrees; 1: differs; 2: unreadable
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

import attrs

from conformance.compare import differences, normalized, unmarked
from fastimpl.trace import FORMAT, VERSION
from refimpl import initial_state, observe, step
from spec import codec
from spec.config import Config, JobSpec
from spec.errors import CommandError
from spec.invariants import check_safety


class TraceError(ValueError):
    """The trace itself is unreadable: not NDJSON, wrong format or version, bad fields."""


@attrs.frozen
class ReplayReport:
    commands: int
    """Commands replayed and checked."""
    observations_compared: int
    ids: str
    stopped: str | None
    """Why the replay stopped before the end (a real storage failure), if it did."""
    mismatch: str | None
    """The first disagreement, with the command sequence up to it; None: none."""

    @property
    def agrees(self) -> bool:
        return self.mismatch is None

    def summary(self) -> str:
        head = f"{self.commands} commands replayed through the model"
        if self.ids == "counter":
            head += f", {self.observations_compared} observations compared"
        else:
            head += ", observations NOT compared (the trace used random ids)"
        lines = [head]
        if self.stopped:
            lines.append(f"stopped early: {self.stopped}")
        lines.append("agrees with the model" if self.agrees else f"MISMATCH: {self.mismatch}")
        return "\n".join(lines)


def _load(n: int, line: str) -> dict[str, object]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"line {n}: not JSON: {err}") from err
    if not isinstance(obj, dict):
        raise TraceError(f"line {n}: not a JSON object")
    return obj


def replay(lines: Iterable[str]) -> ReplayReport:
    """Replay the trace in ``lines`` (the header first); see the module docstring."""
    it = iter(enumerate(lines, 1))
    try:
        _, first = next(it)
    except StopIteration:
        raise TraceError("empty trace: no header line") from None
    head = _load(1, first)
    if head.get("format") != FORMAT:
        raise TraceError(f"line 1: format {head.get('format')!r}, expected {FORMAT!r}")
    if head.get("version") != VERSION:
        raise TraceError(f"line 1: version {head.get('version')!r}, expected {VERSION}")
    try:
        config = codec.decode(Config, head.get("config"), "$.config")
        job = codec.decode(JobSpec, head.get("job"), "$.job")
    except codec.CodecError as err:
        raise TraceError(f"line 1: {err}") from err
    ids = str(head.get("ids"))
    state = initial_state(config, job)
    history: list[str] = []
    compared = 0
    done = 0

    def report(stopped: str | None = None, mismatch: str | None = None) -> ReplayReport:
        if mismatch is not None:
            mismatch += "\nafter commands:\n" + "\n".join(f"    {h}," for h in history)
        return ReplayReport(done, compared, ids, stopped, mismatch)

    for n, text in it:
        if not text.strip():
            continue
        line = _load(n, text)
        try:
            cmd = codec.decode_command(line.get("command"), "$.command")
        except codec.CodecError as err:
            raise TraceError(f"line {n}: {err}") from err
        if line.get("real_faults"):
            return report(
                stopped=f"line {n} ({cmd!r}): the file system failed "
                f"{line['real_faults']} call(s); the model replays only armed faults"
            )
        outcome = line.get("outcome")
        cmd = unmarked(cmd)  # a path it names is the product's, marked with its creator
        try:
            out = step(state, cmd)
        except CommandError as err:
            if outcome != "refused":
                return report(
                    mismatch=f"line {n}: the model refused {cmd!r} ({err}), "
                    f"the store's outcome was {outcome!r}"
                )
            if line.get("reason") != err.reason.value:
                return report(
                    mismatch=f"line {n}: {cmd!r} refused for {line.get('reason')!r} "
                    f"by the store, for {err.reason.value!r} by the model"
                )
            history.append(f"{cmd!r}  # refused: {err.reason.value}")
            done += 1
            continue
        if outcome == "refused":
            return report(
                mismatch=f"line {n}: the store refused {cmd!r} "
                f"({line.get('reason')}), the model accepted it"
            )
        state = out.state
        history.append(repr(cmd))
        done += 1
        model = observe(state)
        broken = check_safety(model)
        if broken:
            return report(mismatch=f"line {n}: the model breaks " + "; ".join(map(str, broken)))
        if ids == "counter" and "observation" in line:
            try:
                impl = codec.decode_observation(line["observation"], "$.observation")
            except codec.CodecError as err:
                raise TraceError(f"line {n}: {err}") from err
            listed = config.open_files_readable
            diff = differences(normalized(model, open_files_listed=listed), normalized(impl))
            if diff:
                return report(
                    mismatch=f"line {n}: observations differ after {cmd!r}:\n" + "\n".join(diff)
                )
            compared += 1
    return report()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m model_tests.replay TRACE.ndjson", file=sys.stderr)
        return 2
    try:
        with open(args[0], encoding="utf-8") as f:
            result = replay(f)
    except (OSError, TraceError) as err:
        print(f"replay: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0 if result.agrees else 1


if __name__ == "__main__":
    sys.exit(main())
