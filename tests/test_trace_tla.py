"""Traces as TLA+ trace-validation models (model_tests/trace_tla.py, tla/TraceCheck.tla):
what the converter writes, what it refuses, and that the checked-in MCTrace is current.
TLC replays the checked-in MCTrace through the spec in tests/test_tlc.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_tests import trace_tla
from model_tests.tla_syntax import TLA_DIR, config_problems, parse_text
from spec import codec
from spec import commands as c
from spec.commands import StorageOp
from spec.config import JobSpec, StateKind, VertexSpec
from spec.ids import SubtaskId

LINES = trace_tla.example_trace()
S0 = SubtaskId("v", 0, 2)


def _trace(*commands: c.Command, job: JobSpec | None = None, refused: int = -1) -> list[str]:
    head = json.loads(LINES[0])
    if job is not None:
        head["job"] = codec.encode(job)
    out = [json.dumps(head)]
    for n, cmd in enumerate(commands):
        line = {"seq": n + 1, "command": codec.encode_command(cmd), "outcome": "ok"}
        if n == refused:
            line.update(outcome="refused", reason="no_such_state")
        out.append(json.dumps(line))
    return out


def test_the_example_becomes_a_module_that_parses_with_a_consistent_config(tmp_path: Path) -> None:
    t = trace_tla.convert(LINES, "MCTraceX")
    assert t.records == len(LINES) - 1  # every command of the example was accepted
    assert parse_text(t.module) is None
    module, cfg = trace_tla.write(t, tmp_path, "MCTraceX")
    for dep in ("TraceCheck", "CheckpointOwnership"):
        (tmp_path / f"{dep}.tla").write_text((TLA_DIR / f"{dep}.tla").read_text())
    assert config_problems(module, cfg) == []
    assert "\\* expect: violates TraceIncomplete" in t.cfg
    assert "TraceLog <- MCTraceXLog" in t.cfg
    assert '[cmd |-> "Failover"' in t.module and '[cmd |-> "Abort"' in t.module


def test_the_checked_in_trace_model_is_the_example_converted() -> None:
    t = trace_tla.convert(LINES, "MCTrace")
    assert (TLA_DIR / "MCTrace.tla").read_text() == t.module
    assert (TLA_DIR / "MCTrace.cfg").read_text() == t.cfg


def test_refused_commands_are_left_out() -> None:
    lines = _trace(
        c.Trigger(),
        c.Complete(1),
        c.WriteState(1, S0, StateKind.KEYED_SHARED, "sst", 10),
        refused=1,
    )
    t = trace_tla.convert(lines)
    assert t.records == 2 and '"Complete"' not in t.module


@pytest.mark.parametrize(
    "lines, problem",
    [
        (
            _trace(c.Trigger(), c.WriteState(1, S0, StateKind.OPERATOR_LIST, "o", 5)),
            "operator_list",
        ),
        (_trace(c.Trigger(savepoint=True)), "savepoints"),
        (_trace(c.FailNextCall(StorageOp.CREATE)), "FailNextCall"),
        (_trace(c.Trigger(), c.RestartCoordinator()), "RestartCoordinator"),
        (
            _trace(c.Trigger(), job=JobSpec((VertexSpec("a", 1), VertexSpec("b", 1)))),
            "2 vertices",
        ),
        (
            _trace(
                c.Trigger(),
                c.WriteState(1, S0, StateKind.KEYED_SHARED, "sst", 10),
                c.WriteState(1, SubtaskId("v", 1, 2), StateKind.KEYED_SHARED, "sst", 11),
            ),
            "different sizes",
        ),
    ],
    ids=["exclusive-state", "savepoint", "fault", "restart", "two-vertices", "sizes"],
)
def test_a_trace_outside_the_model_is_refused_naming_the_line(
    lines: list[str], problem: str
) -> None:
    with pytest.raises(trace_tla.TraceOutsideModel, match=problem):
        trace_tla.convert(lines)


def test_the_command_line_writes_the_example(tmp_path: Path) -> None:
    assert trace_tla.main(["--example", "--out", str(tmp_path), "--name", "MCEx"]) == 0
    assert (tmp_path / "MCEx.tla").exists() and (tmp_path / "MCEx.cfg").exists()
