"""Working state (SPEC §11): the TM's side of its subtasks' live databases, for a host
whose database writes its own files (SlateDB) and tells the TM what it uses: the files
each database uses and wrote (R101, R102), its snapshots, written as shared state or
referred to in place and pinned until acknowledged (R103), and what a host asks of them
(R104); the records themselves are ``fastimpl.working.Databases``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fastimpl.tm_attempt import TmAttempt
from fastimpl.tm_writing import TmWriter
from spec.config import StateKind
from spec.handles import InPlaceFile
from spec.ids import SubtaskId


class TmDatabases:
    """The databases of the attempt ``a``, whose small files its ``writer`` writes."""

    def __init__(self, a: TmAttempt, writer: TmWriter) -> None:
        self.a = a
        self.writer = writer

    def track_database(self, subtask: SubtaskId, files: Mapping[str, int], lineage: str) -> None:
        """R101, R102: the database of ``subtask`` in the directory ``lineage`` uses
        exactly ``files`` (path -> size) now; what it wrote there since is recorded as
        this attempt's, and each private file it no longer uses and no snapshot pins is
        deleted (``flush`` waits for the deletes). ``ValueError``, nothing recorded, for a
        file outside ``lineage`` it was not opened on (R105)."""
        self.a.working.track(subtask, files, lineage)

    def close_database(self, subtask: SubtaskId) -> None:
        """R102: the database of ``subtask`` is given up (a restore replaces it): it uses
        nothing from now on, and each private file of it that no pending snapshot pins is
        deleted."""
        self.a.working.uses.pop(subtask, None)
        self.a.working.release()

    def snapshot_database(
        self, subtask: SubtaskId, checkpoint: int, inline_below: int, savepoint: bool = False
    ) -> tuple[InPlaceFile, ...]:
        """R103: the snapshot of ``subtask``'s database for ``checkpoint``: each file
        smaller than ``inline_below`` (every file, for a savepoint, R55) written as shared
        state ``db:<file>`` (``write``), every other file referred to in place and pinned
        until the acknowledgement carries it. Returns the files referred to in place. A
        ``StorageFault`` is the host's, as from ``write``: the subtask declines (R17)."""

        def write(name: str, data: bytes) -> object:
            return self.writer.write(
                subtask, checkpoint, StateKind.KEYED_SHARED, name, len(data), 1, data, savepoint
            )

        self.a.working.snapshot(subtask, checkpoint, inline_below, savepoint, write)
        w = self.a.working
        return tuple(w.known[p] for p in w.pins.get((subtask, checkpoint), ()))

    def database_files(self) -> tuple[str, ...]:
        """The files this TM's databases use, by path: its answer to ``DatabaseFiles``
        (R104)."""
        return self.a.working.in_use()

    def pinned_files(self) -> tuple[str, ...]:
        """The files an unacknowledged snapshot of this TM refers to in place, by path
        (R103: none of them is deleted until the snapshot is acknowledged or dropped)."""
        return tuple(sorted({p for ps in self.a.working.pins.values() for p in ps}))

    def working_files(self) -> Mapping[str, InPlaceFile]:
        """Every working file a database of this TM uses or a snapshot pins, with its size
        and key groups (read-only): what a host need not list storage for."""
        return MappingProxyType(self.a.working.known)
