"""A storage whose calls a host observes: the seam for counting and kill points.

A host of a TM (the Spark job's worker, a test's TM process) wants to see some of the
TM's storage calls: how many files a task created, the moment a delete is done (an
injected failure's kill point), the k-th append (a process killed mid-write). It gives
the TM a ``StorageHooks`` when it builds it (``TaskManager.alone(hooks=...)``, and when
it rebuilds one from a saved state, ``fastimpl.tm_state.rebuild``); the TM's storage is
then a ``HookedStorage``, which calls the hooks around each of its creates, appends,
closes and deletes. The hooks are the host's, not the TM's: they are no part of the
TM's records and never travel with its state, and a storage without hooks pays nothing.
"""

from __future__ import annotations

import enum
from typing import Any

from fastimpl.storage import Storage


class StorageCall(enum.Enum):
    """The calls a host may observe."""

    CREATE = "create"
    APPEND = "append"
    CLOSE = "close"
    DELETE_FILE = "delete_file"
    DELETE_DIR = "delete_dir"


class StorageHooks:
    """What a host does around the observed calls; this base does nothing. ``before``
    runs before the call (an exception it raises stops the call: nothing reaches
    storage), ``after`` once the call returned (a delete is then queued, or done when the
    storage deletes in the foreground). ``data`` is an append's bytes, else None."""

    def before(
        self, storage: HookedStorage, call: StorageCall, path: str, data: bytes | memoryview | None
    ) -> None:
        """Called before ``call`` on ``path``."""

    def after(self, storage: HookedStorage, call: StorageCall, path: str) -> None:
        """Called after ``call`` on ``path`` returned."""


class HookedStorage(Storage):
    """A ``Storage`` that calls ``hooks`` around its creates, appends, closes and
    deletes; every other call is the plain storage's."""

    def __init__(self, fs: Any, root: str, hooks: StorageHooks, **options: Any) -> None:
        super().__init__(fs, root, **options)
        self.hooks = hooks

    def create(self, path: str) -> None:
        self.hooks.before(self, StorageCall.CREATE, path, None)
        super().create(path)
        self.hooks.after(self, StorageCall.CREATE, path)

    def append(self, path: str, length: int, data: bytes | memoryview) -> None:
        self.hooks.before(self, StorageCall.APPEND, path, data)
        super().append(path, length, data)
        self.hooks.after(self, StorageCall.APPEND, path)

    def append_unobserved(self, path: str, length: int, data: bytes | memoryview) -> None:
        """An append the hooks do not see: for a hook that writes part of an append
        itself (a process killed after half the bytes reached storage, R65)."""
        super().append(path, length, data)

    def close(self, path: str) -> None:
        self.hooks.before(self, StorageCall.CLOSE, path, None)
        super().close(path)
        self.hooks.after(self, StorageCall.CLOSE, path)

    def delete_file(
        self,
        path: str,
        prune: tuple[str, ...] = (),
        deleted_by: dict[str, str] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        self.hooks.before(self, StorageCall.DELETE_FILE, path, None)
        super().delete_file(path, prune, deleted_by, hold=hold)
        self.hooks.after(self, StorageCall.DELETE_FILE, path)

    def delete_dir(
        self,
        path: str,
        prune: tuple[str, ...] = (),
        deleted_by: dict[str, str] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        self.hooks.before(self, StorageCall.DELETE_DIR, path, None)
        super().delete_dir(path, prune, deleted_by, hold=hold)
        self.hooks.after(self, StorageCall.DELETE_DIR, path)
