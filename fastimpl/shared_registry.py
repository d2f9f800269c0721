"""The coordinator's shared-state registry (R22, R42, R54), in the shape of Flink's
``SharedStateRegistryImpl``: one entry per registry key (a shared handle's unique id, or
``dir:<path>`` for a managed directory a checkpoint used), each remembering the latest
completed checkpoint that used it (``last_used``). A completed checkpoint registers what
it uses (``register_completed``, Flink's ``registerReference`` and
``checkpointCompleted``); once retention drops checkpoints, every entry last used below
the lowest retained one is unused (``unregister_unused``, Flink's
``unregisterUnusedState(lowestCheckpointID)``) and the coordinator deletes what it owns.

Where Flink's watermark rule alone would delete at another moment than the rules do,
this registry says so explicitly:

* savepoints are never registered (R55: a completed savepoint is the user's), so a
  savepoint's id never moves an entry's ``last_used``;
* a NO_CLAIM restore registers nothing (R73: the source stays the user's); a CLAIM
  registers the source checkpoint, whose id is lower than any the new job completes;
* a placeholder of a pending checkpoint (R22) pins its entry (``pin``): a pinned entry
  is never unused, whatever the watermark; an abort unpins it (``unpin``), and the entry
  goes then if nothing retained uses it, in key order;
* an entry that becomes unused goes in the order the subsumed checkpoint lists it (the
  order the rules delete in), not in the registry's order: only the subsumed
  checkpoint's keys can have become unused by its subsumption (an entry outlives its
  last user only while pinned, and an unpin releases it at once).

The observation's ``refs`` of an entry (``spec.observation.RegistryView``) are derived
from the retained checkpoints (``view``), not kept per entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from fastimpl.records import Completed
from spec.config import Scope
from spec.handles import FileHandle, Handle, SegmentHandle
from spec.observation import RegistryView

DIR_PREFIX = "dir:"


class SharedEntry:
    """One registered piece of shared state: where it is, whether the coordinator
    deletes it when unused (``owned``), the latest completed checkpoint that used it, and
    the pending checkpoints whose placeholders refer to it (R22)."""

    __slots__ = ("handle", "key", "last_used", "owned", "path", "pinned_by")

    def __init__(self, key: str, path: str, handle: Handle | None, owned: bool) -> None:
        self.key = key
        self.path = path
        self.handle = handle
        self.owned = owned
        self.last_used = 0
        self.pinned_by: set[int] = set()

    @property
    def is_dir(self) -> bool:
        return self.key.startswith(DIR_PREFIX)


def shared_handles(done: Completed) -> list[SegmentHandle | FileHandle]:
    """The handles of shared state a checkpoint names, in its order: what it registers
    (exclusive state is the checkpoint's alone, R54)."""
    out: list[SegmentHandle | FileHandle] = []
    for e in done.entries:
        h = e.handle
        if isinstance(h, SegmentHandle | FileHandle) and h.scope is Scope.SHARED:
            out.append(h)
    return out


def shared_keys(done: Completed) -> list[str]:
    """The registry keys a checkpoint uses, in its order, each once."""
    keys = [h.logical_id for h in shared_handles(done)]
    return list(dict.fromkeys(keys + [DIR_PREFIX + d for d in done.directories]))


class SharedStateRegistry:
    """Entries by key, in the order they were first registered."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, SharedEntry] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, key: str) -> SharedEntry | None:
        return self._entries.get(key)

    def entries(self) -> Iterable[SharedEntry]:
        return self._entries.values()

    def clear(self) -> None:
        """A new job starts with an empty registry (R70)."""
        self._entries = {}

    def register(
        self, key: str, path: str, handle: Handle | None, owned: bool, checkpoint: int
    ) -> SharedEntry:
        """Flink's ``registerReference``: ``checkpoint`` (completed) uses ``key``. A
        registration replaces what is known of the state (its handle, whether the
        coordinator deletes it) and moves ``last_used`` up; the checkpoint's own pin, if
        any, is no longer needed. A key registered for another path is the caller's
        to refuse (``conflict``) before anything changes."""
        old = self._entries.get(key)
        new = SharedEntry(key, path, handle, owned)
        if old is not None:
            new.last_used = old.last_used
            new.pinned_by = old.pinned_by
        new.last_used = max(new.last_used, checkpoint)
        new.pinned_by.discard(checkpoint)
        self._entries[key] = new
        return new

    def conflict(self, key: str, path: str) -> str | None:
        """The path ``key`` is registered for, if it is another one (R54)."""
        old = self._entries.get(key)
        return None if old is None or old.path == path else old.path

    def pin(self, key: str, checkpoint: int) -> bool:
        """R22: a placeholder of pending ``checkpoint`` refers to ``key``; False (nothing
        pinned) if the key is not registered: the checkpoint cannot complete."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        entry.pinned_by.add(checkpoint)
        return True

    def unpin(self, checkpoint: int, lowest_retained: int | None) -> list[SharedEntry]:
        """``checkpoint`` aborted: its pins go, and the entries nothing else keeps are
        unregistered and returned, in key order."""
        released: list[SharedEntry] = []
        for key in sorted(k for k, e in self._entries.items() if checkpoint in e.pinned_by):
            entry = self._entries[key]
            entry.pinned_by.discard(checkpoint)
            if self._unused(entry, lowest_retained):
                del self._entries[key]
                released.append(entry)
        return released

    def unpin_keys(
        self, keys: set[str], checkpoint: int, lowest_retained: int | None
    ) -> list[SharedEntry]:
        """R66: the pins of pending ``checkpoint`` on ``keys`` go (a withdrawn
        acknowledgement's placeholders); the entries nothing else keeps are unregistered
        and returned, in key order."""
        released: list[SharedEntry] = []
        for key in sorted(keys):
            entry = self._entries.get(key)
            if entry is None or checkpoint not in entry.pinned_by:
                continue
            entry.pinned_by.discard(checkpoint)
            if self._unused(entry, lowest_retained):
                del self._entries[key]
                released.append(entry)
        return released

    def unregister_unused(
        self, lowest_retained: int | None, among: Sequence[str]
    ) -> list[SharedEntry]:
        """Flink's ``unregisterUnusedState``: the entries of ``among`` (the keys of the
        checkpoint just subsumed, in its order) that no retained checkpoint uses any
        more (``last_used`` below ``lowest_retained``; None: none is retained) and no
        pending placeholder pins are unregistered and returned."""
        released: list[SharedEntry] = []
        for key in among:
            entry = self._entries.get(key)
            if entry is not None and self._unused(entry, lowest_retained):
                del self._entries[key]
                released.append(entry)
        return released

    @staticmethod
    def _unused(entry: SharedEntry, lowest_retained: int | None) -> bool:
        if entry.pinned_by:
            return False
        return lowest_retained is None or entry.last_used < lowest_retained

    def view(self, retained: Sequence[Completed]) -> dict[str, RegistryView]:
        """What the observation shows: each entry with the retained checkpoints that
        use it (the rules' ``refs``)."""
        refs: dict[str, set[int]] = {}
        for r in retained:
            for key in shared_keys(r):
                refs.setdefault(key, set()).add(r.id)
        return {
            k: RegistryView(e.path, frozenset(refs.get(k, ())), e.owned)
            for k, e in self._entries.items()
        }
