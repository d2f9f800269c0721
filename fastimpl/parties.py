"""The embedding API: the two parties of the store, for an engine that runs them itself.

``fastimpl.CheckpointStore`` runs a job's coordinator and TMs in one process. An engine
whose TMs are processes of their own (Flink's TaskExecutors, Spark's executors) embeds the
two parties instead: one ``CheckpointCoordinator`` where its job master runs, one
``TaskManager`` in each TM process, meeting only through the messages of
``spec.messages`` (as bytes: ``encode_message`` / ``decode_message``) and the storage
both write. Placing subtasks, starting and stopping TM processes and carrying the bytes
are the engine's, as in Flink. ``examples/embedding`` is a complete engine written on
these names alone, and ``docs/embedding.md`` walks through it with the rules of each step.

Every name is re-exported from the module that defines it, which cites the rules its
calls carry; this module implements none, so it names none (the traceability table of
``spec/SPEC.md`` lists the code that does).

The coordinator's side
----------------------

``CheckpointCoordinator(config, vertices, num_tms, storage, ids, engine, job_id="job-0")``
    One job's coordinator. ``storage`` is a ``Storage`` over the checkpoint root,
    ``ids`` an ``IdSource`` (``RandomIds()``), ``engine`` the host's ``CoordinatorEngine``.
    ``deploy(placement)`` records where the subtasks run (all on live TMs). Then each
    call returns what it produced, in the manner of raft's ``Ready``: its result, and
    the notices it decided wait in the coordinator until the host takes them:

    - ``ready() -> Ready``: what the calls since the last ``ready`` produced, for the
      host to carry out in this order: first what it persists (its HA state: the
      ``ha_state`` of the coordinator now), then ``deletes``, the files and
      directories the coordinator decided to delete, which its storage holds until the
      host calls ``Storage.perform(ready.deletes)`` (listing them as gone meanwhile),
      then ``notices``, the ``(tm, CheckpointComplete | CheckpointAborted)`` to send, in
      order (the transport may lose, repeat or reorder them). So a coordinator that
      dies between the steps restarts from HA state naming only files that are there.
      A host takes it after each call, or once after a batch of calls; a ``ResetTm`` or
      ``forget_tm`` in a later call of the batch drops the notices for that TM, as the
      host drops those it queued.
    - ``trigger(savepoint=False) -> int``: the new checkpoint's id. The engine
      carries the barrier to the TMs itself.
    - ``receive_ack(Acknowledgement)``, ``receive_decline(Decline)``: a TM's answer to a
      barrier, decoded. One from an attempt the coordinator gave up on, or for a
      checkpoint no longer pending, changes nothing (its whole files aside).
    - a completion, whose storage effect the host carries out (R51: the ``_metadata``
      is on storage before any TM hears of it): ``prepare_completion(cid) ->
      MetadataWrite`` (``path``, ``data``) changes nothing; the host writes ``data`` as
      ``path`` (``Storage.write_metadata``, atomically), then calls
      ``metadata_written(cid) -> Completed``: the completed checkpoint (``id``, ``job``,
      ``metadata``: the ``_metadata`` path under the root, ``entries``,
      ``directories``), with ``CheckpointComplete`` notices for every current TM; or
      ``metadata_write_failed(cid, fault) -> CompletionFailed``: it aborted instead,
      with ``CheckpointAborted`` notices, and the error for the host to raise.
      ``complete(cid)`` and ``complete_through(coord, storage, cid)`` are the three
      steps in a row. ``CompletionFailed`` (``checkpoint``, ``reason``, ``cause``) is
      raised too when the handles could not be registered (R54), or the checkpoint
      aborted while its ``_metadata`` was written (the file is deleted).
      ``CommandError`` (a ``CkptError``; nothing changed) while a subtask has not
      acknowledged.
    - ``abort(cid)``: ``CheckpointAborted`` notices.
    - ``lose(tm)``: the engine's word that a TM is lost (every pending checkpoint
      aborts); ``receive_stopped(AttemptStopped)``: that a lost attempt's process has
      stopped (its unrecorded files are swept, asking live TMs ``Holdings``).
    - ``failover()``: every subtask restarts: lost TMs are replaced
      (``start_tm``), survivors get ``ResetTm``, every TM a ``TmAssignment``.
      ``replace(tm) -> TmId``: a task-level failover of one TM, the new attempt.
    - ``end_job(retain=...)``: every TM gets ``EndJob`` and answers ``TmEnded``;
      with ``retain`` the retained checkpoints are the user's, otherwise they go.
    - ``restore(spec.commands.Restore(checkpoint, parallelism, mode))``: a
      new job from a retained checkpoint or a savepoint (``docs/library.md``).

    What the engine reads, as values (never the records themselves):

    - ``running_job() -> str`` (a restore starts a new job); ``is_running() -> bool``;
      ``pending_checkpoints() -> tuple[int, ...]``; ``retained_checkpoints() ->
      tuple[Completed, ...]``, oldest first; ``latest_checkpoint() -> int``;
      ``lineage_bases() -> frozenset[str]``, the job bases it may delete in;
    - ``attempt_status(tm) -> Status | None`` (``ALIVE``, ``LOST``: given up on and
      maybe still running, ``STOPPED``, or ``None``: never heard of);
      ``attempts() -> Mapping[TmId, Status]``, the attempts alive or lost;
    - ``file_owners() -> Mapping[str, str]``, ``open_files() -> frozenset[str]``: what
      the coordinator's own records hold (the TMs' are in their reports);
    - ``state_to_restore(subtask) -> tuple[StateEntry, ...]``: what a subtask of a
      restored job starts from;
    - ``working_needed() -> frozenset[str]``: the working files (SPEC §11) a checkpoint
      refers to in place or a live database uses; ``collect_working()`` deletes the
      coordinator's shared ones nothing needs.

    For attempts an engine starts itself (Spark starts a task's TM in the task, and the
    coordinator first hears of it by its acknowledgement):

    - ``adopt_attempt(subtask, tm, first_checkpoint) -> TmId``: ``tm`` runs ``subtask``
      in place of the attempt placed there, which never ran (returned), and may have
      written from ``first_checkpoint`` on; a retried one that replaces an attempt that
      ran is ``replace(old, tm)``;
    - ``attempt_ended(tm, hosted=(), first_checkpoint=1)``: an attempt given up on has
      stopped, having run ``hosted``; one never heard of is taken as a lost attempt of the
      running job; then as ``receive_stopped``.

``CoordinatorEngine``
    The protocol the host implements, the coordinator's only way out besides ``ready``:
    ``duty(tm, msg) -> answer``
    (reliable: ``TmEnded`` for ``EndJob``, ``Held`` for ``Holdings``, ``InUse`` for
    ``DatabaseFiles``, else ``None``; a ``ResetTm`` also drops the notices still
    queued for that TM), ``start_tm(job, first_checkpoint, finished_mark) -> TmId``,
    ``place(subtasks, tms) -> placement``, ``placed(placement)``, ``forget_tm(tm)``.

``Storage(fs, root)``, ``RandomIds()``, ``IdSource``
    The coordinator's storage (an fsspec file system and the root path under it; the
    coordinator's deletes wait for the host's ``perform(ready.deletes)``, then run in a
    background thread: ``drain()`` waits for them, ``list_files()``
    lists the root, ``files_under(path) -> set[str]`` a directory, ``exists_dir(path)``;
    ``read_range(path, offset, length) -> bytes`` reads a state handle's bytes back;
    ``close_all()`` waits for the deletes and closes what is open) and where new file
    names come from. ``protocol`` (read-only, a ``str``) names the kind of store:
    ``"file"`` for a local disk, else the object store's (``"s3"``, ``"memory"``): what a
    host checks before relying on what only a local disk has (directories, a file still
    open in one process readable in another).

``open_base(fs, root, config, token) -> (Storage, Config)``, ``lease_token(tool="") -> bytes``
    A new job's storage: refuses (``BaseInUseError``) a base that holds a job, a
    savepoint or another store's lease, takes the lease with ``token``, and turns
    ``open_files_readable`` off where open files are not readable (object stores).
    ``lease_token`` makes a token no other writer holds, naming the host, the process,
    since when and the ``tool``: for ``open_base`` and ``recover_coordinator``'s
    ``lease``. All of it is ``fastimpl.base_opening``'s, which the in-process store
    opens its base with too.

The task manager's side
-----------------------

``TaskManager.alone(storage, root, config, job, tm, first_checkpoint=1, hooks=None,
finished_mark=0)``
    One TM attempt in a process of its own, built from the storage (an fsspec file
    system, or a URL with ``root`` ""), the config, the job id and its TM id: it keeps
    records of only what it created and still owns. ``hooks``: a ``StorageHooks`` on its
    storage calls; ``finished_mark``: every checkpoint up to it is over for this attempt
    (a replacement's, ``CoordinatorEngine.start_tm``). ``tm`` and ``job`` are its
    attempt's id and its job's. Each call returns what it produced, and the TM never
    calls the coordinator:

    - ``host(subtasks)``: the subtasks the engine runs here now.
    - ``finished(cid, savepoint) -> bool``, ``acknowledged(subtask, cid) -> bool``: the
      checks a host makes before a write or an acknowledgement (a checkpoint the
      TM knows is over is refused, nothing is written).
    - ``write(subtask, cid, kind, name, size, entries, data, savepoint=False) ->
      StateEntry``: one state handle's bytes. A ``StorageFault`` means the
      subtask declines: call ``write_failed(subtask, cid)`` and send a ``Decline``.
    - ``backend_ref(subtask, name)`` then ``reuse(subtask, cid, ref) -> StateEntry |
      None``: incremental state uploaded before: the old handle or a
      placeholder, or ``None`` when it must be written again (``write``).
    - ``acknowledge(subtask, cid) -> (written, Acknowledgement)``: the message to send;
      a ``StorageFault`` declines as above.
    - ``on_notice(CheckpointComplete | CheckpointAborted)``: any order, twice or never.
    - ``on_duty(duty) -> TmEnded | Held | InUse | None``: the answer goes back as the
      result of the engine's ``duty``.
    - ``flush()``: waits until every delete the TM decided has been carried out (they
      run in a background thread, which dies with the process): a host calls it before
      it answers a message whose effects it reports, and before its process exits (a
      queued delete lost with the process leaves an orphan).
    - ``kept_files() -> tuple[KeptFile, ...]``, ``held_files() -> tuple[str, ...]``: the
      files it owns with their sizes and creators, and every file it records: what it
      would answer ``EndJob`` and ``Holdings`` now, for a host that answers for a TM it
      does not keep running between tasks (with its ``report_of``, below).
    - ``remembered(subtask, name) -> StateEntry | None``: what the subtask's backend
      remembers uploading as ``name``, to compare with the entry the latest completed
      checkpoint holds before ``reuse``.
    - ``detach() -> tuple[str, ...]``: its open pooled files' handles given up without
      closing them, for a host that continues the attempt in another process from
      ``export_state`` (below; ``rebuild`` reopens them; local disks only); the files
      given up. The object is not used afterwards.
    - working state, for a host whose database writes its own files (SlateDB):
      ``track_database(subtask, files, lineage)`` (the database uses exactly ``files``
      now; what it no longer uses and owns goes), ``close_database(subtask)``,
      ``snapshot_database(subtask, cid, inline_below, savepoint=False) ->
      tuple[InPlaceFile, ...]`` (the files referred to in place, pinned until the
      acknowledgement), and the read-only ``database_files()``, ``pinned_files()``,
      ``working_files() -> Mapping[str, InPlaceFile]`` (what its databases use, what its
      snapshots pin, and the sizes of both).

``export_state(tm) -> TaskManagerState``, ``rebuild(state, storage, root, hooks=None)``
    A TM's records as data (``spec.tm_state``) and the TM rebuilt from them in another
    process (local disks only: its open pooled files are reopened). For an engine that
    hands a live TM's state to a new process of the same attempt (``flush`` first: a
    queued delete is in no record; ``detach`` after); a killed TM needs neither (the
    coordinator sweeps what it left).

Observing the job and recovering it
-----------------------------------

``report_of(tm) -> TmReport``
    What a TM's own records say, as a value with a JSON codec (``to_json``,
    ``TmReport.from_json``) that a TM process sends to the host.
``observe(coordinator, reports, on_storage, orphans=, deletions=) -> (Observation, list[str])``
    The job's one observation (``spec.observation``): the coordinator's records and the
    TMs' reports merged over a listing of storage, and where the parties disagree. The
    in-process store, the process harness and the Spark job build theirs with it; the
    invariants (``spec.invariants.check_all``) judge it.
``recover_coordinator(config, job_spec, fs, root, engine, ...) -> (coord, Storage, report)``
    The one recovery after the host process died (R95, R96): a coordinator rebuilt from
    storage alone, deleting only what no kept checkpoint refers to, built on ``engine``
    from the start: the engine names the new job's attempts (``start_tm``), is told where
    its subtasks are placed (``placed``), is handed the restore's duties and starts the
    subtasks from ``state_to_restore``. ``incarnation_to_recover`` says which job.
``recover(config, job_spec, fs, root, ...) -> (engine, RecoveryReport)``
    The same hosted in process (an ``InProcessEngine``, what ``CheckpointStore.recover``
    returns a store over).
``resume(config, vertices, storage, ids, engine, ha, placement) -> coord``; ``ha_state``
    The coordinator's process died while its TMs run on (R95): a new coordinator rebuilt
    from storage and what the engine's HA services kept (a ``HaState``: ``ha_state`` of
    the old one after each call, Flink's job id, checkpoint counter and pointers to the
    completed checkpoints);
    every subtask then fails over to it (R60-R62). Both doors rebuild through
    ``fastimpl.resume.rebuild``.
``state_document(...)``, ``write_state(storage, base, data)``, ``withdraw_state(storage,
base)``, ``note_pending(triggered, pending, retained, now)``, ``PendingAt``
    The writer state a host publishes in a job base for outside collectors (SPEC
    "Outside collectors"): the pending checkpoints with their trigger times, the open
    files and the working files a live database needs.

For a host's own bookkeeping and tests
--------------------------------------

``subtasks_of(vertices) -> list[SubtaskId]``
    Every subtask of the vertices, in the order ``deploy`` expects them placed.
``is_working_path(path) -> bool``
    Whether a path is working state (SPEC §11), whose objects a database collects.
``WRITER_STATE``
    The name of the writer state the store publishes in each job base: no party's
    checkpoint data, left out of what a host counts as state.
``HookedStorage(fs, root, hooks)``, ``StorageHooks``, ``StorageCall``
    A ``Storage`` that calls ``hooks`` before each storage call (``StorageCall`` names
    which): where a host's tests inject a fault or a kill.
``command_line(command) -> str``
    One command of the trace language (``fastimpl.CommandTrace``), as a line.

Reading a base without a party
------------------------------

For a tool that reads what the store wrote without running a party (a storage audit, a
garbage collector outside the engine, a generator of test bases), the formats of the
two files the store publishes in a job base:

``decode_metadata(data, expected_job=None, source=...) -> Metadata``
    A completed checkpoint's or savepoint's ``_metadata`` parsed and validated;
    ``MetadataError`` (a ``CkptError`` naming the file, the field and the problem) for
    anything else, whatever the bytes. ``Metadata`` is a frozen value: ``job``,
    ``checkpoint``, ``savepoint``, ``entries`` (``spec.handles.StateEntry``),
    ``directories``, ``shared_bases``, ``version``, ``max_parallelism``, ``working``.
``check_metadata_place(metadata, path)``
    Raises ``MetadataError`` when a ``chk-N/_metadata`` does not describe checkpoint N
    (or a ``savepoint-N/_metadata`` savepoint N): a file copied to another's place.
``encode_metadata(checkpoint, job, savepoint, entries, directories, ...) -> bytes``
    The bytes the store writes as a ``_metadata`` for those entries (keywords
    ``max_parallelism`` and ``working`` as ``Metadata`` has them).
``WRITER_STATE``, ``WRITER_STATE_FORMAT``
    The name of the live writer's published state in the job base (a JSON document:
    what a collector must not take yet, ``docs/audit.md``) and the value of its
    ``format`` field.

Messages and errors
-------------------

The messages (``spec.messages``): TM -> coordinator ``Acknowledgement``, ``Decline``;
notices ``CheckpointComplete``, ``CheckpointAborted``; duties ``ResetTm``,
``TmAssignment``, ``ReusableFiles``, ``LostAttemptStopped``, ``EndJob``, ``Holdings``,
``OpenDatabase``, ``DatabasesOpened``, ``DatabaseFiles`` and their answers ``TmEnded``,
``Held``, ``InUse``; engine -> coordinator ``AttemptStopped``; ``RestoreAssignment``,
``RetainedCheckpoint``, ``KeptFile`` are parts or views of them. ``Message``, ``Duty``,
``Answer`` and ``Notice`` are their unions. ``encode_message(msg) -> bytes`` and
``decode_message(bytes) -> Message`` (``MessageError``, naming the field, for anything
that is not a message of ``MESSAGE_VERSION``).

``CkptError`` is the base of every error the store raises; ``StorageFault`` (a storage
call failed: the subtask declines) and ``CommandError`` (a call invalid in the
current state; nothing changed) are the two a host handles, with ``CompletionFailed``
from a completion. A call given what the API
does not take raises ``UsageError`` (also a ``ValueError``), ``WrongTypeError`` (also a
``TypeError``) or ``NotFoundError`` (also a ``KeyError``); ``OperationFailed`` (also a
``RuntimeError``) says something the library ran could not finish.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastimpl.base_opening import lease_token, open_base
from fastimpl.checkpoint_lifecycle import CompletionFailed, MetadataWrite
from fastimpl.completion import complete_through
from fastimpl.coordinator import (
    CheckpointCoordinator,
    CoordinatorEngine,
    Notice,
    Ready,
    subtasks_of,
)
from fastimpl.ids import IdSource, RandomIds
from fastimpl.metadata import Metadata, MetadataError
from fastimpl.metadata import check_named as check_metadata_place
from fastimpl.metadata import decode as decode_metadata
from fastimpl.metadata import encode as encode_metadata
from fastimpl.records import Completed, Status
from fastimpl.recovery import RecoveryReport, incarnation_to_recover, recover, recover_coordinator
from fastimpl.reports import TmReport, observe, report_of
from fastimpl.resume import HaState, ha_state, resume
from fastimpl.storage import Storage, StorageFault
from fastimpl.storage_hooks import HookedStorage, StorageCall, StorageHooks
from fastimpl.taskmanager import TaskManager
from fastimpl.tm_state import export_state, rebuild
from fastimpl.trace import command_line
from fastimpl.working import is_working_path
from fastimpl.writer_state import FORMAT as WRITER_STATE_FORMAT
from fastimpl.writer_state import (
    WRITER_STATE,
    PendingAt,
    note_pending,
    state_document,
    withdraw_state,
    write_state,
)
from spec.errors import (
    CkptError,
    CommandError,
    NotFoundError,
    OperationFailed,
    UsageError,
    WrongTypeError,
)
from spec.messages import (
    MESSAGE_VERSION,
    Acknowledgement,
    Answer,
    AttemptStopped,
    CheckpointAborted,
    CheckpointComplete,
    DatabaseFiles,
    DatabasesOpened,
    Decline,
    Duty,
    EndJob,
    Held,
    Holdings,
    InUse,
    KeptFile,
    LostAttemptStopped,
    Message,
    MessageError,
    OpenDatabase,
    ResetTm,
    RestoreAssignment,
    RetainedCheckpoint,
    ReusableFiles,
    TmAssignment,
    TmEnded,
    decode_message,
    encode_message,
)

PUBLIC_MODULES: frozenset[str] = frozenset({"fastimpl", "fastimpl.api", "fastimpl.parties"})
"""The modules of ``fastimpl`` an engine or a tool may import (``docs/embedding.md``);
every other module is the store's inside and may change under it."""

PUBLIC_MEMBERS: Mapping[str, frozenset[str]] = {
    "CheckpointCoordinator": frozenset(
        {
            "deploy",
            "ready",
            "trigger",
            "receive_ack",
            "receive_decline",
            "complete",
            "prepare_completion",
            "metadata_written",
            "metadata_write_failed",
            "abort",
            "lose",
            "receive_stopped",
            "failover",
            "replace",
            "end_job",
            "restore",
            "state_to_restore",
            "is_running",
            "pending_checkpoints",
            "attempt_status",
            "attempts",
            "file_owners",
            "open_files",
            "adopt_attempt",
            "attempt_ended",
            "collect_working",
            "working_needed",
            "running_job",
            "retained_checkpoints",
            "latest_checkpoint",
            "lineage_bases",
        }
    ),
    "CoordinatorEngine": frozenset({"duty", "start_tm", "place", "placed", "forget_tm"}),
    "Ready": frozenset({"notices", "deletes"}),
    "MetadataWrite": frozenset({"checkpoint", "path", "data"}),
    "Completed": frozenset({"id", "job", "metadata", "entries", "directories"}),
    "Storage": frozenset(
        {
            "drain",
            "write_metadata",
            "perform",
            "list_files",
            "files_under",
            "read_range",
            "exists_dir",
            "close_all",
            "protocol",
        }
    ),
    "TaskManager": frozenset(
        {
            "alone",
            "host",
            "finished",
            "acknowledged",
            "write",
            "write_failed",
            "backend_ref",
            "reuse",
            "acknowledge",
            "on_notice",
            "on_duty",
            "tm",
            "job",
            "flush",
            "kept_files",
            "held_files",
            "remembered",
            "detach",
            "track_database",
            "close_database",
            "snapshot_database",
            "database_files",
            "pinned_files",
            "working_files",
        }
    ),
}
"""The members of each class above that this docstring documents, and so the only
ones a host may read, write or call (``tests/test_pipeline_public_api.py`` holds
``pipeline/`` to them); every other attribute is the party's own records."""


__all__ = [
    "MESSAGE_VERSION",
    "PUBLIC_MEMBERS",
    "PUBLIC_MODULES",
    "WRITER_STATE",
    "WRITER_STATE_FORMAT",
    "Acknowledgement",
    "Answer",
    "AttemptStopped",
    "CheckpointAborted",
    "CheckpointComplete",
    "CheckpointCoordinator",
    "CkptError",
    "CommandError",
    "Completed",
    "CompletionFailed",
    "CoordinatorEngine",
    "DatabaseFiles",
    "DatabasesOpened",
    "Decline",
    "Duty",
    "EndJob",
    "HaState",
    "Held",
    "Holdings",
    "HookedStorage",
    "IdSource",
    "InUse",
    "KeptFile",
    "LostAttemptStopped",
    "Message",
    "MessageError",
    "Metadata",
    "MetadataError",
    "MetadataWrite",
    "NotFoundError",
    "Notice",
    "OpenDatabase",
    "OperationFailed",
    "PendingAt",
    "RandomIds",
    "Ready",
    "RecoveryReport",
    "ResetTm",
    "RestoreAssignment",
    "RetainedCheckpoint",
    "ReusableFiles",
    "Status",
    "Storage",
    "StorageCall",
    "StorageFault",
    "StorageHooks",
    "TaskManager",
    "TmAssignment",
    "TmEnded",
    "TmReport",
    "UsageError",
    "WrongTypeError",
    "check_metadata_place",
    "command_line",
    "complete_through",
    "decode_message",
    "decode_metadata",
    "encode_message",
    "encode_metadata",
    "export_state",
    "ha_state",
    "incarnation_to_recover",
    "is_working_path",
    "lease_token",
    "note_pending",
    "observe",
    "open_base",
    "rebuild",
    "recover",
    "recover_coordinator",
    "report_of",
    "resume",
    "state_document",
    "subtasks_of",
    "withdraw_state",
    "write_state",
]
