"""fastimpl: the product library (issue 3).

``CheckpointStore`` is the public API: one job's checkpoint files on any fsspec storage,
with its ``Coordinator`` and one ``FileMergingManager`` per TM (see ``fastimpl.api`` and
the README). ``Cluster`` underneath accepts every command of ``spec.commands`` and
behaves exactly as the reference model while writing real files; the lockstep tests
drive it beside the model.
"""

from fastimpl.api import (
    CheckpointStore,
    CheckpointStream,
    Coordinator,
    FileMergingManager,
    ManagerClosedError,
)
from fastimpl.cluster import Cluster
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.metadata import MetadataError
from fastimpl.recovery import RecoveryError, RecoveryReport, recover
from fastimpl.storage import DeleteFailure, Storage, StorageFault
from fastimpl.trace import CommandTrace

__all__ = [
    "CheckpointStore",
    "CheckpointStream",
    "Cluster",
    "CommandTrace",
    "Coordinator",
    "CounterIds",
    "DeleteFailure",
    "FileMergingManager",
    "IdSource",
    "ManagerClosedError",
    "MetadataError",
    "RandomIds",
    "RecoveryError",
    "RecoveryReport",
    "Storage",
    "StorageFault",
    "recover",
]
