"""fastimpl behind the JSON-lines protocol of ``process.py``: the small adapter script
through which the suite tests fastimpl over a process boundary, and a worked example for
implementers in other languages.

    python -m conformance.fastimpl_server

Hostile input (a line that is not UTF-8 or not JSON, nested too deeply, not an object, an
unknown op or a missing, foreign or ill-typed field, a job too large to build) gets one
``{"error": ...}`` reply naming the line and the problem, and changes nothing: the session
that was running goes on as if the line had not come (tests/test_protocol_input.py).
"""

from __future__ import annotations

import io
import json
import sys
from typing import IO, Any

from conformance.adapter import Fastimpl, FastimplSession
from spec import codec
from spec.config import Config, JobSpec
from spec.errors import CkptError

MAX_SIZE = 1024
"""The most TMs, subtasks of a vertex or key groups a job may ask this server for: the
cluster builds them eagerly, so a size of 2**70 would hang it instead of failing."""


class BadMessage(CkptError, ValueError):
    """A line of the protocol that cannot be acted on; nothing was changed."""


def _message(line: str, number: int) -> dict[str, Any]:
    where = f"line {number}"
    if any("\udc80" <= ch <= "\udcff" for ch in line):
        raise BadMessage(f"{where}: not UTF-8")
    try:
        msg = json.loads(line)
    except ValueError as err:  # JSONDecodeError, or an integer of more than 4300 digits
        raise BadMessage(f"{where}: not JSON: {err}") from None
    except RecursionError:
        raise BadMessage(f"{where}: JSON nested too deeply") from None
    if not isinstance(msg, dict):
        raise BadMessage(f"{where}: expected a JSON object, got {type(msg).__name__}")
    return msg


def _field(msg: dict[str, Any], name: str, number: int) -> Any:
    if name not in msg:
        raise BadMessage(f"line {number}: op {msg.get('op')!r} needs field {name!r}")
    return msg[name]


def _check_size(job: JobSpec, config: Config, number: int) -> None:
    sizes = {"$.job.num_tms": job.num_tms, "$.config.max_parallelism": config.max_parallelism}
    sizes |= {f"$.job.vertices.{v.name}.parallelism": v.parallelism for v in job.vertices}
    for where, n in sizes.items():
        if n > MAX_SIZE:
            raise BadMessage(f"line {number}: {where}: {n} is more than {MAX_SIZE}")


def serve(inp: IO[str], out: IO[str]) -> int:
    impl = Fastimpl()
    session: FastimplSession | None = None

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, separators=(",", ":")) + "\n")
        out.flush()

    for number, line in enumerate(inp, 1):
        if not line.strip():
            continue
        try:
            msg = _message(line, number)
            op = msg.get("op")
            if op == "start":
                # Decoded in full before the running session is let go: a start that is
                # refused leaves it running.
                config = codec.decode(Config, _field(msg, "config", number), "$.config")
                job = codec.decode(JobSpec, _field(msg, "job", number), "$.job")
                _check_size(job, config, number)
                if session is not None:
                    session.close()
                    session = None
                session = impl.start(config, job)
                reply({"ok": True})
            elif op == "run":
                if session is None:
                    reply({"error": "run before start"})
                    continue
                cmd = codec.decode_command(_field(msg, "command", number), "$.command")
                reason = session.run(cmd)
                answer: dict[str, Any] = {"outcome": "ok" if reason is None else "refused"}
                if reason is not None:
                    answer["reason"] = reason.value
                answer["observation"] = codec.encode(session.observe())
                reply(answer)
            elif op == "end":
                if session is not None:
                    session.close()
                    session = None
                reply({"ok": True})
            else:
                reply({"error": f"line {number}: unknown op {op!r}"})
        except BadMessage as err:
            reply({"error": str(err)})
        except Exception as err:  # reported to the runner, which fails the case
            reply({"error": f"{type(err).__name__}: {err}"})
    if session is not None:
        session.close()
    return 0


if __name__ == "__main__":
    # A line that is not UTF-8 reaches serve() as lone surrogates and is refused there,
    # instead of ending the loop with a UnicodeDecodeError.
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
    sys.exit(serve(stdin, sys.stdout))
