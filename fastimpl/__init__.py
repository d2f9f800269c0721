"""fastimpl: the product library (issue 3).

``Cluster`` hosts a job's coordinator, its TMs, the notification channel and storage
(an fsspec file system under a root); it accepts every command of ``spec.commands`` and
behaves exactly as the reference model, while writing real files.
"""

from fastimpl.cluster import Cluster
from fastimpl.ids import CounterIds, IdSource, RandomIds
from fastimpl.storage import Storage, StorageFault

__all__ = ["Cluster", "CounterIds", "IdSource", "RandomIds", "Storage", "StorageFault"]
