"""Hostile input on both ends of the conformance process protocol (issue 14): the server
(``fastimpl_server``) reading what a runner sends, and the runner (``process.py``) reading
what an implementation answers.

The server answers each bad line with one ``{"error": ...}`` that names the line and the
problem (never a bare Python exception's name) and changes nothing: the session it was
running answers the next command exactly as a twin that never saw the line. The runner
turns a bad answer into a ``ProtocolError`` saying what was wrong.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.fastimpl_server import MAX_SIZE, serve
from conformance.process import ProcessImplementation, ProtocolError
from spec import codec
from spec.config import Config, JobSpec, MergingMode, VertexSpec

CONFIG = codec.encode(Config.for_mode(MergingMode.WITHIN_CHECKPOINT))
JOB = codec.encode(JobSpec((VertexSpec("a", 2), VertexSpec("b", 1)), num_tms=2))
START = json.dumps({"op": "start", "config": CONFIG, "job": JOB})
TRIGGER = json.dumps({"op": "run", "command": {"type": "Trigger", "savepoint": False}})
ABORT = json.dumps({"op": "run", "command": {"type": "Abort", "checkpoint": 1}})
DEEP = 100_000

HOSTILE: dict[str, tuple[str, str]] = {
    # name: (line, what the error must say)
    "truncated": ("{", "not JSON"),
    "prose": ("not json", "not JSON"),
    "a-list": ("[]", "expected a JSON object, got list"),
    "a-number": ("42", "expected a JSON object, got int"),
    "null": ("null", "expected a JSON object, got NoneType"),
    "op-a-number": ('{"op": 5}', "unknown op 5"),
    "unknown-op": ('{"op": "explode"}', "unknown op 'explode'"),
    "no-op": ("{}", "unknown op None"),
    "run-without-command": ('{"op": "run"}', "needs field 'command'"),
    "command-a-number": ('{"op": "run", "command": 5}', "$.command: expected dict"),
    "wrong-type": (
        '{"op": "run", "command": {"type": "Trigger", "savepoint": "yes"}}',
        "$.command.savepoint: expected bool",
    ),
    "field-of-a-newer-version": (
        '{"op": "run", "command": {"type": "Trigger", "savepoint": false, "priority": 1}}',
        "unknown field(s) priority",
    ),
    "command-of-a-newer-version": (
        '{"op": "run", "command": {"type": "Teleport", "checkpoint": 1}}',
        "'Teleport' is not one of",
    ),
    "huge-number-in-a-command": (
        '{"op": "run", "command": {"type": "Abort", "checkpoint": ' + "9" * 5000 + "}}",
        "not JSON",  # Python refuses integers of more than 4300 digits
    ),
    "deep-nesting": (
        '{"op": "run", "command": ' + "[" * DEEP + "]" * DEEP + "}",
        "nested too deeply",
    ),
    "start-with-a-bad-job": (
        json.dumps({"op": "start", "config": CONFIG, "job": "x"}),
        "$.job: expected dict",
    ),
    "start-without-a-job": (json.dumps({"op": "start", "config": CONFIG}), "needs field 'job'"),
    "start-with-a-huge-job": (  # past R78's bound: refused by spec.config itself
        json.dumps({"op": "start", "config": CONFIG, "job": dict(JOB, num_tms=2**70)}),
        f"$.job: not a valid JobSpec: num_tms must be in 1 .. 32768 (one per slot of the"
        f" largest parallelism), got {2**70} (R78)",
    ),
    "start-with-a-big-job": (  # within R78 but past what the server runs
        json.dumps({"op": "start", "config": CONFIG, "job": dict(JOB, num_tms=MAX_SIZE + 1)}),
        f"$.job.num_tms: {MAX_SIZE + 1} is more than {MAX_SIZE}",
    ),
    "start-with-a-huge-max-parallelism": (
        json.dumps({"op": "start", "config": dict(CONFIG, max_parallelism=2**63), "job": JOB}),
        "$.config: not a valid Config: max_parallelism must be in 1 .. 32768",
    ),
    "start-with-a-negative-size": (
        json.dumps({"op": "start", "config": CONFIG, "job": dict(JOB, num_tms=-1)}),
        "$.job: not a valid JobSpec",
    ),
}
BARE = ("AttributeError", "KeyError", "TypeError", "RecursionError", "IndexError")


def _serve(lines: list[str]) -> list[dict[str, object]]:
    out = io.StringIO()
    serve(io.StringIO("".join(line + "\n" for line in lines)), out)
    return [json.loads(r) for r in out.getvalue().splitlines()]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_server_refuses_a_bad_line_and_changes_nothing(name: str) -> None:
    line, says = HOSTILE[name]
    twin = _serve([START, TRIGGER, TRIGGER, ABORT])
    got = _serve([START, TRIGGER, line, TRIGGER, ABORT])
    assert len(got) == 5, got
    error = got[2].get("error")
    assert isinstance(error, str), got[2]
    assert "line 3" in error or "$." in error, error
    assert says in error, error
    assert not error.startswith(BARE), error
    # The session goes on as if the line had not come.
    assert got[:2] + got[3:] == twin


def test_a_refused_start_keeps_the_session_it_replaced() -> None:
    bad = HOSTILE["start-with-a-bad-job"][0]
    got = _serve([START, TRIGGER, bad, TRIGGER])
    assert "error" in got[2]
    assert got[3].get("outcome") == "ok"
    twin = _serve([START, TRIGGER, TRIGGER])
    assert got[3] == twin[2]


def test_the_server_process_refuses_bytes_that_are_not_utf8() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.fastimpl_server"],
        input=b"\xff\xfe{}\n" + START.encode() + b"\n" + TRIGGER.encode() + b"\n",
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    replies = [json.loads(r) for r in proc.stdout.decode().splitlines()]
    assert replies[0] == {"error": "line 1: not UTF-8"}
    assert replies[1] == {"ok": True} and replies[2]["outcome"] == "ok"


ANSWERS: dict[str, tuple[str, str]] = {
    # what a hostile implementation answers to "start": (its reply, what the error says)
    "a-list": ("[]", "not an object"),
    "deep-nesting": ("[" * DEEP + "]" * DEEP, "nested too deeply"),
    "huge-number": ("9" * 5000, "no JSON"),
    "an-error": ('{"error": "boom"}', "reported an error: boom"),
    "not-ok": ('{"ok": 2}', "expected {'ok': true}"),
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_the_runner_refuses_a_bad_answer(name: str, tmp_path: Path) -> None:
    answer, says = ANSWERS[name]
    script = tmp_path / "hostile.py"
    script.write_text(f"import sys\nfor line in sys.stdin:\n    print({answer!r}, flush=True)\n")
    impl = ProcessImplementation(f"{sys.executable} {script}")
    try:
        with pytest.raises(ProtocolError) as caught:
            impl.start(Config.for_mode(MergingMode.NONE), JobSpec((VertexSpec("a", 1),)))
        assert says in str(caught.value)
    finally:
        impl.close()
