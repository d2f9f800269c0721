"""The writer lease: one store at a time may change a base (issue 14).

A store that opens a base writes its token into ``WRITER_LEASE`` at the root, and checks
that the file still holds it before every ``_metadata`` write and every delete. A store
another one has taken the base from (a recovery, a second run of the job) then stops
changing it (:class:`FencedError`) instead of deleting files the new writer's checkpoints
use. The lease file is the store's own, not checkpoint data: listings leave it out.
"""

from __future__ import annotations

from fastimpl.faults import StorageFault
from fastimpl.fsspec_files import FsspecFiles
from fastimpl.local_tree import LocalTree
from spec.commands import StorageOp

WRITER_LEASE = "_writer"
"""The file at the root naming the one store that may write there (issue 14): written
when a store opens a base, checked before every ``_metadata`` write and every delete, so a
store another one has taken the base from (a recovery, a second run) stops changing it."""


class FencedError(StorageFault):
    """Another store has taken this base over (its lease replaced ours): this store may no
    longer write metadata or delete anything there."""

    def __init__(self, op: StorageOp, path: str, detail: str) -> None:
        super().__init__(op, path)
        self.args = (f"{op.value} {path} refused: {detail}",)


class WriterLease:
    """This store's hold on its base, kept in ``WRITER_LEASE`` through ``files``."""

    def __init__(self, files: LocalTree | FsspecFiles) -> None:
        self._files = files
        self.token: bytes | None = None
        """This store's token in ``WRITER_LEASE`` (``None``: no lease is kept or checked,
        e.g. the model-driven ``InProcessEngine`` of the lockstep tests)."""

    def take(self, token: bytes, *, exclusive: bool) -> bool:
        """Write ``token`` into ``WRITER_LEASE``; ``exclusive``: only if no lease is there
        (atomically where the store can: ``O_EXCL`` on a local disk, a conditional PUT on
        S3). False if ``exclusive`` and a lease was there."""
        try:
            self._files.write_lease(WRITER_LEASE, token, exclusive=exclusive)
        except FileExistsError:
            return False
        self.token = token
        return True

    def check(self, op: StorageOp, path: str) -> None:
        """Raise ``FencedError`` unless ``WRITER_LEASE`` still holds this store's token
        (``StorageFault`` if it cannot be read)."""
        if self.token is None:
            return
        try:
            held = self._files.read(WRITER_LEASE)
        except FileNotFoundError:
            held = b""
        except Exception as err:
            raise StorageFault(op, path, err) from err
        if held != self.token:
            raise FencedError(
                op,
                path,
                f"another store has taken the base over ({WRITER_LEASE} holds"
                f" {held[:80]!r}, this store's lease was {self.token[:80]!r})",
            )
