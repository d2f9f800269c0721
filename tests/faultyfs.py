"""A failing file system: an fsspec file system that wraps another one and fails chosen calls.

``FaultyFileSystem(inner)`` delegates every call to ``inner`` (a ``LocalFileSystem``, a
``MemoryFileSystem``, ...) and can be told to

- fail chosen calls: ``fail(method, times=1, after=0, path_contains=None, exc=None)`` makes
  the next ``times`` calls of ``method`` whose path contains ``path_contains``, after
  skipping ``after`` of them, raise ``exc`` (default: an ``OSError(EIO)`` naming the call
  and the path) without doing anything. ``lost_reply=True`` does the call first and then
  raises (the request reached the store, the answer was lost). Methods: ``open`` (alias
  ``_open``), ``makedirs``, ``mkdir``, ``rm_file``, ``rm``, ``rmdir``, ``pipe_file``,
  ``cat_file``, ``mv``, ``find``, ``ls``, ``info``, and the methods of a file opened for
  writing: ``write``, ``flush``, ``close``;
- crash: ``crash_after(n)`` makes the n-th mutating storage operation from now on raise
  :class:`SimulatedCrash` (a ``BaseException``: no ``except Exception`` of the code under
  test catches it) instead of happening. It is a process death: the operation and
  everything after it never run, every later call of any kind raises ``SimulatedCrash``,
  and open files are not closed properly (bytes written but not flushed are lost; what was
  flushed is on the inner file system already).

Mutating operations, counted in :attr:`FaultyFileSystem.mutations` and logged in
:attr:`FaultyFileSystem.log`: creating a file (``open`` for writing), a ``flush`` of a file
(the bytes of the ``write`` calls before it become durable: "write + flush" is one
operation), closing a file, deleting a file or directory (``rm`` counts each path it
removes, so a crash can cut a recursive delete in half), ``pipe_file`` (a whole-object
write, atomic as on an object store), ``makedirs``/``mkdir`` that create a directory,
``mv`` and ``touch``.

The wrapper's protocol is ``faulty``: ``fastimpl.storage.Storage`` treats it as a remote
store whose open files are readable (no builtin ``open``/``os.fsync``, no directory
pruning, ACROSS merging allowed), so every call goes through fsspec and can be
intercepted. ``object_store=True`` makes it an object store instead: its protocol says
``s3``, and a file written appears on the inner file system only when it is closed (the
close is the upload, one mutating operation; creating and flushing change nothing).
Paths are the inner file system's (``/tmp/x/...`` for a local directory, ``/root/...``
for memory).

``local_root=DIR`` (over a ``LocalFileSystem``) makes it a local disk instead: its
protocol says ``file``, so ``Storage`` takes its real local-disk path (descriptors walked
from the root, ``os.fsync``, renames, directory syncs, pruning), and every OS call of that
path goes through :class:`FaultyOS` (the wrapper's ``local_os``, see
``fastimpl.storage.LocalOS``), with the same ``fail``/``crash_after``/``log``/``mutations``
as above. A read there is ``FaultyOS.read``, failed as ``cat_file``. Methods that ``fail``
takes there: ``open`` (a file for writing), ``write``, ``flush``, ``fsync``, ``close``,
``mkdir``, ``fsync_dir``, ``replace``, ``remove``, ``rmdir``, ``rmtree``, ``scandir``,
``cat_file``, ``find``, ``ls``, ``info``; ``rm_file``, ``rm``, ``makedirs`` and ``mv``
name ``remove``, ``rmtree``, ``mkdir`` and ``replace``. Mutating operations there:
``create`` (opening a file for writing), ``flush`` (the written bytes reach the OS),
``fsync``, ``fsync_dir``, ``mkdir``, ``replace``, ``remove`` and ``rmdir`` (``rmtree``
counts each file and directory it removes, in sorted order). A crash there is a power
loss by default (``crash_after(n, power_loss=True)``): what was not made durable is lost,
as a local file system may lose it. Bytes survive up to the last ``fsync`` of their file;
a directory holds the names it held at its last ``fsync_dir`` (a file or directory
created, renamed in or removed since then is gone, back where it was, or back), and
the directory tree under ``local_root`` is rewritten to that state. ``power_loss=False``
is a process death instead: what reached the OS (flushed) survives, only bytes still in
a file's buffer are lost. DIR itself and everything under it when the wrapper was made
count as durable.

The second half of the module holds what the fault, recovery and bad-input tests share:
:class:`Place` (a local or memory root, with a store on the wrapper over it and a listing
with contents hashes), :func:`payload` and :class:`Ledger` (the bytes the job wrote, to
compare with what the store reads back).
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import itertools
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import fsspec  # type: ignore[import-untyped]
from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]
from fsspec.utils import stringify_path  # type: ignore[import-untyped]

from fastimpl import CheckpointStore, CounterIds, IdSource, testing
from fastimpl.engine import InProcessEngine
from fastimpl.storage import WRITER_LEASE, Dir, LocalOS, path_of
from spec.config import Config, JobSpec
from spec.handles import StateEntry, extent_of, stream_of
from spec.ids import SubtaskId
from spec.observation import RetainedView


class SimulatedCrash(BaseException):
    """The process died at this storage call: nothing after it runs."""


FILE_METHODS = frozenset({"write", "flush", "close"})
FS_METHODS = frozenset(
    {
        "open",
        "makedirs",
        "mkdir",
        "rm_file",
        "rm",
        "rmdir",
        "pipe_file",
        "cat_file",
        "mv",
        "find",
        "ls",
        "info",
        "touch",
    }
)
_ALIASES = {"_open": "open", "_rm": "rm_file"}
LOCAL_WRITE_METHODS = ("open", "write", "flush", "fsync", "close", "mkdir", "fsync_dir", "replace")
"""The OS calls of ``Storage``'s local write path, in the order a write makes them."""
LOCAL_METHODS = frozenset(
    {
        *LOCAL_WRITE_METHODS,
        "remove",
        "rmdir",
        "rmtree",
        "scandir",
        "cat_file",
        "find",
        "ls",
        "info",
    }
)
"""What ``fail`` takes on a local disk (``local_root``): the OS calls of ``FaultyOS``
(a read is ``cat_file``) and the fsspec calls a test may make there."""
_LOCAL_ALIASES = {"rm_file": "remove", "rm": "rmtree", "makedirs": "mkdir", "mv": "replace"}


class _Rule:
    __slots__ = ("exc", "fired", "lost_reply", "method", "path_contains", "skip", "times")

    def __init__(
        self,
        method: str,
        times: int,
        after: int,
        path_contains: str | None,
        exc: BaseException | None,
        lost_reply: bool,
    ) -> None:
        self.method = method
        self.times = times
        self.skip = after
        self.path_contains = path_contains
        self.exc = exc
        self.lost_reply = lost_reply
        self.fired = 0

    def matches(self, method: str, path: str) -> bool:
        if method != self.method or self.fired >= self.times:
            return False
        return self.path_contains is None or self.path_contains in path


class FaultyFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """An fsspec file system that delegates to ``inner`` and fails chosen calls."""

    protocol: str | tuple[str, ...] = "faulty"
    root_marker = "/"
    cachable = False

    def __init__(
        self,
        inner: Any,
        *,
        object_store: bool = False,
        local_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if object_store and local_root is not None:
            raise ValueError("an object store is no local disk")
        self.inner = inner
        self.object_store = object_store
        """Behave as an object store: the protocol says ``s3`` (so ``Storage`` treats it
        as one: no ACROSS merging, a file is durable once closed), and a file written
        appears on the inner file system only when it is closed (the upload)."""
        if object_store:
            self.protocol = ("s3", "faulty")
        self.local_os: FaultyOS | None = None
        """On a local disk (``local_root``): the OS calls of ``Storage``'s local path."""
        if local_root is not None:
            self.protocol = ("file", "faulty")
        self._lock = threading.RLock()
        self._rules: list[_Rule] = []
        self.calls: dict[str, int] = {}
        """How often each method was called (faults and crashes included)."""
        self.faults_fired = 0
        self.fault_log: list[tuple[str, str]] = []
        """(method, path) of every injected fault, in order."""
        self.mutations = 0
        """Mutating operations carried out (or crashed at) so far."""
        self.log: list[tuple[str, str]] = []
        """(operation, path) of every mutating operation carried out, in order."""
        self._crash_at: int | None = None
        self.crashed: tuple[str, str] | None = None
        """The (operation, path) the process died at, once it has."""
        self.crashed_in: str | None = None
        """The name of the thread whose operation the crash hit."""
        self.bulk_rm_sizes: list[int] = []
        """For every ``rm`` called with a list of paths: how many paths it named."""
        self._files: set[FaultyFile] = set()
        self.gates: dict[str, threading.Event] = {}
        """``hold(method)``: calls of ``method`` wait until the event is set."""
        self.power_loss = True
        """What a crash loses on a local disk (``crash_after``)."""
        self._foreground: int | None = None
        self._others: threading.Event | None = None
        if local_root is not None:
            self.local_os = FaultyOS(self, local_root)

    @property
    def open_files_readable(self) -> bool:
        """What this wrapper does with an open file's flushed bytes (it passes them on to
        ``inner`` at once unless it plays an object store): ``fastimpl.storage`` asks a
        wrapper this instead of guessing (R16, issue 14)."""
        return not self.object_store

    # ------------------------------------------------------------------ paths

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("faulty://"):
            path = path[len("faulty://") :]
        return path.rstrip("/") or cls.root_marker

    # ------------------------------------------------------------------ control

    def fail(
        self,
        method: str,
        *,
        times: int = 1,
        after: int = 0,
        path_contains: str | None = None,
        exc: BaseException | None = None,
        lost_reply: bool = False,
    ) -> None:
        """Fail the next ``times`` matching calls of ``method`` after skipping ``after``."""
        method = self._method(method)
        known = LOCAL_METHODS if self.local_os is not None else FS_METHODS | FILE_METHODS
        if method not in known:
            raise ValueError(f"cannot fail {method!r}; known: {sorted(known)}")
        with self._lock:
            self._rules.append(_Rule(method, times, after, path_contains, exc, lost_reply))

    def _method(self, name: str) -> str:
        name = _ALIASES.get(name, name)
        if self.local_os is not None:
            name = _LOCAL_ALIASES.get(name, name)
        return name

    def heal(self, *methods: str) -> None:
        """Forget the armed faults of ``methods`` (of every method if none is named)."""
        names = {self._method(m) for m in methods}
        with self._lock:
            self._rules = [r for r in self._rules if names and r.method not in names]

    def armed(self) -> int:
        """How many injected faults are still to fire."""
        with self._lock:
            return sum(r.times - r.fired for r in self._rules)

    def crash_after(self, n: int, *, power_loss: bool = True) -> None:
        """The ``n``-th mutating operation from now on crashes the process (n >= 1).

        On a local disk (``local_root``) ``power_loss`` says what the crash loses: what
        was not synced (the default), or only what had not reached the OS (a process
        death). Elsewhere a crash is a process death."""
        if n < 1:
            raise ValueError("crash_after needs n >= 1")
        with self._lock:
            self._crash_at = self.mutations + n
            self.power_loss = power_loss

    def hold(self, method: str) -> threading.Event:
        """Calls of ``method`` block until the returned event is set (e.g. to let deletes
        queue up behind a slow first one)."""
        ev = threading.Event()
        self.gates[self._method(method)] = ev
        return ev

    def hold_other_threads(self) -> threading.Event:
        """Calls from threads other than the calling one (the deleter) wait until the
        returned event is set, so that they run only while the caller lets them: with
        the caller waiting for them, the order of all calls is deterministic. A crash
        sets it (every later call raises ``SimulatedCrash``)."""
        ev = threading.Event()
        with self._lock:
            self._foreground = threading.get_ident()
            self._others = ev
        return ev

    # ------------------------------------------------------------------ the checks

    def _wait_turn(self) -> None:
        others = self._others
        if others is not None and threading.get_ident() != self._foreground:
            others.wait()

    def _enter(self, method: str, path: str) -> _Rule | None:
        """Count the call; raise an armed fault. A lost-reply rule is returned instead:
        the caller performs the call, then raises it."""
        self._wait_turn()
        gate = self.gates.get(method)
        if gate is not None:
            gate.wait()
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            self._alive()
            for rule in self._rules:
                if not rule.matches(method, path):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                rule.fired += 1
                self.faults_fired += 1
                self.fault_log.append((method, path))
                if rule.lost_reply:
                    return rule
                raise self._error(rule, method, path)
        return None

    def _error(self, rule: _Rule, method: str, path: str) -> BaseException:
        if rule.exc is not None:
            return rule.exc
        return OSError(errno.EIO, f"injected fault: {method} failed", path)

    @contextmanager
    def call(self, method: str, path: str) -> Iterator[None]:
        """One intercepted call: counted and failed as armed (``_enter``) before its body
        runs; a lost-reply fault raised after the body succeeded (``_after``)."""
        rule = self._enter(method, path)
        yield
        self._after(rule, method, path)

    def _after(self, rule: _Rule | None, method: str, path: str) -> None:
        if rule is not None:
            raise self._error(rule, method, path)

    def _alive(self) -> None:
        if self.crashed is not None:
            raise SimulatedCrash(f"the process died at {self.crashed[0]} {self.crashed[1]}")

    def _mutate(self, op: str, path: str) -> None:
        """One mutating operation is about to happen: count it, or crash instead."""
        self._wait_turn()
        with self._lock:
            self._alive()
            self.mutations += 1
            if self._crash_at is not None and self.mutations >= self._crash_at:
                self.crashed = (op, path)
                self.crashed_in = threading.current_thread().name
                self._die()
                raise SimulatedCrash(f"crash at operation {self.mutations}: {op} {path}")
            self.log.append((op, path))

    def _die(self) -> None:
        """Open files die with the process: unflushed bytes are lost, nothing is closed
        properly (the inner handles are released without writing anything more). On a
        local disk a power loss also loses what was not synced. Threads held back by
        ``hold`` or ``hold_other_threads`` go on (to raise ``SimulatedCrash``)."""
        for f in list(self._files):
            f._drop()
        self._files.clear()
        if self.local_os is not None:
            self.local_os._die(self.power_loss)
        if self._others is not None:
            self._others.set()
        for gate in self.gates.values():
            gate.set()

    # ------------------------------------------------------------------ writing

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        rule = self._enter("open", path)
        if "r" in mode and "+" not in mode:
            f = self.inner.open(path, mode, **kwargs)
            self._after(rule, "open", path)
            return f
        if self.object_store:
            inner = None  # nothing exists until the upload at close
        else:
            self._mutate("create", path)
            inner = self.inner.open(path, mode, **kwargs)
        wrapped = FaultyFile(self, path, inner)
        with self._lock:
            self._files.add(wrapped)
        if rule is not None:
            wrapped._drop()
            self._after(rule, "open", path)
        return wrapped

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        rule = self._enter("makedirs", path)
        if not self.inner.isdir(path):
            self._mutate("mkdir", path)
        self.inner.makedirs(path, exist_ok=exist_ok)
        self._after(rule, "makedirs", path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        rule = self._enter("mkdir", path)
        if not self.inner.isdir(path):
            self._mutate("mkdir", path)
        self.inner.mkdir(path, create_parents=create_parents, **kwargs)
        self._after(rule, "mkdir", path)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        rule = self._enter("pipe_file", path)
        self._mutate("pipe_file", path)
        self.inner.pipe_file(path, value, mode=mode, **kwargs)
        self._after(rule, "pipe_file", path)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        rule = self._enter("touch", path)
        self._mutate("touch", path)
        self.inner.touch(path, truncate=truncate, **kwargs)
        self._after(rule, "touch", path)

    def mv(self, path1: str, path2: str, recursive: bool = False, **kwargs: Any) -> None:
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        rule = self._enter("mv", path1)
        self._mutate("mv", f"{path1} -> {path2}")
        self.inner.mv(path1, path2, recursive=recursive, **kwargs)
        self._after(rule, "mv", path1)

    # ------------------------------------------------------------------ deleting

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        rule = self._enter("rm_file", path)
        if not self.inner.exists(path):
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        self._mutate("rm_file", path)
        self.inner.rm_file(path)
        self._after(rule, "rm_file", path)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rmdir(self, path: str) -> None:
        path = self._strip_protocol(path)
        rule = self._enter("rmdir", path)
        self._mutate("rmdir", path)
        self.inner.rmdir(path)
        self._after(rule, "rmdir", path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Delete files (a list: one bulk call) or, with ``recursive``, directories. Each
        removed path is one mutating operation, so a crash may cut the call in half. The
        paths go in the order given (what a directory holds: deepest first), so that the
        order of deletes does not depend on how they were batched."""
        paths = [path] if isinstance(path, str) else list(path)
        paths = [self._strip_protocol(p) for p in paths]
        if not isinstance(path, str):
            with self._lock:
                self.bulk_rm_sizes.append(len(paths))
        rule = self._enter("rm", paths[0] if len(paths) == 1 else ",".join(paths))
        missing = [p for p in paths if not self.inner.exists(p)]
        present = [p for p in paths if p not in missing]
        expanded = [
            q
            for p in present
            for q in sorted(
                self.inner.expand_path(p, recursive=recursive, maxdepth=maxdepth), reverse=True
            )
        ]
        for p in expanded:
            if self.inner.isfile(p):
                self._mutate("rm_file", p)
                self.inner.rm_file(p)
            elif self.inner.isdir(p):
                pseudo = getattr(self.inner, "pseudo_dirs", None)
                if pseudo is not None and p not in pseudo:
                    continue  # an implied directory of a memory fs: gone with its files
                self._mutate("rmdir", p)
                self.inner.rmdir(p)
        self._after(rule, "rm", ",".join(paths))
        if missing:
            raise FileNotFoundError(errno.ENOENT, "no such file", missing[0])

    # ------------------------------------------------------------------ reading

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        path = self._strip_protocol(path)
        rule = self._enter("cat_file", path)
        out = self.inner.cat_file(path, start=start, end=end, **kw)
        self._after(rule, "cat_file", path)
        return out

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        rule = self._enter("find", path)
        out = self.inner.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        self._after(rule, "find", path)
        return out

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        rule = self._enter("ls", path)
        out = self.inner.ls(path, detail=detail, **kwargs)
        self._after(rule, "ls", path)
        return out

    def info(self, path: str, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        rule = self._enter("info", path)
        out = self.inner.info(path, **kwargs)
        self._after(rule, "info", path)
        return out

    def exists(self, path: str, **kwargs: Any) -> bool:
        path = self._strip_protocol(path)
        self._alive()
        return bool(self.inner.exists(path, **kwargs))

    def isdir(self, path: str) -> bool:
        path = self._strip_protocol(path)
        self._alive()
        return bool(self.inner.isdir(path))

    def isfile(self, path: str) -> bool:
        path = self._strip_protocol(path)
        self._alive()
        return bool(self.inner.isfile(path))

    def open_files(self) -> Iterator[str]:
        """Paths of the files open for writing through this wrapper."""
        with self._lock:
            return iter(sorted(f.path for f in self._files))


class FaultyFile:
    """A file opened for writing through :class:`FaultyFileSystem`.

    ``write`` keeps the bytes here; ``flush`` hands them to the inner file and flushes it
    (one mutating operation); ``close`` flushes what is left and closes the inner file.
    After a crash nothing reaches the inner file any more.
    """

    def __init__(self, fs: FaultyFileSystem, path: str, inner: Any | None) -> None:
        self.fs = fs
        self.path = path
        self._inner = inner
        self._buf: list[bytes] = []
        self.closed = False

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to closed file {self.path}")
        rule = self.fs._enter("write", self.path)
        chunk = bytes(data)
        self._buf.append(chunk)
        self.fs._after(rule, "write", self.path)
        return len(chunk)

    def _push(self) -> None:
        if self._inner is None:
            return  # an object store keeps everything for the upload
        if self._buf:
            data, self._buf = b"".join(self._buf), []
            self._inner.write(data)
        self._inner.flush()

    def flush(self) -> None:
        if self.closed:
            return
        rule = self.fs._enter("flush", self.path)
        if self._inner is not None:
            self.fs._mutate("flush", self.path)
        self._push()
        self.fs._after(rule, "flush", self.path)

    def close(self) -> None:
        if self.closed:
            return
        rule = self.fs._enter("close", self.path)
        if self._inner is None:
            self.fs._mutate("upload", self.path)
            self.fs.inner.pipe_file(self.path, b"".join(self._buf))
            self._buf = []
        else:
            self.fs._mutate("close", self.path)
            self._push()
            self._inner.close()
        self.closed = True
        with self.fs._lock:
            self.fs._files.discard(self)
        self.fs._after(rule, "close", self.path)

    def _drop(self) -> None:
        """Die: forget the unflushed bytes, release the inner handle without writing."""
        self._buf = []
        if not self.closed:
            self.closed = True
            try:
                if self._inner is not None:
                    self._inner.close()  # its own buffer is empty: every push flushed it
            except Exception:
                pass

    def __enter__(self) -> FaultyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FaultyOS(LocalOS):
    """The OS calls of ``Storage``'s local-disk path through a :class:`FaultyFileSystem`
    (made with ``local_root``): each one can be failed or crashed with the wrapper's
    ``fail``/``crash_after``, and each mutating one is counted and logged there.

    Every call does the real OS call (``os.fsync`` included). Alongside, it keeps a model
    of what a power loss would leave under ``root``: for each file the bytes of its last
    ``fsync``, for each directory the names it held at its last ``fsync_dir``. Files and
    directories are nodes (an inode each), so a rename moves a node and a name removed
    still leads to the node's synced bytes. A crash with ``power_loss`` rewrites the tree
    under ``root`` to that model.
    """

    def __init__(self, fs: FaultyFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self._ids = itertools.count(1)
        self._node: dict[str, int] = {}
        """Current path -> node, for the files and directories under the root (root too)."""
        self._is_dir: dict[int, bool] = {}
        self._synced: dict[int, bytes] = {}
        """File node -> its bytes as of its last ``fsync``."""
        self._listing: dict[int, dict[str, int]] = {}
        """Directory node -> its names (name -> node) as of its last ``fsync_dir``."""
        self._open_files: set[FaultyLocalFile] = set()
        self._adopt(self.root)

    # ------------------------------------------------------------------ the model

    def _under(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root.rstrip("/") + "/")

    def _adopt(self, path: str) -> int:
        """A node for ``path`` as it is on disk now, durable with everything under it."""
        node = next(self._ids)
        self._node[path] = node
        if os.path.isdir(path):
            self._is_dir[node] = True
            names = sorted(os.listdir(path))
            self._listing[node] = {n: self._adopt(f"{path.rstrip('/')}/{n}") for n in names}
        else:
            self._is_dir[node] = False
            with builtins.open(path, "rb") as f:
                self._synced[node] = f.read()
        return node

    def _node_of(self, path: str) -> int:
        node = self._node.get(path)
        if node is None:  # made outside this layer (a test writing a file): durable as is
            node = self._adopt(path)
        return node

    def _new(self, path: str, is_dir: bool) -> None:
        if self._under(path):
            node = next(self._ids)
            self._node[path] = node
            self._is_dir[node] = is_dir

    def _forget(self, path: str) -> None:
        self._node.pop(path, None)

    def _die(self, power_loss: bool) -> None:
        for f in list(self._open_files):
            f._drop()
        self._open_files.clear()
        if power_loss:
            self._restore()

    def _restore(self) -> None:
        """Rewrite the tree under the root to what the last syncs made durable."""
        root = self.root
        root_node = self._node.get(root)
        for name in os.listdir(root):
            full = f"{root.rstrip('/')}/{name}"
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.remove(full)
        if root_node is not None:
            self._write_tree(root, root_node)

    def _write_tree(self, path: str, node: int) -> None:
        for name, child in sorted(self._listing.get(node, {}).items()):
            full = f"{path.rstrip('/')}/{name}"
            if self._is_dir[child]:
                os.mkdir(full)
                self._write_tree(full, child)
            else:
                with builtins.open(full, "wb") as f:
                    f.write(self._synced.get(child, b""))

    # ------------------------------------------------------------------ the OS calls
    #
    # Each call does the real one through ``LocalOS`` (by descriptor, never following a
    # link: what the product does) and keeps the model by the path it stands for.

    def open_dir(self, d: Dir | None, name: str) -> Dir:
        self.fs._alive()
        return super().open_dir(d, name)

    def lstat(self, d: Dir | None, name: str) -> os.stat_result:
        self.fs._alive()
        return super().lstat(d, name)

    def open(self, d: Dir, name: str) -> IO[bytes]:
        fs = self.fs
        path = path_of(d, name)
        rule = fs._enter("open", path)
        with fs._lock:
            fs._mutate("create", path)
            real = os.fdopen(self._create(d, name), "wb", buffering=0)
            if path not in self._node:
                self._new(path, False)
            f = FaultyLocalFile(self, path, real)
            self._open_files.add(f)
        if rule is not None:
            f._drop()
            fs._after(rule, "open", path)
        return cast(IO[bytes], f)

    def read(self, d: Dir, name: str, start: int = 0, length: int | None = None) -> bytes:
        with self.fs.call("cat_file", path_of(d, name)):
            return super().read(d, name, start, length)

    def fsync(self, f: IO[bytes]) -> None:
        lf = cast(FaultyLocalFile, f)
        fs = self.fs
        with fs.call("fsync", lf.path), fs._lock:
            fs._mutate("fsync", lf.path)
            os.fsync(lf.fileno())
            node = self._node.get(lf.path)
            if node is not None:
                self._synced[node] = bytes(lf.pushed)

    def fsync_dir(self, d: Dir) -> None:
        fs = self.fs
        path = d.path
        with fs.call("fsync_dir", path), fs._lock:
            fs._mutate("fsync_dir", path)
            super().fsync_dir(d)
            if self._under(path):
                base = path.rstrip("/")
                self._listing[self._node_of(path)] = {
                    n: self._node_of(f"{base}/{n}") for n in os.listdir(path)
                }

    def isdir(self, path: str) -> bool:
        self.fs._alive()
        return os.path.isdir(path)

    def mkdir(self, d: Dir | None, name: str) -> None:
        fs = self.fs
        path = path_of(d, name)
        with fs.call("mkdir", path), fs._lock:
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, "exists", path)
            fs._mutate("mkdir", path)
            super().mkdir(d, name)
            self._new(path, True)

    def replace(self, d: Dir, src: str, dst: str) -> None:
        fs = self.fs
        src_path, dst_path = path_of(d, src), path_of(d, dst)
        with fs.call("replace", src_path), fs._lock:
            fs._mutate("replace", f"{src_path} -> {dst_path}")
            super().replace(d, src, dst)
            node = self._node.pop(src_path, None)
            if node is not None and self._under(dst_path):
                self._node[dst_path] = node
            else:
                self._forget(dst_path)

    def remove(self, d: Dir, name: str) -> None:
        fs = self.fs
        with fs.call("remove", path_of(d, name)), fs._lock:
            self._unlink(d, name)

    def _unlink(self, d: Dir, name: str) -> None:
        path = path_of(d, name)
        super().lstat(d, name)  # FileNotFoundError before the operation is counted
        self.fs._mutate("remove", path)
        super()._unlink(d, name)
        self._forget(path)

    def rmdir(self, d: Dir, name: str) -> None:
        fs = self.fs
        with fs.call("rmdir", path_of(d, name)), fs._lock:
            self._rmdir(d, name)

    def _rmdir(self, d: Dir, name: str) -> None:
        path = path_of(d, name)
        if not stat.S_ISDIR(super().lstat(d, name).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        if os.listdir(path):
            raise OSError(errno.ENOTEMPTY, "directory not empty", path)
        self.fs._mutate("rmdir", path)
        super()._rmdir(d, name)
        self._forget(path)

    def rmtree(self, d: Dir, name: str) -> None:
        """Each file and directory removed is one mutating operation (``_unlink``,
        ``_rmdir``), in sorted order (depth first), so that a crash can cut the call in
        half at a known point."""
        fs = self.fs
        with fs.call("rmtree", path_of(d, name)), fs._lock:
            super().rmtree(d, name)

    def scandir(self, d: Dir) -> list[os.DirEntry[str]]:
        fs = self.fs
        rule = fs._enter("scandir", d.path)
        out = super().scandir(d)
        fs._after(rule, "scandir", d.path)
        return out


class FaultyLocalFile:
    """A file opened for writing through :class:`FaultyOS`: ``write`` keeps the bytes
    here, ``flush`` hands them to the OS (one mutating operation), ``FaultyOS.fsync``
    makes what was flushed durable. ``pushed`` is everything flushed so far (the file is
    new or truncated when opened)."""

    def __init__(self, los: FaultyOS, path: str, real: Any) -> None:
        self.los = los
        self.fs = los.fs
        self.path = path
        self._real = real
        self._buf: list[bytes] = []
        self.pushed = bytearray()
        self.closed = False

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def fileno(self) -> int:
        return int(self._real.fileno())

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to closed file {self.path}")
        rule = self.fs._enter("write", self.path)
        chunk = bytes(data)
        self._buf.append(chunk)
        self.fs._after(rule, "write", self.path)
        return len(chunk)

    def _push(self) -> None:
        if self._buf:
            data, self._buf = b"".join(self._buf), []
            self._real.write(data)
            self.pushed += data

    def flush(self) -> None:
        if self.closed:
            return
        with self.fs.call("flush", self.path), self.fs._lock:
            self.fs._mutate("flush", self.path)
            self._push()

    def close(self) -> None:
        """Closing writes what is left in the buffer (nothing, when every write was
        flushed); not a mutating operation of its own."""
        if self.closed:
            return
        with self.fs.call("close", self.path), self.fs._lock:
            self.fs._alive()
            self._push()
            self._real.close()
            self.closed = True
            self.los._open_files.discard(self)

    def _drop(self) -> None:
        """Die: forget the unflushed bytes, release the real file without writing."""
        self._buf = []
        if not self.closed:
            self.closed = True
            try:
                self._real.close()
            except Exception:
                pass

    def __enter__(self) -> FaultyLocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- test helpers


_roots = itertools.count()


@dataclass
class Place:
    """Where a test's checkpoint files live: a local temporary directory or memory."""

    kind: str
    root: str
    """The root as the file system names it (``/tmp/.../ckpt``, ``/faulty-3``)."""
    url: str
    """The same root as a URL for ``CheckpointStore`` and ``CheckpointStore.recover``."""
    inner: Any
    """The unwrapped file system."""

    @classmethod
    def make(cls, kind: str, tmp_path: Path) -> Place:
        if kind == "local":
            root = str(tmp_path / f"ckpt-{next(_roots)}")
            os.makedirs(root)
            return cls(kind, root, root, fsspec.filesystem("file"))
        if kind == "memory":
            root = f"/faultyfs-{os.getpid()}-{next(_roots)}"
            return cls(kind, root, f"memory://{root}", fsspec.filesystem("memory"))
        raise ValueError(f"unknown place {kind!r}")

    def cleanup(self) -> None:
        if self.kind == "memory" and self.inner.exists(self.root):
            self.inner.rm(self.root, recursive=True)

    def snapshot(self) -> dict[str, tuple[int, str]]:
        """Every file under the root: size and SHA-256 of the contents, by relative path;
        not the store's lease (``WRITER_LEASE``), which is no checkpoint data."""
        if not self.inner.exists(self.root):
            return {}
        out: dict[str, tuple[int, str]] = {}
        prefix = self.root.rstrip("/") + "/"
        for p, info in self.inner.find(self.root, detail=True).items():
            if info.get("type") != "file" or p == prefix + WRITER_LEASE:
                continue
            data = bytes(self.inner.cat_file(p))
            out[p[len(prefix) :]] = (len(data), hashlib.sha256(data).hexdigest())
        return out

    def read(self, rel: str) -> bytes:
        return bytes(self.inner.cat_file(f"{self.root}/{rel}"))

    def read_entry(self, entry: StateEntry) -> bytes:
        """The bytes a handle names, read past the wrapper (armed faults stay armed)."""
        s = stream_of(entry.handle)
        if s is None:
            raise ValueError(f"{entry.handle!r} names no bytes")
        offset = extent_of(s).offset
        data = bytes(
            self.inner.cat_file(f"{self.root}/{s.path}", start=offset, end=offset + s.length)
        )
        if len(data) != s.length:
            raise ValueError(f"{s.path}: {len(data)} bytes at {offset}, wanted {s.length}")
        return data

    def write(self, rel: str, data: bytes) -> None:
        self.inner.pipe_file(f"{self.root}/{rel}", data)

    def store(
        self,
        config: Config,
        job: JobSpec,
        *,
        background_deletes: bool = True,
        ids: IdSource | None = None,
        object_store: bool = False,
        deletion_log: bool = True,
        lease: bool = False,
    ) -> tuple[CheckpointStore, FaultyFileSystem]:
        """A store on this place, every storage call through a fresh wrapper: on a local
        directory ``Storage``'s local-disk path through ``FaultyOS`` (unless it is to be
        an object store), elsewhere fsspec calls. ``lease``: the store takes the base's
        writer lease, as one opened by URL does, so the checks made only where a store
        keeps one (a directory deleted whole is listed first) run too."""
        local_root = self.root if self.kind == "local" and not object_store else None
        fs = FaultyFileSystem(self.inner, object_store=object_store, local_root=local_root)
        cluster = InProcessEngine(
            config,
            job,
            fs,
            self.root,
            ids or CounterIds(),
            background_deletes=background_deletes,
            deletion_log=deletion_log,
        )
        cluster.storage.retry_backoff = 1e-4
        if lease and not cluster.storage.take_lease(b"faultyfs-test", exclusive=True):
            raise ValueError(f"{self.root} holds another store's lease")
        return testing.store_on_engine(cluster), fs


def payload(subtask: SubtaskId, name: str, salt: int = 0) -> bytes:
    """Deterministic bytes of one state handle, 40-400 bytes long."""
    seed = hashlib.sha256(f"{subtask}/{name}/{salt}".encode()).digest()
    n = 40 + int.from_bytes(seed[:2], "big") % 360
    return (seed * (n // len(seed) + 1))[:n]


class Ledger:
    """What the job wrote: the bytes of every (job, checkpoint, subtask, name), to compare
    with what the store reads back for every retained checkpoint."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, int, SubtaskId, str], bytes] = {}

    def record(self, job: str, checkpoint: int, subtask: SubtaskId, name: str, data: bytes) -> None:
        self.data[(job, checkpoint, subtask, name)] = data

    def expected(self, job: str, checkpoint: int) -> dict[tuple[SubtaskId, str], bytes]:
        return {(s, n): v for (j, c, s, n), v in self.data.items() if (j, c) == (job, checkpoint)}

    def problems(
        self,
        store: CheckpointStore,
        views: list[RetainedView] | None = None,
        read: Callable[[StateEntry], bytes] | None = None,
    ) -> list[str]:
        """Every byte of every retained checkpoint (or of ``views``) equals what was written
        for it, and no entry the job acknowledged is missing. ``read`` reads an entry's
        bytes (default: ``store.read``)."""
        read = read or store.read
        out: list[str] = []
        for r in store.coordinator.retained() if views is None else views:
            want = self.expected(r.job, r.checkpoint)
            where = f"{r.job} chk {r.checkpoint}"
            have: set[tuple[SubtaskId, str]] = set()
            for e in r.entries:
                if stream_of(e.handle) is None:
                    continue
                have.add((e.subtask, e.name))
                expected = want.get((e.subtask, e.name))
                if expected is None:
                    out.append(f"{where}: unexpected entry {e.subtask} {e.name}")
                    continue
                try:
                    got = read(e)
                except Exception as err:
                    out.append(f"{where}: {e.subtask} {e.name}: {err!r}")
                    continue
                if got != expected:
                    out.append(f"{where}: {e.subtask} {e.name}: bytes differ")
            out += [f"{where}: lost entry {s} {n}" for s, n in sorted(set(want) - have)]
        return out


__all__ = [
    "FaultyFile",
    "FaultyFileSystem",
    "FaultyLocalFile",
    "FaultyOS",
    "Ledger",
    "Place",
    "SimulatedCrash",
    "payload",
]
