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

A kill point (``("die", k, kind)``) makes the process kill itself with SIGKILL at its
k-th storage call of that kind (``append``, ``delete``, ``any``) from then on: a create,
an append (after half the bytes reached storage), a close, or a delete. So a TM dies
during a write or while deleting at a point the process reaches by itself; between two
calls (after a write, before its acknowledgement) the test kills it from outside.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from fastimpl.catalog import Catalog
from fastimpl.storage import Storage, StorageFault
from fastimpl.taskmanager import TaskManager
from spec.commands import StorageOp
from spec.config import Config, StateKind
from spec.effects import USER, tm_actor
from spec.errors import Reason
from spec.handles import FileHandle, stream_of
from spec.ids import SubtaskId, TmId
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    Decline,
    Duty,
    decode_message,
    encode_message,
)


def records(tm: TaskManager) -> dict[str, Any]:
    """What the TM's own records say, as plain values (the test merges them with the
    coordinator's into one ``Observation``)."""
    cat = tm.catalog
    cat.storage.drain()
    actor = tm_actor(tm.tm)
    claims: dict[str, str] = {p: actor for p in tm.m.pfiles}
    for entries in tm.outputs.values():
        for e in entries:
            if isinstance(e.handle, FileHandle):
                claims[e.handle.path] = actor
    live: dict[str, list[tuple[int, int]]] = {}
    for seg in tm.m.segs.values():
        live.setdefault(seg.path, []).append((seg.offset, seg.length))
    return {
        "owners": cat.owners(),
        "open": sorted(p for p, f in cat.files.items() if f.open),
        "dirs": dict(cat.dir_owner),
        "unrecorded_dirs": unrecorded_dirs(cat),
        "claims": claims,
        "ref_counts": {p: pf.ref_count for p, pf in tm.m.pfiles.items()},
        "live": live,
        "pool_files": sorted(tm.m.pools.values()),
        "deletions": list(cat.deletions or ()),
        "pending": [d.path for d in cat.deferred] + sorted(cat.storage.failed_deletes),
        "refused": [r.path for r in cat.refused_deletes],
    }


def unrecorded_dirs(cat: Catalog) -> list[str]:
    """The directories a party of the store owns with no ``ManagedDir`` for them. Every
    writer of such an owner records the directory too (its creator, which R64 reads when
    it is deleted, and whether it was handed over): ``Catalog.delete_dir`` and
    ``_holds_unknown_files`` read the record of every owned directory they delete. None is
    ever expected. The user's directories are left out: ``resume.rebuild`` marks one
    outside the lineage as the user's with no record, and the guard refuses to delete it
    (I5) before a record is read."""
    return sorted(d for d, o in cat.dir_owner.items() if o != USER and d not in cat.dirs)


class KillPoint:
    """Counts the TM's storage calls of the armed kind (``append``, ``delete`` or any);
    at the armed one the process SIGKILLs itself."""

    def __init__(self, storage: Storage) -> None:
        self.left: int | None = None
        self.kind = "any"
        for name in ("create", "append", "close", "delete_file", "delete_dir"):
            setattr(storage, name, self._wrap(name, getattr(storage, name)))

    def arm(self, calls: int | None, kind: str) -> None:
        self.left, self.kind = calls, kind

    def _reached(self, name: str) -> bool:
        if self.left is None or self.kind not in ("any", name.split("_")[0]):
            return False
        self.left -= 1
        return self.left <= 0

    def _wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self._reached(name):
                if name == "append":  # half the bytes reach storage, then the crash (R65)
                    path, length, data = args
                    call(path, length // 2, bytes(data)[: length // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return call(*args, **kwargs)

        return wrapped


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
    tm = TaskManager.alone(storage, root, config, job, tm_id, first_checkpoint=first_checkpoint)
    if finished_mark is not None:
        tm.finished_mark = finished_mark
    tm.catalog.keep_deletion_log()  # the test checks I2 and I5 over the whole history
    kill = KillPoint(tm.catalog.storage)
    local: LocalCopies = {}
    while True:
        req = conn.recv()
        op = req[0]
        if op == "stop":
            tm.catalog.storage.drain()
            conn.send(("ok",))
            return
        if op == "die":
            kill.arm(req[1], req[2] if len(req) > 2 else "any")
            conn.send(("ok",))
        elif op == "host":
            tm.host([SubtaskId(v, i, p) for v, i, p in req[1]])
            conn.send(("ok",))
        elif op == "notice":
            msg = decode_message(req[1])
            assert isinstance(msg, CheckpointComplete | CheckpointAborted), msg
            tm.on_notice(msg)
            tm.catalog.storage.drain()  # a delete point is reached before the reply
            conn.send(("ok",))
        elif op == "duty":
            duty = decode_message(req[1])
            assert isinstance(duty, Duty), duty
            answer = tm.on_duty(duty)
            tm.catalog.storage.drain()
            conn.send(("ok",) if answer is None else ("answer", encode_message(answer)))
        elif op == "write":
            _, (v, i, p), checkpoint, kind, name, data, savepoint = req
            subtask = SubtaskId(v, i, p)
            why = _refusal(tm, subtask, checkpoint, savepoint)
            if why is not None:
                conn.send(("refused", why))  # nothing is written
                continue
            try:
                _write(tm, local, subtask, checkpoint, StateKind(kind), name, 1, data, savepoint)
            except StorageFault as fault:
                tm.write_failed(subtask, checkpoint, savepoint)
                decline = encode_message(Decline(job, checkpoint, subtask, tm_id))
                conn.send(("decline", decline, fault.op.value))
            else:
                conn.send(("ok",))
        elif op == "ack":
            _, (v, i, p), checkpoint, savepoint = req
            subtask = SubtaskId(v, i, p)
            why = _refusal(tm, subtask, checkpoint, savepoint)
            if why is not None:
                conn.send(("refused", why))
                continue
            try:
                _, ack = tm.acknowledge(subtask, checkpoint, savepoint)
            except StorageFault as fault:
                decline = encode_message(Decline(job, checkpoint, subtask, tm_id))
                conn.send(("decline", decline, fault.op.value))
            else:
                tm.catalog.storage.drain()
                conn.send(("ack", encode_message(ack)))
        elif op == "reuse":
            _, (v, i, p), checkpoint, name, savepoint = req
            sub = SubtaskId(v, i, p)
            conn.send(_reuse(tm, sub, checkpoint, name, savepoint, job, tm_id, local))
        elif op == "arm":  # the storage's fault seam: its next call of this kind fails
            tm.catalog.storage.arm(StorageOp(req[1]))
            conn.send(("ok",))
        elif op == "disarm":  # whether the armed fault was reached, and it is gone
            storage = tm.catalog.storage
            left = [o.value for o in storage.armed]
            storage.armed.clear()
            conn.send(("armed", left))
        elif op == "retry":
            tm.catalog.retry_deletes()
            tm.catalog.storage.drain()
            conn.send(("ok",))
        elif op == "records":
            conn.send(("records", records(tm)))
        else:
            conn.send(("error", f"unknown request {op!r}"))
