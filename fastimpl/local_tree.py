"""The local disk below the store's root, reached through descriptors (issue 14).

Nothing below the root is looked up by a path: the store opens the root, then each
component from its parent with ``O_NOFOLLOW``, and acts on the last name relative to the
directory holding it (through :class:`~fastimpl.descriptors.LocalOS`). A link is refused
wherever it is met, whenever it was put there (a check and a use are one call), one whose
target is inside the base too: the store never makes one, so a link is a hand-made
change, and one inside would give a file two names (two owners, a double delete). The
root and the directories above it are the user's choice of where the base lives, and may
be links.

Durability (R12): a new name is durable only once its directory is synced, so the parent
of each file created, of each ``_metadata`` renamed into place and of each directory made
here is ``fsync``-ed; a directory whose sync has not succeeded yet stays owed and is
synced before any later directory is made or file created.

:class:`LocalTree` is the local-disk side of every storage call of
:class:`~fastimpl.storage.Storage` (``fastimpl.fsspec_files`` is the other side, for every
other file system): the same operations, by name, so that ``Storage`` chooses once.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from fastimpl.descriptors import Dir, LocalOS, NotRegularFile, kind_of, path_of
from spec.errors import CkptError

log = logging.getLogger("fastimpl.storage")
"""The storage layer's one logger: a logging configuration for it covers every piece."""


class UnsafePathError(CkptError, OSError):
    """A path of the store's tree leads through a symbolic link, or names a special file
    (FIFO, device, socket) where a regular file belongs (issue 14). The store never
    creates either, so one is a hand-made change: it is refused, never followed, read
    or deleted through. An ``OSError``, so that every caller handles it as the failed
    storage call it is (a ``ReadFault``, a ``MetadataError``, a delete kept failing)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(errno.ELOOP, message, path)
        self.args = (message,)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


class LocalTree:
    """The store's tree on a local disk: ``root`` and everything below it, every OS call
    made through ``os`` (a :class:`LocalOS`; a wrapper may stand in for it)."""

    def __init__(self, root: str, local_os: LocalOS) -> None:
        self.root = root
        self.os = local_os
        self._unsynced_dirs: set[str] = set()
        """Directories holding a name made here whose sync has not succeeded."""

    # ------------------------------------------------------------------ the walk

    @contextmanager
    def _dir(self, rel: str, path: str, *, make: bool = False) -> Iterator[Dir]:
        """Directory ``rel`` (below the root; ``""``: the root) held open while the body
        runs, reached without following a link: a link on the way is refused with
        ``UnsafePathError`` naming ``path`` (what the caller acts on) and the link.
        ``make``: missing directories are made, and each new name is synced in its parent
        (innermost first) before the body runs (R12)."""
        osl = self.os
        if make and self._unsynced_dirs:
            self._pay_sync_debts()
        top = self.root or "/"
        try:
            d = osl.open_dir(None, top)
        except FileNotFoundError:
            if not make:
                raise
            self._makedirs_outside(top)
            d = osl.open_dir(None, top)
        opened = [d]
        try:
            owed: list[Dir] = []
            parts = rel.split("/") if rel else []
            for i, name in enumerate(parts):
                try:
                    sub = self._open_sub(d, parts, i, path)
                except FileNotFoundError:
                    if not make:
                        raise
                    self._unsynced_dirs.add(d.path)  # owed until the sync below succeeds
                    try:
                        osl.mkdir(d, name)
                    except FileExistsError:
                        pass  # made meanwhile: opened below like any other
                    owed.append(d)
                    sub = self._open_sub(d, parts, i, path)
                opened.append(sub)
                d = sub
            for parent in reversed(owed):
                osl.fsync_dir(parent)
                self._unsynced_dirs.discard(parent.path)
            yield d
        finally:
            for x in reversed(opened):
                osl.close_dir(x)

    @contextmanager
    def _at(self, path: str, *, make: bool = False) -> Iterator[tuple[Dir, str]]:
        """The directory holding ``path`` (held open, as ``_dir``) and ``path``'s name."""
        parent, _, name = path.rpartition("/")
        with self._dir(parent, path, make=make) as d:
            yield d, name

    def _open_sub(self, d: Dir, parts: list[str], i: int, path: str) -> Dir:
        try:
            return self.os.open_dir(d, parts[i])
        except OSError as err:
            if err.errno in (errno.ENOTDIR, errno.ELOOP):
                unsafe = self._unsafe(d, parts[i], path, "/".join(parts[: i + 1]), leaf=False)
                if unsafe is not None:
                    raise unsafe from err
            raise

    def _unsafe(
        self, d: Dir, name: str, path: str, rel: str, *, leaf: bool
    ) -> UnsafePathError | None:
        """What ``name`` in ``d`` is, if that is a reason to refuse ``path``: a link
        (anywhere), or a special file where a regular ``leaf`` file belongs. Asked after
        a call failed, or before a read opens anything (so nothing blocks on a FIFO)."""
        try:
            mode = self.os.lstat(d, name).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            try:
                target = f" to {self.os.readlink(d, name)!r}"
            except OSError:
                target = ""
            return UnsafePathError(
                path,
                f"{path}: {rel} is a symbolic link{target}; the store never follows a"
                " link in its tree (nothing was read, written or deleted through it)",
            )
        if leaf and not stat.S_ISREG(mode):
            return self._special(path, mode)
        return None

    @staticmethod
    def _special(path: str, mode: int) -> UnsafePathError:
        return UnsafePathError(
            path, f"{path} is {kind_of(mode)} where a regular file belongs: not read"
        )

    def _leaf_failed(self, err: OSError, d: Dir, name: str, path: str) -> OSError:
        """The error to raise for a failed call on ``path`` (``name`` in ``d``): a link
        or a special file there is said so; any other error is itself."""
        if isinstance(err, NotRegularFile):
            return self._special(path, err.mode)
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EISDIR):
            return self._unsafe(d, name, path, path, leaf=True) or err
        return err

    def read(self, path: str, start: int = 0, length: int | None = None) -> bytes:
        """Read regular file ``path`` through descriptors: its type is checked before it
        is opened (a FIFO, device or socket is never opened) and again on the descriptor
        (something swapped in since is refused unread)."""
        with self._at(path) as (d, name):
            unsafe = self._unsafe(d, name, path, path, leaf=True)
            if unsafe is not None:
                raise unsafe
            try:
                return self.os.read(d, name, start, length)
            except FileNotFoundError:
                raise
            except OSError as err:
                failed = self._leaf_failed(err, d, name, path)
                if failed is err:
                    raise
                raise failed from err

    def _pay_sync_debts(self) -> None:
        """Sync every directory still owed a sync (one failed, or was never reached),
        innermost first: a later call would find the names there and not know that
        they are not durable yet."""
        for p in sorted(self._unsynced_dirs, key=len, reverse=True):
            try:
                with self._open_full(p) as d:
                    self.os.fsync_dir(d)
            except FileNotFoundError:
                pass  # deleted since: no name in it is owed any more
            except UnsafePathError as err:
                log.warning("not syncing %s: %s", p, err)  # no longer the store's
            self._unsynced_dirs.discard(p)

    @contextmanager
    def _open_full(self, full: str) -> Iterator[Dir]:
        """Directory ``full`` (a full path) held open: through the tree below the root,
        as given at the root and above it."""
        prefix = (self.root or "") + "/"
        if full.startswith(prefix) and full != prefix:
            rel = full[len(prefix) :]
            with self._dir(rel, rel) as d:
                yield d
            return
        d = self.os.open_dir(None, full)
        try:
            yield d
        finally:
            self.os.close_dir(d)

    def _makedirs_outside(self, top: str) -> None:
        """Make the root ``top`` and its missing parents (outside the tree: by path), and
        sync the parent of each directory made here, once."""
        osl = self.os
        made: list[str] = []
        d = top
        while not osl.isdir(d):
            made.append(d)
            parent = os.path.dirname(d)
            if not parent or parent == d:
                break
            d = parent
        owed = {os.path.dirname(d) or "." for d in made}
        self._unsynced_dirs |= owed
        for d in reversed(made):
            try:
                osl.mkdir(None, d)
            except FileExistsError:
                if not osl.isdir(d):
                    raise  # a file of that name
        for p in sorted(owed, key=len, reverse=True):
            with self._open_full(p) as held:
                osl.fsync_dir(held)
            self._unsynced_dirs.discard(p)

    def walk(self, top: str) -> Iterator[tuple[str, Dir, list[os.DirEntry[str]]]]:
        """Every directory from ``top`` (below the root; ``""``: the root) down, depth
        first: its path relative to the root, the directory held open while the caller
        looks at it, and its entries (whose ``stat`` needs it open). Each is opened from
        its parent without following a link; descriptors are held along one path only
        (the depth of the tree, not its width). A directory missing (not made yet,
        deleted meanwhile), or no longer a directory, is skipped; ``top`` a link raises
        ``UnsafePathError``."""
        osl = self.os
        try:
            root = osl.open_dir(None, self.root or "/")
        except (FileNotFoundError, NotADirectoryError):
            return
        held: list[tuple[str, Dir]] = [("", root)]
        stack: list[list[str]] = [top.split("/") if top else []]
        depth = len(stack[0])
        try:
            while stack:
                parts = stack.pop()
                keep = 0
                while (
                    keep < len(parts) and keep + 1 < len(held) and held[keep + 1][0] == parts[keep]
                ):
                    keep += 1
                while len(held) > keep + 1:
                    osl.close_dir(held.pop()[1])
                try:
                    for i in range(keep, len(parts)):
                        held.append((parts[i], self._open_sub(held[-1][1], parts, i, top)))
                except UnsafePathError:
                    if len(parts) == depth:
                        raise  # ``top`` itself, or a directory above it
                    continue  # swapped for a link since it was listed: not descended into
                except (FileNotFoundError, NotADirectoryError):
                    continue
                rel = "/".join(parts)
                d = held[-1][1]
                entries = osl.scandir(d)
                yield rel, d, entries
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append([*parts, e.name])
                    except FileNotFoundError:
                        continue
        finally:
            while held:
                osl.close_dir(held.pop()[1])

    # ------------------------------------------------------------------ writing and removing

    def _create_in(self, d: Dir, name: str, path: str) -> IO[bytes]:
        try:
            return self.os.open(d, name)
        except OSError as err:
            failed = self._leaf_failed(err, d, name, path)
            if failed is err:
                raise
            raise failed from err

    @staticmethod
    def _close_quietly(path: str, f: IO[bytes]) -> None:
        try:
            f.close()
        except Exception as err:
            log.debug("closing %s after a failure: %r", path, err)

    def _write_replace(self, d: Dir, name: str, data: bytes, suffix: str = ".inprogress") -> None:
        """Write ``data`` to ``name`` in ``d`` whole or not at all on a local disk: a
        synced twin (``name`` + ``suffix``), then a rename (the caller syncs the
        directory)."""
        tmp = name + suffix
        with self._create_in(d, tmp, path_of(d, tmp)) as f:
            f.write(data)
            f.flush()
            self.os.fsync(f)
        self.os.replace(d, tmp, name)

    def prune(self, dirs: tuple[str, ...]) -> None:
        """Remove each of ``dirs`` (innermost first) while it is empty."""
        for d in dirs:
            try:
                with self._at(d) as (parent, name):
                    self.os.rmdir(parent, name)  # a link there: ENOTDIR, kept
            except OSError:
                return  # not empty (or already gone): its parents are not empty either

    def _rmtree(self, d: Dir, name: str, path: str) -> None:
        try:
            self.os.rmtree(d, name)
        except OSError as err:
            if err.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            if not stat.S_ISLNK(self.os.lstat(d, name).st_mode):
                raise
            # A managed directory replaced by a link: its name goes, the link's target is
            # not the store's and is never descended into.
            log.warning("%s is a symbolic link: removing the link only", path)
            self.os.remove(d, name)

    # ------------------------------------------------------------------ the operations

    def makedirs(self, path: str) -> None:
        """Make directory ``path`` and its missing parents, each new name synced."""
        with self._dir(path, path, make=True):
            pass

    def create(self, path: str) -> IO[bytes]:
        """A new file ``path`` opened for writing, its name synced in its directory (R12);
        a file opened before a failure is closed before the failure is raised."""
        f: IO[bytes] | None = None
        try:
            with self._at(path, make=True) as (d, name):
                f = self._create_in(d, name, path)
                self.os.fsync_dir(d)  # the new name survives a power loss (R12)
        except Exception:
            if f is not None:
                self._close_quietly(path, f)
            raise
        assert f is not None
        return f

    def sync(self, f: IO[bytes]) -> None:
        """Make the bytes flushed to ``f`` durable (R12)."""
        self.os.fsync(f)

    def reopen(self, path: str) -> IO[bytes]:
        """Regular file ``path`` opened for appending (a link or a special file there is
        refused, never followed or opened)."""
        with self._at(path) as (d, name):
            unsafe = self._unsafe(d, name, path, path, leaf=True)
            if unsafe is not None:
                raise unsafe
            try:
                return self.os.open_append(d, name)
            except FileNotFoundError:
                raise
            except OSError as err:
                failed = self._leaf_failed(err, d, name, path)
                if failed is err:
                    raise
                raise failed from err

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``path`` whole or not at all (a synced ``.inprogress`` twin, a rename),
        then sync its directory: a name put in place survives a power loss."""
        with self._at(path, make=True) as (d, name):
            self._write_replace(d, name, data)
            self.os.fsync_dir(d)

    def sync_after_removal(self, path: str) -> None:
        """Sync the directory of ``path``, from which a failed write's file was removed:
        the removal must not come back at a power loss either (recovery would take an
        aborted checkpoint's ``_metadata`` for a completed one whose files are deleted).
        A failed sync is logged: the write's own failure is what the caller raises."""
        parent = path.rpartition("/")[0]
        try:
            with self._dir(parent, path) as d:
                self.os.fsync_dir(d)
        except FileNotFoundError:
            pass  # the directory was never made: nothing was put in it
        except Exception as sync_err:
            log.warning("syncing %s after removing %s failed: %r", parent, path, sync_err)

    def publish(self, path: str, data: bytes) -> None:
        """Write ``path`` whole or not at all: a synced twin named for this process (two
        processes publishing at once never share one), then a rename."""
        with self._at(path, make=True) as (d, name):
            self._write_replace(d, name, data, f".tmp-{os.getpid()}")

    def unpublish(self, path: str) -> None:
        """Remove ``path`` if it is there (a link there: the link itself)."""
        try:
            self.remove(path)
        except FileNotFoundError:
            pass

    def remove(self, path: str) -> None:
        """Remove file ``path`` (a link there: the link itself)."""
        with self._at(path) as (d, name):
            self.os.remove(d, name)

    def write_lease(self, name: str, data: bytes, *, exclusive: bool) -> None:
        """Write file ``name`` at the root, synced: ``exclusive``, only if it is not there
        (``O_EXCL``: the check and the creation are one step; ``FileExistsError`` else),
        otherwise replacing it whole."""
        with self._dir("", name, make=True) as d:
            if exclusive:
                self.os.create_exclusive(d, name, data)
            else:
                self._write_replace(d, name, data)
            self.os.fsync_dir(d)

    def names(self, path: str) -> set[str]:
        """The names in directory ``path`` (none if it is missing)."""
        try:
            with self._dir(path, path) as d:
                return {e.name for e in self.os.scandir(d)}
        except (FileNotFoundError, NotADirectoryError):
            return set()

    def sizes(self) -> dict[str, int]:
        """Every file below the root with its size: one ``scandir`` per directory and the
        stat it already holds, where fsspec's ``find`` stats every entry again (a listing
        after every command is most of a lockstep run's time)."""
        out: dict[str, int] = {}
        for rel, _, entries in self.walk(""):
            prefix = f"{rel}/" if rel else ""
            for e in entries:
                try:
                    if e.is_file(follow_symlinks=False):
                        out[prefix + e.name] = e.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue  # deleted meanwhile
        return out

    def files_under(self, path: str) -> set[str]:
        """Every name below directory ``path`` that is no directory; ``path`` itself when
        it is a link (not the store's to empty)."""
        out: set[str] = set()
        try:
            for rel, _, entries in self.walk(path):
                for e in entries:
                    if not e.is_dir(follow_symlinks=False):
                        out.add(f"{rel}/{e.name}")  # a file, a link or a special file
        except UnsafePathError:
            return {path}  # a link where the directory was: not the store's to empty
        return out

    def size(self, path: str) -> int:
        """The size of regular file ``path`` (a link or a special file is refused)."""
        with self._at(path) as (d, name):
            unsafe = self._unsafe(d, name, path, path, leaf=True)
            if unsafe is not None:
                raise unsafe
            return int(self.os.lstat(d, name).st_size)

    def is_dir(self, path: str) -> bool:
        """Whether directory ``path`` is there: a link is no directory of the store's,
        nor is anything reached through one."""
        try:
            with self._dir(path, path):
                return True
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            return False

    def delete(self, batch: list[tuple[str, bool]]) -> None:
        """Delete each ``(path, is_dir)`` of ``batch``, a directory with everything in it;
        a path already gone counts as deleted."""
        for path, is_dir in batch:
            try:
                with self._at(path) as (d, name):
                    if is_dir:
                        self._rmtree(d, name, path)
                    else:
                        self.os.remove(d, name)  # a link: the link itself
            except FileNotFoundError:
                pass
