"""The conformance suite over a process boundary: any language, JSON lines on stdin and
stdout. The runner starts the implementation's command once and talks to it:

    -> {"op": "start", "config": {...}, "job": {...}}
    <- {"ok": true}
    -> {"op": "run", "command": {...}}
    <- {"outcome": "ok", "observation": {...}}
       or {"outcome": "refused", "reason": "no_such_state", "observation": {...}}
    -> {"op": "end"}
    <- {"ok": true}

Values are encoded as in the cases (``spec.codec``; CONFORMANCE.md); the observation is
whole. Any reply may instead be ``{"error": "..."}``: the case fails with that message.
The implementation exits when its stdin closes.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import typing
from collections.abc import Mapping
from typing import IO, Any

from conformance.case import OBSERVATION_HINTS
from spec import codec
from spec.commands import Command
from spec.config import Config, JobSpec
from spec.errors import CkptError, Reason
from spec.observation import Observation


class ProtocolError(CkptError, RuntimeError):
    """The implementation's process broke the protocol, died or went silent."""


class _Pipe:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(message, separators=(",", ":")) + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise ProtocolError(f"{self._who()} stopped reading its input: {err}") from err
        line = _readline(stdout, self)
        try:
            reply = json.loads(line)
        except ValueError as err:  # JSONDecodeError, or an integer of over 4300 digits
            raise ProtocolError(f"{self._who()} answered with no JSON: {line[:200]!r}") from err
        except RecursionError:
            raise ProtocolError(f"{self._who()} answered with JSON nested too deeply") from None
        if not isinstance(reply, dict):
            raise ProtocolError(
                f"{self._who()} answered with {type(reply).__name__}, not an object"
            )
        if "error" in reply:
            raise ProtocolError(f"{self._who()} reported an error: {reply['error']}")
        return reply

    def _who(self) -> str:
        return f"the implementation ({shlex.join(self.argv)})"

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _readline(stdout: IO[str], pipe: _Pipe) -> str:
    line = stdout.readline()
    if not line:
        try:
            code: int | None = pipe.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        raise ProtocolError(f"{pipe._who()} closed its output (exit code {code})")
    return line


_HINTS = OBSERVATION_HINTS


class _IncrementalDecoder:
    """Decodes whole observations, reusing what was decoded for the reply before where a
    field (or a mapping's entry) is unchanged: most of an observation is, step to step."""

    def __init__(self) -> None:
        self.raw: dict[str, Any] = {}
        self.value: dict[str, Any] = {}

    def decode(self, data: Any) -> Observation:
        if not isinstance(data, dict):
            raise codec.CodecError("$.observation", "not a JSON object")
        fields: dict[str, Any] = {}
        for name, hint in _HINTS.items():
            if name not in data:
                raise codec.CodecError("$.observation", f"needs field {name!r}")
            raw = data[name]
            if self.raw.get(name, _NONE) == raw:
                fields[name] = self.value[name]
                continue
            at = f"$.observation.{name}"
            old_raw, old_value = self.raw.get(name), self.value.get(name, {})
            if typing.get_origin(hint) is Mapping and isinstance(raw, dict):
                item = typing.get_args(hint)[1]
                known = old_raw if isinstance(old_raw, dict) else {}
                value = {
                    k: old_value[k] if k in known and known[k] == v else codec.decode(item, v, at)
                    for k, v in raw.items()
                }
            else:
                value = codec.decode(hint, raw, at)
            self.raw[name], self.value[name] = raw, value
            fields[name] = value
        unknown = sorted(set(data) - set(_HINTS) - {"type"})
        if unknown:
            raise codec.CodecError("$.observation", f"unknown field(s) {', '.join(unknown)}")
        return Observation(**fields)


_NONE: Any = object()


class ProcessSession:
    def __init__(self, pipe: _Pipe, config: Config, job: JobSpec) -> None:
        self.pipe = pipe
        self.last: dict[str, Any] | None = None
        self._decoder = _IncrementalDecoder()
        reply = pipe.ask({"op": "start", "config": codec.encode(config), "job": codec.encode(job)})
        if reply.get("ok") is not True:
            raise ProtocolError(f"start: expected {{'ok': true}}, got {reply}")

    def run(self, command: Command) -> Reason | None:
        reply = self.pipe.ask({"op": "run", "command": codec.encode_command(command)})
        self.last = reply.get("observation")
        outcome = reply.get("outcome")
        if outcome == "ok":
            return None
        if outcome == "refused":
            try:
                return Reason(reply.get("reason"))
            except ValueError:
                raise ProtocolError(f"run: unknown reason {reply.get('reason')!r}") from None
        raise ProtocolError(f"run: outcome {outcome!r}, expected 'ok' or 'refused'")

    def observe(self) -> Observation:
        if self.last is None:
            raise ProtocolError("run: the reply carried no observation")
        try:
            return self._decoder.decode(self.last)
        except codec.CodecError as err:
            raise ProtocolError(f"run: observation is not valid: {err}") from err

    def close(self) -> None:
        self.pipe.ask({"op": "end"})


class ProcessImplementation:
    """An implementation behind a command line; one process serves every case."""

    def __init__(self, command: str) -> None:
        self.name = command
        self.argv = shlex.split(command)
        self.pipe: _Pipe | None = None

    def start(self, config: Config, job: JobSpec) -> ProcessSession:
        if self.pipe is None or self.pipe.proc.poll() is not None:
            self.pipe = _Pipe(self.argv)
        return ProcessSession(self.pipe, config, job)

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None
