"""The live writer's fence, read from the state it publishes (``fastimpl.writer_state``).

The file is checked, not trusted: a field of the wrong type or a path outside the job
base makes it unreadable, and an unreadable state stops a deletion (it never means "no
writer"). What it gives the deletion guards:

* ``fence``: the writer's time of its oldest pending trigger, or of the publication when
  nothing is pending. Every file written for a pending or later checkpoint, and every pool
  file opened since, was modified at or after it; such a file is never collected.
* ``open_files``: the pool files open at publication (ACROSS: one created for an old
  checkpoint takes segments of the next); never collected.
* ``pins``: the checkpoints a pending checkpoint may reuse segments from (retained when it
  was triggered). If one of them is gone while it is pending, the references it shared
  are no longer in any ``_metadata``: the collection stops.
* ``working_files``: the working files the live databases use or a snapshot pins (§11,
  R100); ``None`` when the writer publishes none, and then no working file is ever an
  orphan (a file written after the publication is newer than the fence).
"""

from __future__ import annotations

import json
from typing import Any

from attrs import frozen

from fastimpl.writer_state import FORMAT, WRITER_STATE
from pipeline.location import Location
from pipeline.safe_read import Refused, read_regular
from spec.layout import is_under

LIMIT = 16 * 1024 * 1024
MARGIN_LOCAL = 2.0
"""Seconds: a local file's time comes from the kernel's coarse clock, a tick behind."""
MARGIN_OBJECT_STORE = 300.0
"""Seconds: an object's time is the store's clock, the fence the writer's."""


class StateError(Exception):
    """The writer state exists but cannot be read or is not what the writer publishes."""


@frozen
class WriterState:
    published_at: float
    seq: int
    running: bool
    pending: tuple[tuple[int, float, tuple[int, ...]], ...]
    open_files: frozenset[str]
    working_files: frozenset[str] | None = None

    @property
    def fence(self) -> float:
        return min([self.published_at, *(t for _c, t, _p in self.pending)])

    @property
    def pins(self) -> frozenset[int]:
        return frozenset(p for _c, _t, pins in self.pending for p in pins)


def margin(loc: Location) -> float:
    return MARGIN_LOCAL if loc.local else MARGIN_OBJECT_STORE


def state_path(loc: Location) -> str:
    return f"{loc.job_dir}/{WRITER_STATE}"


def read_state(loc: Location) -> WriterState | None:
    """The published state, or None when the base has none."""
    path = state_path(loc)
    try:
        data = read_regular(loc, path, LIMIT)
    except FileNotFoundError:
        return None
    except Refused as err:
        raise StateError(f"{path}: {err}") from None
    except Exception as err:
        raise StateError(f"{path}: cannot be read: {type(err).__name__}: {err}") from None
    try:
        return _parse(json.loads(data), loc.job_dir)
    except (ValueError, TypeError, KeyError, RecursionError) as err:
        raise StateError(f"{path}: not a writer state: {type(err).__name__}: {err}") from None


def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"{v!r} is not a number")
    return float(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _parse(doc: Any, job_dir: str) -> WriterState:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("no ckpt-writer-state format tag")
    pending = []
    for p in doc["pending"]:
        pins = tuple(_int(x) for x in p["retained_at_trigger"])
        pending.append((_int(p["checkpoint"]), _num(p["triggered_at"]), pins))
    files = doc["open_files"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise TypeError("open_files is not a list of paths")
    for f in files:
        if not is_under(f, job_dir):
            raise ValueError(f"open file {f!r} is outside the job base")
    running = doc["running"]
    if not isinstance(running, bool):
        raise TypeError("running is not a boolean")
    working = doc.get("working_files")
    if working is not None:
        if not isinstance(working, list) or not all(isinstance(f, str) for f in working):
            raise TypeError("working_files is not a list of paths")
        for f in working:
            if not is_under(f, job_dir):
                raise ValueError(f"working file {f!r} is outside the job base")
    return WriterState(
        _num(doc["published_at"]),
        _int(doc["seq"]),
        running,
        tuple(pending),
        frozenset(files),
        None if working is None else frozenset(working),
    )


def live_working(states: list[WriterState | None]) -> frozenset[str] | None:
    """The working files the live databases use by every state read (``None``: some
    read found no state, or a state without them: then any working file may be in use)."""
    if not states or any(s is None or s.working_files is None for s in states):
        return None
    return frozenset().union(*(s.working_files for s in states if s and s.working_files))


def working_of(loc: Location) -> frozenset[str] | None:
    """What the audit's classification needs: the live databases' files, or ``None``
    when the writer state is missing or unreadable (then none is an orphan)."""
    try:
        return live_working([read_state(loc)])
    except StateError:
        return None
