"""A TaskManager in an OS process of its own, for the multi-process tests (issue 16).

``serve`` runs in a process started with multiprocessing's "spawn" (a fresh
interpreter: nothing of the test process is inherited). It builds the TM from only the
storage URL, the config, the job id and its TM id (``TaskManager.alone``) and answers
requests on its end of a pipe. What crosses the pipe from the coordinator is encoded
``spec.messages`` bytes (notices in; acknowledgements and declines out). The other
requests stand for what reaches a TM inside its own process in a real engine: the task
writing state and acknowledging (Flink's barrier, with its checkpoint type), the engine
saying which subtasks run here, and, for the test's observation only, a snapshot of the
TM's own records.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

from fastimpl.storage import StorageFault
from fastimpl.taskmanager import TaskManager
from spec.config import Config, StateKind
from spec.effects import tm_actor
from spec.handles import FileHandle
from spec.ids import SubtaskId, TmId
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    Decline,
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
        "claims": claims,
        "ref_counts": {p: pf.ref_count for p, pf in tm.m.pfiles.items()},
        "live": live,
        "pool_files": sorted(tm.m.pools.values()),
        "deletions": list(cat.deletions or ()),
        "pending": [d.path for d in cat.deferred] + sorted(cat.storage.failed_deletes),
        "refused": [r.path for r in cat.refused_deletes],
    }


def serve(conn: Connection, storage: Any, root: str, config: Config, job: str, tm_id: TmId) -> None:
    """``storage``: a URL (``root`` "") or an fsspec file system (pickled across)."""
    tm = TaskManager.alone(storage, root, config, job, tm_id)
    tm.catalog.keep_deletion_log()  # the test checks I2 and I5 over the whole history
    while True:
        req = conn.recv()
        op = req[0]
        if op == "stop":
            tm.catalog.storage.drain()
            conn.send(("ok",))
            return
        if op == "host":
            tm.host([SubtaskId(v, i, p) for v, i, p in req[1]])
            conn.send(("ok",))
        elif op == "notice":
            msg = decode_message(req[1])
            assert isinstance(msg, CheckpointComplete | CheckpointAborted), msg
            tm.on_notice(msg)
            conn.send(("ok",))
        elif op == "write":
            _, (v, i, p), checkpoint, kind, name, data, savepoint = req
            subtask = SubtaskId(v, i, p)
            try:
                tm.write(subtask, checkpoint, StateKind(kind), name, len(data), 1, data, savepoint)
            except StorageFault:
                tm.write_failed(subtask, checkpoint, savepoint)
                conn.send(("decline", encode_message(Decline(job, checkpoint, subtask, tm_id))))
            else:
                conn.send(("ok",))
        elif op == "ack":
            _, (v, i, p), checkpoint, savepoint = req
            subtask = SubtaskId(v, i, p)
            try:
                _, ack = tm.acknowledge(subtask, checkpoint, savepoint)
            except StorageFault:
                conn.send(("decline", encode_message(Decline(job, checkpoint, subtask, tm_id))))
            else:
                conn.send(("ack", encode_message(ack)))
        elif op == "records":
            conn.send(("records", records(tm)))
        else:
            conn.send(("error", f"unknown request {op!r}"))
