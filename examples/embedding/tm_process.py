"""One TM process of the example engine: a ``TaskManager`` built with ``alone`` and the
operators it runs, answering the engine's requests on its end of a pipe.

What the store's parties say to each other crosses the pipe as encoded ``spec.messages``
bytes only: notices and duties in, acknowledgements, declines and duty answers out. The
other requests are the engine's own, not the store's: which subtasks run here (Flink's
task deployment), a checkpoint barrier reaching the subtasks (``snapshot``: they write
their state) and the end of the barrier's asynchronous part (``acknowledge``), and
``stop``. The two are split so the engine can kill a TM between them.

The operators are small stand-ins with the state shapes of a real job: ``source``
subtasks keep a read offset (operator list state, written whole every checkpoint), and
``window`` subtasks keep RocksDB-like incremental keyed state: every checkpoint adds one
SST file, a compaction keeps the newest ``LIVE_SSTS``, and an SST already uploaded is
reused (R20-R23) rather than written again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

import fsspec  # type: ignore[import-untyped]

from fastimpl.parties import (
    CheckpointAborted,
    CheckpointComplete,
    CommandError,
    Decline,
    Duty,
    Storage,
    StorageFault,
    TaskManager,
    TmAssignment,
    decode_message,
    encode_message,
)
from spec.config import Config, StateKind
from spec.handles import InlineHandle, StateEntry, extent_of, stream_of
from spec.ids import SubtaskId, TmId

LIVE_SSTS = 3
"""SST files a window subtask's database keeps after compaction."""
SST_BYTES = 3000

Sub = tuple[str, int, int]
"""A subtask as it crosses the pipe: (vertex, index, parallelism)."""


def as_sub(s: SubtaskId) -> Sub:
    return (s.vertex, s.index, s.parallelism)


def sst_bytes(subtask: SubtaskId, checkpoint: int) -> bytes:
    """An SST's contents, derived from its name so a restored one can be checked."""
    seed = hashlib.sha256(f"{subtask}/{checkpoint}".encode()).digest()
    return (seed * (SST_BYTES // len(seed) + 1))[:SST_BYTES]


class Operators:
    """The local state of the subtasks of one TM process: what its operators would
    hold in memory and on local disk."""

    def __init__(self) -> None:
        self.offsets: dict[SubtaskId, int] = {}
        self.ssts: dict[SubtaskId, dict[str, bytes]] = {}
        """Each window subtask's live SST files by name, oldest first."""

    def advance(self, s: SubtaskId, checkpoint: int) -> None:
        """The records a subtask processed before the barrier of ``checkpoint``."""
        if s.vertex == "source":
            self.offsets[s] = self.offsets.get(s, 0) + 1000
        else:
            db = self.ssts.setdefault(s, {})
            db[f"{checkpoint:06d}.sst"] = sst_bytes(s, checkpoint)
            while len(db) > LIVE_SSTS:  # compaction: the oldest file is no longer live
                del db[next(iter(db))]

    def restore(
        self, hosted: Iterable[SubtaskId], entries: Iterable[StateEntry], read: Storage
    ) -> dict[str, int]:
        """R61: the subtasks start from the latest completed checkpoint's entries, read
        back from storage (a real backend downloads its SST files the same way).
        Returns what was restored per subtask, for the narrative."""
        mine = set(hosted)
        for s in mine:
            self.offsets.pop(s, None)
            self.ssts.pop(s, None)
        restored: dict[str, int] = {}
        for e in sorted(entries, key=lambda e: (str(e.subtask), e.name)):
            if e.subtask not in mine:
                continue
            if isinstance(e.handle, InlineHandle):  # R107: small state is in the handle
                data = e.handle.content()
            elif (stream := stream_of(e.handle)) is not None:
                data = read.read_range(*extent_of(stream))
            else:
                continue
            if e.kind is StateKind.OPERATOR_LIST:
                self.offsets[e.subtask] = int(data.decode())
            elif e.kind is StateKind.KEYED_SHARED:
                checkpoint = int(e.name.split(".")[0])
                if data != sst_bytes(e.subtask, checkpoint):
                    raise RuntimeError(f"{e.subtask} restored other bytes for {e.name}")
                self.ssts.setdefault(e.subtask, {})[e.name] = data
            restored[str(e.subtask)] = restored.get(str(e.subtask), 0) + len(data)
        for db in self.ssts.values():  # oldest first, as the database keeps them
            ordered = dict(sorted(db.items()))
            db.clear()
            db.update(ordered)
        return restored


class TmProcess:
    """The TM party and its operators, answering the engine's requests."""

    def __init__(
        self, url: str, config: Config, job: str, tm: TmId, first: int, finished_mark: int | None
    ) -> None:
        self.job = job
        self.tm_id = tm
        # R66: a replacement attempt must not write for checkpoints already over
        self.tm = TaskManager.alone(
            url, "", config, job, tm, first_checkpoint=first, finished_mark=finished_mark or 0
        )
        fs, root = fsspec.core.url_to_fs(url)
        self.read = Storage(fs, root)
        """A reader of restored state: the TM's own storage is not public."""
        self.ops = Operators()
        self.hosted: list[SubtaskId] = []
        """What the engine runs here: its ``host`` request, or a ``TmAssignment``."""

    def handle(self, req: tuple[Any, ...]) -> tuple[Any, ...]:
        op = req[0]
        if op == "host":
            self.hosted = sorted((SubtaskId(*s) for s in req[1]), key=as_sub)
            self.tm.host(self.hosted)
            return ("ok",)
        if op == "notice":
            notice = decode_message(req[1])
            assert isinstance(notice, CheckpointComplete | CheckpointAborted), notice
            self.tm.on_notice(notice)
            self.tm.flush()  # what the notice let go is gone before the reply
            return ("ok",)
        if op == "duty":
            return self.duty(req[1])
        if op == "snapshot":
            return self.snapshot(req[1])
        if op == "acknowledge":
            return self.acknowledge(req[1])
        if op == "stop":
            self.tm.flush()  # a queued delete would die with the process
            return ("stopped",)
        return ("error", f"unknown request {op!r}")

    def duty(self, data: bytes) -> tuple[Any, ...]:
        msg = decode_message(data)
        if not isinstance(msg, Duty):
            return ("error", f"{type(msg).__name__} is not a duty")
        answer = self.tm.on_duty(msg)
        self.tm.flush()
        restored: dict[str, int] = {}
        if isinstance(msg, TmAssignment):  # R60, R61: the subtasks restart from it
            self.hosted = sorted(msg.hosted, key=as_sub)
            entries = () if msg.latest is None else msg.latest.entries
            restored = self.ops.restore(msg.hosted, entries, self.read)
        reply = None if answer is None else encode_message(answer)
        return ("answer", reply, restored)

    def decline(self, s: SubtaskId, checkpoint: int) -> bytes:
        """R17: the subtask writes no more for the checkpoint; the coordinator aborts it."""
        self.tm.write_failed(s, checkpoint)
        return encode_message(Decline(self.job, checkpoint, s, self.tm_id))

    def snapshot(self, checkpoint: int) -> tuple[Any, ...]:
        """The barrier reaches every hosted subtask: each writes its state. Returns the
        declines (encoded) and, for the narrative, the uploads and reuses."""
        declines: list[bytes] = []
        uploaded = reused = 0
        for s in self.hosted:
            if self.tm.finished(checkpoint, False) or self.tm.acknowledged(s, checkpoint):
                continue  # R56: over for this TM; nothing is written
            self.ops.advance(s, checkpoint)
            try:
                if s.vertex == "source":
                    data = str(self.ops.offsets[s]).encode()
                    self.tm.write(
                        s, checkpoint, StateKind.OPERATOR_LIST, "offsets", len(data), 1, data
                    )
                    uploaded += 1
                    continue
                for name, data in self.ops.ssts[s].items():
                    if self.reuse(s, checkpoint, name):
                        reused += 1
                    else:  # new since the last checkpoint, or not reusable (R20)
                        self.tm.write(
                            s, checkpoint, StateKind.KEYED_SHARED, name, len(data), 1, data
                        )
                        uploaded += 1
            except StorageFault:
                declines.append(self.decline(s, checkpoint))
        return ("written", declines, uploaded, reused)

    def reuse(self, s: SubtaskId, checkpoint: int, name: str) -> bool:
        """R21, R22: whether the SST's earlier upload is referenced again."""
        try:
            ref = self.tm.backend_ref(s, name)
        except CommandError:
            return False  # never uploaded by this attempt nor restored
        return self.tm.reuse(s, checkpoint, ref) is not None

    def acknowledge(self, checkpoint: int) -> tuple[Any, ...]:
        """Every hosted subtask's acknowledgement (or decline), encoded."""
        out: list[bytes] = []
        for s in self.hosted:
            if self.tm.finished(checkpoint, False) or self.tm.acknowledged(s, checkpoint):
                continue
            try:
                _, ack = self.tm.acknowledge(s, checkpoint)
            except StorageFault:
                out.append(self.decline(s, checkpoint))
                continue
            out.append(encode_message(ack))
        self.tm.flush()
        return ("acks", out)


def serve(
    conn: Connection,
    url: str,
    config: Config,
    job: str,
    tm: TmId,
    first: int,
    finished_mark: int | None,
) -> None:
    """The process's main loop (multiprocessing's "spawn" target): nothing of the
    engine's process is inherited, only these arguments."""
    process = TmProcess(url, config, job, tm, first, finished_mark)
    while True:
        req = conn.recv()
        conn.send(process.handle(req))
        if req[0] == "stop":
            return
