"""A TM's side of a benchmark job, through the API an engine's task manager uses.

The TM is a ``TaskManager.alone`` in the bench process, built from the storage, the
config, the job id and its TM id only; the coordinator runs in a spawned process
(``bench/coordinator_process.py``) and the two exchange encoded ``spec.messages`` over a
pipe. Why this way round: the figures are about the TM's write path, so the clock runs
in the TM's process with nothing between the timer and the TM (no pipe per write, as a
task writes its state in its own process), while the coordinator's work happens where
an engine's coordinator does it, in another process, on its own clock.

One checkpoint cycle: the coordinator has triggered checkpoint ``cp``; the subtask writes
``segments`` segments of fresh keyed shared state (``TaskManager.write``), acknowledges
(``TaskManager.acknowledge``, the ``Acknowledgement`` encoded), the bytes go to the
coordinator, which decodes them, completes the checkpoint (its ``_metadata``, the
registry, subsuming the previous one) and triggers the next; the encoded notices come
back and the TM decodes and applies them (``TaskManager.on_notice``: it discards the
subsumed checkpoint's segments and deletes their file), its background deletes done.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from bench import coordinator_process
from fastimpl.parties import IdSource, TaskManager
from spec.config import Config, StateKind, VertexSpec
from spec.ids import SubtaskId, TmId
from spec.messages import CheckpointAborted, CheckpointComplete, decode_message, encode_message

JOB_ID = "job-0"
VERTICES = (VertexSpec("v", 1),)
SUBTASK = SubtaskId("v", 0, 1)
"""One vertex of parallelism 1 on one TM: every segment goes through one subtask, so a
checkpoint's segments share one physical file (WITHIN_CHECKPOINT merging)."""
TM_ID: TmId = "tm-1"


@dataclass
class TmPhases:
    """Seconds of the checkpoint cycles of one run, by phase. ``write``, ``acknowledge``
    and ``notices`` are the TM's own work in its process; ``round_trip`` the TM's wait
    for the coordinator's answer (the pipe both ways and the coordinator's work), of
    which ``coordinator`` is what the coordinator's process says it spent."""

    write: float = 0.0
    acknowledge: float = 0.0
    notices: float = 0.0
    round_trip: float = 0.0
    coordinator: float = 0.0

    @property
    def tm(self) -> float:
        return self.write + self.acknowledge + self.notices

    @property
    def wall(self) -> float:
        return self.tm + self.round_trip


class RemoteCoordinator:
    """The coordinator's process (spawned) and the TM's end of its pipe. One process
    serves every run of a benchmark: ``start`` gives it a fresh coordinator."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, there = ctx.Pipe()
        self._proc = ctx.Process(target=coordinator_process.serve, args=(there,), daemon=True)
        self._proc.start()
        there.close()

    def call(self, req: tuple[Any, ...]) -> tuple[Any, ...]:
        conn: Connection = self._conn
        conn.send(req)
        reply: tuple[Any, ...] = conn.recv()
        if reply[0] == "error":
            raise RuntimeError(f"the coordinator's process failed:\n{reply[1]}")
        return reply

    def start(self, url: str, config: Config, tm: TmId = TM_ID) -> int:
        """A fresh coordinator over ``url`` with the job's subtask on ``tm``; the first
        checkpoint id (triggered)."""
        placement = [((SUBTASK.vertex, SUBTASK.index, SUBTASK.parallelism), tm)]
        reply = self.call(("start", url, config, VERTICES, placement, JOB_ID))
        return int(reply[1])

    def fsyncs(self) -> int:
        """``os.fsync`` calls the coordinator's process made since the last ask."""
        return int(self.call(("fsyncs",))[1])

    def metadata_size(self) -> int:
        """Bytes of the largest ``_metadata`` the coordinator holds on its storage."""
        return int(self.call(("metadata_size",))[1])

    def close(self) -> None:
        try:
            self.call(("stop",))
        except (EOFError, OSError):
            pass
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        self._conn.close()

    def __enter__(self) -> RemoteCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TmJob:
    """One TM of the job in this process and a fresh coordinator in ``coordinator``'s.

    ``storage``: an fsspec file system, ``root`` the job's root in it; ``coordinator_url``
    where the coordinator's storage is (the same directory on a local disk; on
    ``memory://`` the coordinator's process has a memory of its own, where it writes
    ``_metadata``, as a real coordinator writes to storage the TM never reads)."""

    def __init__(
        self,
        coordinator: RemoteCoordinator,
        storage: Any,
        root: str,
        coordinator_url: str,
        config: Config,
        ids: IdSource | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.tm = TaskManager.alone(storage, root, config, JOB_ID, TM_ID, ids=ids)
        self.tm.host([SUBTASK])
        self.next = coordinator.start(coordinator_url, config)

    def settle(self) -> None:
        """Wait for the TM's background deletes, so a timing holds the work it caused."""
        self.tm.catalog.storage.drain()

    def cycles(
        self, checkpoints: int, segments: int, size: int, phases: TmPhases | None = None
    ) -> None:
        """``checkpoints`` whole checkpoint cycles (see the module docstring)."""
        tm, coordinator = self.tm, self.coordinator
        clock = time.perf_counter
        data = bytes(size)
        kind = StateKind.KEYED_SHARED
        for _ in range(checkpoints):
            cp = self.next
            t0 = clock()
            for i in range(segments):
                tm.write(SUBTASK, cp, kind, f"{cp}-{i}.sst", size, 1, data)
            t1 = clock()
            ack = encode_message(tm.acknowledge(SUBTASK, cp)[1])
            t2 = clock()
            reply = coordinator.call(("acks", [ack], True))
            t3 = clock()
            for to, raw in reply[1]:
                msg = decode_message(raw)
                if to != TM_ID or not isinstance(msg, CheckpointComplete | CheckpointAborted):
                    raise AssertionError(f"unexpected notice for {to}: {msg}")
                tm.on_notice(msg)
            self.settle()
            t4 = clock()
            self.next = int(reply[2])
            if phases is not None:
                phases.write += t1 - t0
                phases.acknowledge += t2 - t1
                phases.round_trip += t3 - t2
                phases.coordinator += float(reply[3])
                phases.notices += t4 - t3
