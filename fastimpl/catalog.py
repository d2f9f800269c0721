"""The file catalog: every path the store wrote or found on storage, who owns it and
who created it, the managed directories, and the guarded deletes (R42-R45, R64, I5).

A delete goes through ``delete_file`` / ``delete_dir``: refused (and recorded) if the
path is not provably the store's (I5), deferred while a lost attempt that created it may
still run (R64) or after a failing call (R45), else queued on the storage.

In process the catalog is what the coordinator and the TMs still share: ownership moves
between them through it (a TM's whole file becomes the coordinator's on
acknowledgement, R43; a stopped attempt's files become the coordinator's, R64).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import attrs

from fastimpl.ids import IdSource, creator_of, marked
from fastimpl.metadata import MetadataError, base_of, path_parts
from fastimpl.records import FOUND, Deferred, ManagedDir, Status, StoredFile, Tm
from fastimpl.storage import Storage, StorageFault
from spec.effects import USER
from spec.ids import TmId
from spec.layout import SAVEPOINTS, is_under, savepoint_dir
from spec.observation import DeletionRecord

log = logging.getLogger("fastimpl.catalog")
_BAD_DELETIONS_KEPT = 1000
_REFUSED_KEPT = 1000


@attrs.define
class RefusedDelete:
    """A delete the guard refused (I5 before the fact): ``path`` lies outside what the
    store can prove it owns, or is the user's. Nothing was deleted; it is reported by
    ``CheckpointStore.check_invariants`` as an I5 violation, and logged."""

    path: str
    actor: str
    is_dir: bool
    reason: str


def _tm_of_actor(actor: str) -> TmId | None:
    return actor[3:] if actor.startswith("tm:") else None


class CatalogHost(Protocol):
    """What the guards ask the party whose records these are: the bases it may delete
    in, the savepoints it knows were triggered, which attempts it knows are lost (R64),
    and the directories in use. The coordinator answers from what it made, claimed and
    was told; a TM with records of its own (``TaskManager.alone``) from its job's base,
    the savepoints it heard of, and no attempts at all (waiting for a lost attempt is
    the coordinator's, R64)."""

    @property
    def bases(self) -> set[str]: ...

    @property
    def triggered_savepoints(self) -> set[int]: ...

    @property
    def tms(self) -> dict[TmId, Tm]: ...

    def hot_dirs(self) -> frozenset[str]: ...


class DeletionLog:
    """Who deleted what, in the order the deletes ran: kept whole for tests and traces
    that compare the history (``keep``), else only the deletes that broke I2 or I5 (none,
    unless the store has a bug), at most ``_BAD_DELETIONS_KEPT`` of them. Parties in one
    process may write to one log, so that it keeps the order across them; a log is an
    observer's record, never read to decide a delete."""

    __slots__ = ("bad", "records")

    def __init__(self, keep: bool = False) -> None:
        self.records: list[DeletionRecord] | None = [] if keep else None
        self.bad: list[DeletionRecord] = []

    def keep(self) -> None:
        """Log every delete from now on: off by default, as it grows with every checkpoint."""
        if self.records is None:
            self.records = list(self.bad)

    def add(self, rec: DeletionRecord) -> None:
        if self.records is not None:
            self.records.append(rec)
        elif (rec.protected or not rec.existed or rec.owner != rec.actor) and len(
            self.bad
        ) < _BAD_DELETIONS_KEPT:
            self.bad.append(rec)


class Catalog:
    creator_mark: TmId | None = None
    """The attempt whose id marks every file name drawn here (``fastimpl.ids.marked``):
    set for a TM attempt, whose files other parties may find on storage without any
    record of theirs (R64); None for the coordinator's."""

    def __init__(
        self,
        storage: Storage,
        ids: IdSource,
        host: CatalogHost,
        *,
        deletion_log: bool = False,
        log: DeletionLog | None = None,
    ) -> None:
        self.storage = storage
        self.ids = ids
        self.host = host
        self.files: dict[str, StoredFile] = {}
        self.dirs: dict[str, ManagedDir] = {}
        self.dir_owner: dict[str, str] = {}
        self.failed_uploads: set[str] = set()
        """Files whose closing upload failed (object stores): a handle into one declines."""
        self.log = log if log is not None else DeletionLog(deletion_log)
        """Where its deletes are logged (``observe().deletions``); ``log``: one shared
        with other parties in this process."""
        self.deferred: list[Deferred] = []
        self.handed: list[str] | None = None
        """The deletes (a file, or a directory with all it holds) this party decided and
        its storage holds until the host performs them (the coordinator's ``Ready``,
        ``Storage.perform``); None: its deletes go to storage at once (a TM's)."""
        self.refused_deletes: list[RefusedDelete] = []
        self.dir_rules: dict[str, Callable[[str], bool]] = {}
        """Each party's rule for deleting a directory it owns (R41 for a TM, R42 for the
        coordinator), by actor: a directory delete that waited runs only if its owner's
        rule still allows it (``_run_deferred``)."""

    def mkdir(self, path: str, actor: str, creator: TmId) -> None:
        """R40: ``path`` is made at the first write in it, and is its maker's. A party
        with records of its own may find it made by a party whose records it cannot see
        (a lost attempt of the same subtask still writing): recorded as found, it is
        written in and reported, never owned or deleted by this party (R41), and looked
        for again at the next write, since its maker deletes it once empty (R41)."""
        found = self.dirs.get(path)
        if path in self.dir_owner or (found is not None and found.creator != FOUND):
            return
        if self.creator_mark is not None and self.storage.exists_dir(path):
            self.dirs[path] = found or ManagedDir(path, FOUND)
            return
        # not there (any more): its maker deleted it once empty (R41), or nobody made it
        self.dirs.pop(path, None)
        self.storage.mkdir(path)
        self.dir_owner[path] = actor
        self.dirs[path] = ManagedDir(path, creator)

    def sees_dir(self, path: str, others_make: bool) -> bool:
        """R40: whether directory ``path`` is on storage, for a party's acknowledgement.
        One it made, or was told is the coordinator's, is. One another party made (found
        at a write, or any while ``others_make``: a lost attempt of the same subtask may
        still make it, R64, R66) is looked for each time, since its maker deletes it once
        empty (R41); a failing look keeps the record as it was."""
        d = self.dirs.get(path)
        if d is not None and path in self.dir_owner:
            return True
        if d is None and not others_make:
            return False
        try:
            there = self.storage.exists_dir(path)
        except Exception as err:
            log.warning("looking for directory %s failed: %r", path, err)
            return d is not None
        if there:
            self.dirs.setdefault(path, ManagedDir(path, FOUND))
        else:
            self.dirs.pop(path, None)
        return there

    def create(self, path: str, actor: str, creator: TmId | None) -> None:
        self.storage.create(path)
        self.files[path] = StoredFile(0, True, actor, creator)

    def append(self, path: str, data: bytes) -> int:
        """Append ``data`` durably; the offset it starts at."""
        self.storage.append(path, len(data), data)
        f = self.files[path]
        offset = f.size
        f.size += len(data)
        return offset

    def close(self, path: str) -> None:
        f = self.files.get(path)
        if f is not None and f.open:
            self.storage.close(path)
            f.open = False

    def new_file_name(self, directory: str) -> str:
        name = self.ids.file_name(directory)
        if self.creator_mark is not None:
            name = marked(name, self.creator_mark)
        return f"{directory}/{name}"

    def _protected(self, path: str) -> bool:
        f = self.files.get(path)
        owner = f.owner if f is not None else self.dir_owner.get(path)
        return owner == USER or not any(is_under(path, b) for b in self.host.bases)

    @property
    def deletions(self) -> list[DeletionRecord] | None:
        """Every delete, in order, if the log is kept whole (``keep_deletion_log``)."""
        return self.log.records

    @deletions.setter
    def deletions(self, records: list[DeletionRecord] | None) -> None:
        self.log.records = records

    @property
    def bad_deletions(self) -> list[DeletionRecord]:
        """Without the whole log, the deletes that broke I2 or I5."""
        return self.log.bad

    def keep_deletion_log(self) -> None:
        """Log every delete from now on (``observe().deletions``): for tests and traces
        that compare the history; off by default, as it grows with every checkpoint."""
        self.log.keep()

    def _record_delete(self, path: str, actor: str) -> None:
        f = self.files.get(path)
        rec = DeletionRecord(
            path=path,
            actor=actor,
            owner=None if f is None else f.owner,
            existed=f is not None,
            protected=f is not None and self._protected(path),
        )
        self.log.add(rec)  # I2, I5: what check_invariants reads
        self.files.pop(path, None)
        self.failed_uploads.discard(path)
        if self.deferred:  # R45: a file gone by another delete has nothing left to retry
            self.deferred = [d for d in self.deferred if d.is_dir or d.path != path]

    def _waits_for(self, creator: TmId | None, actor: str) -> TmId | None:
        """R64: a lost attempt's files are deleted by others only once it has stopped."""
        if creator is None or _tm_of_actor(actor) == creator:
            return None
        rec = self.host.tms.get(creator)
        return creator if rec is not None and rec.status is Status.LOST else None

    @staticmethod
    def _creator(path: str, f: StoredFile) -> TmId | None:
        """Who created ``path``: its record's word, else its name's (a record rebuilt from
        metadata after a restart, ``fastimpl.resume``, does not know; R64 needs it)."""
        return f.creator if f.creator is not None else creator_of(path)

    def take_waiting(self, d: Deferred) -> None:
        """A delete another party decided and handed over with its files (``TmEnded``):
        it waits here as it waited there, and runs as a waiting delete of these records
        does (whoever owns the path then carries it out, R44)."""
        self._defer(d)

    def _defer(self, d: Deferred) -> None:
        """R45, R64: a waiting delete is listed once, however often it is asked for."""
        if not any(x.path == d.path and x.is_dir == d.is_dir for x in self.deferred):
            self.deferred.append(d)

    def _refuse_delete(self, path: str, actor: str, is_dir: bool) -> bool:
        """I5, checked before the delete: a path the store cannot prove is its own is never
        deleted, whatever decided it (a bug, or a file that named it). The refusal is
        recorded (``refused_deletes``) and logged; the path stays."""
        why = self._foreign(path, is_dir)
        if why is None:
            return False
        if len(self.refused_deletes) < _REFUSED_KEPT:  # each is logged too
            self.refused_deletes.append(RefusedDelete(path, actor, is_dir, why))
        log.error(
            "refused to delete %s %s (%s): %s", "directory" if is_dir else "file", path, actor, why
        )
        return True

    def _foreign(self, path: str, is_dir: bool) -> str | None:
        """Why ``path`` is not the store's to delete, or None. Ownership the store can
        prove: bases it made or claimed (not ``savepoints``), and the directory of a
        savepoint it triggered, for what in it is not the user's (R55: a completed
        savepoint is the user's; a file written there late is not part of it, R43)."""
        try:
            parts = path_parts(path, "<delete>", "path")
        except MetadataError as err:
            return err.problem
        base = base_of(path)
        own_sp = {savepoint_dir(i) for i in self.host.triggered_savepoints}
        if base not in (self.host.bases - {SAVEPOINTS}) | own_sp:
            return f"{base!r} is not a base this store made or claimed"
        depth = len(parts) - len(base.split("/"))
        if depth < (2 if is_dir else 1):
            return "a base, or a folder of a base, is never deleted whole"
        f = self.files.get(path)
        owner = f.owner if f is not None else self.dir_owner.get(path)
        if owner == USER:
            return "the user's"
        if is_dir and any(g.owner == USER for p, g in self.files.items() if is_under(p, path)):
            return "holds the user's files"
        return None

    def delete_file(self, path: str, actor: str) -> None:
        if self._refuse_delete(path, actor, False):
            return
        f = self.files.get(path)
        wait = self._waits_for(None if f is None else self._creator(path, f), actor)
        if wait is not None:
            self._defer(Deferred(actor, path, False, wait))
            return
        try:
            # The storage remembers who deleted it only until the delete is done (_owners)
            self.storage.delete_file(
                path, self._prunable_parents(path), {path: actor}, hold=self.handed is not None
            )
        except StorageFault:
            self._defer(Deferred(actor, path, False, None))
            return
        self._record_delete(path, actor)
        if self.handed is not None:
            self.handed.append(path)

    def _prunable_parents(self, path: str) -> tuple[str, ...]:
        """Parents of ``path`` that may go once empty: below its base, not managed
        directories (those are deleted whole, R42), not a current subtask's shared
        directory (about to be written again)."""
        parts = path.split("/")
        out: list[str] = []
        for n in range(len(parts) - 1, 1, -1):
            d = "/".join(parts[:n])
            if d in self.dir_owner or d in self.host.hot_dirs():
                break
            out.append(d)
        return tuple(out)

    def delete_dir(self, path: str, actor: str) -> None:
        """R42: delete a managed directory with everything in it."""
        if self._refuse_delete(path, actor, True):
            return
        inside = sorted(p for p in self.files if is_under(p, path))
        d = self.dirs.get(path)
        waits = {self._waits_for(d.creator if d is not None else None, actor)}
        waits |= {self._waits_for(self._creator(p, self.files[p]), actor) for p in inside}
        listed: list[set[str]] = []  # storage listed once, when a check below needs it
        if any(r.status is Status.LOST for r in self.host.tms.values()):
            unrecorded = self._unrecorded_under(path, inside, actor, listed)
            if unrecorded is None:
                return
            # R64: a lost attempt's files no party here records would go with the directory
            waits |= {self._waits_for(creator_of(p), actor) for p in unrecorded}
        waits.discard(None)
        if waits:
            self._defer(Deferred(actor, path, True, min(w for w in waits if w)))
            return
        if self.creator_mark is not None or self.storage.lease is not None:
            unrecorded = self._unrecorded_under(path, inside, actor, listed)
            if unrecorded is None:
                return
            if unrecorded and self.creator_mark is not None:
                return  # R41, R66: see _unrecorded_under
            if unrecorded:
                self._delete_known_only(path, inside, sorted(unrecorded), actor)
                return
        try:
            self.storage.delete_dir(
                path,
                self._prunable_parents(path),
                {p: actor for p in inside},
                hold=self.handed is not None,
            )
        except StorageFault:
            self._defer(Deferred(actor, path, True, None))
            return
        for p in inside:
            self._record_delete(p, actor)
        if self.handed is not None:
            self.handed.append(path)
        for sub in [x for x in self.dir_owner if is_under(x, path)]:
            del self.dir_owner[sub]
            self.dirs.pop(sub, None)

    def _unrecorded_under(
        self, path: str, inside: list[str], actor: str, listed: list[set[str]]
    ) -> set[str] | None:
        """The files storage holds under ``path`` that these records do not (listed once
        per delete, kept in ``listed``); None, the delete deferred (R45), if the listing
        fails: a delete that cannot tell what it would take waits.

        They matter three ways. R64: a lost attempt's files no party here records (a TM in
        another process, a zombie whose deletes nobody sees) would go with the directory;
        their creators, by their names (``fastimpl.ids.creator_of``), must have stopped.
        R41, R66, for a TM attempt's records: a later attempt of the same subtask writes
        in the subtask's shared directory too, and what it writes is in its records, not
        in these: then the directory stays (the rule asks again at the next notice).
        Where a store keeps a lease (a base users share): a recursive delete removes only what the
        store knows it wrote (``_delete_known_only``)."""
        if not listed:
            try:
                listed.append(self.storage.files_under(path))
            except Exception as err:  # cannot tell: keep it, retry later
                log.warning("listing %s before deleting it failed: %r", path, err)
                self._defer(Deferred(actor, path, True, None))
                return None
        return listed[0] - set(inside)

    def _delete_known_only(
        self, path: str, inside: list[str], unknown: list[str], actor: str
    ) -> None:
        """The directory holds a file the store has no record of (another run's, a
        user's, a link): its known files are deleted one by one, each with its deletion
        record, and the directory and the unknown files stay (logged)."""
        log.warning(
            "not deleting directory %s: it holds %d file(s) the store did not write (%s);"
            " deleting only the store's own",
            path,
            len(unknown),
            ", ".join(unknown[:5]),
        )
        for p in inside:
            if p in self.files:
                self.delete_file(p, actor)
        for sub in [x for x in self.dir_owner if is_under(x, path)]:
            del self.dir_owner[sub]
            self.dirs.pop(sub, None)

    def retry_deletes(self, *, storage: bool = True) -> None:
        """R45: retry deletes that failed; a delete that fails again stays queued.
        ``storage``: also those that failed on the storage's deleter, which parties
        sharing one storage retry once between them."""
        if storage:
            self.storage.retry_failed()
        ready = [d for d in self.deferred if d.waits_for is None]
        self.deferred = [d for d in self.deferred if d.waits_for is not None]
        for d in ready:
            self._run_deferred(d)

    def release_waits(self, stopped: TmId) -> None:
        """R64: ``stopped`` is known to have stopped: the deletes that waited for it run
        (those that fail again wait for a retry, R45)."""
        self._forget_unseen_deletes(stopped)
        waiting = [d for d in self.deferred if d.waits_for == stopped]
        self.deferred = [d for d in self.deferred if d.waits_for != stopped]
        for d in waiting:
            self._run_deferred(Deferred(d.actor, d.path, d.is_dir, None))

    def _forget_unseen_deletes(self, stopped: TmId) -> None:
        """R64: a record here of a file ``stopped`` created may have outlived the file:
        an attempt in another process deletes its own files (a zombie applying the notices
        it already had) without these records seeing it, even one handed over meanwhile
        (a claim, R72), which it could not learn of. Once it has stopped it deletes no
        more: the records are checked against storage, and one whose file is gone goes
        without a delete of its own (its delete is the attempt's, in its log)."""
        made = [p for p, f in self.files.items() if f.creator == stopped]
        if not made:
            return
        present: set[str] = set()
        try:
            for d in sorted({p.rsplit("/", 1)[0] for p in made}):
                present |= self.storage.files_under(d)
        except Exception as err:  # cannot tell: the records stay
            log.warning("listing what %s created failed: %r", stopped, err)
            return
        for p in made:
            if p not in present:
                del self.files[p]
                self.failed_uploads.discard(p)

    def _run_deferred(self, d: Deferred) -> None:
        """A waiting delete is carried out by whoever owns the path now (R44). A
        directory goes only if its owner's rule still allows it (R41, R42): while the
        delete waited, a new attempt of the subtask may have written into it and a
        checkpoint may refer to it. If not, it is dropped and the rule asks again."""
        if d.is_dir:
            owner = self.dir_owner.get(d.path)
            if owner is None or owner == USER:
                return
            rule = self.dir_rules.get(owner)
            if rule is None or rule(d.path):
                self.delete_dir(d.path, owner)
        else:
            f = self.files.get(d.path)
            if f is not None and f.owner != USER:
                self.delete_file(d.path, f.owner)

    def owners(self) -> dict[str, str]:
        """Who owns each file; a file whose background delete keeps failing is still
        its deleter's (it is listed in ``pending_deletes`` until a retry succeeds)."""
        owners = {p: f.owner for p, f in self.files.items()}
        for failure in self.storage.failed_deletes.values():
            for gone, actor in failure.deleted_by.items():
                owners.setdefault(gone, actor)
        return owners
