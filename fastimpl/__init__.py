"""fastimpl: the product library (issue 3).

``CheckpointStore`` is the public API: one job's checkpoint files on any fsspec storage,
with its ``Coordinator`` and one ``FileMergingManager`` per TM (see ``fastimpl.api`` and
docs/library.md). This package exports that API, what its calls take and return (ids,
traces, recovery reports, failed deletes) and the errors they raise.

Two other doors are documented and not exported here, since a job on the store needs
neither: ``fastimpl.parties`` is the embedding API, the coordinator and TM parties for an
engine that runs them in processes of its own (docs/embedding.md); ``fastimpl.testing``
is the test seam, which inspects a store (its bookkeeping, the invariants) and simulates
faults in it. The in-process engine that wires the parties behind a store
(``fastimpl.engine.InProcessEngine``, which the lockstep tests drive beside the reference
model) is no public API.
"""

from fastimpl.api import (
    CheckpointStore,
    CheckpointStream,
    CompletionFailed,
    Coordinator,
    FileMergingManager,
    ManagerClosedError,
)
from fastimpl.base_opening import BaseInUseError
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.metadata import MetadataError
from fastimpl.recovery import RecoveryError, RecoveryReport, incarnation_to_recover
from fastimpl.storage import (
    CachedLocalDiskError,
    DeleteFailure,
    FencedError,
    StorageFault,
    UnknownWrapperError,
    UnsafePathError,
)
from fastimpl.trace import CommandTrace

__all__ = [
    "BaseInUseError",
    "CachedLocalDiskError",
    "CheckpointStore",
    "CheckpointStream",
    "CommandTrace",
    "CompletionFailed",
    "Coordinator",
    "CounterIds",
    "DeleteFailure",
    "FencedError",
    "FileMergingManager",
    "IdSource",
    "ManagerClosedError",
    "MetadataError",
    "RandomIds",
    "RecoveryError",
    "RecoveryReport",
    "StorageFault",
    "UnknownWrapperError",
    "UnsafePathError",
    "incarnation_to_recover",
]
