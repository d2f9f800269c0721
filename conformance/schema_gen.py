"""``schema.json``, the JSON Schema of a conformance case, derived from the vocabulary's
type hints the way ``spec.codec`` encodes values (so the two cannot drift apart):

    python -m conformance.schema_gen          # print it
    python -m conformance.schema_gen --write  # rewrite schema.json
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from conformance.case import FORMAT, GROWING, MAPPINGS, NAME, RETAINED, SCHEMA, VERSION
from spec import commands
from spec.config import Config, JobSpec
from spec.errors import Reason, WrongTypeError
from spec.observation import Observation


def _hints(cls: type) -> dict[str, Any]:
    mod = sys.modules[cls.__module__]
    return typing.get_type_hints(cls, globalns=vars(mod))


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def ref(self, cls: type, tagged: bool) -> dict[str, Any]:
        name = cls.__name__
        if name not in self.defs:
            self.defs[name] = {}  # placeholder against recursion
            hints = _hints(cls)
            fields = attrs.fields(typing.cast(Any, cls))
            props: dict[str, Any] = {"type": {"const": name}}
            for f in fields:
                props[f.name] = self.of(hints[f.name])
            self.defs[name] = {
                "type": "object",
                "properties": props,
                "required": [f.name for f in fields if f.default is attrs.NOTHING],
                "additionalProperties": False,
            }
        ref: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
        if tagged:
            return {"allOf": [ref, {"required": ["type"]}]}
        return ref

    def of(self, hint: Any) -> dict[str, Any]:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            options = [a for a in args if a is not type(None)]
            tagged = len(options) > 1 and all(attrs.has(a) for a in options)
            alts = [self.ref(a, True) if tagged else self.of(a) for a in options]
            if type(None) in args:
                alts.append({"type": "null"})
            return alts[0] if len(alts) == 1 else {"anyOf": alts}
        if isinstance(hint, type) and attrs.has(hint):
            return self.ref(hint, False)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return {"enum": [m.value for m in hint]}
        if hint is bool:
            return {"type": "boolean"}
        if hint is int:
            return {"type": "integer"}
        if hint is float:
            return {"type": "number"}
        if hint is str:
            return {"type": "string"}
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.of(args[0])}
            return {
                "type": "array",
                "prefixItems": [self.of(a) for a in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        if origin in (frozenset, set, list):
            return {"type": "array", "items": self.of(args[0])}
        if origin in (dict, Mapping):
            return {"type": "object", "additionalProperties": self.of(args[1])}
        raise WrongTypeError(f"no schema for {hint!r}")


def build() -> dict[str, Any]:
    b = _Builder()
    command = b.of(commands.Command)
    config, job = b.of(Config), b.of(JobSpec)
    hints = _hints(Observation)
    props: dict[str, Any] = {}
    for f in attrs.fields(Observation):
        value = b.of(hints[f.name])
        if f.name in MAPPINGS:
            value = {
                "type": "object",
                "additionalProperties": {
                    "anyOf": [value["additionalProperties"], {"type": "null"}]
                },
            }
        props[f"{GROWING}_added" if f.name == GROWING else f.name] = value
        if f.name == RETAINED:
            props[f"{RETAINED}_removed"] = {"type": "array", "items": {"type": "string"}}
            props[f"{RETAINED}_added"] = value
    observation = {
        "type": "object",
        "description": "What changed since the step before: for a mapping, the keys that "
        "changed (null: removed); deletions_added, the deletion records added; any other "
        "field whole. Apply the changes in order for the full expected observation.",
        "properties": props,
        "additionalProperties": False,
    }
    step = {
        "type": "object",
        "properties": {
            "command": command,
            "outcome": {"enum": ["ok", "refused"]},
            "reason": {"enum": [r.value for r in Reason]},
            "observation": observation,
        },
        "required": ["command", "outcome"],
        "additionalProperties": False,
        "if": {"properties": {"outcome": {"const": "refused"}}},
        "then": {"required": ["reason"]},
        "else": {"not": {"required": ["reason"]}},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://ckpt-ownership.invalid/conformance/case.schema.json",
        "title": "ckpt-ownership conformance case",
        "type": "object",
        "properties": {
            "format": {"const": FORMAT},
            "version": {"const": VERSION},
            "name": {"type": "string", "pattern": NAME.pattern},
            "rules": {
                "type": "array",
                "items": {"type": "string", "pattern": r"^(R\d+|I\d+|FLINK-\d+)$"},
            },
            "description": {"type": "string"},
            "source": {"type": "string"},
            "config": config,
            "job": job,
            "steps": {
                "type": "array",
                "minItems": 1,
                "items": step,
            },
        },
        "required": ["format", "version", "name", "rules", "config", "job", "steps"],
        "additionalProperties": False,
        "$defs": dict(sorted(b.defs.items())),
    }


def text() -> str:
    return json.dumps(build(), indent=1, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        SCHEMA.write_text(text(), encoding="utf-8")
        print(f"wrote {SCHEMA}")
        return 0
    if argv:
        print(__doc__)
        return 2
    print(text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
