"""One TM's side of the store: its pools, segments and physical files, what its
subtasks wrote and acknowledged, what their backends remember uploading, and what the
TM has heard from the coordinator (R30-R35).

The TM never calls the coordinator: ``acknowledge`` returns the ``Acknowledgement``
to send, a failed write leaves the ``Decline`` to its caller, and the coordinator's
notices are applied by ``on_notice`` in whatever order they arrive, duplicated or late.
What it knows of the job it learns from the engine's calls: the subtasks it runs, each
checkpoint's type (with the write, as Flink's barrier carries it), and on a restart the
retained checkpoints and which attempts are lost.

Its records of files and directories (``fastimpl.catalog``) are its own, in a process
of its own (``TaskManager.alone``, built from the storage, the config, the job id and its
TM id) or beside the other parties in one (``TaskManager.own``, as ``fastimpl.engine``
composes them): they hold only what it created and still owns. It learns each hand-over
from a message: a whole file stops being its own when it acknowledges it (R43), a
directory when the notice of a checkpoint that reported it completes (R42).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast, overload

import attrs
import fsspec  # type: ignore[import-untyped]

from fastimpl.catalog import Catalog
from fastimpl.ids import IdSource, RandomIds
from fastimpl.manager import Manager
from fastimpl.records import BackendRef, Status, Tm
from fastimpl.storage import Storage
from fastimpl.storage_hooks import HookedStorage, StorageHooks
from fastimpl.tm_attempt import BackendKey, OutKey, SubtaskFacts, TmAttempt
from fastimpl.tm_databases import TmDatabases
from fastimpl.tm_duties import TmDuties
from fastimpl.tm_files import TmFiles
from fastimpl.tm_notices import TmNotices
from fastimpl.tm_reuse import TmReuse
from fastimpl.tm_writing import TmWriter
from fastimpl.working import Databases
from spec.config import Config, MergingMode, StateKind
from spec.handles import InPlaceFile, StateEntry
from spec.ids import SubtaskId, TmId
from spec.layout import SAVEPOINTS, job_base, shared_dir
from spec.messages import (
    Acknowledgement,
    CheckpointAborted,
    CheckpointComplete,
    Duty,
    EndJob,
    Held,
    Holdings,
    InUse,
    KeptFile,
    TmAssignment,
    TmEnded,
)

_T = TypeVar("_T")


class _Record(Generic[_T]):
    """A field of a TM's ``TmAttempt``, read and written through the ``TaskManager``:
    ``tm.hosted`` is its attempt's ``hosted``, the one record every part changes."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    @overload
    def __get__(self, party: None, owner: type) -> _Record[_T]: ...
    @overload
    def __get__(self, party: TaskManager, owner: type) -> _T: ...
    def __get__(self, party: TaskManager | None, owner: type) -> _Record[_T] | _T:
        if party is None:
            return self
        return cast(_T, getattr(party._attempt, self.name))

    def __set__(self, party: TaskManager, value: _T) -> None:
        setattr(party._attempt, self.name, value)


class TaskManager:
    """One TM attempt (``tm``) of job ``job``: the calls of its host, each answered by the
    part of the TM whose concern it is, where it is documented with its rules. The parts
    share one record of the attempt (``fastimpl.tm_attempt``, whose fields the TM shows
    as its own): ``fastimpl.tm_writing`` writes and acknowledges, ``fastimpl.tm_reuse``
    reuses what was uploaded, ``fastimpl.tm_notices`` applies the coordinator's notices
    and ``fastimpl.tm_duties`` its duties, ``fastimpl.tm_files`` keeps the segments and
    files, ``fastimpl.tm_databases`` the subtasks' live databases."""

    tm = _Record[TmId]()
    actor = _Record[str]()
    job = _Record[str]()
    cfg = _Record[Config]()
    mode = _Record[MergingMode]()
    catalog = _Record[Catalog]()
    ids = _Record[IdSource]()
    hosted = _Record[list[SubtaskId]]()
    savepoints = _Record[set[int]]()
    m = _Record[Manager]()
    outputs = _Record[dict[OutKey, list[StateEntry]]]()
    acked = _Record[dict[OutKey, tuple[StateEntry, ...]]]()
    backend = _Record[dict[BackendKey, BackendRef]]()
    known_completed = _Record[int]()
    finished_mark = _Record[int]()
    known_aborted = _Record[set[int]]()
    known_watermark = _Record[int]()
    first_checkpoint = _Record[int]()
    finished_savepoints = _Record[set[int]]()
    reset_epoch = _Record[int]()
    assigned_epoch = _Record[int]()
    lost = _Record[set[TmId]]()
    ended = _Record[TmEnded | None]()
    working = _Record[Databases]()
    _per_subtask = _Record[dict[SubtaskId, SubtaskFacts]]("per_subtask")

    def __init__(
        self,
        tm: TmId,
        job: str,
        config: Config,
        catalog: Catalog,
        ids: IdSource,
        first_checkpoint: int = 1,
    ) -> None:
        self._attempt = a = TmAttempt(tm, job, config, catalog, ids, first_checkpoint)
        self._files = files = TmFiles(a)
        self._writer = TmWriter(a, files)
        self._reuse = TmReuse(a)
        self._notices = TmNotices(a, files)
        self._duties = TmDuties(a, files)
        self._databases = TmDatabases(a, self._writer)

    @classmethod
    def alone(
        cls,
        storage: Any,
        root: str,
        config: Config,
        job: str,
        tm: TmId,
        *,
        ids: IdSource | None = None,
        first_checkpoint: int = 1,
        hooks: StorageHooks | None = None,
        finished_mark: int = 0,
    ) -> TaskManager:
        """A TM in a process of its own: ``storage`` is an fsspec file system (or a URL,
        ``root`` then the path under it), and nothing else of the job is needed. It keeps
        its own ``Storage`` and records of the files and directories it created and
        still owns, and deletes only what those say is its own, under its job's base and
        the savepoints it heard of (I5). ``hooks``: the host's observer of its storage
        calls (``fastimpl.storage_hooks``), if any. ``finished_mark``: every checkpoint
        up to it is over for this attempt (R66: a new attempt writes for the checkpoints
        pending when it starts and later ones, for no other), as ``finished`` says."""
        if isinstance(storage, str):
            fs, path = fsspec.core.url_to_fs(storage)
            root = f"{path.rstrip('/')}/{root.strip('/')}" if root else path
        else:
            fs = storage
        store = Storage(fs, root) if hooks is None else HookedStorage(fs, root, hooks)
        if not store.open_files_readable and config.open_files_readable:
            config = attrs.evolve(config, open_files_readable=False)  # as the engine does
        ids = ids if ids is not None else RandomIds()
        party = cls.own(store, config, job, tm, ids, first_checkpoint)
        party.finished_mark = finished_mark
        return party

    @classmethod
    def own(
        cls,
        store: Storage,
        config: Config,
        job: str,
        tm: TmId,
        ids: IdSource,
        first_checkpoint: int = 1,
    ) -> TaskManager:
        """A TM with records of its own over ``store``. The names it draws carry its
        attempt id (R64: what it creates may be found on storage with nobody's record of
        it, its process killed; the name says whose it is)."""
        view = _OwnView(job)
        party = cls(tm, job, config, Catalog(store, ids, view), ids, first_checkpoint)
        view.party = party
        party.catalog.creator_mark = tm
        return party

    # ------------------------------------------------------------------ the attempt, guards (R56)

    def host(self, subtasks: list[SubtaskId]) -> None:
        self._attempt.host(subtasks)

    def restart_knowledge(self, latest: int, mark: int, watermark: int, first: int) -> None:
        self._attempt.restart_knowledge(latest, mark, watermark, first)

    def forget(self) -> None:
        self._attempt.forget()

    def note(self, checkpoint: int, savepoint: bool) -> None:
        self._attempt.note(checkpoint, savepoint)

    def finished(self, checkpoint: int, savepoint: bool = False) -> bool:
        return self._attempt.finished(checkpoint, savepoint)

    def acknowledged(self, subtask: SubtaskId, checkpoint: int) -> bool:
        return self._attempt.acknowledged(subtask, checkpoint)

    def _facts(self, subtask: SubtaskId) -> SubtaskFacts:
        return self._attempt.facts(subtask)

    # ------------------------------------------------------------------ duties (R60-R66, R72, R90)

    def on_duty(self, msg: Duty) -> TmEnded | Held | InUse | None:
        return self._duties.on_duty(msg)

    def holdings(self, msg: Holdings) -> Held:
        return self._duties.holdings(msg)

    def reset(self) -> None:
        self._duties.reset()

    def on_assignment(self, msg: TmAssignment) -> None:
        self._duties.on_assignment(msg)

    def end(self, msg: EndJob) -> TmEnded:
        return self._duties.end(msg)

    def end_job(self, keep: set[str]) -> None:
        self._duties.end_job(keep)

    def restore(
        self,
        hosted: list[SubtaskId],
        retained: list[tuple[int, tuple[StateEntry, ...]]],
        latest: tuple[int, tuple[StateEntry, ...]] | None,
        lost: frozenset[TmId] = frozenset(),
    ) -> None:
        self._duties.restore(hosted, retained, latest, lost)

    # ------------------------------------------------------------------ writing (R10-R17)

    def write(
        self,
        subtask: SubtaskId,
        checkpoint: int,
        kind: StateKind,
        name: str,
        size: int,
        entries: int,
        data: bytes,
        savepoint: bool = False,
    ) -> StateEntry:
        return self._writer.write(subtask, checkpoint, kind, name, size, entries, data, savepoint)

    def _write_stream(
        self,
        subtask: SubtaskId,
        checkpoint: int,
        kind: StateKind,
        name: str,
        size: int,
        entries: int,
        data: bytes,
        partial: bool = False,
    ) -> StateEntry:
        w = self._writer
        return w._write_stream(subtask, checkpoint, kind, name, size, entries, data, partial)

    def write_failed(self, subtask: SubtaskId, checkpoint: int, savepoint: bool = False) -> None:
        self._writer.write_failed(subtask, checkpoint, savepoint)

    def acknowledge(
        self, subtask: SubtaskId, checkpoint: int, savepoint: bool = False
    ) -> tuple[tuple[StateEntry, ...], Acknowledgement]:
        return self._writer.acknowledge(subtask, checkpoint, savepoint)

    # ------------------------------------------------------------------ reuse (R20-R23)

    def backend_ref(self, subtask: SubtaskId, name: str) -> BackendRef:
        return self._reuse.backend_ref(subtask, name)

    def reuse(
        self, subtask: SubtaskId, checkpoint: int, ref: BackendRef, savepoint: bool = False
    ) -> StateEntry | None:
        return self._reuse.reuse(subtask, checkpoint, ref, savepoint)

    def remembered(self, subtask: SubtaskId, name: str) -> StateEntry | None:
        return self._reuse.remembered(subtask, name)

    # ------------------------------------------------------------------ notices (R30-R35)

    def on_notice(self, msg: CheckpointComplete | CheckpointAborted) -> None:
        self._notices.on_notice(msg)

    # ------------------------------------------------------------------ segments and files

    def close_open_files(self) -> None:
        self._files.close_open_files()

    def close_within_files(
        self, which: Callable[[int], bool], subtask_done: SubtaskId | None = None
    ) -> None:
        self._files.close_within_files(which, subtask_done)

    def drop_outputs_where(self, which: Callable[[int], bool]) -> None:
        self._files.drop_outputs_where(which)

    def drop_outputs(self, subtask: SubtaskId, checkpoint: int) -> None:
        self._files.drop_outputs(subtask, checkpoint)

    def flush(self) -> None:
        self._files.flush()

    def kept_files(self) -> tuple[KeptFile, ...]:
        return self._files.kept_files()

    def held_files(self) -> tuple[str, ...]:
        return self._files.held_files()

    def detach(self) -> tuple[str, ...]:
        return self._files.detach()

    # working state (§11): the TM's side of its subtasks' live databases, for a host
    # whose database writes its own files (SlateDB) and tells the TM what it uses

    def track_database(self, subtask: SubtaskId, files: Mapping[str, int], lineage: str) -> None:
        self._databases.track_database(subtask, files, lineage)

    def close_database(self, subtask: SubtaskId) -> None:
        self._databases.close_database(subtask)

    def snapshot_database(
        self, subtask: SubtaskId, checkpoint: int, inline_below: int, savepoint: bool = False
    ) -> tuple[InPlaceFile, ...]:
        return self._databases.snapshot_database(subtask, checkpoint, inline_below, savepoint)

    def database_files(self) -> tuple[str, ...]:
        return self._databases.database_files()

    def pinned_files(self) -> tuple[str, ...]:
        return self._databases.pinned_files()

    def working_files(self) -> Mapping[str, InPlaceFile]:
        return self._databases.working_files()


class _OwnView:
    """What the guards of a TM's own records ask (``CatalogHost``): the TM deletes only
    under its job's base and in savepoints it was told of, and a delete of a file another
    attempt created waits while the TM knows that attempt may still run (R64: told by
    ``TmAssignment.lost``, released by ``LostAttemptStopped``)."""

    def __init__(self, job: str) -> None:
        self._bases = {job_base(job), SAVEPOINTS}
        self._job = job
        self.party: TaskManager | None = None

    @property
    def bases(self) -> set[str]:
        return self._bases

    @property
    def triggered_savepoints(self) -> set[int]:
        return set() if self.party is None else self.party.savepoints

    @property
    def tms(self) -> dict[TmId, Tm]:
        lost = () if self.party is None else self.party.lost
        return {t: Tm(t, Status.LOST) for t in lost}

    def hot_dirs(self) -> frozenset[str]:
        """Directories about to be written again: the hosted subtasks' shared ones."""
        hosted = [] if self.party is None else self.party.hosted
        hot = {shared_dir(self._job, s) for s in hosted}
        hot |= {d.rsplit("/", 1)[0] for d in hot}
        return frozenset(hot | {f"{job_base(self._job)}/taskowned", SAVEPOINTS})
