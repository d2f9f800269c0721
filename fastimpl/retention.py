"""What the coordinator keeps (Flink's CompletedCheckpointStore and SharedStateRegistry):
the ``num_retained`` latest completed checkpoints (R52), the shared-state registry of the
state they use (R54), the checkpoint a new job restored from until it completes one of
its own, and what follows from them: which paths are still referred to, which unused
shared files and directories the coordinator deletes (R42, R54), and which paths a claim
may give it (R72, I5).
"""

from __future__ import annotations

from collections.abc import Iterable

from fastimpl.coordinated_job import CoordinatedJob
from fastimpl.metadata import MetadataError, base_of
from fastimpl.records import Completed
from fastimpl.shared_registry import (
    DIR_PREFIX,
    SharedEntry,
    SharedStateRegistry,
    shared_handles,
    shared_keys,
)
from fastimpl.tm_book import TmBook
from fastimpl.working import SharedWorking
from spec.config import Scope
from spec.effects import COORDINATOR, USER, tm_actor
from spec.handles import Extent, FileHandle, StateEntry, extent_of, stream_of
from spec.layout import is_under


class Retention:
    """The retained checkpoints, the shared-state registry, and the deletes they decide."""

    def __init__(self, run: CoordinatedJob, tm_book: TmBook, working: SharedWorking) -> None:
        self.run = run
        self.tm_book = tm_book
        self.working = working
        self.retained: list[Completed] = []
        self.registry = SharedStateRegistry()
        """The shared state the retained checkpoints use (``fastimpl.shared_registry``)."""
        self.latest_completed = 0
        self.watermark = 0
        """The highest checkpoint subsumed (R31: TMs discard what only it and older used)."""
        self.restoring: tuple[StateEntry, ...] = ()
        """The entries of the checkpoint the running job restored from, until it completes
        one of its own: still referred to (``referenced``)."""

    def load_completed(self, metadata: str, job: str | None = None) -> Completed:
        """Read a completed checkpoint back from its ``_metadata`` file, validated.

        Raises ``MetadataError`` naming the file and the problem; reading changes nothing.
        """
        meta = self.run.storage.read_metadata(metadata, expected_job=job)
        return Completed(
            meta.checkpoint,
            meta.job,
            meta.savepoint,
            meta.entries,
            meta.directories,
            metadata,
            meta.max_parallelism,
            meta.working,
        )

    def retain(self, done: Completed) -> None:
        """R52, R54: a completed checkpoint is retained, registering what it uses; the
        oldest beyond ``num_retained`` are subsumed. The new job's own checkpoint ends
        what it restored from."""
        self.restoring = ()
        self.latest_completed = done.id
        self.register(done)
        self.retained.append(done)
        while len(self.retained) > self.run.cfg.num_retained:  # R52
            self.subsume(self.retained.pop(0))

    def id_clash(self, entries: Iterable[StateEntry]) -> str | None:
        """R54: a logical id the acknowledgements name for another extent than another of
        these entries or a retained checkpoint does (path, offset, length: a whole file
        starts at 0), or of shared state for another path than the registry holds, said
        in words; else None. Exclusive state counts too: the reader refuses such a
        ``_metadata`` (``metadata.check_ids``), and recovery such kept checkpoints."""
        seen: dict[str, Extent] = {}
        for r in self.retained:
            for old in r.entries:
                if (s := stream_of(old.handle)) is not None:
                    seen.setdefault(s.logical_id, extent_of(s))
        for e in entries:
            h = stream_of(e.handle)
            if h is None:
                continue
            if h.scope is Scope.SHARED:
                other = self.registry.conflict(h.logical_id, h.path)
                if other is not None:
                    return f"logical id {h.logical_id!r} names {h.path!r} and {other!r}"
            extent = extent_of(h)
            prev = seen.setdefault(h.logical_id, extent)
            if prev != extent:
                return f"logical id {h.logical_id!r} names {extent} and {prev}"
        return None

    def lowest_retained(self) -> int | None:
        return self.retained[0].id if self.retained else None

    def delete_unused(self, released: list[SharedEntry]) -> None:
        """R54: the coordinator deletes the unused shared files it owns (directories go
        through ``collect_dirs``, which knows who still works in them)."""
        catalog = self.run.catalog
        for reg in released:
            if reg.owned and not reg.is_dir:
                f = catalog.files.get(reg.path)
                if f is not None and f.owner == COORDINATOR:
                    catalog.delete_file(reg.path, COORDINATOR)

    def register(self, done: Completed, recorded: Completed | None = None) -> None:
        """R54: a completed (or claimed) checkpoint registers the shared state it uses,
        keyed by unique handle ids, and its directories (``dir:<path>``), which become
        the coordinator's (R42).

        A logical id already registered for another path is a ``MetadataError`` naming
        the file (checked for every retained checkpoint before anything changes, see
        ``conflicting_ids``; here it is the last line of defence)."""
        catalog = self.run.catalog
        for h in shared_handles(done):
            other = self.registry.conflict(h.logical_id, h.path)
            if other is not None:
                raise MetadataError(
                    done.metadata,
                    "payload.entries",
                    f"logical id {h.logical_id!r} names {h.path!r}, already registered "
                    f"for {other!r} (conflicting registration)",
                )
            # I5: the registry deletes a whole file only if it may be the coordinator's; a
            # file the user holds (another base's, R72 outside the lineage) is only read
            f = catalog.files.get(h.path)
            owned = isinstance(h, FileHandle) and (f is None or f.owner != USER)
            self.registry.register(h.logical_id, h.path, h, owned, done.id)
        for d in done.directories:
            self.registry.register(f"{DIR_PREFIX}{d}", d, None, True, done.id)
            md = catalog.dirs.get(d)
            if md is not None:
                md.handed_over = True
            if self.may_claim(d, recorded or done, is_dir=True):
                catalog.dir_owner[d] = COORDINATOR  # R42

    def subsume(self, old: Completed) -> None:
        """R52, R54: ``old`` is no longer retained (already removed from ``retained``):
        the shared state no retained checkpoint uses any more goes, then its exclusive
        files and its ``_metadata``."""
        catalog = self.run.catalog
        self.watermark = max(self.watermark, old.id)
        unused = self.registry.unregister_unused(self.lowest_retained(), shared_keys(old))
        self.delete_unused(unused)
        for e in old.entries:
            h = e.handle
            if isinstance(h, FileHandle) and h.scope is Scope.EXCLUSIVE:
                f = catalog.files.get(h.path)
                if f is not None and f.owner == COORDINATOR:
                    catalog.delete_file(h.path, COORDINATOR)
        f = catalog.files.get(old.metadata)
        if f is not None and f.owner == COORDINATOR:
            catalog.delete_file(old.metadata, COORDINATOR)

    def referenced(self, path: str) -> bool:
        if self.working.needed(path):  # working state (§11): R104
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

    def collect_dirs(self) -> None:
        """R42: the coordinator deletes a directory it owns once nothing refers to it."""
        catalog = self.run.catalog
        for path in sorted(catalog.dir_owner):
            if self.collectable(path):
                catalog.delete_dir(path, COORDINATOR)

    def dir_referenced(self, path: str) -> bool:
        """R42: whether a retained checkpoint refers to directory ``path``."""
        return f"{DIR_PREFIX}{path}" in self.registry or any(
            path in r.directories for r in self.retained
        )

    def collectable(self, path: str) -> bool:
        """R42 for one directory: the coordinator may delete it now."""
        catalog = self.run.catalog
        if catalog.dir_owner.get(path) != COORDINATOR:
            return False
        if self.dir_referenced(path):
            return False
        live = set(self.tm_book.current_tms())
        running = self.run.running
        d = catalog.dirs.get(path)
        if d is not None and d.creator in live and running:
            return False
        if running and path in self.tm_book.managed_dirs(live):
            return False  # R42: a live TM works there: it writes there at its next write
        inside = [f for p, f in catalog.files.items() if is_under(p, path)]
        if any(f.owner in {tm_actor(t) for t in live} for f in inside):
            # R42: a live TM works there, with a file it has not acknowledged yet (a
            # subtask's new attempt in a directory a zombie created, R66, R64)
            return False
        return all(f.owner in (COORDINATOR, tm_actor(f.creator or "")) for f in inside)

    @staticmethod
    def paths_of(done: Completed) -> set[str]:
        return (
            {done.metadata}
            | {s.path for e in done.entries if (s := stream_of(e.handle)) is not None}
            | {w.path for _, w in done.working}  # working state (§11): R105, in place
        )

    def may_claim(self, path: str, recorded: Completed | None, is_dir: bool = False) -> bool:
        """I5: the coordinator takes a path only in a base of its lineage, and never a
        path of the user's that the claimed checkpoint did not itself hold (its files, and
        its directories with everything in them, R72, as the store recorded them)."""
        if base_of(path) not in self.run.lineage:
            return False
        catalog = self.run.catalog
        f = catalog.files.get(path)
        owner = catalog.dir_owner.get(path) if is_dir else (f.owner if f is not None else None)
        if owner != USER:
            return True
        if recorded is None:
            return False
        if is_dir:
            return path in recorded.directories
        return path in self.paths_of(recorded) or any(
            is_under(path, d) for d in recorded.directories
        )
