"""A completion carried out by its host (R51, raft's ``Ready``): the coordinator prepares
the ``_metadata`` (``prepare_completion``), the host writes it, and only then does the
checkpoint complete (``metadata_written``) and its notices go; a failed write aborts it
(``metadata_write_failed``). ``complete_through`` is the three steps in a row, with the
write through a ``Storage``: what the in-process engine, the Spark driver and
``CheckpointCoordinator.complete`` do. A host that orders other work around the write
(its own HA store first, a batch of completions) calls the steps itself.
"""

from __future__ import annotations

from typing import Protocol

from fastimpl.checkpoint_lifecycle import CompletionFailed, MetadataWrite
from fastimpl.records import Completed
from fastimpl.storage import Storage, StorageFault


class Completing(Protocol):
    """The coordinator's three steps of a completion."""

    def prepare_completion(self, checkpoint: int) -> MetadataWrite: ...

    def metadata_written(self, checkpoint: int) -> Completed: ...

    def metadata_write_failed(self, checkpoint: int, fault: BaseException) -> CompletionFailed: ...


def complete_through(coord: Completing, storage: Storage, checkpoint: int) -> Completed:
    """Complete ``checkpoint`` with its ``_metadata`` written through ``storage``
    (atomically, ``Storage.write_metadata``); ``CompletionFailed`` if it aborted instead
    (the write failed, R51, or it could not be registered, R54)."""
    write = coord.prepare_completion(checkpoint)
    try:
        storage.write_metadata(write.path, write.data)
    except StorageFault as fault:
        raise coord.metadata_write_failed(checkpoint, fault) from fault
    return coord.metadata_written(checkpoint)
