"""How an implementation's observation is compared with the model's: the lockstep
machine (``test_lockstep.py``) and trace replay (``replay.py``) use the same rules."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar, cast

import attrs

from spec.ids import escape_name, unescape_name
from spec.observation import DeletionRecord, Observation

_V = TypeVar("_V")

METADATA_SUFFIX = "/_metadata"


def normalized(obs: Observation, *, open_files_listed: bool = True) -> Observation:
    """Metadata files are compared by existence, not by byte size. Without
    ``open_files_listed`` (an object store) a file still open is not on storage yet. A
    file name may carry its creator's mark (``unmarked``). Deletions and pending deletes
    are compared without their order."""
    obs = unmarked(obs)
    files = {
        p: (-1 if p.endswith(METADATA_SUFFIX) else n)
        for p, n in obs.files.items()
        if open_files_listed or p not in obs.open_files
    }
    # what was deleted and what waits to be are compared as multisets: each party keeps
    # its own waiting deletes and runs them when it learns an attempt stopped (R45, R64),
    # so the order between parties says nothing; each record still says who deleted
    # what, whose it was and whether it existed (I2, I5)
    return attrs.evolve(
        obs,
        files=files,
        pending_deletes=tuple(sorted(obs.pending_deletes)),
        deletions=tuple(sorted(obs.deletions, key=deletion_key)),
    )


def deletion_key(d: DeletionRecord) -> tuple[str, str, str, bool, bool]:
    """The order a deletion history is compared and stored in: each party runs its own
    deletes, so only the multiset of them is the rule's (R45: once per path)."""
    return (d.path, d.actor, d.owner or "", d.existed, d.protected)


MARK = "."
_DRAWN = re.compile(r"f[0-9]{6}|f[a-z2-7]{16}[0-9a-z]+")
"""A drawn file name: the model's counter (``f000001``) or a random prefix and a counter
(R2); a directory (an operator's name) is never one."""


@functools.lru_cache(maxsize=1 << 16)
def _unmarked_path(path: str) -> str:
    """``path`` (or a name that ends in one, after a ``:``) without a creator mark on its
    file name: ``<drawn>.<escaped attempt id>`` (``spec.ids.escape_name``). Parties that
    keep records of their own name each file after the attempt that created it, since
    that name is the one record of its creator every party can read from a listing once
    the attempt's process is gone (R64); the model draws the same names without it."""
    cut = max(path.rfind("/"), path.rfind(":"))
    head, name = path[: cut + 1], path[cut + 1 :]
    drawn, dot, mark = name.partition(MARK)
    if not dot or not mark or not _DRAWN.fullmatch(drawn):
        return path
    try:
        attempt = unescape_name(mark)
    except (ValueError, UnicodeDecodeError):
        return path
    if not attempt or escape_name(attempt) != mark:
        return path
    return head + drawn


def unmarked(value: _V) -> _V:
    """``value`` (an observation, a command, or any part of one) with every file path
    unmarked: the same object where nothing changes."""
    if isinstance(value, Observation) and not any(
        MARK in p.rsplit("/", 1)[-1]
        for p in (*value.files, *value.owners, *(d.path for d in value.deletions))
    ):
        return value  # no file of it is marked (the model's own)
    return cast(_V, _unmark(value))


def _unmark(value: object) -> object:
    # the lockstep unmarks an observation after every command: the cheap tests come
    # first, and the abstract Mapping's (slow) only for what no other test took
    if isinstance(value, str):
        return _unmarked_path(value) if MARK in value else value
    if isinstance(value, int | float | Enum) or value is None:
        return value
    if isinstance(value, tuple | frozenset):
        items = [(v, _unmark(v)) for v in value]
        if all(v is v2 for v, v2 in items):
            return value
        return type(value)(v2 for _, v2 in items)
    if attrs.has(type(value)):
        try:
            return _unmark_frozen(value)
        except TypeError:  # not hashable: walked each time
            return _unmark_fields(value)
    if isinstance(value, Mapping):
        pairs = [(k, v, _unmark(k), _unmark(v)) for k, v in value.items()]
        if all(k is k2 and v is v2 for k, v, k2, v2 in pairs):
            return value
        return {k2: v2 for _, _, k2, v2 in pairs}
    return value


@functools.lru_cache(maxsize=1 << 16)
def _unmark_frozen(value: object) -> object:
    """Records (handles, entries) recur from one observation to the next: each is
    unmarked once."""
    return _unmark_fields(value)


def _unmark_fields(value: object) -> object:
    changes = {}
    for f in attrs.fields(cast(Any, type(value))):
        if f.init:
            old = getattr(value, f.name)
            new = _unmark(old)
            if new is not old:
                changes[f.name] = new
    return attrs.evolve(value, **changes) if changes else value  # type: ignore[misc]


def differences(model: Observation, impl: Observation) -> list[str]:
    """One readable paragraph per field of ``Observation`` that differs."""
    out = []
    for f in attrs.fields(Observation):
        a, b = getattr(model, f.name), getattr(impl, f.name)
        if a != b:
            out.append(f"{f.name}:\n    model: {a!r}\n    fast:  {b!r}{_apart(a, b)}")
    return out


def _apart(model: object, impl: object) -> str:
    """What only one side holds, for collections too long to compare by eye."""
    if isinstance(model, Mapping) and isinstance(impl, Mapping):
        a: list[str] = sorted(map(repr, model.items()))
        b: list[str] = sorted(map(repr, impl.items()))
    elif isinstance(model, tuple | frozenset) and isinstance(impl, tuple | frozenset):
        a, b = list(map(repr, model)), list(map(repr, impl))
    else:
        return ""
    only_a = [x for x in a if x not in b]
    only_b = [x for x in b if x not in a]
    if not only_a and not only_b:
        return "\n    (the same items, in another order)"
    return f"\n    only the model's: {only_a}\n    only fast's:  {only_b}"
