"""How an implementation's observation is compared with the model's: the lockstep
machine (``test_lockstep.py``) and trace replay (``replay.py``) use the same rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

import attrs

from spec.ids import escape_name, unescape_name
from spec.observation import Observation

_V = TypeVar("_V")

METADATA_SUFFIX = "/_metadata"


def normalized(obs: Observation, *, open_files_listed: bool = True) -> Observation:
    """Metadata files are compared by existence, not by byte size. Without
    ``open_files_listed`` (an object store) a file still open is not on storage yet. A
    file name may carry its creator's mark (``unmarked``)."""
    obs = unmarked(obs)
    files = {
        p: (-1 if p.endswith(METADATA_SUFFIX) else n)
        for p, n in obs.files.items()
        if open_files_listed or p not in obs.open_files
    }
    return attrs.evolve(obs, files=files)


MARK = "."


def _unmarked_path(path: str) -> str:
    """``path`` (or a name that ends in one, after a ``:``) without a creator mark on its
    file name: ``<drawn>.<escaped attempt id>``
    (``spec.ids.escape_name``). Parties that keep records of their own name each file
    after the attempt that created it, since that name is the one record of its creator
    every party can read from a listing once the attempt's process is gone (R64); the
    model draws the same names without it."""
    cut = max(path.rfind("/"), path.rfind(":"))
    if cut < 0:
        return path
    head, name = path[: cut + 1], path[cut + 1 :]
    drawn, dot, mark = name.partition(MARK)
    if not dot or not drawn or not mark:
        return path
    try:
        attempt = unescape_name(mark)
    except (ValueError, UnicodeDecodeError):
        return path
    if not attempt or escape_name(attempt) != mark:
        return path
    return head + drawn


def unmarked(value: _V) -> _V:
    """``value`` (an observation, or any part of one) with every path unmarked."""
    return cast(_V, _unmark(value))


def _unmark(value: object) -> object:
    if isinstance(value, str):
        return _unmarked_path(value)
    if isinstance(value, Mapping):
        return {_unmark(k): _unmark(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_unmark(v) for v in value)
    if isinstance(value, frozenset):
        return frozenset(_unmark(v) for v in value)
    if attrs.has(type(value)):
        fields = attrs.fields(cast(Any, type(value)))
        changes = {f.name: _unmark(getattr(value, f.name)) for f in fields if f.init}
        return attrs.evolve(value, **changes)  # type: ignore[misc]
    return value


def differences(model: Observation, impl: Observation) -> list[str]:
    """One readable paragraph per field of ``Observation`` that differs."""
    out = []
    for f in attrs.fields(Observation):
        a, b = getattr(model, f.name), getattr(impl, f.name)
        if a != b:
            out.append(f"{f.name}:\n    model: {a!r}\n    fast:  {b!r}")
    return out
