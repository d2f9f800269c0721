"""The write-ahead deletion log and the one-run-per-base lock (issue 32, finding 4).

Each run of ``--delete-orphans`` gets a run id, and every record it appends carries it:
runs sharing a log never mix. Before each delete the run appends its ``intent`` and syncs
the log; after it, the ``result`` (``deleted``, ``gone``, ``failed`` or ``skip-unknown``).
Syncing the next intent syncs the result before it, so a run killed at any point (a
process kill or a power loss) leaves at most one intent without a result, and the set of
files it deleted is exact: every ``deleted`` result, plus that last file if it no longer
exists, which the next run using the log checks and records (``previous-intent``,
:func:`unfinished`).

One deletion run per base at a time: a run holds an exclusive ``flock`` on a lock file
for the whole plan and delete (:class:`BaseLock`). On a local disk the lock file lies in
the machine's temporary directory, named by the base directory's device and inode, never
in a checkpoint tree, so every run on this machine on the base meets it whatever log it
writes or path it names the base by. An object store has no advisory lock: there the lock
file lies beside the log, and only runs on this machine that write their log in the same
directory are kept apart. A second run is refused, naming the holder (the lock file holds
its run id, host, pid and start).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pipeline.location import Location
from spec.errors import CkptError

INTENT = "intent"
RESULTS = ("deleted", "gone", "failed", "skip-unknown")
PREVIOUS = "previous-intent"


class LockHeld(CkptError):
    """Another deletion run holds the base's lock."""


def new_run_id() -> str:
    return uuid.uuid4().hex


class Log:
    """An append-only JSON-lines log: one ``write`` per record (``O_APPEND``: a record is
    never split by another writer's), synced on request."""

    def __init__(self, path: str, run: str) -> None:
        self.path = path
        self.run = run
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def write(self, doc: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps({**doc, "run": self.run}) + "\n").encode())

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def records(path: str) -> Iterator[dict[str, Any]]:
    """The log's records; a line that is not a JSON object (the last one, torn by a
    crash while it was written) is no record."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            yield doc


def unfinished(path: str, base: str) -> list[tuple[str, str]]:
    """(run, path) of each intent without a result of an earlier run on ``base`` (one per
    run at most), not yet resolved by a ``previous-intent`` record."""
    base_of: dict[str, str] = {}
    open_intent: dict[str, str] = {}
    resolved: set[tuple[str, str]] = set()
    for doc in records(path):
        run, event = str(doc.get("run")), doc.get("event")
        if event == "plan":
            base_of[run] = str(doc.get("base"))
        elif event == INTENT:
            open_intent[run] = str(doc.get("path"))
        elif event in RESULTS and open_intent.get(run) == doc.get("path"):
            del open_intent[run]
        elif event == PREVIOUS:
            resolved.add((str(doc.get("of_run")), str(doc.get("path"))))
    return [(r, p) for r, p in open_intent.items()
            if base_of.get(r) == base and (r, p) not in resolved]


def deleted_by(path: str) -> dict[str, set[str]]:
    """Per run: the files it deleted, exactly, as the log says (an intent without a result
    counts once a later run found its file gone)."""
    out: dict[str, set[str]] = {}
    for doc in records(path):
        run, event = str(doc.get("run")), doc.get("event")
        if event == "deleted":
            out.setdefault(run, set()).add(str(doc["path"]))
        elif event == PREVIOUS and doc.get("exists") is False:
            out.setdefault(str(doc["of_run"]), set()).add(str(doc["path"]))
    return out


# --------------------------------------------------------------------------- the lock


def lock_path(loc: Location, log_path: str) -> str:
    """Where the base's lock lies (see the module docstring)."""
    if loc.local:
        # Keyed by the base directory's identity, outside every checkpoint tree: the
        # store counts every file under its root as its own or a stray (I3), so the lock
        # is written there by no one; a run on this machine on the same base (by any path
        # or link) finds the same lock. Runs on other machines are not kept apart.
        st = os.stat(loc.full(loc.job_dir))
        locks = os.path.join(tempfile.gettempdir(), "ckpt-audit-locks")
        os.makedirs(locks, mode=0o700, exist_ok=True)
        return os.path.join(locks, f"{st.st_dev}-{st.st_ino}.lock")
    key = hashlib.sha256(loc.uri().encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(os.path.dirname(os.path.abspath(log_path)), f".ckpt-audit-{key}.lock")


class BaseLock:
    """The exclusive advisory lock of one deletion run on one base (``flock``: released
    when the process dies, however it dies)."""

    def __init__(self, loc: Location, log_path: str, run: str) -> None:
        self.path = lock_path(loc, log_path)
        self.run = run
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            raise LockHeld(f"the deletion lock {self.path} cannot be opened: "
                           f"{err.strerror or err}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self._fd)
            raise LockHeld(f"another deletion run holds {self.path}: {holder}") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps({
            "run": run, "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "base": loc.uri(),
        }).encode(), 0)

    def _holder(self) -> str:
        try:
            data = os.pread(self._fd, 4096, 0).decode("utf-8", "replace")
            doc = json.loads(data)
            return (f"run {doc['run']} on host {doc['host']}, pid {doc['pid']}, "
                    f"since {doc['since']}")
        except (OSError, ValueError, KeyError, TypeError):
            return "a run that has not written its name yet"

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1

    def __enter__(self) -> BaseLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
