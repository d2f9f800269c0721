"""fastimpl: the product library (issue 3).

``CheckpointStore`` is the public API: one job's checkpoint files on any fsspec storage,
with its ``Coordinator`` and one ``FileMergingManager`` per TM (see ``fastimpl.api`` and
docs/library.md). Underneath, ``fastimpl.coordinator`` and ``fastimpl.taskmanager`` are the
two parties, wired in one process by ``fastimpl.engine.InProcessEngine``, which behaves
exactly as the reference model while writing real files; the lockstep tests drive it
beside the model.
"""

from fastimpl.api import (
    BaseInUseError,
    CheckpointStore,
    CheckpointStream,
    Coordinator,
    FileMergingManager,
    ManagerClosedError,
)
from fastimpl.engine import InProcessEngine
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.metadata import MetadataError
from fastimpl.recovery import RecoveryError, RecoveryReport, incarnation_to_recover, recover
from fastimpl.storage import (
    CachedLocalDiskError,
    DeleteFailure,
    FencedError,
    Storage,
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
    "Coordinator",
    "CounterIds",
    "DeleteFailure",
    "FencedError",
    "FileMergingManager",
    "IdSource",
    "InProcessEngine",
    "ManagerClosedError",
    "MetadataError",
    "RandomIds",
    "RecoveryError",
    "RecoveryReport",
    "Storage",
    "StorageFault",
    "UnknownWrapperError",
    "UnsafePathError",
    "incarnation_to_recover",
    "recover",
]
