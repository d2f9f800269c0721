"""A conformance case: a named command sequence with the outcome and the observation the
reference model expects after every step, stored as JSON (``schema.json``).

A step's ``observation`` holds only what changed since the step before (before the first
step every mapping is empty and nothing else has a value), so that a case stays small:

* a mapping field (``files``, ``owners``, ``claims``, ...) lists the keys whose value
  changed, with the new value, and ``null`` for a key that is gone;
* ``deletions`` only grows: ``deletions_added`` lists the records added at the end;
* ``retained`` changes at its ends: ``retained_removed`` names (by metadata path) the
  checkpoints no longer retained, ``retained_added`` lists those appended at the end
  (given whole, as ``retained``, when a change is not of that form);
* every other field is given whole when it changed.

A reader applies the steps' changes in order to get the full expected observation
(``from_json`` does). Observations are stored normalized as
``conformance.compare.normalized`` makes them (metadata files by existence, size -1;
files still open left out where the storage does not list them, ``open_files_readable``
false).
"""

from __future__ import annotations

import gzip
import json
import re
import typing
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from conformance.compare import deletion_key
from spec import codec
from spec import observation as observation_module
from spec.commands import Command
from spec.config import Config, JobSpec
from spec.errors import CkptError, OperationFailed, Reason, UsageError
from spec.observation import Observation

FORMAT = "ckpt-conformance-case"
VERSION = 1


def _package_data(name: str) -> Path:
    """A data file shipped inside this package (the wheel's package data), found through
    importlib.resources so that an installed ``ckpt`` needs no source tree."""
    found = resources.files("conformance") / name
    if not isinstance(found, Path):
        raise OperationFailed(
            f"conformance/{name} is inside an archive ({found!r}); install the wheel unzipped"
        )
    return found


CORPUS = _package_data("corpus")
SCHEMA = _package_data("schema.json")
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
"""Short names: lower case, digits and dashes, at most 64 characters (also file names)."""
OBSERVATION_FIELDS = tuple(f.name for f in attrs.fields(Observation))
MAPPINGS = ("files", "directories", "owners", "claims", "ref_counts", "live_segments", "registry")
"""The mapping fields of an observation, stored key by key."""
GROWING = "deletions"
"""Stored as ``deletions_added``: the records added since the step before."""
RETAINED = "retained"
"""Stored as ``retained_removed`` / ``retained_added`` where the change is of that form."""


class CaseError(CkptError, ValueError):
    """A case file that is not a valid case; the message names the file and the place."""


@frozen
class Step:
    command: Command
    refused: Reason | None
    """None: the command is accepted; otherwise the reason it must be refused for."""
    observation: Observation
    """The full expected observation after the step (normalized)."""


@frozen
class Case:
    name: str
    rules: tuple[str, ...]
    """What the case pins: rule ids of SPEC.md (``R12``), invariants (``I3``), Flink bugs
    (``FLINK-38347``)."""
    description: str
    source: str
    """Where the sequence comes from: a rule test, or ``random:<seed>``."""
    config: Config
    job: JobSpec
    steps: tuple[Step, ...]


def _observation_json(obs: Observation) -> dict[str, Any]:
    data: dict[str, Any] = codec.encode(obs)
    del data["type"]  # always an Observation: the tag would only repeat
    return data


def _empty() -> dict[str, Any]:
    return {**{m: {} for m in MAPPINGS}, GROWING: [], RETAINED: []}


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def delta(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """What changed from ``before`` to ``now`` (encoded observations), as stored."""
    out: dict[str, Any] = {}
    for key, value in now.items():
        old = before.get(key, _MISSING)
        if key in MAPPINGS:
            assert isinstance(old, dict)
            changes = {k: v for k, v in value.items() if old.get(k, _MISSING) != v}
            changes.update({k: None for k in old if k not in value})
            if changes:
                out[key] = dict(sorted(changes.items()))
        elif key == GROWING:
            # the history is stored sorted (``conformance.compare.normalized``: each party
            # runs its own deletes), so a step's new deletes may sort before older ones:
            # what it adds is the multiset difference
            left = Counter(_key(d) for d in old)
            added = []
            for d in value:
                k = _key(d)
                if left[k]:
                    left[k] -= 1
                else:
                    added.append(d)
            if +left:
                raise UsageError("the deletion history of an observation shrank")
            if added:
                out[f"{GROWING}_added"] = added
        elif key == RETAINED and old != value:
            gone = [r["metadata"] for r in old if r not in value]
            kept = [r for r in old if r in value]
            if value[: len(kept)] == kept:
                if gone:
                    out[f"{RETAINED}_removed"] = gone
                if len(value) > len(kept):
                    out[f"{RETAINED}_added"] = value[len(kept) :]
            else:
                out[key] = value
        elif old != value:
            out[key] = value
    return out


OBSERVATION_HINTS = typing.get_type_hints(Observation, globalns=vars(observation_module))
"""Each observation field's declared type, for decoding one field at a time."""
_HINTS = OBSERVATION_HINTS


class _Reader:
    """Applies the stored changes step by step, decoding only what changed (a value
    decoded once is reused by every later step)."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {m: {} for m in MAPPINGS}
        self.fields[GROWING] = ()
        self.fields[RETAINED] = ()

    def _decode(self, name: str, data: Any, where: str) -> Any:
        return codec.decode(_HINTS[name], data, where)

    def apply(self, change: dict[str, Any], where: str) -> Observation:
        for key, value in change.items():
            at = f"{where}.{key}"
            if key in MAPPINGS:
                if not isinstance(value, dict):
                    raise CaseError(f"{at}: not a JSON object")
                hint = typing.get_args(_HINTS[key])[1]
                merged = dict(self.fields[key])
                for k, v in value.items():
                    if v is None:
                        if k not in merged:
                            raise CaseError(f"{at}: {k!r} removed but not there")
                        del merged[k]
                    else:
                        merged[k] = codec.decode(hint, v, f"{at}.{k}")
                self.fields[key] = merged
            elif key == f"{GROWING}_added":
                added = self._decode(GROWING, value, at)
                self.fields[GROWING] = tuple(
                    sorted((*self.fields[GROWING], *added), key=deletion_key)
                )
            elif key == f"{RETAINED}_removed":
                if not isinstance(value, list):
                    raise CaseError(f"{at}: not an array")
                old = self.fields[RETAINED]
                left = tuple(r for r in old if r.metadata not in value)
                if len(left) != len(old) - len(value):
                    raise CaseError(f"{at}: {value} are not all retained")
                self.fields[RETAINED] = left
            elif key == f"{RETAINED}_added":
                self.fields[RETAINED] = (*self.fields[RETAINED], *self._decode(RETAINED, value, at))
            elif key in OBSERVATION_FIELDS:
                self.fields[key] = self._decode(key, value, at)
            else:
                raise CaseError(f"{where}: unknown field {key!r}")
        missing = [f for f in OBSERVATION_FIELDS if f not in self.fields]
        if missing:
            raise CaseError(f"{where}: no value yet for {', '.join(missing)}")
        return Observation(**self.fields)


_MISSING: Any = object()


def to_json(case: Case) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    before: dict[str, Any] = _empty()
    for s in case.steps:
        now = _observation_json(s.observation)
        changed = delta(before, now)
        step: dict[str, Any] = {"command": codec.encode_command(s.command)}
        if s.refused is None:
            step["outcome"] = "ok"
        else:
            step["outcome"] = "refused"
            step["reason"] = s.refused.value
        if changed:
            step["observation"] = changed
        steps.append(step)
        before = now
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": case.name,
        "rules": list(case.rules),
        "description": case.description,
        "source": case.source,
        "config": codec.encode(case.config),
        "job": codec.encode(case.job),
        "steps": steps,
    }


def dumps(case: Case) -> str:
    """One line per step, so that a diff of a regenerated case reads step by step."""
    data = to_json(case)
    steps = data.pop("steps")
    head = json.dumps(data, sort_keys=True, separators=(",", ":"))
    body = ",\n".join(json.dumps(s, sort_keys=True, separators=(",", ":")) for s in steps)
    return head[:-1] + ',"steps":[\n' + body + "\n]}\n"


def from_json(data: Any, where: str = "case") -> Case:
    """Decode a case (already checked against the schema or not): every problem is a
    ``CaseError`` naming the place (``steps[3].observation.files``)."""
    if not isinstance(data, dict):
        raise CaseError(f"{where}: not a JSON object")
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise CaseError(
            f"{where}: format {data.get('format')!r} version {data.get('version')!r}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    try:
        config = codec.decode(Config, data.get("config"), f"{where}.config")
        job = codec.decode(JobSpec, data.get("job"), f"{where}.job")
        raw_steps = data.get("steps")
        if not isinstance(raw_steps, list) or not raw_steps:
            raise CaseError(f"{where}.steps: a non-empty array is needed")
        reader = _Reader()
        steps = []
        for i, raw in enumerate(raw_steps):
            at = f"{where}.steps[{i}]"
            if not isinstance(raw, dict):
                raise CaseError(f"{at}: not a JSON object")
            cmd = codec.decode_command(raw.get("command"), f"{at}.command")
            outcome = raw.get("outcome")
            if outcome == "ok":
                refused = None
            elif outcome == "refused":
                try:
                    refused = Reason(raw.get("reason"))
                except ValueError:
                    raise CaseError(f"{at}.reason: {raw.get('reason')!r} is no Reason") from None
            else:
                raise CaseError(f"{at}.outcome: {outcome!r}, expected 'ok' or 'refused'")
            change = raw.get("observation", {})
            if not isinstance(change, dict):
                raise CaseError(f"{at}.observation: not a JSON object")
            obs = reader.apply(change, f"{at}.observation")
            steps.append(Step(cmd, refused, obs))
    except codec.CodecError as err:
        raise CaseError(str(err)) from err
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise CaseError(f"{where}.name: {name!r} is not a short name ({NAME.pattern})")
    rules = data.get("rules")
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise CaseError(f"{where}.rules: an array of strings is needed")
    return Case(
        name,
        tuple(rules),
        str(data.get("description", "")),
        str(data.get("source", "")),
        config,
        job,
        tuple(steps),
    )


GZIP_PREFIX = "random-"
"""Generated cases are many and long, and nobody reads them by hand: they are stored
gzip-compressed (``random-....json.gz``); the named cases are plain ``.json``."""


def case_name(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".json")


def read_text(path: Path) -> str:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def write_case(case: Case, folder: Path) -> Path:
    text = dumps(case).encode("utf-8")
    if case.name.startswith(GZIP_PREFIX):
        path = folder / f"{case.name}.json.gz"
        path.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
    else:
        path = folder / f"{case.name}.json"
        path.write_bytes(text)
    return path


def read_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, ValueError) as err:
        raise CaseError(f"{path.name}: unreadable: {err}") from err


def load(path: Path) -> Case:
    return from_json(read_json(path), path.name)


def corpus_files(folder: Path = CORPUS) -> list[Path]:
    return sorted([*folder.glob("*.json"), *folder.glob("*.json.gz")], key=case_name)


def load_corpus(folder: Path = CORPUS) -> Iterator[Case]:
    for path in corpus_files(folder):
        yield load(path)


def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return data
