"""A TaskManager in an OS process of its own, for the multi-process tests (issue 16).

``serve`` runs in a process started with multiprocessing's "spawn" (a fresh
interpreter: nothing of the test process is inherited). It builds the TM from only the
storage URL, the config, the job id and its TM id (``TaskManager.alone``) and answers
requests on its end of a pipe. What crosses the pipe from the coordinator is encoded
``spec.messages`` bytes (notices and duties in; acknowledgements, declines and the
answer to ``EndJob`` out). The other requests stand for what reaches a TM inside its own
process in a real engine: the task writing state and acknowledging (Flink's barrier,
with its checkpoint type), the engine saying which subtasks run here, and, for the
test's observation only, a snapshot of the TM's own records.

A kill point (``("die", k, kind)``, a hook on the TM's storage: ``KillPoint``) makes the
process kill itself with SIGKILL at its k-th storage call of that kind (``append``,
``delete``, ``any``) from then on: a create, an append (after half the bytes reached
storage), a close, or a delete. So a TM dies
during a write or while deleting at a point the process reaches by itself; between two
calls (after a write, before its acknowledgement) the test kills it from outside.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from fastimpl.ids import IdSource
from fastimpl.reports import report_of
from fastimpl.storage import StorageFault
from fastimpl.storage_hooks import HookedStorage, StorageCall, StorageHooks
from fastimpl.taskmanager import TaskManager
from spec.commands import StorageOp
from spec.config import Config, StateKind
from spec.errors import Reason
from spec.handles import stream_of
from spec.ids import SubtaskId, TmId
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    Decline,
    Duty,
    decode_message,
    encode_message,
)


def records(tm: TaskManager) -> str:
    """What the TM's own records say (``fastimpl.reports.TmReport``), encoded: the test
    merges them with the coordinator's into one ``Observation``."""
    return report_of(tm).to_json()


def _sigkill() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("SIGKILL returned")  # never reached


class KillPoint(StorageHooks):
    """Counts the TM's storage calls of the armed kind (``append``, ``delete`` or any);
    at the armed one the process dies (``die``: SIGKILL itself, by default). The TM's
    storage calls it (``fastimpl.storage_hooks``): nothing of the storage is patched."""

    def __init__(self, die: Callable[[], NoReturn] = _sigkill) -> None:
        self.left: int | None = None
        self.kind = "any"
        self.die = die

    def arm(self, calls: int | None, kind: str) -> None:
        self.left, self.kind = calls, kind

    def _reached(self, name: str) -> bool:
        if self.left is None or self.kind not in ("any", name.split("_")[0]):
            return False
        self.left -= 1
        return self.left <= 0

    def before(
        self, storage: HookedStorage, call: StorageCall, path: str, data: bytes | memoryview | None
    ) -> None:
        if self._reached(call.value):
            if call is StorageCall.APPEND:  # half the bytes reach storage, then the crash (R65)
                assert data is not None
                half = len(data) // 2
                storage.append_unobserved(path, half, bytes(data)[:half])
            self.die()


def _refusal(tm: TaskManager, subtask: SubtaskId, checkpoint: int, savepoint: bool) -> str | None:
    """The engine's checks of a write or acknowledgement that only the TM can make (its
    own knowledge, R56): the ``Reason`` value, or None."""
    if tm.finished(checkpoint, savepoint):
        return Reason.CHECKPOINT_FINISHED_FOR_TM.value
    if tm.acknowledged(subtask, checkpoint):
        return Reason.ALREADY_ACKNOWLEDGED.value
    return None


LocalCopies = dict[tuple[str, int], bytes]
"""The bytes of each upload this process made, by its stream's (path, offset): the local
state a backend uploads again when an old upload may not be reused (a RocksDB backend's
SST files on local disk)."""


def _reuse(
    tm: TaskManager,
    subtask: SubtaskId,
    checkpoint: int,
    name: str,
    savepoint: bool,
    job: str,
    tm_id: TmId,
    local: LocalCopies,
) -> tuple[Any, ...]:
    """R20-R23, as the in-process engine's ``reuse_shared``: the old handle, a placeholder,
    or the same bytes uploaded again. The bytes come from the process's own copy of what
    it uploaded, as a backend's do from its local files: storage may not give them back,
    since the old upload may lie in a pooled file still open on an object store (not
    written before it is closed, R12) or in one the store deleted (its checkpoint aborted),
    and the model re-uploads in both cases (R20; the soak's seed 1008-within-s3). State
    this process restored and never wrote is read back from the retained checkpoint's
    file, which exists (I1)."""
    why = _refusal(tm, subtask, checkpoint, savepoint)
    if why is None and (subtask, name) not in tm.backend:
        why = Reason.NO_SUCH_STATE.value
    if why is not None:
        return ("refused", why)
    ref = tm.backend_ref(subtask, name)
    if tm.reuse(subtask, checkpoint, ref, savepoint) is not None:
        return ("ok",)
    old = ref.entry
    stream = stream_of(old.handle)
    storage = tm.catalog.storage
    try:
        data = b""
        if stream is not None and stream.length > 0:
            at = getattr(stream, "offset", 0)
            copy = local.get((stream.path, at))
            data = copy if copy is not None else storage.read_range(stream.path, at, stream.length)
        _write(tm, local, subtask, checkpoint, old.kind, old.name, old.entries, data, savepoint)
    except StorageFault as fault:
        tm.write_failed(subtask, checkpoint, savepoint)
        decline = encode_message(Decline(job, checkpoint, subtask, tm_id))
        return ("decline", decline, fault.op.value)
    return ("ok",)


def _write(
    tm: TaskManager,
    local: LocalCopies,
    subtask: SubtaskId,
    checkpoint: int,
    kind: StateKind,
    name: str,
    entries: int,
    data: bytes,
    savepoint: bool,
) -> None:
    """A write, whose bytes the process keeps (``LocalCopies``)."""
    entry = tm.write(subtask, checkpoint, kind, name, len(data), entries, data, savepoint)
    stream = stream_of(entry.handle)
    if stream is not None and kind is StateKind.KEYED_SHARED:
        local[(stream.path, getattr(stream, "offset", 0))] = data


class TmServer:
    """One TM attempt answering the requests of ``serve`` (the module docstring), in
    whatever process holds it: ``serve``'s spawned one, or a test's own (``die`` then
    raises instead of killing the process)."""

    def __init__(
        self,
        storage: Any,
        root: str,
        config: Config,
        job: str,
        tm_id: TmId,
        first_checkpoint: int = 1,
        finished_mark: int | None = None,
        *,
        die: Callable[[], NoReturn] = _sigkill,
        ids: IdSource | None = None,
    ) -> None:
        self.job = job
        self.tm_id = tm_id
        self.kill = KillPoint(die)
        self.tm = TaskManager.alone(
            storage, root, config, job, tm_id,
            first_checkpoint=first_checkpoint, ids=ids, hooks=self.kill,
        )  # fmt: skip
        if finished_mark is not None:
            self.tm.finished_mark = finished_mark
        self.tm.catalog.keep_deletion_log()  # the test checks I2 and I5 over the whole history
        self.local: LocalCopies = {}

    def handle(self, req: tuple[Any, ...]) -> tuple[Any, ...]:
        """The reply to ``req``."""
        tm, job, tm_id, local = self.tm, self.job, self.tm_id, self.local
        op = req[0]
        if op == "stop":
            tm.catalog.storage.drain()
            return ("ok",)
        if op == "die":
            self.kill.arm(req[1], req[2] if len(req) > 2 else "any")
            return ("ok",)
        if op == "host":
            tm.host([SubtaskId(v, i, p) for v, i, p in req[1]])
            return ("ok",)
        if op == "notice":
            msg = decode_message(req[1])
            assert isinstance(msg, CheckpointComplete | CheckpointAborted), msg
            tm.on_notice(msg)
            tm.catalog.storage.drain()  # a delete point is reached before the reply
            return ("ok",)
        if op == "duty":
            duty = decode_message(req[1])
            assert isinstance(duty, Duty), duty
            answer = tm.on_duty(duty)
            tm.catalog.storage.drain()
            return ("ok",) if answer is None else ("answer", encode_message(answer))
        if op == "write":
            _, (v, i, p), checkpoint, kind, name, data, savepoint = req
            subtask = SubtaskId(v, i, p)
            why = _refusal(tm, subtask, checkpoint, savepoint)
            if why is not None:
                return ("refused", why)  # nothing is written
            try:
                _write(tm, local, subtask, checkpoint, StateKind(kind), name, 1, data, savepoint)
            except StorageFault as fault:
                tm.write_failed(subtask, checkpoint, savepoint)
                decline = encode_message(Decline(job, checkpoint, subtask, tm_id))
                return ("decline", decline, fault.op.value)
            return ("ok",)
        if op == "ack":
            _, (v, i, p), checkpoint, savepoint = req
            subtask = SubtaskId(v, i, p)
            why = _refusal(tm, subtask, checkpoint, savepoint)
            if why is not None:
                return ("refused", why)
            try:
                _, ack = tm.acknowledge(subtask, checkpoint, savepoint)
            except StorageFault as fault:
                decline = encode_message(Decline(job, checkpoint, subtask, tm_id))
                return ("decline", decline, fault.op.value)
            tm.catalog.storage.drain()
            return ("ack", encode_message(ack))
        if op == "reuse":
            _, (v, i, p), checkpoint, name, savepoint = req
            sub = SubtaskId(v, i, p)
            return _reuse(tm, sub, checkpoint, name, savepoint, job, tm_id, local)
        if op == "arm":  # the storage's fault seam: its next call of this kind fails
            tm.catalog.storage.arm(StorageOp(req[1]))
            return ("ok",)
        if op == "disarm":  # whether the armed fault was reached, and it is gone
            storage = tm.catalog.storage
            left = [o.value for o in storage.armed]
            storage.armed.clear()
            return ("armed", left)
        if op == "retry":
            tm.catalog.retry_deletes()
            tm.catalog.storage.drain()
            return ("ok",)
        if op == "records":
            return ("records", records(tm))
        return ("error", f"unknown request {op!r}")


def serve(
    conn: Connection,
    storage: Any,
    root: str,
    config: Config,
    job: str,
    tm_id: TmId,
    first_checkpoint: int = 1,
    finished_mark: int | None = None,
) -> None:
    """``storage``: a URL (``root`` "") or an fsspec file system (pickled across)."""
    server = TmServer(storage, root, config, job, tm_id, first_checkpoint, finished_mark)
    while True:
        req = conn.recv()
        conn.send(server.handle(req))
        if req[0] == "stop":
            return
