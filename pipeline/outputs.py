"""Where the audit writes its own files (``--log``, ``--json``, ``--out``): never inside a
checkpoint tree, and checked before anything is read (issue 32, findings 3 and 9).

An output inside the tree is a write the audit makes into what it audits: a ``--log``
naming ``chk-5/_metadata`` appends JSON lines to a retained checkpoint's metadata, a
``--json`` there overwrites it, a ``--log`` naming an orphan is deleted by the run it
records, and ``--out`` makes files the next audit calls orphans. So an output that
resolves (links followed: the OS will follow them when writing) to the directory holding
the job base, or to anything below one of its entries (the audited base, a sibling base,
an application folder, ``savepoints/``), is refused; a regular file directly beside the
bases is not in any tree and is allowed, a directory there (``--out``) is not.

An output that cannot be written is a usage error naming it, found here rather than as a
traceback once the audit has run (or, for the deletion log, once it is about to delete).
"""

from __future__ import annotations

import os
import stat

from pipeline.location import LOCAL, Location
from pipeline.names import shown
from spec.errors import CkptError
from spec.layout import SAVEPOINTS

STDOUT = "-"


class OutputError(CkptError):
    """An output option names a place the audit must not or cannot write (exit 2)."""


def check_outputs(loc: Location, outputs: list[tuple[str, str | None]]) -> None:
    """``outputs``: (option, path) pairs; a ``None`` path (option not given) or ``-``
    (stdout) is skipped. Raises :class:`OutputError` for the first bad one."""
    for option, path in outputs:
        if path is None or path == STDOUT:
            continue
        where = _inside_tree(loc, option, path)
        if where is not None:
            raise OutputError(
                f"{option} {shown(path)} lies inside {where}: the audit never writes into a "
                "checkpoint tree (it would change a _metadata or write a file the next audit "
                "calls an orphan); write it elsewhere"
            )
        problem = _unwritable(option, path)
        if problem is not None:
            raise OutputError(f"{option} {shown(path)} cannot be written: {problem}")


def _split(path: str) -> tuple[str, str]:
    """(protocol, path): a local path is ``file``."""
    if "://" in path:
        protocol, rest = path.split("://", 1)
        return ("file" if protocol in LOCAL else protocol, rest)
    return "file", path


def _inside_tree(loc: Location, option: str, path: str) -> str | None:
    """What tree ``path`` lies in (in words), or ``None`` if it lies in none."""
    protocol, rest = _split(path)
    if loc.local and protocol == "file":
        top = os.path.realpath(loc.container)
        real = os.path.realpath(os.path.abspath(rest))
        if real != top and not real.startswith(top.rstrip("/") + "/"):
            return None
        parts = [] if real == top else os.path.relpath(real, top).split(os.sep)
    elif not loc.local and protocol in ("s3", "s3a"):
        top = loc.container.strip("/")
        key = rest.strip("/")
        if key != top and not key.startswith(top + "/"):
            return None
        parts = [] if key == top else key[len(top) + 1 :].split("/")
    else:
        return None  # another store than the audited one: no tree of it there
    return _tree_of(loc, option, parts, real if loc.local else None)


def _tree_of(loc: Location, option: str, parts: list[str], real: str | None) -> str | None:
    if not parts:
        return "the directory that holds the job bases"
    first = parts[0]
    if first == loc.job_dir:
        return f"the audited base {shown(first)}"
    if first == SAVEPOINTS:
        return "the savepoints"
    if len(parts) > 1:
        return f"{shown(first)}, a sibling of the audited base"
    if option == "--out" or (real is not None and os.path.isdir(real)):
        return f"the directory holding the bases (a new folder {shown(first)} among them)"
    return None


def _unwritable(option: str, path: str) -> str | None:
    """Why a local output cannot be written, or ``None``. Object-store outputs (``--out``
    on Spark) are written by Spark, which reports its own errors."""
    protocol, rest = _split(path)
    if protocol != "file":
        return None
    full = os.path.abspath(rest)
    if option == "--out":
        return _dir_unwritable(full)
    try:
        mode = os.stat(full).st_mode
    except FileNotFoundError:
        parent = os.path.dirname(full)
        # --json makes its folder; the deletion log is appended where it is named.
        return _dir_unwritable(parent) if option == "--json" else _existing_dir(parent)
    except OSError as err:
        return _why(err)
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return _open_fails(full)


def _dir_unwritable(full: str) -> str | None:
    """A directory that is, or can be made at, ``full``."""
    probe = full
    while not os.path.lexists(probe):
        up = os.path.dirname(probe)
        if up == probe:
            break
        probe = up
    return _existing_dir(probe)


def _existing_dir(full: str) -> str | None:
    try:
        mode = os.stat(full).st_mode
    except OSError as err:
        return f"{shown(full)}: {_why(err)}"
    if not stat.S_ISDIR(mode):
        return f"{shown(full)} is not a directory"
    if not os.access(full, os.W_OK | os.X_OK):
        return f"the directory {shown(full)} is not writable"
    return None


def _open_fails(full: str) -> str | None:
    """Opening an existing file for appending writes nothing and changes nothing; a FIFO
    without a reader fails at once (``O_NONBLOCK``) instead of blocking."""
    try:
        fd = os.open(full, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        return _why(err)
    os.close(fd)
    return None


def _why(err: OSError) -> str:
    return f"{type(err).__name__}: {err.strerror or err}"
