"""NDJSON traces of the commands a store executed, for replay through the model (issue 4).

A trace is one JSON object per line. The first line is the header: format name and
version, the store's ``Config`` and ``JobSpec`` and its id source (``"counter"``: names
the model makes too, so that files compare one by one; ``"random"``: they do not). Then
one line per command, in the order the store executed them:

``{"seq": 1, "command": {...}, "outcome": "ok"}``; ``"outcome"`` is ``"ok"``,
``"refused"`` (with ``"reason"``, the ``Reason`` value: nothing changed) or ``"fault"``
(with ``"op"``: the command raised a ``StorageFault``). ``"real_faults"``, when present,
counts calls the file system itself failed during the command (an injected
``FailNextCall`` is a command of its own and not counted): the model cannot replay those,
so a replay stops comparing there. With ``observations=True`` each line also carries
``"observation"``, the store's observation after the command (one listing of storage per
command: for tests and debugging, not for production).

Commands and observations are encoded by ``spec.codec``; ``model_tests/replay.py`` reads
a trace back and replays it through the reference model.
"""

from __future__ import annotations

import json
import threading
from typing import IO, Any

from spec import codec
from spec import commands as c
from spec.config import Config, JobSpec
from spec.errors import CommandError
from spec.observation import Observation

FORMAT = "ckpt-ownership/command-trace"
VERSION = 1


class CommandTrace:
    """Writes a trace to ``out`` (a text file opened for writing, or a path). ``append``
    (a path only): the trace there goes on, numbered on from its last command line (a
    driver restarted in a new process, ``pipeline.stream.trace``)."""

    def __init__(
        self, out: IO[str] | str, *, observations: bool = False, append: bool = False
    ) -> None:
        self._own = isinstance(out, str)
        self._seq = 0
        if isinstance(out, str) and append:
            with open(out, encoding="utf-8") as f:
                self._seq = max(0, sum(1 for line in f if line.strip()) - 1)  # the header
        mode = "a" if append else "w"
        self._out: IO[str] = open(out, mode, encoding="utf-8") if isinstance(out, str) else out  # noqa: SIM115
        self.observations = observations
        self._lock = threading.Lock()

    @property
    def numbered(self) -> int:
        """The command lines of the trace so far (an appended one's earlier ones too)."""
        return self._seq

    def header(self, config: Config, job: JobSpec, ids: str) -> None:
        self._line(
            {
                "format": FORMAT,
                "version": VERSION,
                "config": codec.encode(config),
                "job": codec.encode(job),
                "ids": ids,
            }
        )

    def record(
        self,
        cmd: c.Command,
        error: BaseException | None,
        real_faults: int,
        observation: Observation | None,
    ) -> None:
        self.record_line(command_line(cmd, error, real_faults, observation))

    def record_line(self, line: dict[str, Any]) -> None:
        """A command line made elsewhere (``command_line``: a party in another process
        logged it); the trace numbers it."""
        with self._lock:
            self._seq += 1
            self._line({"seq": self._seq, **line})

    def _line(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._own:
            self._out.close()


def command_line(
    cmd: c.Command,
    error: BaseException | None = None,
    real_faults: int = 0,
    observation: Observation | None = None,
) -> dict[str, Any]:
    """One command's line of a trace, without its ``seq`` (see the module docstring)."""
    line: dict[str, Any] = {"command": codec.encode_command(cmd)}
    if error is None:
        line["outcome"] = "ok"
    elif isinstance(error, CommandError):
        line["outcome"] = "refused"
        line["reason"] = error.reason.value
    else:
        line["outcome"] = "fault"
        op = getattr(error, "op", None)
        line["op"] = getattr(op, "value", type(error).__name__)
    if real_faults:
        line["real_faults"] = real_faults
    if observation is not None:
        line["observation"] = codec.encode(observation)
    return line
