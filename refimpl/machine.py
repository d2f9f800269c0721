"""The transition function: ``step(state, command) -> Outcome(state, effects)``.

Every rule of spec/SPEC.md that changes state lives in this module, named by its number
next to the code that carries it out. Theory of operation:

* ``step`` copies the containers of the frozen input into a private ``_Work`` (records
  stay frozen and are replaced with ``evolve``), applies one command, and freezes the
  result. A command that raises ``CommandError`` leaves the input untouched, so an
  invalid command changes nothing (the state is a value).
* Refusals: ``apply`` first runs ``spec.refusals.check``, which walks the command's guards
  in the order of ``spec.refusals.GUARDS`` over the model's predicate for each
  (``_Work.checks``); the command handlers then run on a state that passed every guard.
* Storage is modelled in the state itself (``files``, ``dir_owner``): every storage call
  goes through one of the ``_fs_*`` helpers, which record the effect in order and apply
  it, so the model's observation shows the files that would exist.
* Deletes go through ``_delete_file`` / ``_delete_dir``: they defer a delete of a file
  created by a lost attempt (R64), queue a delete whose storage call fails (R45), and
  record every deletion with the owner at that moment, so the invariants can judge it.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import evolve, frozen

from refimpl.redistribute import redistribute
from refimpl.state import (
    BackendRef,
    Completed,
    Deferred,
    ManagedDir,
    ModelState,
    Notice,
    NoticeKind,
    Pending,
    PFile,
    RegEntry,
    Seg,
    StoredFile,
    TmRec,
    TmStatus,
    WFile,
    place,
    subtasks_of,
)
from spec import commands as c
from spec.commands import StorageOp
from spec.config import MAX_TMS, MergingMode, RestoreMode, Scope, StateKind, VertexSpec
from spec.effects import (
    COORDINATOR,
    USER,
    AppendBytes,
    CallFailed,
    CloseFile,
    CreateFile,
    DeleteDir,
    DeleteFile,
    Effect,
    MakeDir,
    WriteMetadata,
    tm_actor,
)
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    InlineHandle,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
    stream_of,
)
from spec.ids import SubtaskId, TmId
from spec.keygroups import key_group_range, max_parallelism_refusal
from spec.layout import (
    METADATA,
    checkpoint_dir,
    is_under,
    job_base,
    metadata_path,
    savepoint_dir,
    shared_dir,
    taskowned_dir,
    working_dir,
)
from spec.observation import DeletionRecord
from spec.refusals import Check, check


@frozen
class Outcome:
    state: ModelState
    effects: tuple[Effect, ...]


class _StorageFault(Exception):
    """An armed storage fault fired (R17, R45, R51)."""

    def __init__(self, op: StorageOp, path: str) -> None:
        super().__init__(f"{op.value} {path}")
        self.op = op
        self.path = path


def step(state: ModelState, command: c.AnyCommand) -> Outcome:
    """Apply one command. Raises ``CommandError`` (state unchanged) if it is invalid."""
    work = _Work(state)
    work.apply(command)
    return Outcome(work.freeze(), tuple(work.effects))


def guard_checks(state: ModelState, command: c.AnyCommand) -> dict[str, Check]:
    """The model's predicate for each guard of ``command`` in ``state``, by name: what
    ``step`` checks the command with first (``spec.refusals.check``)."""
    return _Work(state).checks(command)


def _tm_of_actor(actor: str) -> TmId | None:
    return actor[3:] if actor.startswith("tm:") else None


class _Work:
    """A mutable working copy of one state, for the length of one command."""

    def __init__(self, s: ModelState) -> None:
        self.s = s
        self.cfg = s.config
        self.job = s.job
        self.job_seq = s.job_seq
        self.running = s.running
        self.vertices = s.vertices
        self.num_tms = s.num_tms
        self.placement = dict(s.placement)
        self.tms = dict(s.tms)
        self.next_checkpoint = s.next_checkpoint
        self.pending = dict(s.pending)
        self.aborted = set(s.aborted)
        self.retained = list(s.retained)
        self.savepoints = dict(s.savepoints)
        self.savepoint_ids = set(s.savepoint_ids)
        self.latest_completed = s.latest_completed
        self.watermark = s.watermark
        self.registry = dict(s.registry)
        self.segs = dict(s.segs)
        self.pfiles = dict(s.pfiles)
        self.pools = dict(s.pools)
        self.outputs = dict(s.outputs)
        self.acked = dict(s.acked)
        self.backend = dict(s.backend)
        self.dirs = dict(s.dirs)
        self.dir_owner = dict(s.dir_owner)
        self.files = dict(s.files)
        self.deletions = list(s.deletions)
        self.deferred = list(s.deferred)
        self.channel = list(s.channel)
        self.armed = list(s.armed)
        self.restoring = s.restoring
        self.bases = set(s.bases)
        self.next_file = s.next_file
        self.next_segment = s.next_segment
        self.next_tm = s.next_tm
        self.wfiles = dict(s.wfiles)
        self.dbs = dict(s.dbs)
        self.wout = dict(s.wout)
        self.effects: list[Effect] = []

    def freeze(self) -> ModelState:
        return ModelState(
            config=self.cfg,
            job=self.job,
            job_seq=self.job_seq,
            running=self.running,
            vertices=self.vertices,
            num_tms=self.num_tms,
            placement=self.placement,
            tms=self.tms,
            next_checkpoint=self.next_checkpoint,
            pending=self.pending,
            aborted=frozenset(self.aborted),
            retained=tuple(self.retained),
            savepoints=self.savepoints,
            savepoint_ids=frozenset(self.savepoint_ids),
            latest_completed=self.latest_completed,
            watermark=self.watermark,
            registry=self.registry,
            segs=self.segs,
            pfiles=self.pfiles,
            pools=self.pools,
            outputs=self.outputs,
            acked=self.acked,
            backend=self.backend,
            dirs=self.dirs,
            dir_owner=self.dir_owner,
            files=self.files,
            deletions=tuple(self.deletions),
            deferred=tuple(self.deferred),
            channel=tuple(self.channel),
            armed=tuple(self.armed),
            restoring=self.restoring,
            bases=frozenset(self.bases),
            next_file=self.next_file,
            next_segment=self.next_segment,
            next_tm=self.next_tm,
            # a working file's record goes with the file (R102, R104)
            wfiles={p: w for p, w in self.wfiles.items() if p in self.files},
            dbs=self.dbs,
            wout=self.wout,
        )

    # ------------------------------------------------------------------ dispatch

    def apply(self, cmd: c.AnyCommand) -> None:
        check(cmd, self.checks(cmd))
        match cmd:
            case c.WriteWorking():
                self.write_working(cmd)
            case c.DropWorking():
                self.drop_working(cmd)
            case c.SnapshotWorking():
                self.snapshot_working(cmd)
            case c.CollectWorking():
                self.collect_working()
            case c.Trigger():
                self.trigger(cmd)
            case c.WriteState():
                self.write_state(cmd)
            case c.ReuseShared():
                self.reuse_shared(cmd)
            case c.Acknowledge():
                self.acknowledge(cmd)
            case c.Decline():
                self.decline(cmd)
            case c.Complete():
                self.complete(cmd)
            case c.Abort():
                self.coordinator_abort(cmd.checkpoint)
            case c.DeliverNotification():
                self.deliver(cmd.index)
            case c.DropNotification():
                del self.channel[cmd.index]
            case c.DuplicateNotification():
                self.channel.append(self.channel[cmd.index])
            case c.CrashTm():
                self.crash_tm(cmd.tm)
            case c.AttemptStopped():
                self.attempt_stopped(cmd.tm)
            case c.CrashDuringWrite():
                self.crash_during_write(cmd)
            case c.Failover():
                self.failover()
            case c.ReplaceTm():
                self.replace_tm(cmd.tm)
            case c.RestartCoordinator():
                self.restart_coordinator()
            case c.Restore():
                self.restore(cmd)
            case c.FailNextCall():
                self.armed.append(cmd.op)
            case c.RetryDeletes():
                self.retry_deletes()
            case c.Cancel():
                self.end_job(retain=cmd.retain)

    # ------------------------------------------------------------------ guards (spec/refusals.py)

    def checks(self, cmd: c.AnyCommand) -> dict[str, Check]:
        """The model's predicate for each guard ``spec.refusals.GUARDS`` lists for
        ``cmd``, by name; ``apply`` runs them in that order (``spec.refusals.check``), so
        each may rely on the guards before it."""
        match cmd:
            case c.Trigger() | c.Failover() | c.Cancel() | c.CollectWorking():
                return {"running": self._ended}
            case c.RestartCoordinator():
                return {"running": self._ended, "none_lost": self._lost_attempts}
            case c.WriteState() | c.Acknowledge() | c.SnapshotWorking():
                return self._writer_checks(cmd.checkpoint, cmd.subtask, cmd.attempt)
            case c.ReuseShared():
                return self._writer_checks(cmd.checkpoint, cmd.subtask, cmd.attempt) | {
                    "state_exists": lambda: self._no_state(cmd)
                }
            case c.Decline():
                return self._writer_checks(cmd.checkpoint, cmd.subtask, None, zombie=False)
            case c.CrashDuringWrite():
                return self._writer_checks(cmd.checkpoint, cmd.subtask, None, zombie=False) | {
                    "partial_write": lambda: (
                        None
                        if 0 < cmd.written < cmd.size
                        else "a crash mid-write needs 0 < written < size"
                    )
                }
            case c.Complete():
                return self._checkpoint_checks(cmd.checkpoint) | {
                    "all_acknowledged": lambda: self._missing_acks(cmd.checkpoint)
                }
            case c.Abort():
                return self._checkpoint_checks(cmd.checkpoint)
            case c.DeliverNotification() | c.DropNotification() | c.DuplicateNotification():
                return {"notification_exists": lambda: self._no_notice(cmd.index)}
            case c.CrashTm() | c.ReplaceTm():
                return {
                    "running": self._ended,
                    "tm_known": lambda: self._unknown_tm(cmd.tm),
                    "tm_alive_in_job": lambda: self._not_live(cmd.tm),
                }
            case c.AttemptStopped():
                return {
                    "tm_known": lambda: self._unknown_tm(cmd.tm),
                    "tm_lost": lambda: self._not_lost(cmd.tm),
                }
            case c.Restore():
                return self._restore_checks(cmd)
            case c.FailNextCall() | c.RetryDeletes():
                return {}
            case c.WriteWorking():
                return self._database_checks(cmd.subtask, cmd.attempt) | {
                    "working_bytes": lambda: (
                        None if cmd.size > 0 else "a working file has at least one byte"
                    )
                }
            case c.DropWorking():
                return self._database_checks(cmd.subtask, cmd.attempt) | {
                    "database_uses": lambda: self._not_used(cmd)
                }

    def _ended(self) -> str | None:
        """R90: an ended job takes no command."""
        return None if self.running else f"job {self.job} has ended"

    def _checkpoint_checks(self, checkpoint: int) -> dict[str, Check]:
        """A checkpoint the coordinator decides on: triggered, and still pending (R51)."""
        return {
            "running": self._ended,
            "checkpoint_triggered": lambda: self._never_triggered(checkpoint),
            "checkpoint_pending": lambda: (
                None if checkpoint in self.pending else f"checkpoint {checkpoint} is not pending"
            ),
        }

    def _never_triggered(self, checkpoint: int) -> str | None:
        if 1 <= checkpoint < self.next_checkpoint:
            return None
        return f"checkpoint {checkpoint} unknown"

    def _missing_acks(self, checkpoint: int) -> str | None:
        p = self.pending[checkpoint]
        missing = [s for s in self.placement if s not in p.acks]
        if not missing:
            return None
        return f"checkpoint {checkpoint} lacks acks from {[str(s) for s in missing]}"

    def _acting_tm(self, subtask: SubtaskId, attempt: TmId | None) -> TmId:
        """The TM that acts for ``subtask``: its host, or the ``attempt`` named (a
        zombie, R64); the guards decide whether it may."""
        return self.placement[subtask] if attempt is None else attempt

    def _database_checks(
        self, subtask: SubtaskId, attempt: TmId | None, *, zombie: bool = True
    ) -> dict[str, Check]:
        """The attempt whose database acts: the subtask's live TM, or a zombie that hosted
        it (R106), checked as a writer is before its checkpoint (R57, R64)."""
        return {
            "running": self._ended,
            "subtask_known": lambda: (
                None if subtask in self.placement else f"{subtask} is not a subtask of {self.job}"
            ),
            **self._acting_checks(subtask, attempt, zombie=zombie),
        }

    def _acting_checks(
        self, subtask: SubtaskId, attempt: TmId | None, *, zombie: bool
    ) -> dict[str, Check]:
        """R57, R64: the subtask's host acts if it is alive; a command that may come from
        a zombie (``zombie``) names a lost ``attempt`` that hosted the subtask. Each
        predicate runs once the subtask is known."""

        def host_alive() -> str | None:
            if attempt is not None:
                return None
            tm = self.placement[subtask]
            status = self.tms[tm].status
            return None if status is TmStatus.ALIVE else f"{tm} hosting {subtask} is {status.value}"

        checks: dict[str, Check] = {"host_alive": host_alive}
        if not zombie:
            return checks
        return checks | {
            "writer_known": lambda: self._unknown_tm(self._acting_tm(subtask, attempt)),
            "attempt_lost": lambda: (
                None
                if attempt is None or self.tms[attempt].status is TmStatus.LOST
                else f"attempt {attempt} is not a lost TM"
            ),
            "attempt_hosted": lambda: (
                None
                if attempt is None or subtask in self.tms[attempt].hosted
                else f"{attempt} never hosted {subtask}"
            ),
        }

    def _writer_checks(
        self, checkpoint: int, subtask: SubtaskId, attempt: TmId | None, *, zombie: bool = True
    ) -> dict[str, Check]:
        """The TM a write or acknowledgement comes from (R10, R56, R64): the database's
        checks, a checkpoint triggered, not over for that TM, not yet acknowledged."""

        def finished() -> str | None:
            tm = self._acting_tm(subtask, attempt)
            if not self._finished_for_tm(self.tms[tm], checkpoint):
                return None
            return f"{tm} already knows checkpoint {checkpoint} is finished"

        def acknowledged() -> str | None:
            if (self._acting_tm(subtask, attempt), subtask, checkpoint) not in self.acked:
                return None
            return f"{subtask} already acknowledged {checkpoint}"

        return self._database_checks(subtask, attempt, zombie=zombie) | {
            "checkpoint_triggered": lambda: self._never_triggered(checkpoint),
            "not_finished_for_tm": finished,
            "not_acknowledged": acknowledged,
        }

    def _no_state(self, cmd: c.ReuseShared) -> str | None:
        """R20: only shared state the acting TM wrote (or restored) can be reused."""
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        if (tm, cmd.subtask, cmd.name) in self.backend:
            return None
        return f"{cmd.subtask} on {tm} has no shared state {cmd.name!r}"

    def _not_used(self, cmd: c.DropWorking) -> str | None:
        """R102: a database stops using only a file it uses."""
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        if cmd.path in self.dbs.get((tm, cmd.subtask), frozenset()):
            return None
        return f"the database of {cmd.subtask} on {tm} uses no {cmd.path}"

    def _no_notice(self, index: int) -> str | None:
        if 0 <= index < len(self.channel):
            return None
        return f"no notification {index} of {len(self.channel)}"

    def _unknown_tm(self, tm: TmId) -> str | None:
        return None if tm in self.tms else f"no TM {tm}"

    def _not_live(self, tm: TmId) -> str | None:
        """A live TM of the running job, named by a command (R57, R66)."""
        if self.tms[tm].status is TmStatus.ALIVE and tm in self.placement.values():
            return None
        return f"{tm} is not a live TM of {self.job}"

    def _lost_attempts(self) -> str | None:
        """R64, R95: a coordinator restarts only once no attempt it gave up on may still
        run: what a zombie writes, a coordinator rebuilt from storage could not tell from
        the dead one's garbage."""
        lost = sorted(t for t, rec in self.tms.items() if rec.status is TmStatus.LOST)
        return None if not lost else f"lost attempts not known stopped: {', '.join(lost)}"

    def _not_lost(self, tm: TmId) -> str | None:
        """R64: only a lost attempt can be known to have stopped."""
        status = self.tms[tm].status
        return None if status is TmStatus.LOST else f"{tm} is {status.value}, not lost"

    def _restore_source(self, checkpoint: int) -> Completed | None:
        """R70: a checkpoint the current job retains, or a completed savepoint."""
        source = next((r for r in self.retained if r.id == checkpoint), None)
        return source if source is not None else self.savepoints.get(checkpoint)

    def _restore_checks(self, cmd: c.Restore) -> dict[str, Check]:
        def retained() -> str | None:
            if self._restore_source(cmd.checkpoint) is not None:
                return None
            return f"checkpoint {cmd.checkpoint} is not retained nor a savepoint"

        def parallelism() -> str | None:
            """R75, R78: known vertices, parallelisms within the max, a TM count in range."""
            names = {v.name for v in self.vertices}
            new_par = dict(cmd.parallelism)
            if not set(new_par) <= names or any(
                p < 1 or p > self.cfg.max_parallelism for p in new_par.values()
            ):
                return f"bad parallelism {cmd.parallelism}"
            if cmd.num_tms is not None and not 1 <= cmd.num_tms <= MAX_TMS:
                return f"num_tms {cmd.num_tms} not in 1 .. {MAX_TMS}"
            return None

        def same_max_parallelism() -> str | None:
            """R77: the max parallelism of the new job (the command's, else the configured
            one) is the one the checkpoint was taken with."""
            source = self._restore_source(cmd.checkpoint)
            assert source is not None  # source_retained held
            configured = self.cfg.max_parallelism
            wanted = configured if cmd.max_parallelism is None else cmd.max_parallelism
            why = max_parallelism_refusal(source.max_parallelism, wanted, source.entries)
            if why is None and wanted != configured:
                why = (
                    f"the restore asks for max parallelism {wanted}, the job runs with {configured}"
                )
            return None if why is None else f"checkpoint {source.id}: {why}"

        return {
            "source_retained": retained,
            "parallelism_valid": parallelism,
            "max_parallelism_same": same_max_parallelism,
        }

    def _is_savepoint(self, checkpoint: int) -> bool:
        """Whether an id is a savepoint is fixed when it is triggered (every TM is told)."""
        return checkpoint in self.savepoint_ids

    def _finished_for_tm(self, rec: TmRec, checkpoint: int) -> bool:
        if checkpoint in rec.known_aborted or checkpoint < rec.first_checkpoint:
            return True  # R10: an attempt never writes for checkpoints before its start
        if checkpoint in rec.finished_savepoints:
            return True
        return not self._is_savepoint(checkpoint) and checkpoint <= rec.finished_mark

    # ------------------------------------------------------------------ storage (R45)

    def _fire(self, op: StorageOp, path: str, actor: str) -> None:
        if op in self.armed:
            self.armed.remove(op)
            self.effects.append(CallFailed(op.value, path, actor))
            raise _StorageFault(op, path)

    def _fs_mkdir(self, path: str, actor: str, creator: TmId) -> None:
        if path in self.dir_owner:
            return
        self.effects.append(MakeDir(path, actor))
        self.dir_owner[path] = actor
        self.dirs[path] = ManagedDir(path, creator)

    def _fs_create(self, path: str, actor: str, creator: TmId | None) -> None:
        self._fire(StorageOp.CREATE, path, actor)
        self.effects.append(CreateFile(path, actor))
        self.files[path] = StoredFile(0, True, actor, creator)

    def _fs_append(self, path: str, length: int, actor: str) -> int:
        self._fire(StorageOp.APPEND, path, actor)
        f = self.files[path]
        self.effects.append(AppendBytes(path, f.size, length, actor))
        self.files[path] = evolve(f, size=f.size + length)
        return f.size

    def _fs_close(self, path: str, actor: str) -> None:
        f = self.files.get(path)
        if f is not None and f.open:
            self.effects.append(CloseFile(path, actor))
            self.files[path] = evolve(f, open=False)

    def _new_file_name(self, directory: str) -> str:
        """R2: names come from counters in the state and are never handed out twice."""
        name = f"{directory}/f{self.next_file:06d}"
        self.next_file += 1
        return name

    def _new_logical_id(self) -> str:
        lid = f"s{self.next_segment:06d}"
        self.next_segment += 1
        return lid

    def _protected(self, path: str) -> bool:
        owner = self.files[path].owner if path in self.files else self.dir_owner.get(path)
        return owner == USER or not any(is_under(path, b) for b in self.bases)

    def _record_delete(self, path: str, actor: str) -> None:
        f = self.files.get(path)
        self.deletions.append(
            DeletionRecord(
                path=path,
                actor=actor,
                owner=None if f is None else f.owner,
                existed=f is not None,
                protected=f is not None and self._protected(path),
            )
        )
        self.files.pop(path, None)
        if self.deferred:  # R45: a file gone by another delete has nothing left to retry
            self.deferred = [d for d in self.deferred if d.is_dir or d.path != path]

    def _waits_for(self, creator: TmId | None, actor: str) -> TmId | None:
        """R64: a lost attempt's files are deleted by others only once it has stopped."""
        if creator is None or _tm_of_actor(actor) == creator:
            return None
        rec = self.tms.get(creator)
        return creator if rec is not None and rec.status is TmStatus.LOST else None

    def _defer(self, d: Deferred) -> None:
        """R45, R64: a waiting delete is listed once, however often it is asked for."""
        if not any(x.path == d.path and x.is_dir == d.is_dir for x in self.deferred):
            self.deferred.append(d)

    def _delete_file(self, path: str, actor: str) -> None:
        f = self.files.get(path)
        wait = self._waits_for(None if f is None else f.creator, actor)
        if wait is not None:
            self._defer(Deferred(actor, path, False, wait))
            return
        try:
            self._fire(StorageOp.DELETE, path, actor)
        except _StorageFault:
            self._defer(Deferred(actor, path, False, None))
            return
        self.effects.append(DeleteFile(path, actor))
        self._record_delete(path, actor)

    def _delete_dir(self, path: str, actor: str) -> None:
        """Delete a managed directory with everything in it (R42)."""
        inside = sorted(p for p in self.files if is_under(p, path))
        creator = self.dirs[path].creator if path in self.dirs else None
        waits = {self._waits_for(creator, actor)} | {
            self._waits_for(self.files[p].creator, actor) for p in inside
        }
        wait = next((w for w in sorted(waits - {None})), None)  # type: ignore[type-var]
        if wait is not None:
            self._defer(Deferred(actor, path, True, wait))
            return
        try:
            self._fire(StorageOp.DELETE, path, actor)
        except _StorageFault:
            self._defer(Deferred(actor, path, True, None))
            return
        self.effects.append(DeleteDir(path, actor))
        for p in inside:
            self._record_delete(p, actor)
        for d in [d for d in self.dir_owner if is_under(d, path)]:
            del self.dir_owner[d]
            self.dirs.pop(d, None)

    def retry_deletes(self) -> None:
        """R45: retry deletes that failed; a delete that fails again stays queued."""
        ready = [d for d in self.deferred if d.waits_for is None]
        self.deferred = [d for d in self.deferred if d.waits_for is not None]
        for d in ready:
            self._run_deferred(d)

    def _run_deferred(self, d: Deferred) -> None:
        """A waiting delete is carried out by whoever owns the path now (ownership may
        have moved while it waited, R44); what became the user's is never deleted. A
        directory is deleted only if its owner's rule still allows it (R41, R42): while
        the delete waited, a new attempt of the subtask may have written into it and a
        checkpoint may refer to it. If not, the delete is dropped; the rule asks again."""
        if d.is_dir:
            owner = self.dir_owner.get(d.path)
            if owner == COORDINATOR:
                if self._collectable(d.path):
                    self._delete_dir(d.path, owner)
            elif owner is not None and owner != USER:
                tm = _tm_of_actor(owner)
                if tm is not None and self._releasable(tm, d.path):
                    self._delete_dir(d.path, owner)
        elif d.path in self.files and self.files[d.path].owner != USER:
            self._delete_file(d.path, self.files[d.path].owner)

    # ------------------------------------------------------------------ trigger (R50, R55)

    def trigger(self, cmd: c.Trigger) -> None:
        cid = self.next_checkpoint
        self.next_checkpoint += 1
        self.pending[cid] = Pending(cid, cmd.savepoint)
        if cmd.savepoint:
            self.savepoint_ids.add(cid)

    # ------------------------------------------------------------------ writing (R10-R17)

    def write_state(self, cmd: c.WriteState) -> None:
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        if cmd.size == 0:
            return  # R10: an empty snapshot creates no file and no handle
        try:
            entry = self._write_stream(
                tm, cmd.subtask, cmd.checkpoint, cmd.kind, cmd.name, cmd.size, cmd.entries
            )
        except _StorageFault:
            self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            return
        self._add_output(tm, cmd.subtask, cmd.checkpoint, entry)

    def _add_output(self, tm: TmId, subtask: SubtaskId, checkpoint: int, e: StateEntry) -> None:
        key = (tm, subtask, checkpoint)
        self.outputs[key] = (*self.outputs.get(key, ()), e)
        if e.kind is StateKind.KEYED_SHARED and not self._is_savepoint(checkpoint):
            self.backend[(tm, subtask, e.name)] = BackendRef(e, checkpoint, confirmed=False)

    def _key_groups(self, subtask: SubtaskId, kind: StateKind) -> tuple[int, int] | None:
        if not kind.keyed:
            return None
        return key_group_range(self.cfg.max_parallelism, subtask.parallelism, subtask.index)

    def _write_stream(
        self,
        tm: TmId,
        subtask: SubtaskId,
        checkpoint: int,
        kind: StateKind,
        name: str,
        size: int,
        entries: int,
        *,
        partial: int | None = None,
    ) -> StateEntry:
        """Write one stream; returns its entry. ``partial`` writes only that many bytes and
        then crashes (R65): the caller gets no handle."""
        actor = tm_actor(tm)
        lid = self._new_logical_id()
        kg = self._key_groups(subtask, kind)
        if kind.scope is Scope.EXCLUSIVE and size < self.cfg.inline_threshold:
            # R107: small private state travels in its handle; no file, nothing to own
            if partial is not None:
                raise _StorageFault(StorageOp.APPEND, "")  # nothing reached storage
            inline = InlineHandle.of(bytes(size), lid)
            return StateEntry(subtask, kind, name, inline, entries, kg)
        if self._is_savepoint(checkpoint) or self.cfg.merging_mode is MergingMode.NONE:
            # R11, R55: one file per handle, owned by the writing TM until acknowledged
            if self._is_savepoint(checkpoint):
                directory = savepoint_dir(checkpoint)
            elif kind.scope is Scope.SHARED:
                directory = shared_dir(self.job, subtask)
            else:
                directory = checkpoint_dir(self.job, checkpoint)
            path = self._new_file_name(directory)
            self._fs_create(path, actor, tm)
            try:
                self._fs_append(path, size if partial is None else partial, actor)
            except _StorageFault:
                self._fs_close(path, actor)
                self._delete_file(path, actor)
                raise
            if partial is not None:
                raise _StorageFault(StorageOp.APPEND, path)
            self._fs_close(path, actor)  # R12: durable before the handle exists
            handle = FileHandle(path, size, lid, kind.scope)
            return StateEntry(subtask, kind, name, handle, entries, kg)
        path, offset = self._append_segment(tm, subtask, checkpoint, kind.scope, size, partial)
        seg = Seg(lid, tm, path, offset, size, subtask, kind.scope, checkpoint, checkpoint, False)
        self.segs[(tm, lid)] = seg
        pf = self.pfiles[(tm, path)]
        pf = evolve(pf, ref_count=pf.ref_count + 1, live_bytes=pf.live_bytes + size)
        self.pfiles[(tm, path)] = pf
        if pf.open and pf.size >= self.cfg.max_file_size:
            self._close_pfile(tm, path)  # R12: roll at max file size
        return StateEntry(
            subtask, kind, name, SegmentHandle(path, offset, size, lid, kind.scope), entries, kg
        )

    def _pool_key(
        self, tm: TmId, subtask: SubtaskId, checkpoint: int, scope: Scope
    ) -> tuple[str, ...]:
        """R13: SHARED merged per subtask, EXCLUSIVE per TM; WITHIN pools per checkpoint."""
        owner = str(subtask) if scope is Scope.SHARED else tm
        within = self.cfg.merging_mode is MergingMode.WITHIN_CHECKPOINT
        return (tm, scope.value, owner, str(checkpoint) if within else "*")

    def _managed_dir(self, tm: TmId, subtask: SubtaskId, scope: Scope) -> str:
        if scope is Scope.SHARED:
            return shared_dir(self.job, subtask)
        return taskowned_dir(self.job, tm)

    def _append_segment(
        self,
        tm: TmId,
        subtask: SubtaskId,
        checkpoint: int,
        scope: Scope,
        size: int,
        partial: int | None,
    ) -> tuple[str, int]:
        actor = tm_actor(tm)
        key = self._pool_key(tm, subtask, checkpoint, scope)
        directory = self._managed_dir(tm, subtask, scope)
        self._fs_mkdir(directory, actor, tm)  # R40: created lazily at the first write
        path = self.pools.get(key)
        if path is not None:
            pf = self.pfiles[(tm, path)]
            if pf.size > 0 and pf.size + size > self.cfg.max_file_size:
                self._close_pfile(tm, path)  # R12: roll before exceeding max file size
                path = None
        if path is None:
            path = self._new_file_name(directory)
            self._fs_create(path, actor, tm)
            cp = checkpoint if key[3] != "*" else None
            self.pfiles[(tm, path)] = PFile(path, tm, scope, key, cp, True, 0, 0, 0)
            self.pools[key] = path
        try:
            offset = self._fs_append(path, size if partial is None else partial, actor)
        except _StorageFault:
            self._poison(tm, path)
            raise
        pf = self.pfiles[(tm, path)]
        self.pfiles[(tm, path)] = evolve(pf, size=pf.size + (size if partial is None else partial))
        if partial is not None:
            raise _StorageFault(StorageOp.APPEND, path)
        return path, offset

    def _poison(self, tm: TmId, path: str) -> None:
        """R17: a file whose write failed is closed and never written or reused again."""
        pf = self.pfiles[(tm, path)]
        self.pfiles[(tm, path)] = evolve(pf, reusable=False)
        self._close_pfile(tm, path)

    def _write_failed(self, tm: TmId, subtask: SubtaskId, checkpoint: int) -> None:
        """R17: the subtask's snapshot failed: it declines the checkpoint and writes no
        more for it (R14)."""
        self._tm_drop_outputs(tm, subtask, checkpoint)
        self.acked[(tm, subtask, checkpoint)] = ()
        self._close_within_files(tm, lambda cp: cp == checkpoint, subtask_done=subtask)
        if checkpoint in self.pending and self.tms[tm].status is TmStatus.ALIVE:
            self.coordinator_abort(checkpoint)

    # ------------------------------------------------------------------ reuse (R20-R23)

    def reuse_shared(self, cmd: c.ReuseShared) -> None:
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        ref = self.backend[(tm, cmd.subtask, cmd.name)]
        old = ref.entry
        stream = stream_of(old.handle)
        size = 0 if stream is None else stream.length
        if not self._is_savepoint(cmd.checkpoint) and self._reusable(tm, ref):
            if isinstance(old.handle, SegmentHandle):
                key = (tm, old.handle.logical_id)
                seg = self.segs[key]
                # R21: reuse advances last-used (FLINK-35570)
                self.segs[key] = evolve(seg, last_used=max(seg.last_used, cmd.checkpoint))
                entry = old
            else:
                assert stream is not None
                entry = evolve(old, handle=PlaceholderHandle(stream.logical_id))
            self._add_output_reused(tm, cmd.subtask, cmd.checkpoint, entry, ref)
            return
        # R20: not reusable: upload the same local state again
        try:
            entry = self._write_stream(
                tm, cmd.subtask, cmd.checkpoint, old.kind, old.name, size, old.entries
            )
        except _StorageFault:
            self._write_failed(tm, cmd.subtask, cmd.checkpoint)
            return
        self._add_output(tm, cmd.subtask, cmd.checkpoint, entry)

    def _add_output_reused(
        self, tm: TmId, subtask: SubtaskId, checkpoint: int, e: StateEntry, ref: BackendRef
    ) -> None:
        key = (tm, subtask, checkpoint)
        self.outputs[key] = (*self.outputs.get(key, ()), e)
        self.backend[(tm, subtask, e.name)] = evolve(
            ref, checkpoint=max(ref.checkpoint, checkpoint)
        )

    def _reusable(self, tm: TmId, ref: BackendRef) -> bool:
        """R20: only state of a checkpoint this TM knows completed (FLINK-25395), in a file
        it owns (FLINK-35803) that is still reusable (R80)."""
        if not ref.confirmed:
            return False
        h = ref.entry.handle
        if isinstance(h, SegmentHandle):
            seg = self.segs.get((tm, h.logical_id))
            pf = self.pfiles.get((tm, h.path))
            return seg is not None and pf is not None and pf.reusable
        return isinstance(h, FileHandle) and self.cfg.merging_mode is MergingMode.NONE

    # ------------------------------------------------------------------ acknowledge (R43, R56)

    def acknowledge(self, cmd: c.Acknowledge) -> None:
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        refs = self.wout.pop((tm, cmd.subtask, cmd.checkpoint), ())
        if cmd.attempt is None:
            # R103: the acknowledgement hands what it refers to in place to the coordinator,
            # whether the checkpoint is still pending or not (as R43 does for whole files)
            self._share(refs)
            p = self.pending.get(cmd.checkpoint)
            if p is not None and refs:
                self.pending[cmd.checkpoint] = evolve(
                    p, working=dict(p.working) | {cmd.subtask: refs}
                )
        else:
            # R56: the coordinator ignores a zombie's acknowledgement and takes nothing;
            # the zombie, which cannot tell, forgets what it referred to in place as any
            # acknowledgement does: its own until it stopped, then the coordinator's (R64)
            self._share(refs, take=False)
        self._acknowledge(cmd, tm)
        self._db_release(tm)  # R102: what its snapshot pinned and it no longer uses goes

    def _acknowledge(self, cmd: c.Acknowledge, tm: TmId) -> None:
        key = (tm, cmd.subtask, cmd.checkpoint)
        entries = list(self.outputs.pop(key, ()))
        if self.cfg.merging_mode is not MergingMode.NONE and not self._is_savepoint(cmd.checkpoint):
            # R40: every acknowledgement reports the managed directories that exist
            for directory in (shared_dir(self.job, cmd.subtask), taskowned_dir(self.job, tm)):
                if directory in self.dir_owner:
                    d = self.dirs[directory]
                    if d.creator == tm:
                        self.dirs[directory] = evolve(d, used_by=d.used_by | {cmd.checkpoint})
                    entries.append(
                        StateEntry(
                            cmd.subtask, StateKind.CHANNEL, "dir", DirectoryHandle(directory), 0
                        )
                    )
        self.acked[key] = tuple(entries)
        self._close_within_files(tm, lambda cp: cp == cmd.checkpoint, subtask_done=cmd.subtask)
        if cmd.attempt is not None or cmd.checkpoint not in self.pending:
            if cmd.attempt is None:
                self._take_over_files(entries)  # R43: a late ack still hands files over
                for e in entries:
                    s = stream_of(e.handle)
                    if s is not None and self._coordinator_owns_stream(e):
                        self._delete_file(s.path, COORDINATOR)
            return  # R56: the replaced attempt's acknowledgement is ignored
        p = self.pending[cmd.checkpoint]
        received = self._take_over_files(entries)
        self.pending[cmd.checkpoint] = evolve(
            p, acks=dict(p.acks) | {cmd.subtask: tuple(entries)}, received=p.received | received
        )
        if not self._placeholders_resolve(entries):
            self.coordinator_abort(cmd.checkpoint)  # R22: reference to discarded state
            return
        for e in entries:  # R22: a referenced entry stays while the checkpoint is pending
            if isinstance(e.handle, PlaceholderHandle):
                reg = self.registry[e.handle.logical_id]
                self.registry[reg.key] = evolve(reg, pins=reg.pins | {cmd.checkpoint})

    def _coordinator_owns_stream(self, e: StateEntry) -> bool:
        return isinstance(e.handle, FileHandle)

    def _take_over_files(self, entries: Iterable[StateEntry]) -> frozenset[str]:
        """R43: whole-file handles (NONE mode, savepoints) become the coordinator's."""
        taken: set[str] = set()
        for e in entries:
            if isinstance(e.handle, FileHandle) and e.handle.path in self.files:
                f = self.files[e.handle.path]
                self.files[e.handle.path] = evolve(f, owner=COORDINATOR)
                taken.add(e.handle.path)
        return frozenset(taken)

    def _placeholders_resolve(self, entries: Iterable[StateEntry]) -> bool:
        return all(
            e.handle.logical_id in self.registry
            for e in entries
            if isinstance(e.handle, PlaceholderHandle)
        )

    def decline(self, cmd: c.Decline) -> None:
        tm = self.placement[cmd.subtask]
        self._write_failed(tm, cmd.subtask, cmd.checkpoint)

    # ------------------------------------------------------------------ coordinator (R50-R56)

    def current_tms(self) -> list[TmId]:
        return sorted({t for t in self.placement.values() if self.tms[t].status is TmStatus.ALIVE})

    def notify(self, kind: NoticeKind, checkpoint: int, mark: int, savepoint: bool) -> None:
        open_sps = frozenset(k for k, p in self.pending.items() if p.savepoint)
        for tm in self.current_tms():
            self.channel.append(Notice(tm, kind, checkpoint, mark, savepoint, open_sps))

    def coordinator_abort(self, checkpoint: int) -> None:
        p = self.pending.pop(checkpoint)
        self.aborted.add(checkpoint)
        for key in self._pinned_by(checkpoint):
            reg = self.registry[key]
            self.registry[key] = evolve(reg, pins=reg.pins - {checkpoint})
            self._release_entry(key)
        for path in sorted(p.received):  # R43: what the acks handed over goes
            if path in self.files and self.files[path].owner == COORDINATOR:
                self._delete_file(path, COORDINATOR)
        self.notify(NoticeKind.ABORT, checkpoint, self.latest_completed, p.savepoint)

    def complete(self, cmd: c.Complete) -> None:
        p = self.pending[cmd.checkpoint]
        entries: list[StateEntry] = []
        directories: list[str] = []
        for s in sorted(p.acks):
            for e in p.acks[s]:
                if isinstance(e.handle, DirectoryHandle):
                    if e.handle.path not in directories:
                        directories.append(e.handle.path)
                elif isinstance(e.handle, PlaceholderHandle):
                    reg = self.registry[e.handle.logical_id]
                    assert reg.handle is not None
                    entries.append(evolve(e, handle=reg.handle))
                else:
                    entries.append(e)
        meta = (
            f"{savepoint_dir(cmd.checkpoint)}/{METADATA}"
            if p.savepoint
            else metadata_path(self.job, cmd.checkpoint)
        )
        done = Completed(
            cmd.checkpoint,
            self.job,
            p.savepoint,
            tuple(entries),
            tuple(directories),
            meta,
            self.cfg.max_parallelism,  # R77: the metadata records it
            tuple((s, path) for s in sorted(p.working) for path in p.working[s]),  # R103
        )
        try:
            self._fire(StorageOp.METADATA, meta, COORDINATOR)
        except _StorageFault:
            self.coordinator_abort(cmd.checkpoint)  # R51: no metadata, no checkpoint
            return
        self.effects.append(WriteMetadata(meta, cmd.checkpoint, len(entries), COORDINATOR))
        self.files[meta] = StoredFile(len(entries), False, COORDINATOR, None)
        del self.pending[cmd.checkpoint]
        if p.savepoint:
            self._complete_savepoint(done, p)
            return
        self.restoring = ()
        self.latest_completed = cmd.checkpoint
        self._register(done)
        self.retained.append(done)
        while len(self.retained) > self.cfg.num_retained:  # R52
            self._subsume(self.retained.pop(0))
        self.notify(NoticeKind.COMPLETE, cmd.checkpoint, self.watermark, False)
        for older in sorted(
            k for k, v in self.pending.items() if k < cmd.checkpoint and not v.savepoint
        ):
            self.coordinator_abort(older)  # R53
        self._collect_dirs()

    def _complete_savepoint(self, done: Completed, p: Pending) -> None:
        """R55: a completed savepoint belongs to the user; it never subsumes anything."""
        for path in [*sorted(p.received), done.metadata]:
            if path in self.files:
                self.files[path] = evolve(self.files[path], owner=USER)
        self.savepoints[done.id] = done
        self.notify(NoticeKind.COMPLETE, done.id, self.watermark, True)

    def _pinned_by(self, checkpoint: int) -> list[str]:
        return sorted(k for k, r in self.registry.items() if checkpoint in r.pins)

    def _release_entry(self, key: str) -> None:
        """R54: an entry nobody refers to goes; the coordinator deletes what it owns.
        Directories go through ``_collect_dirs``, which knows who still works in them."""
        reg = self.registry[key]
        if reg.refs or reg.pins:
            return
        del self.registry[key]
        if reg.owned and not key.startswith("dir:"):
            if reg.path in self.files and self.files[reg.path].owner == COORDINATOR:
                self._delete_file(reg.path, COORDINATOR)

    def _register(self, done: Completed) -> None:
        """R54: the registry is keyed by unique handle ids; refs are checkpoint ids."""
        for e in done.entries:
            h = e.handle
            if not isinstance(h, SegmentHandle | FileHandle) or h.scope is not Scope.SHARED:
                continue
            reg = self.registry.get(h.logical_id)
            if reg is not None and reg.path != h.path:
                raise AssertionError(f"conflicting registration of {h.logical_id}")  # R54
            owned = isinstance(h, FileHandle)
            refs = (reg.refs if reg else frozenset()) | {done.id}
            pins = (reg.pins if reg else frozenset()) - {done.id}
            self.registry[h.logical_id] = RegEntry(h.logical_id, h.path, h, refs, owned, pins)
        for d in done.directories:
            key = f"dir:{d}"
            reg = self.registry.get(key)
            refs = (reg.refs if reg else frozenset()) | {done.id}
            self.registry[key] = RegEntry(key, d, None, refs, True)
            # R42: a directory used by a completed checkpoint is the coordinator's
            if d in self.dirs:
                self.dirs[d] = evolve(self.dirs[d], handed_over=True)
            self.dir_owner[d] = COORDINATOR

    def _subsume(self, old: Completed) -> None:
        """R52, R54: drop a checkpoint's references; delete what nobody refers to."""
        self.watermark = max(self.watermark, old.id)
        keys = [
            h.logical_id
            for e in old.entries
            if isinstance(h := e.handle, SegmentHandle | FileHandle) and h.scope is Scope.SHARED
        ] + [f"dir:{d}" for d in old.directories]
        for key in dict.fromkeys(keys):
            reg = self.registry.get(key)
            if reg is None:
                continue
            self.registry[key] = evolve(reg, refs=reg.refs - {old.id})
            self._release_entry(key)
        for e in old.entries:
            h = e.handle
            if isinstance(h, FileHandle) and h.scope is Scope.EXCLUSIVE and h.path in self.files:
                if self.files[h.path].owner == COORDINATOR:
                    self._delete_file(h.path, COORDINATOR)
        if old.metadata in self.files and self.files[old.metadata].owner == COORDINATOR:
            self._delete_file(old.metadata, COORDINATOR)

    # ------------------------------------------------------------------ notifications (R30-R35)

    def deliver(self, index: int) -> None:
        """R34: any notice may arrive at any time, twice or never; handlers are monotonic."""
        n = self.channel.pop(index)
        rec = self.tms.get(n.tm)
        if rec is None or rec.status is TmStatus.STOPPED:
            return  # a stopped TM hears nothing
        if n.kind is NoticeKind.COMPLETE:
            self.tm_complete(n.tm, n.checkpoint, n.mark, n.savepoint)
            if not n.savepoint:
                self._finish_savepoints(n.tm, n.checkpoint, n.pending_savepoints)
        else:
            self.tm_abort(n.tm, n.checkpoint, n.mark, n.savepoint)

    def _finish_savepoints(self, tm: TmId, checkpoint: int, still_open: frozenset[int]) -> None:
        """R35: a completion lists the savepoints still pending; the others up to it are
        finished, so what the TM wrote for them and never acknowledged goes."""
        mine = {k[2] for k in (*self.outputs, *self.acked) if k[0] == tm}
        done = {sp for sp in mine if sp <= checkpoint and sp not in still_open}
        for sp in sorted(sp for sp in done if self._is_savepoint(sp)):
            self._savepoint_finished(tm, sp)

    def _savepoint_finished(self, tm: TmId, savepoint: int) -> None:
        rec = self.tms[tm]
        self.tms[tm] = evolve(rec, finished_savepoints=rec.finished_savepoints | {savepoint})
        self._tm_drop_outputs_where(tm, lambda cp: cp == savepoint)
        for key in [k for k in self.acked if k[0] == tm and k[2] == savepoint]:
            del self.acked[key]

    def tm_complete(self, tm: TmId, checkpoint: int, watermark: int, savepoint: bool) -> None:
        rec = self.tms[tm]
        if savepoint:
            # R35: a savepoint's files went to the user; only unacked leftovers remain
            self._savepoint_finished(tm, checkpoint)
            return
        self.tms[tm] = evolve(
            rec,
            known_completed=max(rec.known_completed, checkpoint),
            finished_mark=max(rec.finished_mark, checkpoint),
            known_watermark=max(rec.known_watermark, watermark),
        )
        self._confirm(tm, checkpoint)
        # R31: subsume by watermark, then everything unacknowledged of finished checkpoints
        for key in sorted(
            k for k, s in self.segs.items() if k[0] == tm and s.last_used <= watermark
        ):
            self._discard(key)
        self._tm_drop_outputs_where(tm, lambda cp: cp <= checkpoint and not self._is_savepoint(cp))
        self._close_within_files(tm, lambda cp: cp <= checkpoint)

    def tm_abort(self, tm: TmId, checkpoint: int, latest_completed: int, savepoint: bool) -> None:
        rec = self.tms[tm]
        self.tms[tm] = evolve(
            rec,
            known_aborted=rec.known_aborted | {checkpoint},
            known_completed=max(rec.known_completed, latest_completed),
        )
        if latest_completed:
            self._confirm(tm, latest_completed)  # R32: abort carries the latest completed id
        for key in sorted(
            k
            for k, s in self.segs.items()
            if k[0] == tm and s.created_for == checkpoint and s.last_used <= checkpoint
        ):
            self._discard(key)
        self._tm_drop_outputs_where(tm, lambda cp: cp == checkpoint)
        self._close_within_files(tm, lambda cp: cp == checkpoint)
        if savepoint:
            self._savepoint_finished(tm, checkpoint)
        else:
            self._tm_release_dirs(tm)

    def _confirm(self, tm: TmId, checkpoint: int) -> None:
        """R23: what a subtask acknowledged for a completed checkpoint becomes its baseline."""
        for (t, subtask, cp), entries in sorted(self.acked.items(), key=lambda kv: str(kv[0])):
            if t != tm or cp != checkpoint:
                continue
            names = {e.name: e for e in entries if e.kind is StateKind.KEYED_SHARED}
            for bkey, ref in list(self.backend.items()):
                if bkey[0] != tm or bkey[1] != subtask:
                    continue
                if bkey[2] in names:
                    acked = names[bkey[2]]
                    # a placeholder stands for the stream the baseline already holds
                    base = ref.entry if isinstance(acked.handle, PlaceholderHandle) else acked
                    self.backend[bkey] = BackendRef(base, max(ref.checkpoint, cp), True)
                elif ref.checkpoint <= cp:
                    del self.backend[bkey]
            for e in names.values():
                h = e.handle
                if isinstance(h, SegmentHandle) and (tm, h.logical_id) in self.segs:
                    self.segs[(tm, h.logical_id)] = evolve(
                        self.segs[(tm, h.logical_id)], confirmed=True
                    )
        for key in [k for k in self.acked if k[0] == tm and k[2] < checkpoint]:
            if not self._is_savepoint(key[2]):
                del self.acked[key]

    def _discard(self, key: tuple[TmId, str]) -> None:
        """R33: discarding is idempotent: a segment is dropped from the table once."""
        seg = self.segs.pop(key, None)
        if seg is None:
            return
        fkey = (seg.tm, seg.path)
        pf = self.pfiles[fkey]
        self.pfiles[fkey] = evolve(
            pf, ref_count=pf.ref_count - 1, live_bytes=pf.live_bytes - seg.length
        )
        self._check_file(seg.tm, seg.path)

    def _check_file(self, tm: TmId, path: str) -> None:
        """R15, R80, R81: delete a closed unreferenced file; bound space amplification."""
        pf = self.pfiles.get((tm, path))
        if pf is None:
            return
        bound = self.cfg.amplification_bound
        if bound is not None and pf.size > bound * pf.live_bytes:
            self.pfiles[(tm, path)] = pf = evolve(pf, reusable=False)
            if pf.open:
                self._close_pfile(tm, path)  # R81: roll a pooled file over the bound
                return
        if not pf.open and pf.ref_count == 0:
            del self.pfiles[(tm, path)]
            if path in self.files and self.files[path].owner == tm_actor(tm):
                self._delete_file(path, tm_actor(tm))

    def _close_pfile(self, tm: TmId, path: str) -> None:
        pf = self.pfiles[(tm, path)]
        if self.pools.get(pf.pool_key) == path:
            del self.pools[pf.pool_key]
        if pf.open:
            self._fs_close(path, tm_actor(tm))
            self.pfiles[(tm, path)] = evolve(pf, open=False)
        self._check_file(tm, path)

    def _close_within_files(
        self, tm: TmId, which: object, subtask_done: SubtaskId | None = None
    ) -> None:
        """R14: a WITHIN file closes once nobody can still write to it for its checkpoint."""
        assert callable(which)
        for (t, path), pf in sorted(self.pfiles.items()):
            if t != tm or not pf.open or pf.checkpoint is None or not which(pf.checkpoint):
                continue
            if subtask_done is not None:
                if pf.scope is Scope.SHARED and pf.pool_key[2] != str(subtask_done):
                    continue
                if (
                    pf.scope is Scope.EXCLUSIVE
                    and self.cfg.open_files_readable
                    and not self._tm_done_with(tm, pf.checkpoint)
                ):
                    continue  # R12: on an object store the acknowledgement uploads it now
            self._close_pfile(tm, path)

    def _tm_done_with(self, tm: TmId, checkpoint: int) -> bool:
        hosted = [s for s, t in self.placement.items() if t == tm]
        return all((tm, s, checkpoint) in self.acked for s in hosted)

    def _tm_drop_outputs_where(self, tm: TmId, which: object) -> None:
        assert callable(which)
        keys = {k for k in [*self.outputs, *self.wout] if k[0] == tm and which(k[2])}
        for key in sorted(keys, key=str):
            self._tm_drop_outputs(tm, key[1], key[2])

    def _tm_drop_outputs(self, tm: TmId, subtask: SubtaskId, checkpoint: int) -> None:
        """Discard what a subtask wrote for a checkpoint and never acknowledged."""
        if self.wout.pop((tm, subtask, checkpoint), None) is not None:
            self._db_release(tm)  # R102: the snapshot's pins go with it
        for e in self.outputs.pop((tm, subtask, checkpoint), ()):
            h = e.handle
            if isinstance(h, FileHandle):
                if h.path in self.files and self.files[h.path].owner == tm_actor(tm):
                    self._delete_file(h.path, tm_actor(tm))
                bkey = (tm, subtask, e.name)
                if bkey in self.backend and self.backend[bkey].entry == e:
                    del self.backend[bkey]
            elif isinstance(h, SegmentHandle):
                seg = self.segs.get((tm, h.logical_id))
                if (
                    seg is not None
                    and seg.created_for == checkpoint
                    and seg.last_used <= checkpoint
                ):
                    self._discard((tm, h.logical_id))
                bkey = (tm, subtask, e.name)
                if (
                    bkey in self.backend
                    and self.backend[bkey].entry == e
                    and not self.backend[bkey].confirmed
                ):
                    del self.backend[bkey]

    def _tm_release_dirs(self, tm: TmId) -> None:
        """R41: a TM deletes a directory it created only if every checkpoint that reported
        it is known aborted and nothing it tracks lies in it (a set, not a counter)."""
        for path in sorted(self.dirs):
            if self._releasable(tm, path):
                self._delete_dir(path, tm_actor(tm))

    def _releasable(self, tm: TmId, path: str) -> bool:
        """R41 for one directory: ``tm`` may delete it now."""
        d = self.dirs.get(path)
        if d is None or d.creator != tm or d.handed_over or not d.used_by:
            return False
        if self.dir_owner.get(path) != tm_actor(tm):
            return False
        if not d.used_by <= self.tms[tm].known_aborted:
            return False
        if any(p.tm == tm and is_under(p.path, path) for p in self.pfiles.values()):
            return False
        return not any(is_under(f, path) for f in self.files)

    # ------------------------------------------------------------------ crashes (R60-R65)

    def crash_tm(self, tm: TmId) -> None:
        self._lose(tm)

    def replace_tm(self, tm: TmId) -> None:
        """R66: task-level failover. ``tm`` is lost (a zombie until it stops, R64) and its
        acknowledgements of pending checkpoints are withdrawn; a new attempt runs its
        subtasks, may write for every pending checkpoint and later ones, and starts them
        as a restarting TM does (R61, R62, R105). Nothing is aborted, no other TM is
        reset."""
        rec = self.tms[tm]
        hosted = sorted(s for s, t in self.placement.items() if t == tm)
        self.tms[tm] = evolve(rec, status=TmStatus.LOST, hosted=frozenset(hosted))
        self._withdraw_acks(hosted)
        new = f"tm-{self.next_tm}"
        self.next_tm += 1
        self.tms[new] = self._started_for_pending(new)
        for s in hosted:
            self.placement[s] = new
        # R63, R64: its exclusive directory stays its own while it may still run (a
        # zombie applies the notices sent to it and deletes the directory once empty,
        # R41); the coordinator takes it when the attempt is known stopped
        self._restore_manager(new)
        self._open_databases(self.retained[-1] if self.retained else None, only=new)
        self._collect_dirs()

    def _started_for_pending(self, tm: TmId) -> TmRec:
        """R10, R66: a new attempt started for the checkpoints pending now: every earlier
        one, and every later one that is no longer pending, is over for it. Below the
        lowest pending checkpoint (not a savepoint) every checkpoint is over; above it a
        checkpoint no longer pending was aborted (completing it would have aborted the
        pending one, R53), and a savepoint no longer pending is finished."""
        first = min(self.pending, default=self.next_checkpoint)
        lowest = min(
            (k for k, p in self.pending.items() if not p.savepoint), default=self.next_checkpoint
        )
        over = [k for k in range(first, self.next_checkpoint) if k not in self.pending]
        return TmRec(
            tm,
            TmStatus.ALIVE,
            known_completed=self.latest_completed,
            finished_mark=lowest - 1,
            known_aborted=frozenset(k for k in over if k > lowest and not self._is_savepoint(k)),
            known_watermark=self.watermark,
            first_checkpoint=first,
            finished_savepoints=frozenset(k for k in over if self._is_savepoint(k)),
        )

    def _withdraw_acks(self, subtasks: list[SubtaskId]) -> None:
        """R66, R56: the acknowledgements a replaced attempt sent for pending checkpoints
        are withdrawn with what they handed over: the pins of their placeholders (R22),
        their in-place references (R103), and their whole files (R43), which the
        coordinator deletes once the attempt stopped (R64)."""
        for cid in sorted(self.pending):
            p = self.pending[cid]
            gone = [s for s in subtasks if s in p.acks]
            if not gone:
                continue
            entries = [e for s in gone for e in p.acks[s]]
            acks = {s: v for s, v in p.acks.items() if s not in gone}
            handed = {e.handle.path for e in entries if isinstance(e.handle, FileHandle)}
            handed &= p.received
            self.pending[cid] = evolve(
                p,
                acks=acks,
                received=p.received - handed,
                working={s: v for s, v in p.working.items() if s not in gone},
            )
            still = {
                e.handle.logical_id
                for v in acks.values()
                for e in v
                if isinstance(e.handle, PlaceholderHandle)
            }
            pinned = {
                e.handle.logical_id for e in entries if isinstance(e.handle, PlaceholderHandle)
            }
            for key in sorted(pinned - still):
                reg = self.registry.get(key)
                if reg is not None and cid in reg.pins:
                    self.registry[key] = evolve(reg, pins=reg.pins - {cid})
                    self._release_entry(key)
            for path in sorted(handed):
                if path in self.files and self.files[path].owner == COORDINATOR:
                    self._delete_file(path, COORDINATOR)

    def _lose(self, tm: TmId) -> None:
        """R57: a lost TM's subtasks can acknowledge nothing more, and what they did
        acknowledge may be cleaned once the attempt stops: pending checkpoints abort."""
        hosted = frozenset(s for s, t in self.placement.items() if t == tm)
        self.tms[tm] = evolve(self.tms[tm], status=TmStatus.LOST, hosted=hosted)
        for cid in sorted(self.pending):
            self.coordinator_abort(cid)

    def crash_during_write(self, cmd: c.CrashDuringWrite) -> None:
        tm = self.placement[cmd.subtask]
        try:
            self._write_stream(
                tm,
                cmd.subtask,
                cmd.checkpoint,
                cmd.kind,
                cmd.name,
                cmd.size,
                1,
                partial=cmd.written,
            )
        except _StorageFault:
            pass  # R65: the half-written bytes stay with the crashed attempt
        self._lose(tm)

    def attempt_stopped(self, tm: TmId) -> None:
        """R64: once a lost attempt has stopped, what waited for it is deleted, and the
        coordinator deletes whatever the attempt still owned."""
        rec = self.tms[tm]
        self.tms[tm] = evolve(rec, status=TmStatus.STOPPED, hosted=frozenset())
        for path, f in sorted(self.files.items()):
            if f.creator == tm and f.open:
                if self.cfg.open_files_readable:
                    self.files[path] = evolve(f, open=False)  # its process is gone
                else:
                    # R65: an object store writes an object when its file is closed (R12);
                    # its writer is gone, so it never will be, whoever owns it by now
                    del self.files[path]
        self._forget_tm(tm)
        actor = tm_actor(tm)
        formerly = sorted(p for p, f in self.files.items() if f.owner == actor)
        for path in formerly:
            self.files[path] = evolve(self.files[path], owner=COORDINATOR)
        its_dirs = sorted(p for p, o in self.dir_owner.items() if o == actor)
        for path in its_dirs:
            self.dir_owner[path] = COORDINATOR
        waiting = [d for d in self.deferred if d.waits_for == tm]
        # its own deletes that were to be retried (R45) die with its memory; whoever owns
        # each path now carries them out (R44), the coordinator for what it still owned
        its_own = [d for d in self.deferred if d.actor == actor and d.waits_for is None]
        self.deferred = [d for d in self.deferred if d not in waiting and d not in its_own]
        for d in waiting:
            self._run_deferred(evolve(d, waits_for=None))
        for d in its_own:
            self._run_deferred(d)
        for path in formerly:
            if path in self.files and not self._referenced(path):
                self._delete_file(path, COORDINATOR)
        self._drop_empty_dirs(its_dirs)
        self._collect_dirs()

    def _drop_empty_dirs(self, taken: list[str]) -> None:
        """R64: a directory the stopped attempt owned that a live attempt works in (its
        subtask's shared one, R66) and that holds nothing goes. The stopped attempt may have
        deleted it (R41) unseen, its acknowledgements ignored (R56); the live attempt makes
        it again at its next write (R40)."""
        if not self.running:
            return
        live = self._managed_dirs(set(self.current_tms()))
        for path in taken:
            if (
                self.dir_owner.get(path) == COORDINATOR
                and path in live
                and not self._dir_referenced(path)
                and not any(is_under(p, path) for p in self.files)
            ):
                self._delete_dir(path, COORDINATOR)

    def _forget_tm(self, tm: TmId) -> None:
        """A TM that is gone keeps no memory: its tables go, its files stay on storage."""
        self.segs = {k: v for k, v in self.segs.items() if k[0] != tm}
        self.pfiles = {k: v for k, v in self.pfiles.items() if k[0] != tm}
        self.pools = {k: v for k, v in self.pools.items() if k[0] != tm}
        self.outputs = {k: v for k, v in self.outputs.items() if k[0] != tm}
        self.acked = {k: v for k, v in self.acked.items() if k[0] != tm}
        self.backend = {k: v for k, v in self.backend.items() if k[0] != tm}
        self.channel = [n for n in self.channel if n.tm != tm]
        self.dbs = {k: v for k, v in self.dbs.items() if k[0] != tm}
        self.wout = {k: v for k, v in self.wout.items() if k[0] != tm}

    def _referenced(self, path: str) -> bool:
        # R104: a working file stays while a checkpoint refers to it or a live database uses it
        if self._working_needed(path):
            return True
        for r in self.retained:
            if path == r.metadata:
                return True
            for e in r.entries:
                s = stream_of(e.handle)
                if s is not None and s.path == path:
                    return True
        return any(
            (s := stream_of(e.handle)) is not None and s.path == path for e in self.restoring
        )

    def _referenced_dirs(self) -> set[str]:
        return {d for r in self.retained for d in r.directories}

    def _collect_dirs(self) -> None:
        """R42: the coordinator deletes a directory it owns once nothing refers to it and
        no live TM of the job still works in it."""
        for path in sorted(self.dir_owner):
            if self._collectable(path):
                self._delete_dir(path, COORDINATOR)

    def _dir_referenced(self, path: str) -> bool:
        """R42: whether a retained checkpoint refers to directory ``path``."""
        return path in self._referenced_dirs() or f"dir:{path}" in self.registry

    def _collectable(self, path: str) -> bool:
        """R42 for one directory: the coordinator may delete it now."""
        if self.dir_owner.get(path) != COORDINATOR:
            return False
        if self._dir_referenced(path):
            return False
        live = set(self.current_tms())
        d = self.dirs.get(path)
        if d is not None and d.creator in live and self.running:
            return False
        if self.running and path in self._managed_dirs(live):
            return False  # a live TM works there: it writes there at its next write
        if any(t in live and is_under(p, path) for (t, p) in self.pfiles):
            return False
        inside = [f for p, f in self.files.items() if is_under(p, path)]
        return all(f.owner in (COORDINATOR, tm_actor(f.creator or "")) for f in inside)

    def _managed_dirs(self, tms: set[TmId]) -> set[str]:
        """R42, R61: the directories the TMs ``tms`` manage in the running job, holding a
        file there yet or not: the shared directories of the subtasks they host and their
        own exclusive ones."""
        hosted = {shared_dir(self.job, s) for s, t in self.placement.items() if t in tms}
        return hosted | {taskowned_dir(self.job, t) for t in tms}

    def failover(self) -> None:
        """R60-R63: restart every subtask from the latest completed checkpoint."""
        for cid in sorted(self.pending):
            self.coordinator_abort(cid)
        replaced: dict[TmId, TmId] = {}
        for tm in sorted(set(self.placement.values())):
            if self.tms[tm].status is not TmStatus.ALIVE:
                new = f"tm-{self.next_tm}"
                self.next_tm += 1
                replaced[tm] = new
                self.tms[new] = TmRec(new, TmStatus.ALIVE, first_checkpoint=self.next_checkpoint)
        self.placement = {s: replaced.get(t, t) for s, t in self.placement.items()}
        survivors = sorted(set(self.placement.values()) - set(replaced.values()))
        for tm in survivors:  # R60: no stale manager survives a failover (FLINK-35400)
            self._tm_drop_outputs_where(tm, lambda cp: True)
            for (t, path), pf in sorted(self.pfiles.items()):
                if t == tm and pf.open:
                    self._fs_close(path, tm_actor(tm))
            self._forget_tm(tm)
        # R63, R64: a lost TM's exclusive directory stays its own until it is known
        # stopped (``attempt_stopped`` gives it to the coordinator)
        for tm in sorted(set(self.placement.values())):
            rec = self.tms[tm]
            self.tms[tm] = evolve(
                rec,
                known_completed=self.latest_completed,
                finished_mark=self.next_checkpoint - 1,
                known_watermark=self.watermark,
                first_checkpoint=self.next_checkpoint,
            )
            self._restore_manager(tm)
        source = self.retained[-1] if self.retained else None
        self._open_databases(source)  # R105: failover opens the checkpointed files in place
        for tm in survivors:
            self._db_release(tm)  # R62: a survivor's private files the checkpoint lacks go
        self._collect_dirs()

    def _restore_manager(self, tm: TmId) -> None:
        """R61, R62: take over the files of every retained checkpoint in the directories this
        TM now manages; everything else there that no live writer holds is garbage."""
        actor = tm_actor(tm)
        hosted = sorted(s for s, t in self.placement.items() if t == tm)
        if self.cfg.merging_mode is MergingMode.NONE:
            self._reload_backend(tm, hosted)
            return
        managed = [shared_dir(self.job, s) for s in hosted] + [taskowned_dir(self.job, tm)]
        keep: dict[str, tuple[StateEntry, int, int]] = {}
        for r in self.retained:
            for e in r.entries:
                h = e.handle
                if isinstance(h, SegmentHandle) and any(is_under(h.path, d) for d in managed):
                    prev = keep.get(h.logical_id)
                    first = r.id if prev is None else min(prev[1], r.id)
                    keep[h.logical_id] = (e, first, r.id)
        files_kept: dict[str, PFile] = {}
        for lid, (e, first, last) in sorted(keep.items()):
            h = e.handle
            assert isinstance(h, SegmentHandle)
            pf = files_kept.get(h.path) or PFile(
                h.path,
                tm,
                h.scope,
                ("restored", h.path),
                None,
                False,
                self.files[h.path].size if h.path in self.files else 0,
                0,
                0,
            )
            files_kept[h.path] = evolve(
                pf, ref_count=pf.ref_count + 1, live_bytes=pf.live_bytes + h.length
            )
            self.segs[(tm, lid)] = Seg(
                lid, tm, h.path, h.offset, h.length, e.subtask, h.scope, first, last, True
            )
        for path, pf in files_kept.items():
            self.pfiles[(tm, path)] = pf
            if path in self.files:
                self.files[path] = evolve(self.files[path], owner=actor)
        for d in managed:
            owner = self.dir_owner.get(d)
            if owner is not None and owner != COORDINATOR and not self._lost_actor(owner):
                self.dir_owner[d] = actor
                self.dirs[d] = evolve(self.dirs[d], creator=tm, used_by=frozenset())
            for path in sorted(p for p in self.files if is_under(p, d) and p not in files_kept):
                f = self.files[path]
                if not f.owner.startswith("tm:"):
                    continue  # not a TM's to clean: the coordinator's or the user's
                if self.tms[f.owner[3:]].status is TmStatus.LOST:
                    continue  # R64: the zombie's, until it is known to have stopped
                self.files[path] = evolve(f, owner=actor)
                self._delete_file(path, actor)  # R62: safe cleanup of the garbage
        for pf in files_kept.values():
            self._check_file(tm, pf.path)
        self._reload_backend(tm, hosted)

    def _lost_actor(self, actor: str) -> bool:
        """R64: whether ``actor`` is a lost attempt that may still run. A directory it
        created stays its own until it is known stopped: it deletes the directory once
        empty (R41) without knowing it was replaced, and that delete is its own."""
        tm = _tm_of_actor(actor)
        rec = None if tm is None else self.tms.get(tm)
        return rec is not None and rec.status is TmStatus.LOST

    def _reload_backend(self, tm: TmId, hosted: list[SubtaskId]) -> None:
        # the backend reloads the latest completed checkpoint's shared state (R23)
        latest = self.retained[-1] if self.retained and self.retained[-1].job == self.job else None
        if latest is None:
            return
        for e in latest.entries:
            if e.subtask in hosted and e.kind is StateKind.KEYED_SHARED:
                h = e.handle
                ok = (isinstance(h, SegmentHandle) and (tm, h.logical_id) in self.segs) or (
                    isinstance(h, FileHandle) and self.cfg.merging_mode is MergingMode.NONE
                )
                if ok:
                    self.backend[(tm, e.subtask, e.name)] = BackendRef(e, latest.id, True)

    def restart_coordinator(self) -> None:
        """R95: rebuild retention and the registry from the persisted metadata alone; then
        the job's subtasks restart as in a failover."""
        rebuilt = [r for r in self.retained if r.metadata in self.files]
        self.retained = []
        self.registry = {}
        for done in rebuilt:
            self._register(done)
            self.retained.append(done)
        received = {p for pend in self.pending.values() for p in pend.received}
        self.pending = {}
        self.aborted |= set(range(self.latest_completed + 1, self.next_checkpoint)) - set(
            self.savepoints
        )
        for path in sorted(received):
            if (
                path in self.files
                and self.files[path].owner == COORDINATOR
                and not self._referenced(path)
            ):
                self._delete_file(path, COORDINATOR)
        self._retry_own_deletes()
        self.failover()

    def _retry_own_deletes(self) -> None:
        """R95, R45: a restarted coordinator remembers none of its deletes that failed;
        what they were to delete is its own and unreferenced, so it goes now (a directory
        only if R42 allows it then), and a delete that fails again is pending again."""

        def owner(d: Deferred) -> str | None:
            if d.is_dir:
                return self.dir_owner.get(d.path)
            f = self.files.get(d.path)
            return None if f is None else f.owner

        mine = [d for d in self.deferred if d.waits_for is None and owner(d) == COORDINATOR]
        self.deferred = [d for d in self.deferred if d not in mine]
        for d in mine:
            self._run_deferred(d)

    # ------------------------------------------------------------------ restore (R70-R76)

    def restore(self, cmd: c.Restore) -> None:
        source = self._restore_source(cmd.checkpoint)
        assert source is not None  # the guard source_retained held
        new_par = dict(cmd.parallelism)
        mode = RestoreMode.NO_CLAIM if source.savepoint else cmd.mode  # R73
        # R71, R74: the new job's TMs start with empty tables and new directories, so no
        # restored file is ever theirs, whatever its path; only the mode decides (_claim).
        if self.running:
            self.end_job(retain=True)
        for t, rec in list(self.tms.items()):
            if rec.status is TmStatus.LOST:
                self.tms[t] = evolve(rec, hosted=frozenset())  # R64: a zombie stays in its job
        # R70: a new job with new directories; ids continue
        self.job_seq += 1
        self.job = f"job-{self.job_seq}"
        self.bases.add(job_base(self.job))
        self.vertices = tuple(
            VertexSpec(v.name, new_par.get(v.name, v.parallelism)) for v in self.vertices
        )
        if cmd.num_tms is not None:
            self.num_tms = cmd.num_tms  # R70: Spark runs one TM per subtask
        tms = []
        for _ in range(self.num_tms):
            tms.append(f"tm-{self.next_tm}")
            self.next_tm += 1
        for t in tms:
            self.tms[t] = TmRec(
                t,
                TmStatus.ALIVE,
                finished_mark=self.next_checkpoint - 1,
                first_checkpoint=self.next_checkpoint,
            )
        subtasks = subtasks_of(self.vertices)
        self.placement = place(subtasks, tms)
        self.running = True
        self.pending = {}
        self.retained = []
        self.registry = {}
        self.watermark = 0
        self.latest_completed = 0
        assignment = redistribute(source.entries, self.vertices, self.cfg.max_parallelism)
        self.restoring = tuple(e for s in sorted(assignment) for e in assignment[s])
        if mode is RestoreMode.CLAIM:
            self._claim(source)
        self._open_databases(source)  # R105: in place (CLAIM) or the user's, never deleted
        same = all(
            v.parallelism == ov.parallelism
            for v, ov in zip(self.vertices, self.s.vertices, strict=True)
        )
        if mode is RestoreMode.CLAIM and same and self.cfg.merging_mode is MergingMode.NONE:
            # R72: with the coordinator owning the claimed files, NONE mode may reuse them
            for s in subtasks:
                for e in assignment.get(s, ()):
                    if e.kind is StateKind.KEYED_SHARED and isinstance(e.handle, FileHandle):
                        t = self.placement[s]
                        self.backend[(t, s, e.name)] = BackendRef(e, source.id, True)

    def _claim(self, source: Completed) -> None:
        """R72: the new job's coordinator owns the restored checkpoint: its metadata, the
        files it references and its directories with everything in them but what a lost
        attempt still owns there and the checkpoint does not reference: that stays the
        attempt's until it is known stopped (R64), as it may still delete it."""
        self.bases.add(source.metadata.split("/", 1)[0])
        paths = {source.metadata} | {s.path for e in source.entries if (s := stream_of(e.handle))}
        paths |= {path for _, path in source.working}  # R105: claimed in place
        lost = {tm_actor(t) for t, rec in self.tms.items() if rec.status is TmStatus.LOST}
        for d in source.directories:
            paths |= {p for p, f in self.files.items() if is_under(p, d) and f.owner not in lost}
            if d in self.dir_owner:
                self.dir_owner[d] = COORDINATOR
        for p in sorted(paths):
            if p in self.files:
                self.files[p] = evolve(self.files[p], owner=COORDINATOR)
        claimed = evolve(source, job=source.job)
        self._register(claimed)
        for d in source.directories:
            if d in self.dirs:
                self.dirs[d] = evolve(self.dirs[d], handed_over=True)
        self.retained = [claimed]
        self.latest_completed = source.id

    # ------------------------------------------------------------------ job end (R90, R91)

    def end_job(self, *, retain: bool) -> None:
        for cid in sorted(self.pending):
            self.coordinator_abort(cid)
        handed = {d for r in self.retained for d in r.directories}
        for tm in self.current_tms():
            actor = tm_actor(tm)
            self._tm_drop_outputs_where(tm, lambda cp: True)
            # R90, R102: the databases close; their private files go with them
            self.dbs = {k: v for k, v in self.dbs.items() if k[0] != tm}
            self._db_release(tm)
            keep = {
                s.logical_id
                for r in self.retained
                for e in r.entries
                if (s := stream_of(e.handle)) is not None
            }
            for key in sorted(k for k in self.segs if k[0] == tm and k[1] not in keep):
                self._discard(key)
            for (t, path), pf in sorted(self.pfiles.items()):
                if t == tm and pf.open:
                    self._close_pfile(tm, path)
            # R90, R44: its waiting deletes are handed over with what it owns; they wait
            # behind the coordinator's own (which a storage fault may hit first)
            handed_waits = [w for w in self.deferred if w.actor == actor]
            self.deferred = [w for w in self.deferred if w.actor != actor] + handed_waits
            for path, d in sorted(self.dirs.items()):
                # R90: directories no completed checkpoint used go with the TM that made them
                if d.creator == tm and path not in handed and self.dir_owner.get(path) == actor:
                    inside = [p for p in self.files if is_under(p, path)]
                    if all(self.files[p].owner == actor for p in inside):
                        self._delete_dir(path, actor)
            for path in sorted(p for p, f in self.files.items() if f.owner == actor):
                self.files[path] = evolve(self.files[path], owner=COORDINATOR)
            for path in sorted(p for p, o in self.dir_owner.items() if o == actor):
                self.dir_owner[path] = COORDINATOR
            self._forget_tm(tm)
            self.tms[tm] = evolve(self.tms[tm], status=TmStatus.STOPPED)
        self.running = False
        self.restoring = ()
        if retain:
            # R91: the retained checkpoints and everything they use become the user's
            for r in self.retained:
                paths = {r.metadata} | {s.path for e in r.entries if (s := stream_of(e.handle))}
                paths |= {path for _, path in r.working}  # R105: in place, the user's
                for rd in r.directories:
                    if rd in self.dir_owner:
                        self.dir_owner[rd] = USER
                for p in paths:
                    if p in self.files:
                        self.files[p] = evolve(self.files[p], owner=USER)
        else:
            while self.retained:
                self._subsume(self.retained.pop(0))
        for path in sorted(p for p, f in self.files.items() if f.owner == COORDINATOR):
            if not self._referenced(path) and any(is_under(path, b) for b in self.bases):
                self._delete_file(path, COORDINATOR)
        self._collect_dirs()

    # ------------------------------------------------------------------ working state (R100-R106)

    def _live_dbs(self) -> dict[tuple[TmId, SubtaskId], frozenset[str]]:
        """R100: a database is live while its attempt is alive and hosts its subtask in the
        running job; a lost attempt's database is a zombie, fenced from the live one."""
        if not self.running:
            return {}
        return {
            (t, sub): uses
            for (t, sub), uses in self.dbs.items()
            if self.placement.get(sub) == t and self.tms[t].status is TmStatus.ALIVE
        }

    def _working_needed(self, path: str) -> bool:
        """R104: a retained checkpoint refers to it in place, a pending checkpoint's
        acknowledgement does, or a live database uses it."""
        if path not in self.wfiles:
            return False
        if any(path == p for r in self.retained for _, p in r.working):
            return True
        if any(path in refs for p in self.pending.values() for refs in p.working.values()):
            return True
        return any(path in uses for uses in self._live_dbs().values())

    def _put_working(self, tm: TmId, subtask: SubtaskId, size: int, *, faults: bool) -> str:
        """R101: one immutable working file, written whole (SlateDB puts whole objects):
        private to the attempt that wrote it. Restore copies arm no fault (``faults``)."""
        actor = tm_actor(tm)
        path = self._new_file_name(working_dir(self.job, subtask))
        if faults:
            self._fs_create(path, actor, tm)
            try:
                self._fs_append(path, size, actor)
            except _StorageFault:
                self._fs_close(path, actor)
                self._delete_file(path, actor)
                raise
        else:
            self.effects.append(CreateFile(path, actor))
            self.effects.append(AppendBytes(path, 0, size, actor))
            self.files[path] = StoredFile(size, True, actor, tm)
        self._fs_close(path, actor)
        kg = key_group_range(self.cfg.max_parallelism, subtask.parallelism, subtask.index)
        self.wfiles[path] = WFile(path, kg)
        key = (tm, subtask)
        self.dbs[key] = self.dbs.get(key, frozenset()) | {path}
        return path

    def write_working(self, cmd: c.WriteWorking) -> None:
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        try:
            self._put_working(tm, cmd.subtask, cmd.size, faults=True)
        except _StorageFault:
            pass  # R45: the failed write leaves nothing the database uses

    def drop_working(self, cmd: c.DropWorking) -> None:
        """R102: a database may stop using any file at any time; what happens to the file
        depends on its state, never on who asks."""
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        key = (tm, cmd.subtask)
        self.dbs[key] = self.dbs[key] - {cmd.path}
        self._db_release(tm)

    def _db_release(self, tm: TmId) -> None:
        """R102: an attempt deletes its private files that none of its databases uses and
        no unacknowledged snapshot of it refers to. A shared file is never the database's
        to delete: the coordinator collects it (R104)."""
        actor = tm_actor(tm)
        used = {p for (t, _), uses in self.dbs.items() if t == tm for p in uses}
        pinned = {p for (t, _, _), refs in self.wout.items() if t == tm for p in refs}
        for path, wf in sorted(self.wfiles.items()):
            if wf.shared or path in used or path in pinned:
                continue
            f = self.files.get(path)
            if f is not None and f.owner == actor:
                self._delete_file(path, actor)

    def _share(self, paths: Iterable[str], *, take: bool = True) -> None:
        """R103: referred to in place by an acknowledgement: never its database's to
        delete again, and the coordinator's for good (``take``: unless the coordinator
        ignored the acknowledgement, R56)."""
        for path in paths:
            wf = self.wfiles.get(path)
            f = self.files.get(path)
            if wf is None or f is None:
                continue
            self.wfiles[path] = evolve(wf, shared=True)
            if take and f.owner != USER:
                self.files[path] = evolve(f, owner=COORDINATOR)

    def snapshot_working(self, cmd: c.SnapshotWorking) -> None:
        """R103: small files are uploaded as shared state (segments when merging), large
        ones are referred to in place and pinned until the acknowledgement; a file of the
        user's is copied first (R105, NO_CLAIM); a savepoint copies everything (R55)."""
        tm = self._acting_tm(cmd.subtask, cmd.attempt)
        key = (tm, cmd.subtask)
        savepoint = self._is_savepoint(cmd.checkpoint)
        refs: list[str] = []
        for path in sorted(self.dbs.get(key, frozenset())):
            f = self.files[path]
            if savepoint or f.size < cmd.inline_below:
                name = f"db:{path.rsplit('/', 1)[1]}"
                try:
                    entry = self._write_stream(
                        tm, cmd.subtask, cmd.checkpoint, StateKind.KEYED_SHARED, name, f.size, 1
                    )
                except _StorageFault:
                    self._write_failed(tm, cmd.subtask, cmd.checkpoint)
                    return
                self._add_output(tm, cmd.subtask, cmd.checkpoint, entry)
                continue
            if f.owner == USER:
                # R105: the first checkpoint after NO_CLAIM refers only to files of its own
                copy = self._put_working(tm, cmd.subtask, f.size, faults=False)
                self.dbs[key] = self.dbs[key] - {path}
                refs.append(copy)
                continue
            refs.append(path)
        wkey = (tm, cmd.subtask, cmd.checkpoint)
        self.wout[wkey] = tuple(dict.fromkeys([*self.wout.get(wkey, ()), *refs]))

    def collect_working(self) -> None:
        """R104: the coordinator deletes a shared file once no retained checkpoint, no
        pending acknowledgement and no live database refers to it; a file a lost attempt
        wrote waits until it stopped (R64). SlateDB: delete the checkpoints, then GC."""
        for path, wf in sorted(self.wfiles.items()):
            f = self.files.get(path)
            if f is None or not wf.shared or f.owner != COORDINATOR:
                continue
            if not self._working_needed(path):
                self._delete_file(path, COORDINATOR)

    def _open_databases(self, source: Completed | None, only: TmId | None = None) -> None:
        """R105: each subtask of the running job (of TM ``only``, if given: R66) opens a
        database on the working files the source refers to for subtasks of its own
        operator and its key groups (a projection, in place, no copy) and on copies of
        its small files from their segments; without a source it starts empty."""
        if source is None:
            return
        assignment = redistribute(source.entries, self.vertices, self.cfg.max_parallelism)
        for sub, tm in sorted(self.placement.items()):
            if only is not None and tm != only:
                continue
            lo, hi = key_group_range(self.cfg.max_parallelism, sub.parallelism, sub.index)
            uses = {
                path
                for referred_by, path in source.working
                if referred_by.vertex == sub.vertex
                and path in self.wfiles
                and self.wfiles[path].key_groups[0] <= hi
                and lo <= self.wfiles[path].key_groups[1]
            }
            key = (tm, sub)
            self.dbs[key] = self.dbs.get(key, frozenset()) | uses
            for e in assignment.get(sub, ()):
                st = stream_of(e.handle)
                if e.name.startswith("db:") and st is not None:
                    self._put_working(tm, sub, st.length, faults=False)
