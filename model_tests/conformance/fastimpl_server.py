"""fastimpl behind the JSON-lines protocol of ``process.py``: the small adapter script
through which the suite tests fastimpl over a process boundary, and a worked example for
implementers in other languages.

    python -m model_tests.conformance.fastimpl_server
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from model_tests.conformance.adapter import Fastimpl, FastimplSession
from spec import codec
from spec.config import Config, JobSpec


def serve(inp: IO[str], out: IO[str]) -> int:
    impl = Fastimpl()
    session: FastimplSession | None = None

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, separators=(",", ":")) + "\n")
        out.flush()

    for line in inp:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "start":
                if session is not None:
                    session.close()
                config = codec.decode(Config, msg["config"], "$.config")
                job = codec.decode(JobSpec, msg["job"], "$.job")
                session = impl.start(config, job)
                reply({"ok": True})
            elif op == "run":
                if session is None:
                    reply({"error": "run before start"})
                    continue
                cmd = codec.decode_command(msg["command"], "$.command")
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
                reply({"error": f"unknown op {op!r}"})
        except Exception as err:  # reported to the runner, which fails the case
            reply({"error": f"{type(err).__name__}: {err}"})
    if session is not None:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.stdin, sys.stdout))
