"""Disaggregated working state (SPEC §11, R100-R106): a subtask's live database keeps its
files in ``<job>/taskowned/working/<subtask>/db/`` on the checkpoint storage, and a
checkpoint refers to them where they are instead of uploading a copy.

Two sides, as the parties are:

* ``Databases`` is one TM attempt's: the files each of its databases uses, the files an
  unacknowledged snapshot refers to (pinned, R103) and the files the attempt wrote. It
  writes a working file whole (R101), deletes a private file of its own once no database
  of it uses it and no snapshot pins it (R102), hands the files a snapshot refers to in
  place to the coordinator with the acknowledgement (``Acknowledgement.in_place``), and
  opens databases on a restored checkpoint's files (``OpenDatabase``, R105). It never
  deletes a file it no longer owns: a shared file is the coordinator's (R102).
* ``SharedWorking`` is the coordinator's: which working files acknowledgements handed it
  (shared, R100), the in-place references of pending and retained checkpoints, and its
  collection (R104), which asks the live TMs which files their databases use
  (``DatabaseFiles``) before it deletes a shared file nobody refers to.

The engine's calls that drive them (``WriteWorking``, ``DropWorking``,
``SnapshotWorking``, ``CollectWorking``) are ``fastimpl.engine.WorkingCalls``: they reach
into the engine's parties, and this module is imported by the coordinator and the TM,
which the engine imports (no import circle, issue 34).

The parties call in through small hooks marked ``# working state (§11)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

from fastimpl.catalog import Catalog
from fastimpl.records import Completed, Pending, StoredFile
from fastimpl.redistribute import assign
from fastimpl.storage import Storage, StorageFault
from spec.config import Config, VertexSpec
from spec.effects import COORDINATOR, USER, tm_actor
from spec.errors import CommandError, Reason, UsageError
from spec.handles import InPlaceFile, StateEntry, stream_of
from spec.ids import SubtaskId, TmId
from spec.keygroups import key_group_range
from spec.layout import WORKING, working_dir
from spec.messages import (
    Acknowledgement,
    Answer,
    DatabaseFiles,
    DatabasesOpened,
    Duty,
    InUse,
    OpenDatabase,
)

DB_PREFIX = "db:"
"""The state name of a small working file merged into a checkpoint (R103)."""

PinKey = tuple[SubtaskId, int]


def is_working_path(path: str) -> bool:
    """A file under ``<base>/taskowned/working/<subtask>/db/`` (R1), at any depth (a
    store such as SlateDB keeps ``compacted/``, ``manifest/`` ... below ``db/``)."""
    parts = path.split("/")
    return len(parts) >= 6 and parts[1] == "taskowned" and parts[2] == WORKING and parts[4] == "db"


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


@contextmanager
def unfaulted(storage: Storage) -> Iterator[None]:
    """A copy made while restoring or for a NO_CLAIM snapshot (R105) arms no fault in the
    model: an armed fault waits for the next call of its kind outside it."""
    armed, storage.armed = storage.armed, []
    try:
        yield
    finally:
        storage.armed = armed


# ------------------------------------------------------------------------ the TM's side


class Databases:
    """One TM attempt's live databases (R100-R102, R105, R106)."""

    def __init__(self, catalog: Catalog, job: str, tm: TmId, max_parallelism: int) -> None:
        self.catalog = catalog
        self.job = job
        self.tm = tm
        self.actor = tm_actor(tm)
        self.max_parallelism = max_parallelism
        self.uses: dict[SubtaskId, set[str]] = {}
        """The files each database uses."""
        self.pins: dict[PinKey, tuple[str, ...]] = {}
        """R103: the files each unacknowledged snapshot refers to in place."""
        self.known: dict[str, InPlaceFile] = {}
        """Size and key groups of every file a database of this attempt uses or pins."""
        self.written: set[str] = set()
        """Files this attempt wrote and may still own: what R102 may delete. Kept when
        the tables are forgotten (a reset), as the attempt's storage records are."""
        self.opened: set[tuple[int, SubtaskId]] = set()
        """The ``OpenDatabase`` duties applied (epoch, subtask): each once."""
        self.users: set[str] = set()
        """Files opened as the user's (NO_CLAIM, R105): copied before a snapshot refers
        to them. A TM with records of its own holds no record of them to say so."""

    # -- R101
    def write(self, subtask: SubtaskId, data: bytes, *, faults: bool = True) -> str:
        """R101: one immutable file, created, written whole and closed before the
        database uses it; private to this attempt. A failing call leaves nothing used
        (R45): a created file is deleted again."""
        cat = self.catalog
        path = cat.new_file_name(working_dir(self.job, subtask))
        if not faults:
            with unfaulted(cat.storage):
                self._put(path, data)
        else:
            self._put(path, data)
        kg = key_group_range(self.max_parallelism, subtask.parallelism, subtask.index)
        self.known[path] = InPlaceFile(path, len(data), kg)
        self.uses.setdefault(subtask, set()).add(path)
        self.written.add(path)
        return path

    def track(self, subtask: SubtaskId, files: Mapping[str, int], lineage: str) -> None:
        """R101, R102 for a database that writes its own files (SlateDB): it uses exactly
        ``files`` (path -> size) now, as its manifest says. A file under ``lineage`` (the
        database's own directory, inside the subtask's working directory) that it did not
        use before is one it wrote whole: recorded as this attempt's, private, and used. A
        file it used and no longer lists it stopped using (a compaction replaced it), and
        ``release`` deletes what that frees. A file outside ``lineage`` that it did not
        use before is refused (``ValueError``, nothing recorded): only ``open`` (R105)
        makes a database use a file it did not write."""
        own = working_dir(self.job, subtask) + "/"
        if not (lineage + "/").startswith(own) or lineage + "/" == own:
            raise UsageError(f"{lineage} is not a database directory of {subtask} in {self.job}")
        uses = self.uses.setdefault(subtask, set())
        new = {p: n for p, n in files.items() if p not in uses}
        foreign = sorted(p for p in new if not p.startswith(lineage + "/"))
        if foreign:
            raise UsageError(f"the database of {subtask} lists files it neither wrote nor "
                             f"was opened on: {foreign[:3]}")  # fmt: skip
        bad = sorted(p for p, n in new.items() if n <= 0)
        if bad:
            raise UsageError(f"working files of no bytes: {bad[:3]}")
        kg = key_group_range(self.max_parallelism, subtask.parallelism, subtask.index)
        cat = self.catalog
        for path, size in sorted(new.items()):
            cat.files[path] = StoredFile(size, False, self.actor, self.tm)
            self.known[path] = InPlaceFile(path, size, kg)
            self.written.add(path)
            uses.add(path)
        for path in sorted(uses - set(files)):
            uses.discard(path)
        self.release()

    def _put(self, path: str, data: bytes) -> None:
        cat = self.catalog
        cat.create(path, self.actor, self.tm)
        try:
            cat.append(path, data)
        except StorageFault:
            cat.close(path)
            cat.delete_file(path, self.actor)
            raise
        cat.close(path)

    # -- R102
    def drop(self, subtask: SubtaskId, path: str) -> None:
        uses = self.uses.get(subtask, set())
        if path not in uses:
            raise CommandError(
                Reason.NO_SUCH_STATE, f"the database of {subtask} on {self.tm} uses no {path}"
            )
        uses.discard(path)
        self.release()

    def release(self) -> None:
        """R102: delete each private file of this attempt that none of its databases
        uses and no unacknowledged snapshot pins. A file handed over (shared, the
        user's) is not its own any more: never deleted here."""
        if not self.written:
            return
        used = {p for paths in self.uses.values() for p in paths}
        pinned = {p for paths in self.pins.values() for p in paths}
        cat = self.catalog
        for path in sorted(self.written):
            if path in used or path in pinned:
                continue
            f = cat.files.get(path)
            if f is None or f.owner != self.actor:
                self.written.discard(path)  # gone, or handed over: never this attempt's again
                continue
            cat.delete_file(path, self.actor)
            if path not in cat.files:
                self.written.discard(path)
                self.known.pop(path, None)

    # -- R103
    def snapshot(
        self,
        subtask: SubtaskId,
        checkpoint: int,
        inline_below: int,
        savepoint: bool,
        write: Callable[[str, bytes], object],
    ) -> None:
        """R103: each file smaller than ``inline_below`` (every file, for a savepoint,
        R55) is written as shared state named ``db:<file>`` through ``write`` (the TM's
        state stream: a merged segment when merging is on); every other file is referred
        to in place and pinned until the acknowledgement. A file of the user's (NO_CLAIM)
        is copied into a new private file first, so that the new job's checkpoints refer
        only to files of its own (R105). A ``StorageFault`` of ``write`` is the caller's
        (the subtask declines, R17); the pins gathered so far are not recorded."""
        cat = self.catalog
        refs: list[str] = []
        for path in sorted(self.uses.get(subtask, set())):
            size = self.known[path].length
            # With records of its own the TM no longer holds a file it handed over: the
            # coordinator's, referred to in place again
            f = cat.files.get(path)
            if savepoint or size < inline_below:
                write(f"{DB_PREFIX}{path.rsplit('/', 1)[1]}", self._read(path, 0, size))
                continue
            if path in self.users or (f is not None and f.owner == USER):
                copy = self.write(subtask, self._read(path, 0, size), faults=False)
                self.uses[subtask].discard(path)
                refs.append(copy)
                continue
            refs.append(path)
        key = (subtask, checkpoint)
        self.pins[key] = tuple(dict.fromkeys([*self.pins.get(key, ()), *refs]))

    def _read(self, path: str, offset: int, length: int) -> bytes:
        return self.catalog.storage.read_range(path, offset, length)

    def unpin(self, subtask: SubtaskId, checkpoint: int) -> tuple[InPlaceFile, ...]:
        """What the acknowledgement of ``checkpoint`` refers to in place: the pins go
        with it (the files are the coordinator's from then on, or, if the coordinator
        ignores the acknowledgement, private again, R56)."""
        paths = self.pins.pop((subtask, checkpoint), ())
        return tuple(self._in_place(p) for p in paths)

    def _in_place(self, path: str) -> InPlaceFile:
        return self.known[path]  # every file a database uses was written or opened here

    def drop_pins(self, subtask: SubtaskId, checkpoint: int) -> None:
        """A snapshot that is never acknowledged: its pins go (R102)."""
        if self.pins.pop((subtask, checkpoint), None) is not None:
            self.release()

    def pin_keys(self) -> list[PinKey]:
        return list(self.pins)

    def handed_over(self, paths: Iterable[str]) -> None:
        """The TM forgets what an acknowledgement handed over (as R43 for whole files):
        the coordinator's from now on."""
        for p in paths:
            self.catalog.files.pop(p, None)
            self.written.discard(p)

    # -- R105
    def open(self, msg: OpenDatabase, read: Callable[[StateEntry], bytes]) -> None:
        """R105: the database of ``msg.subtask`` uses the restored files in place and a
        new private copy of each small file, read from its segment."""
        key = (msg.epoch, msg.subtask)
        if key in self.opened:
            return
        self.opened.add(key)
        uses = self.uses.setdefault(msg.subtask, set())
        for f in msg.in_place:
            uses.add(f.path)
            self.known.setdefault(f.path, f)
            if msg.users:
                self.users.add(f.path)
        for e in msg.small:
            self.write(msg.subtask, read(e), faults=False)

    def in_use(self) -> tuple[str, ...]:
        return tuple(sorted({p for paths in self.uses.values() for p in paths}))

    def forget(self) -> None:
        """A reset or a stopped process: the databases close, the pins go. What the
        attempt wrote stays its own on storage (``written``)."""
        self.uses = {}
        self.pins = {}

    def close_all(self) -> None:
        """R90, R102: the job ends: every database closes, so each private file goes."""
        self.uses = {}
        self.release()


# ------------------------------------------------------------------------ the coordinator's side


class DutyRoute(Protocol):
    """The engine's reliable call to one TM, through which R104 asks which files the
    live databases use and R105 has them opened (``CoordinatorEngine.duty``)."""

    def duty(self, tm: TmId, msg: Duty) -> Answer | None: ...


class WorkingCoordinator(Protocol):
    """What the coordinator's working files read of the coordinator that owns them
    (``fastimpl.coordinator.CheckpointCoordinator``). The coordinator builds
    ``SharedWorking`` with itself, so this module names what it needs here instead of
    importing the coordinator (no import circle)."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def engine(self) -> DutyRoute: ...
    @property
    def cfg(self) -> Config: ...
    @property
    def job(self) -> str: ...
    @property
    def running(self) -> bool: ...
    @property
    def vertices(self) -> tuple[VertexSpec, ...]: ...
    @property
    def placement(self) -> Mapping[SubtaskId, TmId]: ...
    @property
    def pending(self) -> Mapping[int, Pending]: ...
    @property
    def retained(self) -> Sequence[Completed]: ...

    def current_tms(self) -> list[TmId]:
        """The live attempts hosting a subtask of the running job (R104 asks them)."""

    def _writes_in(self, path: str, attempt: TmId) -> bool:
        """Whether ``attempt`` may have written ``path`` for this store (I5)."""


class SharedWorking:
    """The coordinator's working files (R100 shared, R103, R104, R105)."""

    def __init__(self, coord: WorkingCoordinator) -> None:
        self.coord = coord
        self.shared: set[str] = set()
        """Working files an acknowledgement handed over: the coordinator's for good."""
        self.opens = True
        """Whether a restore opens the model's databases (``OpenDatabase``): not where the
        databases are an outside store's that the tasks open themselves (a recovery with
        ``leave_working``, the streaming job's SlateDB)."""

    def take(self, ack: Acknowledgement) -> tuple[InPlaceFile, ...]:
        """R103: what a current attempt's acknowledgement refers to in place becomes the
        coordinator's (the user's stays the user's), whether its checkpoint is pending or
        not; the references taken (the pending checkpoint's, if it still is). A file its
        records do not hold (a TM in another process) is recorded only where this store
        writes (I5)."""
        cat = self.coord.catalog
        taken: list[InPlaceFile] = []
        for w in ack.in_place:
            if not is_working_path(w.path):
                continue  # I5: not a working file this store wrote
            f = cat.files.get(w.path)
            if f is None and self.coord._writes_in(w.path, ack.attempt):
                f = StoredFile(w.length, False, COORDINATOR, ack.attempt)
                cat.files[w.path] = f
            if f is None:
                continue
            if f.owner != USER:
                f.owner = COORDINATOR
            self.shared.add(w.path)
            taken.append(w)
        return tuple(taken)

    def referred(self) -> set[str]:
        """Working files a retained checkpoint or a pending one's acknowledgement refers
        to in place."""
        c = self.coord
        out = {w.path for r in c.retained for _, w in r.working}
        out |= {w.path for p in c.pending.values() for ws in p.working.values() for w in ws}
        return out

    def in_use(self) -> set[str]:
        """R104: the files the live databases use, as their TMs answer (``InUse``)."""
        c = self.coord
        if not c.running:
            return set()
        used: set[str] = set()
        for tm in c.current_tms():
            answer = c.engine.duty(tm, DatabaseFiles(c.job, tm))
            if isinstance(answer, InUse):
                used |= set(answer.paths)
        return used

    def needed(self, path: str) -> bool:
        """R104: a working file stays while a checkpoint refers to it or a live database
        uses it."""
        if not is_working_path(path):
            return False
        return path in self.referred() or path in self.in_use()

    def collect(self) -> None:
        """R104: delete each shared file the coordinator owns that no retained checkpoint,
        no pending acknowledgement and no live database refers to (a lost attempt's wait
        for it to stop, R64, in the catalog's delete)."""
        cat = self.coord.catalog
        self.shared &= set(cat.files)
        candidates = sorted(p for p in self.shared if cat.files[p].owner == COORDINATOR)
        if not candidates:
            return
        keep = self.referred() | self.in_use()
        for path in candidates:
            if path not in keep and path in cat.files:
                cat.delete_file(path, COORDINATOR)

    def paths_of(self, done: Completed) -> set[str]:
        return {w.path for _, w in done.working}

    def open_databases(
        self,
        source: Completed | None,
        epoch: int,
        users: bool = False,
        only: TmId | None = None,
    ) -> None:
        """R105: each subtask of the running job (of TM ``only``, if given: R66) opens a
        database on the working files ``source`` refers to for subtasks of its own
        operator and its key groups (in place: a projection on a rescale) and on copies
        of its small files; then each TM deletes the private files none of its databases
        uses any more (R62)."""
        c = self.coord
        if not self.opens:
            return
        cat = c.catalog
        entries = () if source is None else source.entries
        assignment = assign(entries, c.vertices, c.cfg.max_parallelism)
        by_operator: dict[str, dict[str, InPlaceFile]] = {}
        for referred_by, w in () if source is None else source.working:
            by_operator.setdefault(referred_by.vertex, {}).setdefault(w.path, w)
        for sub, tm in sorted(c.placement.items()):
            if only is not None and tm != only:
                continue
            kg = key_group_range(c.cfg.max_parallelism, sub.parallelism, sub.index)
            files = by_operator.get(sub.vertex, {})
            in_place = tuple(
                w
                for path, w in sorted(files.items())
                if path in cat.files and overlaps(w.key_groups, kg)
            )
            small = tuple(
                e
                for e in assignment.get(sub, ())
                if e.name.startswith(DB_PREFIX) and stream_of(e.handle) is not None
            )
            # the user's files (NO_CLAIM, or a recovered predecessor's, R91) are copied
            # before a snapshot refers to them: the TM's records do not say whose they are
            theirs = users or any(cat.files[w.path].owner == USER for w in in_place)
            if in_place or small:
                c.engine.duty(tm, OpenDatabase(c.job, tm, epoch, sub, in_place, small, theirs))
        for tm in sorted(set(c.placement.values())):
            if only is None or tm == only:
                c.engine.duty(tm, DatabasesOpened(c.job, tm, epoch))

    def give_to_user(self, done: Completed) -> None:
        """R91, R105: a retained checkpoint given to the user takes its in-place files."""
        cat = self.coord.catalog
        for _, w in done.working:
            f = cat.files.get(w.path)
            if f is not None:
                f.owner = USER
