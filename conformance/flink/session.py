"""The adapter: our task-manager commands as calls on Flink 2.3's ``FileMergingSnapshotManager``
(one manager per TM attempt, as Flink's TaskExecutor keeps one per job), with the reference
model as the coordinator stand-in (``profile``).

Each command first runs on the stand-in: it decides refusals (the coordinator's guards) and
what messages reach which TM. Then the TM side runs on Flink:

* ``Trigger``: ``notifyCheckpointStart`` for every subtask of a live TM;
* ``WriteState``: ``createCheckpointStateOutputStream``, ``write``, ``closeAndGetHandle``;
* ``ReuseShared``: the state backend's choice, as Flink's RocksDB backend makes it: a
  handle of the last checkpoint the TM knows completed, if ``couldReusePreviousStateHandle``,
  is reused (``reusePreviousStateHandle``), otherwise its bytes are uploaded again;
* ``DeliverNotification``: ``complete(c, k)`` is ``notifyCheckpointComplete(c)`` then
  ``notifyCheckpointSubsumed(k)``; ``abort(c, L)`` is ``notifyCheckpointComplete(L)`` then
  ``notifyCheckpointAborted(c)`` (Flink's StreamTask does both on an abort);
* ``CrashTm``: nothing (a lost TM may run on as a zombie); ``AttemptStopped``: the manager
  is dropped without ``close()`` (its process is gone); ``CrashDuringWrite``: ``write`` and
  ``flush`` part of a stream, never closed;
* ``Failover`` and ``RestartCoordinator``: each live TM's manager is closed and a new one
  built (FLINK-35400), new TMs get new managers, and every subtask's manager gets
  ``restoreStateHandles`` with the handles it acknowledged for the latest completed
  checkpoint; ``Cancel``: every live TM's manager is closed.

Deletions the stand-in's coordinator makes in TM directories (a handed-over directory,
R42) are made on Flink's disk by the adapter, as Flink's JobManager would.

The observation is the stand-in's, except the judged part (``profile.judged``): the files
in the TM directories come from Flink's disk, named after the model's files they pair with
(same directory, same order of creation, R2), and the deletions of such files are the ones
seen on Flink's disk.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import attrs

from conformance.adapter import ModelSession
from conformance.flink.jvm import Jvm, hex_id, shared_jvm
from conformance.flink.naming import Namer, local_path
from conformance.flink.profile import foreign_deletion, out_of_reach, tm_side
from refimpl.state import ModelState, NoticeKind, TmStatus
from spec import commands as c
from spec.config import Config, JobSpec, Scope, StateKind
from spec.errors import CkptError, Reason
from spec.ids import SubtaskId, TmId
from spec.layout import shared_dir, taskowned_dir
from spec.observation import DeletionRecord, Observation

Handle = Any
"""A Java ``SegmentFileStateHandle`` (py4j proxy)."""


class OutOfReach(CkptError):
    """A command the adapter cannot translate (``profile.NO_COUNTERPART``)."""


def job_hex(job: str) -> str:
    """A Flink ``JobID`` for one of our job ids."""
    return hex_id(job)


class Backend:
    """What Flink's RocksDB backend keeps for one subtask on one TM to decide reuse: the
    shared handles uploaded per checkpoint, and the last checkpoint it learned completed
    (``RocksIncrementalSnapshotStrategy``: only the last completed one is a baseline)."""

    def __init__(self) -> None:
        self.uploaded: dict[int, dict[str, Handle]] = {}
        self.last_completed = 0

    def completed(self, checkpoint: int) -> None:
        if checkpoint > self.last_completed:
            self.last_completed = checkpoint
            self.uploaded = {k: v for k, v in self.uploaded.items() if k >= checkpoint}

    def aborted(self, checkpoint: int) -> None:
        self.uploaded.pop(checkpoint, None)

    def baseline(self, name: str) -> Handle | None:
        return self.uploaded.get(self.last_completed, {}).get(name)


class FlinkSession:
    def __init__(self, config: Config, job: JobSpec, jvm: Jvm, root: str) -> None:
        why = out_of_reach(config, ())
        if why is not None:
            raise OutOfReach(why)
        self.jvm = jvm
        self.config = config
        self.model = ModelSession(config, job)
        self.job = self.model.state.job
        self.root = root
        self.namer = Namer()
        self.managers: dict[TmId, Any] = {}
        self.keys: dict[SubtaskId, Any] = {}
        self.backends: dict[tuple[TmId, SubtaskId], Backend] = {}
        self.sizes: dict[tuple[TmId, SubtaskId, str], int] = {}
        self.outputs: dict[tuple[TmId, SubtaskId, int], list[tuple[str, StateKind, Handle]]] = {}
        self.acked: dict[tuple[SubtaskId, int], list[tuple[str, StateKind, Handle]]] = {}
        self.crashed_streams: list[Any] = []
        """Streams of crashed writes, never closed (R65), and kept referenced so that py4j
        does not release them to the JVM's collector."""
        self.stand_in_deleted: list[DeletionRecord] = []
        self.flink_deleted: list[tuple[str, str]] = []
        """(flink path, our path) of every file that left Flink's disk not by the stand-in."""
        self.present: dict[str, int] = {}
        self.calls: list[str] = []
        """The Flink calls made so far, as lines of a Java-free Python script (``repro``)."""
        self.handle_ids: dict[str, int] = {}
        self.last_notice = ""
        """The kind of the last notification delivered (``complete``, ``abort``)."""
        for tm in sorted(self._live(self.model.state)):
            self._start_manager(tm, self.model.state)

    # ------------------------------------------------------------------ managers

    def _live(self, s: ModelState) -> set[TmId]:
        return {t for t in s.placement.values() if s.tms[t].status is TmStatus.ALIVE}

    def _key(self, sub: SubtaskId) -> Any:
        if sub not in self.keys:
            self.keys[sub] = self.jvm.key(job_hex(self.job), sub)
        return self.keys[sub]

    def _start_manager(self, tm: TmId, s: ModelState) -> None:
        j = self.jvm
        mgr = j.manager(job_hex(self.job), tm, self.config)
        base = os.path.join(self.root, self.job)
        mgr.initFileSystem(
            j.fs,
            j.path(base),
            j.path(os.path.join(base, "shared")),
            j.path(os.path.join(base, "taskowned")),
            4096,
        )
        self.managers[tm] = mgr
        self.calls.append(f"m[{tm!r}] = manager({tm!r})")
        hosted = sorted(sub for sub, t in s.placement.items() if t == tm)
        for sub in hosted:
            key = self._key(sub)
            mgr.registerSubtaskForSharedStates(key)
            self.calls.append(f"m[{tm!r}].registerSubtaskForSharedStates({_k(sub)})")
            self.namer.directory(
                str(mgr.getManagedDir(key, j.scopes[Scope.SHARED]).toString()),
                shared_dir(self.job, sub),
            )
            self.backends[(tm, sub)] = Backend()
        if hosted:
            self.namer.directory(
                str(mgr.getManagedDir(self._key(hosted[0]), j.scopes[Scope.EXCLUSIVE]).toString()),
                taskowned_dir(self.job, tm),
            )

    def _hosted(self, tm: TmId, s: ModelState) -> list[SubtaskId]:
        if s.tms[tm].status is TmStatus.ALIVE:
            return sorted(sub for sub, t in s.placement.items() if t == tm)
        return sorted(s.tms[tm].hosted)

    # ------------------------------------------------------------------ commands

    def run(self, command: c.Command) -> Reason | None:
        why = out_of_reach(self.config, (command,))
        if why is not None:
            raise OutOfReach(why)
        before = self.model.state
        reason = self.model.run(command)
        if reason is not None:
            return reason
        after = self.model.state
        self._tm_side(command, before, after)
        self._stand_in_deletes(before, after)
        return None

    def _tm_side(self, cmd: c.Command, before: ModelState, after: ModelState) -> None:
        j = self.jvm
        if isinstance(cmd, c.Trigger):
            cp = before.next_checkpoint
            for tm in sorted(self._live(after)):
                for sub in self._hosted(tm, after):
                    self.managers[tm].notifyCheckpointStart(self._key(sub), j.long(cp))
                    self.calls.append(f"m[{tm!r}].notifyCheckpointStart({_k(sub)}, L({cp}))")
        elif isinstance(cmd, c.WriteState):
            tm = cmd.attempt or before.placement[cmd.subtask]
            self._write(tm, cmd.subtask, cmd.checkpoint, cmd.kind, cmd.name, cmd.size)
        elif isinstance(cmd, c.ReuseShared):
            self._reuse(cmd, cmd.attempt or before.placement[cmd.subtask])
        elif isinstance(cmd, c.Acknowledge):
            tm = cmd.attempt or before.placement[cmd.subtask]
            pending = after.pending.get(cmd.checkpoint)
            was = before.pending.get(cmd.checkpoint)
            taken = (pending is not None and cmd.subtask in pending.acks) or any(
                r.id == cmd.checkpoint for r in after.retained
            )
            if taken and (was is None or cmd.subtask not in was.acks):
                out = self.outputs.get((tm, cmd.subtask, cmd.checkpoint), [])
                self.acked[(cmd.subtask, cmd.checkpoint)] = list(out)
        elif isinstance(cmd, c.DeliverNotification):
            self._deliver(before, cmd.index)
        elif isinstance(cmd, c.CrashDuringWrite):
            tm = before.placement[cmd.subtask]
            stream = self.managers[tm].createCheckpointStateOutputStream(
                self._key(cmd.subtask), j.long(cmd.checkpoint), j.scopes[cmd.kind.scope]
            )
            stream.write(bytearray(cmd.written))
            stream.flush()
            self.calls.append(
                f"crashed.append(partial(m[{tm!r}], {_k(cmd.subtask)}, {cmd.checkpoint}, "
                f"{cmd.kind.scope.name}, {cmd.written}))"
            )
            self.crashed_streams.append(stream)
        elif isinstance(cmd, c.AttemptStopped):
            if self.managers.pop(cmd.tm, None) is not None:
                self.calls.append(f"del m[{cmd.tm!r}]  # the attempt stopped: no close()")
        elif isinstance(cmd, c.Failover | c.RestartCoordinator):
            self._restart(before, after)
        elif isinstance(cmd, c.Cancel):
            for tm in sorted(self._live(before)):
                self.managers[tm].close()
                self.calls.append(f"m[{tm!r}].close()")
        # Complete, Abort, Decline, Drop/DuplicateNotification, CrashTm, CollectWorking and
        # RetryDeletes reach no TM: the stand-in's messages arrive through Deliver

    def _write(
        self, tm: TmId, sub: SubtaskId, cp: int, kind: StateKind, name: str, size: int
    ) -> None:
        j = self.jvm
        stream = self.managers[tm].createCheckpointStateOutputStream(
            self._key(sub), j.long(cp), j.scopes[kind.scope]
        )
        if size:
            stream.write(bytearray(size))
        handle = stream.closeAndGetHandle()
        call = f"write(m[{tm!r}], {_k(sub)}, {cp}, {kind.scope.name}, {size})"
        if handle is None:
            self.calls.append(call)
            return
        hid = self.handle_ids.setdefault(str(handle.getLogicalFileId()), len(self.handle_ids) + 1)
        self.calls.append(f"h[{hid}] = {call}")
        self.namer.saw(str(handle.getFilePath().toString()))
        self.outputs.setdefault((tm, sub, cp), []).append((name, kind, handle))
        if kind is StateKind.KEYED_SHARED:
            self.backends[(tm, sub)].uploaded.setdefault(cp, {})[name] = handle
            self.sizes[(tm, sub, name)] = size

    def _reuse(self, cmd: c.ReuseShared, tm: TmId) -> None:
        j = self.jvm
        mgr = self.managers[tm]
        backend = self.backends[(tm, cmd.subtask)]
        prev = backend.baseline(cmd.name)
        hid = self.handle_ids.get(str(prev.getLogicalFileId())) if prev is not None else None
        if prev is not None and mgr.couldReusePreviousStateHandle(prev):
            mgr.reusePreviousStateHandle(j.long(cmd.checkpoint), j.list([prev]))
            self.calls.append(
                f"assert m[{tm!r}].couldReusePreviousStateHandle(h[{hid}])\n"
                f"m[{tm!r}].reusePreviousStateHandle(L({cmd.checkpoint}), jlist(h[{hid}]))"
            )
            self.outputs.setdefault((tm, cmd.subtask, cmd.checkpoint), []).append(
                (cmd.name, StateKind.KEYED_SHARED, prev)
            )
            backend.uploaded.setdefault(cmd.checkpoint, {})[cmd.name] = prev
            return
        if prev is not None:
            self.calls.append(f"assert not m[{tm!r}].couldReusePreviousStateHandle(h[{hid}])")
        size = self.sizes.get((tm, cmd.subtask, cmd.name))
        if size is None and prev is not None:
            size = int(prev.getStateSize())
        self._write(tm, cmd.subtask, cmd.checkpoint, StateKind.KEYED_SHARED, cmd.name, size or 0)

    def _deliver(self, before: ModelState, index: int) -> None:
        j = self.jvm
        notice = before.channel[index]
        self.last_notice = notice.kind.value
        mgr = self.managers.get(notice.tm)
        if mgr is None or notice.savepoint:
            return
        for sub in self._hosted(notice.tm, before):
            key = self._key(sub)
            backend = self.backends.setdefault((notice.tm, sub), Backend())
            m, k = f"m[{notice.tm!r}]", _k(sub)
            if notice.kind is NoticeKind.COMPLETE:
                mgr.notifyCheckpointComplete(key, j.long(notice.checkpoint))
                self.calls.append(f"{m}.notifyCheckpointComplete({k}, L({notice.checkpoint}))")
                backend.completed(notice.checkpoint)
                if notice.mark > 0:
                    mgr.notifyCheckpointSubsumed(key, j.long(notice.mark))
                    self.calls.append(f"{m}.notifyCheckpointSubsumed({k}, L({notice.mark}))")
            else:
                if notice.mark > 0:
                    mgr.notifyCheckpointComplete(key, j.long(notice.mark))
                    self.calls.append(f"{m}.notifyCheckpointComplete({k}, L({notice.mark}))")
                    backend.completed(notice.mark)
                mgr.notifyCheckpointAborted(key, j.long(notice.checkpoint))
                self.calls.append(f"{m}.notifyCheckpointAborted({k}, L({notice.checkpoint}))")
                backend.aborted(notice.checkpoint)

    def _restart(self, before: ModelState, after: ModelState) -> None:
        j = self.jvm
        for tm in sorted(self._live(before) & self._live(after)):
            self.managers.pop(tm).close()
            self.calls.append(f"m.pop({tm!r}).close()  # failover: the manager is rebuilt")
        for tm in sorted(self._live(after)):
            self._start_manager(tm, after)
        if not after.retained:
            return
        cp = after.retained[-1].id
        for sub, tm in sorted(after.placement.items()):
            acked = self.acked.get((sub, cp), [])
            backend = self.backends[(tm, sub)]
            backend.last_completed = cp
            backend.uploaded = {cp: {n: h for n, k, h in acked if k is StateKind.KEYED_SHARED}}
            for n, _kind, h in acked:
                self.sizes.setdefault((tm, sub, n), int(h.getStateSize()))
            handles = j.list(h for _n, _kind, h in acked)
            self.managers[tm].restoreStateHandles(j.long(cp), self._key(sub), handles.stream())
            hids = ", ".join(
                f"h[{self.handle_ids[str(h.getLogicalFileId())]}]" for _n, _kind, h in acked
            )
            self.calls.append(
                f"m[{tm!r}].restoreStateHandles(L({cp}), {_k(sub)}, jlist({hids}).stream())"
            )
            self.acked[(sub, cp)] = list(acked)

    def _stand_in_deletes(self, before: ModelState, after: ModelState) -> None:
        """The stand-in's coordinator deletes in TM directories what Flink's JobManager
        would (a handed-over directory, R42): the adapter does it on Flink's disk."""
        for rec in after.deletions[len(before.deletions) :]:
            if rec.actor.startswith("tm:") or not tm_side(rec.path, self.job):
                continue
            flink = self.namer.flink_path(rec.path)
            if flink is not None and os.path.isfile(flink):
                os.remove(flink)
                self.calls.append(
                    f"delete_as_jobmanager({os.path.relpath(flink, self.root)!r})"
                    "  # a handed-over directory (R42)"
                )
                self.present.pop(flink, None)
                self.stand_in_deleted.append(rec)

    # ------------------------------------------------------------------ observation

    def observe(self) -> Observation:
        model = self.model.observe()
        on_disk = self._disk()
        for flink in sorted(set(self.present) - set(on_disk)):
            self.flink_deleted.append((flink, self.namer.ours(flink)))
        self.present = on_disk
        self.namer.pair(on_disk, {p for p in model.files if tm_side(p, self.job)})
        files = {p: n for p, n in model.files.items() if not tm_side(p, self.job)}
        files.update({self.namer.ours(f): n for f, n in on_disk.items()})
        return attrs.evolve(model, files=files, deletions=self._deletions(model))

    def _disk(self) -> dict[str, int]:
        out: dict[str, int] = {}
        base = os.path.join(self.root, self.job)
        for top in ("shared", "taskowned"):
            for dirpath, _dirs, names in os.walk(os.path.join(base, top)):
                for name in names:
                    path = os.path.join(dirpath, name)
                    out[path] = os.path.getsize(path)
        return out

    def _deletions(self, model: Observation) -> tuple[DeletionRecord, ...]:
        kept = [d for d in model.deletions if not (d.existed and tm_side(d.path, self.job))]
        by_path: dict[str, list[DeletionRecord]] = {}
        for d in model.deletions:
            if d.existed and tm_side(d.path, self.job):
                by_path.setdefault(d.path, []).append(d)
        seen: list[DeletionRecord] = list(self.stand_in_deleted)
        for rec in self.stand_in_deleted:
            records = by_path.get(rec.path)
            if records:
                records.pop(0)
        for _flink, ours in self.flink_deleted:
            records = by_path.get(ours)
            seen.append(records.pop(0) if records else foreign_deletion(ours))
        return tuple(kept + seen)

    def retained_handles(self) -> list[tuple[str, int, int]]:
        """(file, start, size) of every handle the stand-in's retained checkpoints hold,
        as Flink returned them when the subtasks acknowledged (I1's references)."""
        ids = {r.id for r in self.model.state.retained}
        out = []
        for (_sub, cp), entries in sorted(self.acked.items(), key=lambda kv: kv[0][1]):
            if cp in ids:
                for _n, _kind, h in entries:
                    path = local_path(str(h.getFilePath().toString()))
                    out.append((path, int(h.getStartPos()), int(h.getStateSize())))
        return out

    def flink_files(self) -> dict[str, int]:
        """Every file in the job's TM directories on Flink's disk, with its size."""
        return self._disk()

    def flink_dirs(self) -> dict[str, str]:
        """Our TM directories -> Flink's, relative to the storage root."""
        return {ours: os.path.relpath(flink, self.root) for flink, ours in self.namer.dirs.items()}

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _k(sub: SubtaskId) -> str:
    return f"key({sub.vertex!r}, {sub.index}, {sub.parallelism})"


class Flink:
    """Flink 2.3's manager through pyflink's gateway, on a local directory per case."""

    name = "flink-2.3"

    def __init__(self, base: str | None = None) -> None:
        self.base = base or tempfile.mkdtemp(prefix="ckpt-flink-")
        self.count = 0

    def start(self, config: Config, job: JobSpec) -> FlinkSession:
        self.count += 1
        root = os.path.join(self.base, f"case-{self.count}")
        shutil.rmtree(root, ignore_errors=True)  # every case starts on empty storage
        os.makedirs(root)
        return FlinkSession(config, job, shared_jvm(), root)
