"""How an implementation's observation is compared with the model's: the lockstep
machine (``test_lockstep.py``) and trace replay (``replay.py``) use the same rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar, cast

import attrs

from spec.ids import escape_name, unescape_name
from spec.observation import DeletionRecord, Observation, WorkingObservation

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
        deletions=tuple(sorted(obs.deletions, key=_deletion_key)),
    )


def _deletion_key(d: DeletionRecord) -> tuple[str, str, str, bool, bool]:
    return (d.path, d.actor, d.owner or "", d.existed, d.protected)


MARK = "."
_DRAWN = re.compile("f[a-z0-9]+")
"""A drawn file name (``f`` and lower-case letters and digits, R2)."""


def _unmarked_path(path: str, names: AbstractSet[str] | None) -> str:
    """``path`` (or a name that ends in one, after a ``:``) without a creator mark on its
    file name: ``<drawn>.<escaped attempt id>`` (``spec.ids.escape_name``). Parties that
    keep records of their own name each file after the attempt that created it, since
    that name is the one record of its creator every party can read from a listing once
    the attempt's process is gone (R64); the model draws the same names without it.
    ``names``: the marked file names known to be files; None: any name of that form."""
    cut = max(path.rfind("/"), path.rfind(":"))
    if cut < 0:
        return path
    head, name = path[: cut + 1], path[cut + 1 :]
    if names is not None and name not in names:
        return path  # not a file's name: a directory's, an operator's
    drawn, dot, mark = name.partition(MARK)
    if not dot or not _DRAWN.fullmatch(drawn) or not mark:
        return path
    try:
        attempt = unescape_name(mark)
    except (ValueError, UnicodeDecodeError):
        return path
    if not attempt or escape_name(attempt) != mark:
        return path
    return head + drawn


def _file_names(value: object) -> AbstractSet[str] | None:
    """The names of the files an observation shows (on storage, recorded or deleted):
    only these are unmarked, never a directory that happens to look like one."""
    if isinstance(value, Observation):
        paths = [*value.files, *value.owners, *(d.path for d in value.deletions)]
    elif isinstance(value, WorkingObservation):
        paths = list(value.files)
    else:
        return None
    return frozenset(p.rsplit("/", 1)[-1] for p in paths)


def unmarked(value: _V) -> _V:
    """``value`` (an observation, a command, or any part of one) with every file path
    unmarked."""
    return cast(_V, _unmark(value, _file_names(value)))


def _unmark(value: object, names: AbstractSet[str] | None) -> object:
    if isinstance(value, str):
        return _unmarked_path(value, names)
    if isinstance(value, Mapping):
        return {_unmark(k, names): _unmark(v, names) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_unmark(v, names) for v in value)
    if isinstance(value, frozenset):
        return frozenset(_unmark(v, names) for v in value)
    if attrs.has(type(value)):
        fields = attrs.fields(cast(Any, type(value)))
        changes = {f.name: _unmark(getattr(value, f.name), names) for f in fields if f.init}
        return attrs.evolve(value, **changes)  # type: ignore[misc]
    return value


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
