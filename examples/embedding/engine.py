"""The example engine: the host's side of ``CoordinatorEngine``, with each TM attempt an
OS process (``examples.embedding.tm_process``, started with multiprocessing's "spawn").

Everything the coordinator says to a TM goes through here as encoded ``spec.messages``
bytes over the TM's pipe, and every answer comes back as bytes and is decoded before the
coordinator sees it. Placing subtasks (round-robin), starting and stopping TM processes
and noticing that one died are the engine's, as in Flink. The coordinator's notices are
what its ``ready()`` gives after a call (raft's ``Ready``); ``post`` delivers them in
order; a real transport may lose, repeat or reorder them (R34), which the TM accepts.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from examples.embedding import tm_process
from fastimpl.parties import (
    Answer,
    Duty,
    Ready,
    TmAssignment,
    decode_message,
    encode_message,
)
from spec.config import Config
from spec.ids import SubtaskId, TmId


class TmDied(Exception):
    """A TM process is gone: its pipe broke."""


class PipeEngine:
    """A ``CoordinatorEngine`` whose TMs are processes reached over pipes."""

    def __init__(self, url: str, config: Config) -> None:
        self.url = url
        self.config = config
        self.ctx = multiprocessing.get_context("spawn")
        self.conns: dict[TmId, Connection] = {}
        self.procs: dict[TmId, BaseProcess] = {}
        self.dead: set[TmId] = set()
        self.next_tm = 1
        self.placement: dict[SubtaskId, TmId] = {}
        """Where each subtask runs: the engine's choice, told to the coordinator."""
        self.restored: dict[TmId, dict[str, int]] = {}
        """Bytes each TM restored per subtask at its last assignment (the narrative)."""

    # ------------------------------------------------------------------ the pipes

    def call(self, tm: TmId, *req: Any) -> tuple[Any, ...]:
        """One request to the TM process and its reply."""
        if tm in self.dead:
            raise TmDied(tm)
        try:
            self.conns[tm].send(req)
            reply: tuple[Any, ...] = self.conns[tm].recv()
        except (EOFError, OSError):
            self.bury(tm)
            raise TmDied(tm) from None
        if reply[0] == "error":
            raise RuntimeError(f"{tm}: {reply[1]}")
        return reply

    def bury(self, tm: TmId) -> int | None:
        """The process is gone (or going): wait for it; its exit code."""
        self.dead.add(tm)
        proc = self.procs[tm]
        proc.join(timeout=30)
        self.conns[tm].close()
        return proc.exitcode

    def kill(self, tm: TmId) -> int | None:
        """SIGKILL the TM's process (a machine lost): no goodbye, its records die with it."""
        self.procs[tm].kill()
        return self.bury(tm)

    def live(self) -> list[TmId]:
        return sorted(t for t in self.conns if t not in self.dead)

    def hosting(self) -> list[TmId]:
        """The live TMs that run subtasks."""
        return sorted({t for t in self.placement.values() if t not in self.dead})

    def stop_all(self) -> list[int | None]:
        """Stop every TM process still running; their exit codes."""
        for tm in self.live():
            self.forget_tm(tm)
        return [p.exitcode for t, p in sorted(self.procs.items())]

    # ------------------------------------------------------------------ CoordinatorEngine

    def post(self, ready: Ready) -> None:
        """The coordinator's notices since the host last asked, each to its TM."""
        for tm, msg in ready.notices:
            if tm not in self.dead:
                self.call(tm, "notice", encode_message(msg))

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        tm = f"tm-{self.next_tm}"
        self.next_tm += 1
        here, there = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=tm_process.serve,
            args=(there, self.url, self.config, job, tm, first_checkpoint, finished_mark),
            name=tm,
            daemon=True,
        )
        proc.start()
        there.close()
        self.conns[tm] = here
        self.procs[tm] = proc
        return tm

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        self.placement = dict(placement)
        for tm in self.live():
            mine = [tm_process.as_sub(s) for s, t in placement.items() if t == tm]
            self.call(tm, "host", mine)

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        # ResetTm: no notice waits for ``tm`` here (each is delivered at once), so
        # there is nothing of its old attempt to drop
        _, data, restored = self.call(tm, "duty", encode_message(msg))
        if isinstance(msg, TmAssignment):
            self.restored[tm] = restored
        if data is None:
            return None
        answer = decode_message(data)
        if not isinstance(answer, Answer):
            raise RuntimeError(f"{tm} answered {type(answer).__name__}")
        return answer

    def forget_tm(self, tm: TmId) -> None:
        if tm in self.dead or tm not in self.conns:
            return
        try:
            self.call(tm, "stop")
        except TmDied:
            return
        self.bury(tm)
