"""Where the streaming job meets the checkpoint store: the only module of ``pipeline.stream``
that imports ``fastimpl``.

Two parties, as Flink has them. On a worker, a subtask's snapshot code talks to a
``TaskManagerSide``: it writes state, reuses shared state uploaded before, acknowledges
(an encoded message, handed to the driver through Spark's ``collect``), reads back what a
restore needs, and applies the coordinator's notices. On the driver, the job talks to a
``CoordinatorSide``: it triggers a checkpoint per micro-batch, receives the
acknowledgements, completes (its notices travel to the workers with the next batch's
tasks) and says what each subtask restores from (an encoded ``RestoreAssignment``).
Everything that crosses Spark is bytes, so every other module is the same whichever
implementation sits behind these two protocols.

The implementation here relays: the worker side records its writes and reuses, and its
acknowledgement carries them (with the bytes of what it wrote) to the driver, which
replays them on the in-process ``fastimpl.api.CheckpointStore`` in the order written, then
acknowledges there. The store therefore writes the files a task manager would (the same
count, names, merging and deletes), from the driver's process. It reads directly from
storage on the worker, as a restoring task manager does. When fastimpl's TaskManager and
Coordinator parties exist (issue 17's second part), ``TaskManagerRecipe.open`` builds a
real TaskManager in the worker and ``InProcessCoordinator`` gives way to the Coordinator:
no other module changes.
"""

from __future__ import annotations

import json
import posixpath
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import fsspec  # type: ignore[import-untyped]
from attrs import field, frozen

from fastimpl.api import CheckpointStore
from spec import codec
from spec.config import Config, JobSpec, RestoreMode, StateKind, VertexSpec
from spec.handles import SegmentHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.messages import (
    CheckpointComplete,
    RestoreAssignment,
    decode_message,
    encode_message,
)

VERTEX = "count"
"""The keyed stage's name: the vertex of the job's checkpoints."""


class CheckpointNotCompleted(RuntimeError):
    """The coordinator could not complete a checkpoint (a subtask declined or did not
    acknowledge, or writing ``_metadata`` failed): it is aborted, and the micro-batch
    must be run again from the previous one."""


class RelayError(ValueError):
    """Bytes that are not a relayed acknowledgement (truncated, foreign, inconsistent)."""


class TaskManagerSide(Protocol):
    """The worker's half: one subtask attempt's writes for one checkpoint at a time."""

    def apply_notices(self, notices: Sequence[bytes]) -> None:
        """Apply the coordinator's notices (completes, aborts), oldest first."""

    def write(
        self, checkpoint: int, subtask: SubtaskId, kind: StateKind, name: str, data: bytes
    ) -> StateEntry | None:
        """Write one piece of state (its scope follows ``kind``: SHARED for
        ``KEYED_SHARED``, EXCLUSIVE otherwise). The entry it will be acknowledged as, or
        ``None`` when the party decides that only at the acknowledgement (relayed)."""

    def reuse(self, checkpoint: int, subtask: SubtaskId, entry: StateEntry) -> StateEntry | None:
        """Reuse shared state a completed checkpoint holds (``entry``, from the restore
        assignment): the entry acknowledged for it, or ``None`` as for ``write``."""

    def acknowledge(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        """The encoded acknowledgement of everything written for ``checkpoint``."""

    def decline(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        """The encoded refusal of ``checkpoint``: nothing written for it is acknowledged."""

    def read(self, entry: StateEntry) -> bytes:
        """The bytes of a state entry (from a restore assignment), read from storage."""


class CoordinatorSide(Protocol):
    """The driver's half: one checkpoint per micro-batch."""

    def trigger(self) -> int:
        """Start a checkpoint; its id."""

    def receive(self, message: bytes) -> None:
        """An acknowledgement or a decline from ``TaskManagerSide``."""

    def complete(self, checkpoint: int) -> list[bytes]:
        """Complete ``checkpoint``; the notices for the workers. Raises
        ``CheckpointNotCompleted`` (the checkpoint is then aborted)."""

    def abort(self, checkpoint: int) -> None:
        """Give ``checkpoint`` up (its batch failed)."""

    def restore_assignment(self, subtask: SubtaskId, checkpoint: int) -> bytes:
        """An encoded ``RestoreAssignment``: what ``subtask`` holds in the latest completed
        checkpoint, for a task that writes ``checkpoint`` next (reused from a local DB
        that is at that checkpoint, or downloaded when there is none)."""

    def task_manager_recipe(self) -> TaskManagerRecipe:
        """What a worker needs to build its ``TaskManagerSide`` (picklable)."""

    @property
    def job_id(self) -> str:
        """The running job (a restore or a recovery starts a new one, R70)."""

    def restoring(self) -> bool:
        """Whether the job still starts from a restored checkpoint (no checkpoint of its
        own completed yet): nothing restored is reused then, the next checkpoint uploads
        everything (R71)."""

    def rescale(self, parallelism: int, mode: RestoreMode | None = None) -> None:
        """Restore the latest completed checkpoint into a new job whose keyed stage has
        ``parallelism`` subtasks (``mode``: the configured one by default)."""

    def read(self, entry: StateEntry) -> bytes:
        """The bytes of a state entry of a restore assignment (the driver reads the
        operator state back after a restart)."""

    def settle(self) -> None:
        """Wait until the deletes already decided are carried out (for figures: what
        storage holds then is what the retained checkpoints need, plus what merging
        keeps)."""

    def violations(self, *, quiet: bool = False) -> list[str]:
        """The store's invariants (I1-I5, and I6 when ``quiet``) checked on the real
        files; empty when they hold."""

    def close(self) -> None:
        """Finish queued deletes; checkpoints stay on storage."""


def open_coordinator(
    url: str,
    config: Config,
    parallelism: int,
    *,
    num_tms: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    crashed_job: str | None = None,
) -> CoordinatorSide:
    """The coordinator of a new job on ``url`` whose keyed stage has ``parallelism``
    subtasks hosted by ``num_tms`` TMs (default: one per subtask). With ``crashed_job``
    the job continues one whose driver died: the store recovers it from the persisted
    ``_metadata`` (a new job that claims the latest completed checkpoint, and deletes
    what the crashed one left unfinished)."""
    job = JobSpec((VertexSpec(VERTEX, parallelism),), num_tms=num_tms or parallelism)
    if crashed_job is None:
        store = CheckpointStore(url, config, job, storage_options=storage_options)
        return InProcessCoordinator(store, storage_options, url=url)
    store, report = CheckpointStore.recover(
        url, config, job, crashed_job=crashed_job, storage_options=storage_options
    )
    co = InProcessCoordinator(store, storage_options, url=url)
    co.restored_from = report.checkpoints[-1] if report.checkpoints else 0
    return co


@frozen
class TaskManagerRecipe:
    """A worker's ``TaskManagerSide``, built in the worker's process from storage and
    job identity alone (it travels in the task's closure)."""

    url: str
    job: str
    storage_options: Mapping[str, Any] = field(factory=dict)

    def open(self, attempt: str) -> TaskManagerSide:
        return RelayedTaskManager(self, attempt)


# ---------------------------------------------------------------------------- the relay

_MAGIC = b"ckpt-relay-1\n"
_KINDS = frozenset(k.value for k in StateKind)
_LEN = struct.Struct(">I")


def _encode_relay(header: dict[str, Any], payloads: Sequence[bytes]) -> bytes:
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return b"".join([_MAGIC, _LEN.pack(len(head)), head, *payloads])


def _decode_relay(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """The header and the payloads of a relayed message; ``RelayError`` for anything
    else, before anything is replayed."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _LEN.size:
        raise RelayError("not a relayed acknowledgement (no ckpt-relay-1 header)")
    at = len(_MAGIC)
    (n,) = _LEN.unpack_from(data, at)
    at += _LEN.size
    try:
        header = json.loads(data[at : at + n].decode())
    except (UnicodeDecodeError, ValueError) as err:
        raise RelayError(f"relayed acknowledgement: unreadable header: {err}") from None
    if not isinstance(header, dict) or not isinstance(header.get("ops"), list):
        raise RelayError("relayed acknowledgement: the header is not an object with ops")
    at += n
    payloads: list[bytes] = []
    for i, op in enumerate(header["ops"]):
        if not isinstance(op, dict):
            raise RelayError(f"relayed acknowledgement: op {i} is not an object")
        if op.get("op") == "write":
            size = op.get("size")
            if type(size) is not int or size < 0 or at + size > len(data):
                raise RelayError(f"relayed acknowledgement: op {i}: size {size!r} overruns")
            payloads.append(data[at : at + size])
            at += size
    if at != len(data):
        raise RelayError(f"relayed acknowledgement: {len(data) - at} bytes after the last op")
    return header, payloads


class RelayedTaskManager:
    """``TaskManagerSide`` that writes nothing itself: its acknowledgement carries the
    writes and reuses to the driver (see the module docstring)."""

    def __init__(self, recipe: TaskManagerRecipe, attempt: str) -> None:
        self.recipe = recipe
        self.attempt = attempt
        self._ops: dict[tuple[int, SubtaskId], list[tuple[dict[str, Any], bytes | None]]] = {}
        self.notices_applied = 0
        fs, root = fsspec.core.url_to_fs(recipe.url, **dict(recipe.storage_options))
        self._fs = fs
        self._root = str(root).rstrip("/")

    def apply_notices(self, notices: Sequence[bytes]) -> None:
        # The store applied them on the driver already; decoding checks they are messages.
        for n in notices:
            decode_message(n)
            self.notices_applied += 1

    def write(
        self, checkpoint: int, subtask: SubtaskId, kind: StateKind, name: str, data: bytes
    ) -> StateEntry | None:
        op = {"op": "write", "kind": kind.value, "name": name, "size": len(data)}
        self._ops.setdefault((checkpoint, subtask), []).append((op, bytes(data)))
        return None

    def reuse(self, checkpoint: int, subtask: SubtaskId, entry: StateEntry) -> StateEntry | None:
        op = {"op": "reuse", "name": entry.name}
        self._ops.setdefault((checkpoint, subtask), []).append((op, None))
        return None

    def acknowledge(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        ops = self._ops.pop((checkpoint, subtask), [])
        header = {
            "checkpoint": checkpoint,
            "subtask": codec.encode(subtask),
            "attempt": self.attempt,
            "declined": False,
            "ops": [op for op, _ in ops],
        }
        return _encode_relay(header, [d for _, d in ops if d is not None])

    def decline(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        self._ops.pop((checkpoint, subtask), None)
        header = {
            "checkpoint": checkpoint,
            "subtask": codec.encode(subtask),
            "attempt": self.attempt,
            "declined": True,
            "ops": [],
        }
        return _encode_relay(header, [])

    def read(self, entry: StateEntry) -> bytes:
        s = stream_of(entry.handle)
        if s is None:
            raise ValueError(f"{entry.name!r}: {type(entry.handle).__name__} names no bytes")
        path = s.path
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{entry.name!r}: handle path {path!r} is not inside the base")
        offset = s.offset if isinstance(s, SegmentHandle) else 0
        full = posixpath.join(self._root, path) if self._root else path
        data = bytes(self._fs.cat_file(full, start=offset, end=offset + s.length))
        if len(data) != s.length:
            raise ValueError(
                f"{entry.name!r}: wanted {s.length} bytes at {offset} of {path}, got {len(data)}"
            )
        return data


class InProcessCoordinator:
    """``CoordinatorSide`` over the in-process store: replays relayed acknowledgements on
    the TM that hosts each subtask, and completes with the store's coordinator."""

    def __init__(
        self,
        store: CheckpointStore,
        storage_options: Mapping[str, Any] | None = None,
        url: str | None = None,
    ) -> None:
        self.store = store
        self._url = url
        self._storage_options = dict(storage_options or {})
        self.received: dict[int, set[SubtaskId]] = {}
        self.restored_from = 0
        """The checkpoint the job was restored from (0: none): what a subtask's local DB
        must be at to be taken up while the job is restoring."""

    @property
    def job_id(self) -> str:
        return self.store.job_id

    def restoring(self) -> bool:
        retained = self.store.coordinator.retained()
        return self.restored_from > 0 and (not retained or retained[-1].job != self.job_id)

    def rescale(self, parallelism: int, mode: RestoreMode | None = None) -> None:
        retained = self.store.coordinator.retained()
        if not retained:
            raise CheckpointNotCompleted("no completed checkpoint to rescale from")
        latest = retained[-1].checkpoint
        self.store.coordinator.rescale(latest, {VERTEX: parallelism}, mode=mode)
        self.store.deliver_notifications()
        self.restored_from = latest

    def read(self, entry: StateEntry) -> bytes:
        return self.store.read(entry)

    def task_manager_recipe(self) -> TaskManagerRecipe:
        if self._url is None:
            raise ValueError("the coordinator was made without the storage url")
        return TaskManagerRecipe(self._url, self.store.job_id, self._storage_options)

    def trigger(self) -> int:
        c = self.store.coordinator.trigger()
        self.received[c] = set()
        return c

    def receive(self, message: bytes) -> None:
        header, payloads = _decode_relay(message)
        try:
            checkpoint = header["checkpoint"]
            subtask = codec.decode(SubtaskId, header["subtask"], "$.subtask")
            declined = header["declined"]
        except (KeyError, codec.CodecError) as err:
            raise RelayError(f"relayed acknowledgement: bad header: {err}") from None
        if type(checkpoint) is not int or type(declined) is not bool:
            raise RelayError("relayed acknowledgement: bad checkpoint or declined field")
        if declined:
            self.store.coordinator.decline(checkpoint, subtask)
            return
        for i, op in enumerate(header["ops"]):  # all checked before the first is replayed
            ok = op.get("op") == "reuse" or (op.get("op") == "write" and op.get("kind") in _KINDS)
            if not ok or not isinstance(op.get("name"), str) or not op["name"]:
                raise RelayError(f"relayed acknowledgement: op {i} is not a write or reuse: {op}")
        manager = self.store.manager_for(subtask)
        data = iter(payloads)
        for op in header["ops"]:
            if op["op"] == "write":
                manager.write(checkpoint, subtask, StateKind(op["kind"]), op["name"], next(data))
            else:
                manager.reuse_shared(checkpoint, subtask, op["name"])
        manager.acknowledge(checkpoint, subtask)
        self.received.setdefault(checkpoint, set()).add(subtask)

    def complete(self, checkpoint: int) -> list[bytes]:
        if checkpoint in self.received and checkpoint not in self.store.coordinator.pending():
            # The store aborted it while receiving: a subtask declined, or an acknowledgement
            # reused shared state whose registry entry is gone (R22, a late confirmation:
            # tests/test_stream_reuse_races.py). The caller re-runs the batch on this error,
            # so it must be this one and not the store's refusal to complete.
            self.received.pop(checkpoint, None)
            raise CheckpointNotCompleted(
                f"checkpoint {checkpoint} was aborted before it could complete"
            )
        done = self.store.coordinator.complete(checkpoint)
        self.received.pop(checkpoint, None)
        if done is None:
            raise CheckpointNotCompleted(f"checkpoint {checkpoint} did not complete (aborted)")
        self.store.deliver_notifications()
        retained = [r.checkpoint for r in self.store.coordinator.retained()]
        subsumed = min(retained) - 1 if retained else 0
        return [encode_message(CheckpointComplete(self.store.job_id, checkpoint, subsumed, False))]

    def abort(self, checkpoint: int) -> None:
        if checkpoint in self.store.coordinator.pending():
            self.store.coordinator.abort(checkpoint)
            self.store.deliver_notifications()
        self.received.pop(checkpoint, None)

    def restore_assignment(self, subtask: SubtaskId, checkpoint: int) -> bytes:
        retained = self.store.coordinator.retained()
        latest = retained[-1] if retained else None
        restoring = self.restoring()
        # While restoring: the subtask's share of the restored checkpoint (cut by key
        # groups after a rescale, R75); then its entries of the job's latest checkpoint.
        source = (
            self.store.manager_for(subtask).state_to_restore(subtask)
            if restoring
            else (() if latest is None else latest.entries)
        )
        entries = tuple(
            e for e in source if e.subtask == subtask and stream_of(e.handle) is not None
        )
        referenced = frozenset(
            s.path for r in retained for e in r.entries if (s := stream_of(e.handle)) is not None
        )
        tm = self.store.placement()[subtask]
        return encode_message(
            RestoreAssignment(
                self.store.job_id,
                subtask,
                tm,
                entries,
                referenced,
                checkpoint,
                self.restored_from if restoring or latest is None else latest.checkpoint,
                min(r.checkpoint for r in retained) - 1 if retained else 0,
            )
        )

    def settle(self) -> None:
        self.store.flush()

    def violations(self, *, quiet: bool = False) -> list[str]:
        self.store.flush()
        return [str(v) for v in self.store.check_invariants(quiet=quiet)]

    def close(self) -> None:
        self.store.close()


def decode_assignment(data: bytes) -> RestoreAssignment:
    """A ``RestoreAssignment`` from ``CoordinatorSide.restore_assignment``."""
    msg = decode_message(data)
    if not isinstance(msg, RestoreAssignment):
        raise ValueError(f"expected a RestoreAssignment, got a {type(msg).__name__}")
    return msg
