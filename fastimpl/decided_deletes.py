"""Deletes a coordinator decided that its host has not carried out yet (raft's ``Ready``).

The coordinator's calls decide deletes and hand them to its storage, which holds them:
nothing is removed until the host takes the ``Ready`` and calls ``Storage.perform`` with
its ``deletes``. The host can so order them after what must come first: Flink writes
its HA store's pointer to a new checkpoint before it subsumes the old one, so that a
coordinator dying in between restarts from a checkpoint whose files are all there.

Until then the storage answers as if they were done (a listing leaves out what a held
delete removes: the coordinator's records already have), and a file or directory made
where a held delete would remove it has those deletes carried out first (a late delete
never removes a newer file).
"""

from __future__ import annotations

from attrs import frozen

from spec.layout import is_under


@frozen
class Decided:
    """One delete the coordinator decided: a file, or a directory with all it holds;
    ``prune``: parents to remove once that leaves them empty; ``deleted_by``: who
    decided to delete each file it removes (kept with a delete that keeps failing)."""

    path: str
    is_dir: bool
    prune: tuple[str, ...]
    deleted_by: dict[str, str] | None


class DecidedDeletes:
    """The held deletes, in the order they were decided (a path once)."""

    def __init__(self) -> None:
        self._held: dict[str, Decided] = {}
        self._dirs: set[str] = set()
        """Directories a held delete or prune removes (a create under one waits)."""

    def __len__(self) -> int:
        return len(self._held)

    def has(self, path: str) -> bool:
        return path in self._held

    def hold(self, d: Decided) -> None:
        """Hold ``d`` until the host performs it; a path held already keeps its place
        (the later decision's prunes and deciders are added to it)."""
        old = self._held.get(d.path)
        if old is not None:
            prune = old.prune + tuple(p for p in d.prune if p not in old.prune)
            by = {**(old.deleted_by or {}), **(d.deleted_by or {})} or None
            d = Decided(d.path, old.is_dir or d.is_dir, prune, by)
        self._held[d.path] = d
        if d.is_dir:
            self._dirs.add(d.path)
        self._dirs.update(d.prune)

    def take(self, paths: tuple[str, ...] | list[str]) -> list[Decided]:
        """The held deletes of ``paths``, in the order given, no longer held (a path
        no delete is held for is passed over)."""
        out = [d for d in (self._held.pop(p, None) for p in paths) if d is not None]
        if out:
            self._recount_dirs()
        return out

    def blocking(self, path: str) -> list[str]:
        """The held deletes that would remove ``path`` or a directory holding it, or whose
        prunes would: carried out before anything is made there."""
        hit = {path} if path in self._held else set()
        if self._dirs and any(is_under(path, d) for d in self._dirs):
            for d in self._held.values():
                if (d.is_dir and is_under(path, d.path)) or any(is_under(path, x) for x in d.prune):
                    hit.add(d.path)
        return [p for p in self._held if p in hit]

    def gone(self, path: str) -> bool:
        """Whether a held delete removes file ``path`` (itself or a directory of it)."""
        if path in self._held:
            return True
        return bool(self._dirs) and any(
            is_under(path, d.path) for d in self._held.values() if d.is_dir
        )

    def _recount_dirs(self) -> None:
        self._dirs = set()
        for d in self._held.values():
            if d.is_dir:
                self._dirs.add(d.path)
            self._dirs.update(d.prune)
