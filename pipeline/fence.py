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

The state is checked against the base, too (issue 32, finding 5: :func:`check_against`):
its ``job`` must be the base's, and its ``retained`` and ``latest_completed`` checkpoints
must agree with the ``_metadata`` on storage. A state copied from another job, or a stale
one (an old copy put back, a writer that stopped publishing), then refuses the deletion
instead of fencing nothing. A forgery that gets these fields right is not detected: the
file is the writer's word, and nothing on storage tells its pending checkpoints.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import frozen

from fastimpl.parties import WRITER_STATE, WRITER_STATE_FORMAT
from pipeline.location import Location
from pipeline.safe_read import Refused, read_regular
from spec.errors import CkptError, UsageError, WrongTypeError
from spec.layout import is_under, job_base

LIMIT = 16 * 1024 * 1024
MARGIN_LOCAL = 2.0
"""Seconds: a local file's time comes from the kernel's coarse clock, a tick behind."""
MARGIN_OBJECT_STORE = 300.0
"""Seconds: an object's time is the store's clock, the fence the writer's."""


class StateError(CkptError):
    """The writer state exists but cannot be read or is not what the writer publishes."""


class StateMismatch(CkptError):
    """The writer state reads but disagrees with the base (``field`` names the field)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{WRITER_STATE} field {field!r}: {why}")
        self.field = field


@frozen
class WriterState:
    published_at: float
    seq: int
    running: bool
    pending: tuple[tuple[int, float, tuple[int, ...]], ...]
    open_files: frozenset[str]
    working_files: frozenset[str] | None = None
    job: str = ""
    latest_completed: int = 0
    retained: tuple[int, ...] = ()

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
        raise WrongTypeError(f"{v!r} is not a number")
    return float(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise WrongTypeError(f"{v!r} is not an integer")
    return v


def _parse(doc: Any, job_dir: str) -> WriterState:
    if not isinstance(doc, dict) or doc.get("format") != WRITER_STATE_FORMAT:
        raise UsageError("no ckpt-writer-state format tag")
    pending = []
    for p in doc["pending"]:
        pins = tuple(_int(x) for x in p["retained_at_trigger"])
        pending.append((_int(p["checkpoint"]), _num(p["triggered_at"]), pins))
    files = doc["open_files"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise WrongTypeError("open_files is not a list of paths")
    for f in files:
        if not is_under(f, job_dir):
            raise UsageError(f"open file {f!r} is outside the job base")
    running = doc["running"]
    if not isinstance(running, bool):
        raise WrongTypeError("running is not a boolean")
    working = doc.get("working_files")
    if working is not None:
        if not isinstance(working, list) or not all(isinstance(f, str) for f in working):
            raise WrongTypeError("working_files is not a list of paths")
        for f in working:
            if not is_under(f, job_dir):
                raise UsageError(f"working file {f!r} is outside the job base")
    job = doc["job"]
    if not isinstance(job, str):
        raise WrongTypeError("job is not a string")
    retained = doc["retained"]
    if not isinstance(retained, list):
        raise WrongTypeError("retained is not a list of checkpoint ids")
    return WriterState(
        _num(doc["published_at"]),
        _int(doc["seq"]),
        running,
        tuple(pending),
        frozenset(files),
        None if working is None else frozenset(working),
        job,
        _int(doc["latest_completed"]),
        tuple(_int(x) for x in retained),
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


def check_against(
    states: list[WriterState], job_dir: str, own: set[int], lineage: set[int]
) -> None:
    """Raise :class:`StateMismatch` unless the states read agree with the base: each
    names its job (the store writes the job id, the streaming job the base's name), and
    the last one read, after the ``_metadata`` were listed, agrees with them. ``own``: the
    ids of this base's checkpoints read just now; ``lineage``: those and the checkpoints
    of the jobs beside it (a restored job's coordinator retains a checkpoint of the base it
    claimed, and publishes one list into each base of its lineage).

    * ``latest_completed`` is never older than the newest checkpoint of the base: an older
      one is a stale state (or another job's);
    * each ``retained`` checkpoint, and ``latest_completed``, has a ``_metadata`` on
      storage, unless the writer published again while the audit listed (the first and
      last states differ) and it is newer than any listed: it completed since.
    """
    for s in states:
        if s.job != job_dir and job_base(s.job) != job_dir:
            raise StateMismatch("job", f"names job {s.job!r}, not this base's {job_dir!r}")
    last = states[-1]
    newest = max(own, default=0)
    if last.latest_completed < newest:
        raise StateMismatch(
            "latest_completed",
            f"says {last.latest_completed}, but this base holds checkpoint {newest}: a "
            "stale or foreign state",
        )
    moved = states[0].seq != last.seq or states[0].published_at != last.published_at
    named = [("retained", c) for c in last.retained]
    if last.latest_completed:
        named.append(("latest_completed", last.latest_completed))
    for field, cid in named:
        if cid in lineage or (moved and cid > newest):
            continue
        raise StateMismatch(
            field, f"names checkpoint {cid}, which has no _metadata on storage in this "
            "base or a job beside it"
        )
