"""Every file system but a local disk: the store's calls as fsspec calls by path.

The other side of :class:`~fastimpl.local_tree.LocalTree`: the same operations, by name,
so that :class:`~fastimpl.storage.Storage` chooses once. An object store has no
directories and no links, and writes an object whole when its file is closed (a single
PUT is atomic already), so nothing here syncs a directory or refuses a link.
"""

from __future__ import annotations

import logging
import threading
from typing import IO, Any

log = logging.getLogger("fastimpl.storage")
"""The storage layer's one logger: a logging configuration for it covers every piece."""


def full_path(root: str, path: str) -> str:
    """``path`` (relative to the store's root, ``/``-separated) below ``root``."""
    if not path:
        return root
    return f"{root}/{path}" if root else path


class FsspecFiles:
    """The store's tree on file system ``fs`` below ``root``, by path."""

    def __init__(self, fs: Any, root: str, protocol: str, *, open_files_readable: bool) -> None:
        self.fs = fs
        self.root = root
        self.open_files_readable = open_files_readable
        # fsspec's memory file system iterates a shared dict when it lists or deletes
        # recursively; a lock keeps the deleter thread from racing the writer there.
        self._fs_lock: threading.Lock | None = threading.Lock() if protocol == "memory" else None

    def full(self, path: str) -> str:
        return full_path(self.root, path)

    # ------------------------------------------------------------------ writing

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(self.full(path), exist_ok=True)

    def create(self, path: str) -> IO[bytes]:
        """A new file ``path`` opened for writing (its parent made first, for a file
        system that has directories)."""
        full = self.full(path)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        f: IO[bytes] = self.fs.open(full, "wb")
        return f

    def sync(self, f: IO[bytes]) -> None:
        """Nothing: the flush made the bytes what this store can make them."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``path`` whole or not at all: one PUT."""
        full = self.full(path)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(full, data)

    def publish(self, path: str, data: bytes) -> None:
        """Write ``path`` whole or not at all: one PUT."""
        self.fs.pipe_file(self.full(path), data)

    def unpublish(self, path: str) -> None:
        """Remove ``path`` if it is there."""
        try:
            self.fs.rm_file(self.full(path))
        except FileNotFoundError:
            pass

    def remove(self, path: str) -> None:
        self.fs.rm_file(self.full(path))

    def drop_unclosed(self, path: str) -> None:
        """Remove file ``path``, whose writer died before closing it, if the file system
        shows it: one that shows a file from its creation (memory://, standing in for an
        object store in tests) keeps what no object store would have (R12, R65)."""
        full = self.full(path)
        try:
            if self.fs.exists(full):
                self.fs.rm_file(full)
        except Exception as err:
            log.debug("removing discarded %s: %r", path, err)

    def write_lease(self, name: str, data: bytes, *, exclusive: bool) -> None:
        """Write file ``name`` at the root: ``exclusive``, only if it is not there (a
        conditional PUT where the store has one; ``FileExistsError`` else)."""
        self.fs.pipe_file(self.full(name), data, mode="create" if exclusive else "overwrite")

    # ------------------------------------------------------------------ reading

    def read(self, path: str, start: int = 0, length: int | None = None) -> bytes:
        """Up to ``length`` bytes (all with ``None``) of file ``path`` from ``start``."""
        if length is None and not start:
            return bytes(self.fs.cat_file(self.full(path)))
        end = None if length is None else start + length
        return bytes(self.fs.cat_file(self.full(path), start=start, end=end))

    def names(self, path: str) -> set[str]:
        """The names in directory ``path`` (none if it is missing)."""
        try:
            listed = self.fs.ls(self.full(path) or "/", detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed}

    def sizes(self) -> dict[str, int]:
        """Every file below the root with its size."""
        top = self.root or "/"
        if self.open_files_readable:
            if not self.fs.exists(top):
                return {}
        # On an object store a prefix with no object under it is simply empty: one LIST
        # request answers, where ``exists`` would add a HEAD and another LIST per call.
        try:
            found = self.fs.find(top, detail=True)
        except FileNotFoundError:
            return {}
        prefix = self.root + "/"
        out: dict[str, int] = {}
        for p, info in found.items():
            if info.get("type") != "file":
                continue
            p = p if isinstance(p, str) else str(p)
            rel = p[len(prefix) :] if p.startswith(prefix) else p.lstrip("/")
            out[rel] = int(info["size"])
        return out

    def files_under(self, path: str) -> set[str]:
        """Every file below directory ``path``."""
        prefix = self.root + "/" if self.root else ""
        try:
            found = self.fs.find(self.full(path))
        except FileNotFoundError:
            return set()
        return {str(p)[len(prefix) :] if str(p).startswith(prefix) else str(p) for p in found}

    def size(self, path: str) -> int:
        return int(self.fs.size(self.full(path)))

    def is_dir(self, path: str) -> bool:
        return bool(self.fs.isdir(self.full(path)))

    # ------------------------------------------------------------------ deleting

    def delete(self, batch: list[tuple[str, bool]]) -> None:
        """Delete each ``(path, is_dir)`` of ``batch``, the files in one bulk call where
        the store has one; a path already gone counts as deleted."""
        files = [self.full(p) for p, d in batch if not d]
        dirs = [self.full(p) for p, d in batch if d]
        lock = self._fs_lock
        if lock is not None:
            lock.acquire()
        try:
            if files:
                if len(files) == 1:
                    try:
                        self.fs.rm_file(files[0])
                    except FileNotFoundError:
                        pass
                else:
                    try:
                        self.fs.rm(files)  # one bulk call where the store has one
                    except FileNotFoundError:
                        for p in files:
                            try:
                                self.fs.rm_file(p)
                            except FileNotFoundError:
                                pass
            for top in dirs:
                if self.fs.exists(top):
                    self.fs.rm(top, recursive=True)
        finally:
            if lock is not None:
                lock.release()
