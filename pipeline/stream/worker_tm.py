"""A subtask's TaskManager on the Spark worker (``fastimpl.parties.TaskManager.alone``).

The TM writes the state files itself, through fsspec, from the Python worker that runs
the subtask's task; what it tells the driver is an encoded ``spec.messages``
``Acknowledgement`` or ``Decline`` (returned through ``collect``), and what the driver
tells it (notices, duties) arrives encoded with the next batch's tasks (``MailItem``s,
applied oldest first, each once: a TM skips what it applied before, and a notice or duty
that is late or repeated changes nothing, R34 and the duties' epochs).

Identity. One TM per subtask attempt: ``tm-<12 hex>``, drawn when a task starts the
subtask without a usable TM. Spark gives a partition no fixed Python worker (consecutive
batches of one partition run in different processes), so a TM kept in one process would
see its subtasks move nearly every batch, and no task could be sent to reach it. The TM's
records therefore travel with the subtask's local RocksDB, as the DB itself does
(``pipeline.stream.subtask``): at the end of a task they are saved into the DB's
directory (``TM_STATE``), and the next task of the subtask, in whichever worker of the
executor, takes DB and TM together. What is saved is data, never an object graph: a
``spec.tm_state.TmState`` (the TM's records, ``fastimpl.parties.export_state``, with
the last mail item applied and the working database's lineage) in its JSON encoding,
which the next task decodes, checks field by field and rebuilds a TM of its process from
(``fastimpl.parties.rebuild``). A state that does not decode starts a new TM attempt,
with the reason logged. A TM's open pooled files are given up in one process and taken
up in the next (``TaskManager.detach`` and ``rebuild``; local disks only, and only
ACROSS merging keeps a file open past a task, which object stores refuse, R16).

What the worker counts of the TM's storage calls (the files a task created) and the
kill point of an injected failure (``deleting``: once the TM's next delete is done) are
hooks the worker gives the TM's storage (``fastimpl.parties.StorageHooks``), not part
of the TM.

A TM attempt ends when its records are lost: its task was killed (the records died with
the worker, or were left in a directory the retry sweeps), the DB was dropped (its
checkpoint aborted, a speculative copy put another back), or the subtask ran on another
executor's disk. The next task starts a new attempt, which the coordinator first hears of
by its acknowledgement (``pipeline.stream.coordination``).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
from attrs import field, frozen

from fastimpl.parties import (
    HookedStorage,
    StorageCall,
    StorageFault,
    StorageHooks,
    TaskManager,
    command_line,
    export_state,
    rebuild,
)
from fastimpl.parties import report_of as tm_report_of
from spec import commands as c
from spec.config import Config, StateKind
from spec.errors import UsageError
from spec.handles import InlineHandle, InPlaceFile, SegmentHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    DatabasesOpened,
    Decline,
    OpenDatabase,
    ResetTm,
    ReusableFiles,
    TmAssignment,
    decode_message,
    encode_message,
)
from spec.tm_state import TmState, TmStateError, decode_tm_state, encode_tm_state

TM_STATE = "ckpt-tm-state.json"
"""In the subtask's DB directory: the TM's records between two tasks, an encoded
``spec.tm_state.TmState`` (RocksDB ignores it)."""
OLD_TM_STATE = "ckpt-tm.pickle"
"""Where earlier versions left the TM as a pickle. Never read (unpickling bytes found on
disk runs whatever code they name): removed where found, and the task starts a new TM
attempt, as for any state it cannot take."""

log = logging.getLogger("pipeline.stream.worker_tm")

MailItem = tuple[str, int, bytes]
"""``(TM id, sequence number, encoded spec.messages notice or duty)``."""


class StateReader:
    """Reads the bytes of a state entry from storage (a restore on a worker, the
    driver's read of the operator state)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options))
        self._fs = fs
        self._root = str(root).rstrip("/")

    def read(self, entry: StateEntry) -> bytes:
        if isinstance(entry.handle, InlineHandle):  # R107: the bytes are in the handle
            return entry.handle.content()
        s = stream_of(entry.handle)
        if s is None:
            raise UsageError(f"{entry.name!r}: {type(entry.handle).__name__} names no bytes")
        path = s.path
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise UsageError(f"{entry.name!r}: handle path {path!r} is not inside the base")
        offset = s.offset if isinstance(s, SegmentHandle) else 0
        full = posixpath.join(self._root, path) if self._root else path
        data = bytes(self._fs.cat_file(full, start=offset, end=offset + s.length))
        if len(data) != s.length:
            raise UsageError(
                f"{entry.name!r}: wanted {s.length} bytes at {offset} of {path}, got {len(data)}"
            )
        return data


@frozen
class TaskManagerRecipe:
    """What a worker needs to build or take up its subtask's TM (in the task's closure):
    the storage, the configuration and the job, nothing else of the driver's."""

    url: str
    job: str
    config: Config
    storage_options: Mapping[str, Any] = field(factory=dict)

    def reader(self) -> StateReader:
        return StateReader(self.url, self.storage_options)

    def open(self, db_dir: Path | None, subtask: SubtaskId, checkpoint: int) -> WorkerTaskManager:
        """The TM saved in ``db_dir`` (the subtask's local DB, taken by this task) if it
        is this job's, else a new TM attempt whose first checkpoint is ``checkpoint``
        (``WorkerTaskManager.not_taken`` says why a saved state was not taken)."""
        fs, root = fsspec.core.url_to_fs(self.url, **dict(self.storage_options))
        hooks = WorkerHooks()
        why: str | None = None
        if db_dir is not None:
            drop_old_state(db_dir)
            saved = db_dir / TM_STATE
            if saved.is_file():
                taken = _thaw(saved.read_bytes(), fs, str(root), self.job, subtask, hooks)
                saved.unlink()  # the records are this task's now; saved again at its end
                if isinstance(taken, Thawed):
                    return WorkerTaskManager(
                        taken.tm, self.reader(), subtask, taken.applied,
                        new=False, hooks=hooks, lineage=taken.lineage,
                    )  # fmt: skip
                why = taken
                log.warning("%s: the saved TM state is not taken (%s): a new TM attempt",
                            subtask, why)  # fmt: skip
        tm = TaskManager.alone(
            fs, str(root), self.config, self.job, f"tm-{uuid.uuid4().hex[:12]}",
            first_checkpoint=checkpoint, hooks=hooks,
            finished_mark=checkpoint - 1,  # every earlier checkpoint is over for it (R66)
        )  # fmt: skip
        tm.host([subtask])
        out = WorkerTaskManager(tm, self.reader(), subtask, 0, new=True, hooks=hooks)
        out.not_taken = why
        return out


def drop_old_state(db_dir: Path) -> bool:
    """Remove a TM pickled by an earlier version (``OLD_TM_STATE``) unread; whether one
    was there."""
    old = db_dir / OLD_TM_STATE
    if not old.is_file():
        return False
    old.unlink()
    log.warning("%s: a pickled TM of an earlier version, removed unread", old)
    return True


class WorkerHooks(StorageHooks):
    """The worker's hooks on its TM's storage: it counts the files the TM creates, and
    calls ``on_delete`` (once, then cleared) when the TM's next delete is done (the
    ``deleting`` point of an injected failure), the queued deletes drained first."""

    def __init__(self) -> None:
        self.created = 0
        self.on_delete: Callable[[], None] | None = None

    def after(self, storage: HookedStorage, call: StorageCall, path: str) -> None:
        if call is StorageCall.CREATE:
            self.created += 1
        elif call is StorageCall.DELETE_FILE or call is StorageCall.DELETE_DIR:
            then, self.on_delete = self.on_delete, None
            if then is not None:
                storage.drain()  # done, not merely queued
                then()


@frozen
class Thawed:
    """A saved TM taken up by this process: the TM, the last mail item it applied, its
    working database's lineage."""

    tm: TaskManager
    applied: int
    lineage: str | None


def _thaw(
    data: bytes, fs: Any, root: str, job: str, subtask: SubtaskId, hooks: StorageHooks
) -> Thawed | str:
    """The TM saved by ``WorkerTaskManager.save``, rebuilt with a storage of this process
    (``hooks`` on it); else why not: the bytes are not a TM state of this version (the
    field and the problem), or it is another job's or subtask's (a restore started a new
    job: the old job's TMs are over, whatever their records say), or its job ended for
    it. A new attempt is safe in each case. Nothing is read from storage or reopened
    before the state is known to be this subtask's."""
    try:
        state = decode_tm_state(data)
    except TmStateError as err:
        return f"undecodable: {err}"
    r = state.records
    if r.job != job:
        return f"{r.tm} is of job {r.job}, not {job}"
    if r.hosted != (subtask,):
        return f"{r.tm} hosts {[str(s) for s in r.hosted]}, not {subtask}"
    if r.ended is not None:
        return f"the job ended for {r.tm}"
    tm = rebuild(r, fs, root, hooks=hooks)
    return Thawed(tm, state.applied, state.lineage)


class WorkerTaskManager:
    """``TaskManagerSide`` on a worker: one subtask's TM for one task."""

    def __init__(
        self,
        tm: TaskManager,
        reader: StateReader,
        subtask: SubtaskId,
        applied: int,
        *,
        new: bool,
        hooks: WorkerHooks,
        lineage: str | None = None,
    ) -> None:
        self.tm = tm
        self.hooks = hooks
        """On the TM's storage (``TaskManager.alone(hooks=...)``): counts and kill point."""
        self.reader = reader
        self.subtask = subtask
        self.applied = applied
        """The sequence number of the last mail item this TM applied."""
        self.new = new
        self._failed: set[int] = set()
        self.lineage = lineage
        """The database directory the subtask's SlateDB is at (``--state-backend working``)."""
        self.reset = False
        """This task applied a ``ResetTm`` (a failover, R60): the TM's databases closed and
        reopened on the latest retained checkpoint's files (R105), not on their latest
        state."""
        self.commands: list[dict[str, Any]] = []
        """The spec commands this TM carried out in this task, in order, as lines of a
        ``fastimpl.trace`` (the driver's run trace takes them, ``pipeline.stream.trace``):
        its writes and reuses. Its acknowledgement, and the notices it applied, the driver
        logs itself (the outcome of an acknowledgement is the coordinator's)."""
        self._reuploading: str | None = None
        self.not_taken: str | None = None
        """Why the state saved in the subtask's DB was not taken (this is then a new TM
        attempt); None if there was none or it was taken."""

    @property
    def created(self) -> int:
        """Files this task created on storage (the worker's count, for the figures)."""
        return self.hooks.created

    @property
    def on_delete(self) -> Callable[[], None] | None:
        """Called (once, then cleared) when the next delete the TM makes is done: an
        injected failure's ``deleting`` point, while the TM may have more to make."""
        return self.hooks.on_delete

    @on_delete.setter
    def on_delete(self, then: Callable[[], None] | None) -> None:
        self.hooks.on_delete = then

    @property
    def tm_id(self) -> str:
        return self.tm.tm

    def apply_mail(self, mail: Sequence[MailItem]) -> int:
        """Apply the items addressed to this TM that it has not applied yet, oldest first;
        how many."""
        n = 0
        for tm, seq, data in sorted(mail, key=lambda m: m[1]):
            if tm != self.tm.tm or seq <= self.applied:
                continue
            msg = decode_message(data)
            if isinstance(msg, CheckpointComplete | CheckpointAborted):
                if msg.job == self.tm.job:
                    self.tm.on_notice(msg)
            elif isinstance(
                msg, ResetTm | TmAssignment | ReusableFiles | OpenDatabase | DatabasesOpened
            ):
                self.tm.on_duty(msg)
                self.reset = self.reset or isinstance(msg, ResetTm)
            else:
                raise UsageError(f"mail item {seq} for {tm} is a {type(msg).__name__}")
            self.applied = seq
            n += 1
        self.tm.flush()
        return n

    def _log(self, cmd: c.Command, error: BaseException | None = None) -> None:
        # a real storage failure, not an armed fault: the model cannot replay it
        self.commands.append(command_line(cmd, error, 1 if error is not None else 0))

    def write(
        self, checkpoint: int, subtask: SubtaskId, kind: StateKind, name: str, data: bytes
    ) -> StateEntry | None:
        """The entry written, or None once a write of this checkpoint failed (the subtask
        declines it at ``acknowledge``, R17)."""
        if checkpoint in self._failed:
            return None
        # The upload again of what ``reuse`` may not reuse is, in the model, ReuseShared.
        again, self._reuploading = self._reuploading == name, None
        cmd: c.Command = (
            c.ReuseShared(checkpoint, subtask, name)
            if again
            else c.WriteState(checkpoint, subtask, kind, name, len(data), 1)
        )
        try:
            entry = self.tm.write(subtask, checkpoint, kind, name, len(data), 1, data)
        except StorageFault as err:
            self._log(cmd, err)
            self.tm.write_failed(subtask, checkpoint)
            self._failed.add(checkpoint)
            return None
        self._log(cmd)
        return entry

    def reuse(self, checkpoint: int, subtask: SubtaskId, entry: StateEntry) -> StateEntry | None:
        """R20-R22: the entry acknowledged for an upload of a completed checkpoint, when
        this TM's backend remembers exactly that upload and may still reuse it; None:
        the caller uploads the bytes again. The backend's memory is the TM's own (never
        a cache of the worker's), and it must name the very handle the completed
        checkpoint holds (SPARK-55820)."""
        if checkpoint in self._failed:
            return None
        remembered = self.tm.remembered(subtask, entry.name)
        if remembered is None or remembered.handle != entry.handle:
            return None
        reused = self.tm.reuse(subtask, checkpoint, self.tm.backend_ref(subtask, entry.name))
        if reused is None:
            self._reuploading = entry.name
        else:
            self._log(c.ReuseShared(checkpoint, subtask, entry.name))
        return reused

    def acknowledge(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        if checkpoint in self._failed:
            return self.decline(checkpoint, subtask)
        try:
            _, ack = self.tm.acknowledge(subtask, checkpoint)
        except StorageFault:
            return self.decline(checkpoint, subtask)
        self.tm.flush()
        return encode_message(ack)

    def decline(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        if not self.tm.acknowledged(subtask, checkpoint):
            self.tm.write_failed(subtask, checkpoint)
        self._failed.add(checkpoint)
        return encode_message(Decline(self.tm.job, checkpoint, subtask, self.tm.tm))

    def read(self, entry: StateEntry) -> bytes:
        return self.reader.read(entry)

    # -- working state (§11): the TM's side of the subtask's SlateDB (``working_task``)
    def track(self, subtask: SubtaskId, files: Mapping[str, int], lineage: str) -> None:
        """R101, R102: the database at ``lineage`` uses exactly ``files`` now (its
        manifest's SSTs, path -> size); what it no longer uses and still owns goes."""
        self.lineage = lineage
        self.tm.track_database(subtask, files, lineage)
        self.tm.flush()

    def known_sizes(self) -> dict[str, int]:
        """The sizes of the working files this TM's databases use or its snapshots pin."""
        return {p: f.length for p, f in self.tm.working_files().items()}

    def open_restored(self, subtask: SubtaskId, epoch: int, files: Sequence[InPlaceFile]) -> None:
        """R105: the database restored for ``subtask`` uses ``files`` where they are (a
        clone's SSTs in the databases it was cloned from); nothing is copied."""
        self.tm.on_duty(OpenDatabase(self.tm.job, self.tm.tm, epoch, subtask, tuple(files), ()))

    def close_database(self, subtask: SubtaskId) -> None:
        """The subtask's database is given up (a restore replaces it): it uses nothing,
        and each private file of it that no pending snapshot pins goes (R102)."""
        self.tm.close_database(subtask)
        self.tm.flush()

    def snapshot_working(self, checkpoint: int, subtask: SubtaskId) -> tuple[InPlaceFile, ...]:
        """R103: refer to every file the database uses in place (pinned until the
        acknowledgement); the files, with their sizes. Every SST is referred to in place,
        whatever its size: a SlateDB clone reads its source's SSTs where they are, so a
        merged copy could not be restored from (``inline_below`` 1)."""
        if checkpoint in self._failed:
            return ()
        return self.tm.snapshot_database(subtask, checkpoint, inline_below=1)

    def save(self, db_dir: Path) -> None:
        """Leave the TM's records in ``db_dir`` for the subtask's next task (``TM_STATE``,
        written whole then renamed); the open files' handles are given up (every append
        is durable already)."""
        self.tm.flush()  # a queued delete is in no record
        records = export_state(self.tm)
        data = encode_tm_state(TmState(records, self.applied, self.lineage))
        self.tm.detach()
        tmp = db_dir / (TM_STATE + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, db_dir / TM_STATE)

    def close(self) -> None:
        """Finish the deletes the TM queued (its records stay wherever they were saved)."""
        self.tm.flush()

    def report(self) -> bytes:
        """What the TM records, for the driver (JSON): the answers to ``Holdings`` and
        ``EndJob`` and the observation of the invariants come from the last report of
        each TM, which is exact between two batches (a TM changes its records only
        while a task of its subtask runs)."""
        return report_of(
            self.tm,
            self.applied,
            self.created,
            new=self.new,
            lineage=self.lineage,
            commands=self.commands,
        )


def report_of(
    tm: TaskManager,
    applied: int,
    created: int = 0,
    *,
    new: bool = False,
    lineage: str | None = None,
    commands: Sequence[dict[str, Any]] = (),
) -> bytes:
    """The TM's report (``fastimpl.parties.report_of``, its decided deletes carried out
    first), the fields of its JSON codec (``TmReport.to_json``) as they are, with what the driver
    answers for the TM between two tasks (``held``: every file it records, for
    ``Holdings``; ``owned``: the files it owns, for ``EndJob``; ``working``: the files its
    databases use, for ``DatabaseFiles``), the files its unacknowledged snapshots pin, and
    the worker's own figures."""
    report: dict[str, Any] = json.loads(tm_report_of(tm).to_json())["report"]
    report.update(
        job=tm.job,
        applied=applied,
        created=created,
        new=new,
        owned=[[k.path, k.size, k.creator] for k in tm.kept_files()],
        held=list(tm.held_files()),
        # working state (§11): R104's DatabaseFiles, the database directory it writes,
        # and R103's pins
        working=list(tm.database_files()),
        lineage=lineage,
        pinned=list(tm.pinned_files()),
        commands=list(commands),
    )
    return json.dumps(report, sort_keys=True).encode()


def deliver_mail(
    recipe: TaskManagerRecipe, db_dir: Path, subtask: SubtaskId, mail: Sequence[MailItem]
) -> bytes:
    """Apply the mail to the TM saved in ``db_dir`` (taken by the caller) and save it
    again: how the last notices reach the TMs once no batch follows. Its report, or
    b"" when no TM of this job is saved there."""
    drop_old_state(db_dir)
    saved = db_dir / TM_STATE
    if not saved.is_file():
        return b""
    fs, root = fsspec.core.url_to_fs(recipe.url, **dict(recipe.storage_options))
    hooks = WorkerHooks()
    taken = _thaw(saved.read_bytes(), fs, str(root), recipe.job, subtask, hooks)
    if not isinstance(taken, Thawed):
        log.warning("%s: the saved TM state is not taken (%s): no mail delivered", subtask, taken)
        return b""
    party = WorkerTaskManager(
        taken.tm, recipe.reader(), subtask, taken.applied,
        new=False, hooks=hooks, lineage=taken.lineage,
    )  # fmt: skip
    party.apply_mail(mail)
    party.save(db_dir)
    out = party.report()
    party.close()
    return out
