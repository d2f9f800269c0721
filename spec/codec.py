"""JSON for the shared vocabulary: commands, observations, configurations.

One encoding, used wherever a value leaves the process: fastimpl's NDJSON command traces
(replayed through the model, issue 4) and the conformance cases (issue 5). The encoding is
driven by the values' own type hints, so a field added to the vocabulary is encoded with
no change here:

* an attrs value is a JSON object of its fields; where the declared type is a union of
  attrs classes (a ``Command``, a ``Handle``) the object also carries ``"type"``, the
  class name;
* enums are their value; tuples and lists are arrays; frozensets are sorted arrays;
  mappings are objects with string keys (in sorted order); ``None`` is ``null``.

``decode(hint, data)`` inverts ``encode`` given the declared type, and refuses what does
not fit it with a ``CodecError`` naming where (``$.entries[2].handle.offset``) and why.
"""

from __future__ import annotations

import enum
import functools
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from spec import commands, config, handles, ids, observation
from spec.errors import CkptError, UsageError, WrongTypeError

Json = Any
"""A value ``json.dumps`` accepts: dict, list, str, int, float, bool or None."""

T = TypeVar("T")


class CodecError(CkptError, ValueError):
    """Data that does not decode to the declared type; ``where`` is a JSON path."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # called for every JSON object: the loop below only on a duplicate
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise UsageError(f"duplicate key {k!r}")
            seen.add(k)
    return out


E = TypeVar("E", bound=CodecError)


def open_envelope(
    data: bytes, error: type[E], *, body: str, version: int, fmt: str | None = None
) -> Json:
    """The ``body`` of a versioned JSON envelope (``{"version", body}``, with ``"format"``
    when ``fmt`` is given): refused with ``error`` naming the field for bytes that are not
    UTF-8 JSON, a duplicate key, another format or version, or a field too many or
    missing. The body itself is the caller's to decode."""
    try:
        envelope = json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise error("$", f"not UTF-8 JSON: {err}") from None
    if not isinstance(envelope, dict):
        raise error("$", f"expected an object, got {type(envelope).__name__}")
    fields = {"version", body} | ({"format"} if fmt is not None else set())
    unknown = sorted(set(envelope) - fields)
    if unknown:
        raise error("$", f"unknown field(s) {', '.join(unknown)} in the envelope")
    if fmt is not None and envelope.get("format") != fmt:
        raise error("$.format", f"{envelope.get('format')!r} is not {fmt!r}")
    got = envelope.get("version")
    if type(got) is not int or got != version:
        raise error("$.version", f"version {got!r}: this side reads version {version} only")
    if body not in envelope:
        raise error("$", f"no {body} in the envelope")
    return envelope[body]


_MODULES = (commands, config, handles, ids, observation)
_CLASSES: dict[str, type] = {
    name: obj
    for mod in _MODULES
    for name, obj in vars(mod).items()
    if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == mod.__name__
}
"""Every attrs class of the vocabulary by name: the ``"type"`` tag's values."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    mod = __import__(cls.__module__, fromlist=["_"])
    return typing.get_type_hints(cls, globalns=vars(mod))


_PLAIN = frozenset({type(None), bool, int, float, str})
"""Types whose values are their own encoding (exactly these: a subclass takes the plan
of its class)."""

_SELF = "self"
_ENUM = "enum"
_Plan = Callable[[Any], dict[str, Json]] | str | None


@functools.cache
def _plan(cls: type) -> _Plan:
    """How ``encode`` treats values of ``cls``, worked out once per class, not once per
    value (an acknowledgement carries thousands): an attrs class's encoder
    (``_attrs_encoder``); ``_SELF`` for a subclass of a plain type (an ``IntEnum`` member
    say: it is its own encoding, as ``json`` writes it); ``_ENUM``; ``None`` for the
    rest."""
    if issubclass(cls, bool | int | float | str):
        return _SELF
    if attrs.has(cls):
        return _attrs_encoder(cls)
    if issubclass(cls, enum.Enum):
        _ENUMS.add(cls)
        return _ENUM
    return None


_ENUMS: set[type] = set()
"""The enum classes ``_plan`` has met (none a subclass of a plain type): a field holding
a member of one is encoded in place, without a call."""


def _field(v: object) -> Json:
    """A field's value that is not of a plain type, encoded."""
    t = type(v)
    if t in _ENUMS:
        return typing.cast(enum.Enum, v)._value_
    if t is tuple:
        return [x if type(x) in _PLAIN else encode(x) for x in typing.cast(tuple[Any, ...], v)]
    return encode(v)


def _attrs_encoder(cls: type) -> Callable[[Any], dict[str, Json]]:
    """The encoder of an attrs class: a function written for its fields (as attrs writes
    its ``__init__``), one dict display with each field read once and taken as it is
    when of a plain type, so that an entry costs no loop over its fields."""
    names = [f.name for f in attrs.fields(typing.cast(Any, cls))]
    reads = "".join(f"    v{i} = value.{n}\n" for i, n in enumerate(names))
    items = "".join(
        f", {n!r}: v{i} if type(v{i}) in _PLAIN else _field(v{i})" for i, n in enumerate(names)
    )
    source = f"def encode_attrs(value):\n{reads}    return {{'type': {cls.__name__!r}{items}}}\n"
    scope: dict[str, Any] = {"_PLAIN": _PLAIN, "_field": _field}
    # the source holds nothing but the class's name and its fields' names (identifiers)
    exec(compile(source, f"<codec encoder of {cls.__qualname__}>", "exec"), scope)
    encoder: Callable[[Any], dict[str, Json]] = scope["encode_attrs"]
    return encoder


def encode(value: object) -> Json:
    """``value`` as plain JSON data (see the module docstring)."""
    cls: Any = type(value)  # a type is hashable; mypy says object.__hash__ may not be
    if cls in _PLAIN:
        return value
    plan = _plan(cls)
    if callable(plan):
        return plan(value)
    if plan is _SELF:
        return value
    if plan is _ENUM:
        return typing.cast(enum.Enum, value)._value_  # what .value returns, without its descriptor
    return _encode_other(value)


def _encode_other(value: object) -> Json:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, frozenset | set):
        return sorted((encode(v) for v in value), key=repr)
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in sorted(value.items())}
    raise WrongTypeError(f"cannot encode {type(value).__name__}: {value!r}")


def decode(hint: Any, data: Json, where: str = "$") -> Any:
    """The value of declared type ``hint`` that ``encode`` turned into ``data``.

    A decoder compiled once per declared type does the work, with no JSON path in hand
    (an acknowledgement's thousands of entries would build one string per field); only
    when it finds the data does not fit is it decoded again by ``_decode_at``, which
    keeps the path and names where and why in the ``CodecError``."""
    try:
        return _decoder(hint)(data)
    except Exception:  # not fitting (or a hint the compiled decoders do not take)
        pass
    return _decode_at(hint, data, where)


def _decode_at(hint: Any, data: Json, where: str) -> Any:
    """``decode`` with the JSON path ``where`` kept: the error names the field."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _decode_at(options[0], data, where)
        if all(attrs.has(a) for a in options):
            return _decode_tagged(options, data, where)
        for option in options:  # unions of plain types: the first that fits
            try:
                return _decode_at(option, data, where)
            except CodecError:
                continue
        raise CodecError(where, f"{data!r} fits none of {hint}")
    if isinstance(hint, type) and attrs.has(hint):
        return _decode_attrs(hint, data, where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in hint)
            raise CodecError(where, f"{data!r} is not one of {allowed}") from None
    if hint is bool:
        return _expect(data, bool, where)
    if hint is int:
        if isinstance(data, bool):
            raise CodecError(where, f"expected an integer, got {data!r}")
        return _expect(data, int, where)
    if hint is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise CodecError(where, f"expected a number, got {data!r}")
        return float(data)
    if hint is str:
        return _expect(data, str, where)
    if origin is tuple:
        items = _expect(data, list, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode_at(args[0], v, f"{where}[{i}]") for i, v in enumerate(items))
        if len(items) != len(args):
            raise CodecError(where, f"expected {len(args)} items, got {len(items)}")
        return tuple(
            _decode_at(a, v, f"{where}[{i}]")
            for i, (a, v) in enumerate(zip(args, items, strict=True))
        )
    if origin in (frozenset, set):
        items = _expect(data, list, where)
        return frozenset(_decode_at(args[0], v, f"{where}[{i}]") for i, v in enumerate(items))
    if origin in (list,):
        items = _expect(data, list, where)
        return [_decode_at(args[0], v, f"{where}[{i}]") for i, v in enumerate(items)]
    if origin in (dict, Mapping):
        obj = _expect(data, dict, where)
        return {
            _decode_at(args[0], k, f"{where}.{k}"): _decode_at(args[1], v, f"{where}.{k}")
            for k, v in obj.items()
        }
    raise CodecError(where, f"no decoding for declared type {hint!r}")


def _expect(data: Json, kind: type[T], where: str) -> T:
    if not isinstance(data, kind):
        raise CodecError(where, f"expected {kind.__name__}, got {type(data).__name__} {data!r}")
    return data


def _decode_tagged(options: list[type], data: Json, where: str) -> Any:
    obj = _expect(data, dict, where)
    tag = obj.get("type")
    by_name = {o.__name__: o for o in options}
    if not isinstance(tag, str) or tag not in by_name:  # a list is no name (nor hashable)
        raise CodecError(f"{where}.type", f"{tag!r} is not one of {', '.join(sorted(by_name))}")
    return _decode_attrs(by_name[tag], obj, where)


def _decode_attrs(cls: type, data: Json, where: str) -> Any:
    obj = _expect(data, dict, where)
    tag = obj.get("type", cls.__name__)
    if tag != cls.__name__:
        raise CodecError(f"{where}.type", f"expected {cls.__name__!r}, got {tag!r}")
    hints = _hints(cls)
    fields = attrs.fields(typing.cast(Any, cls))
    names = {f.name for f in fields}
    unknown = sorted(set(obj) - names - {"type"})
    if unknown:
        raise CodecError(where, f"unknown field(s) {', '.join(unknown)} for {cls.__name__}")
    kwargs: dict[str, Any] = {}
    for f in fields:
        if f.name in obj:
            kwargs[f.name] = _decode_at(hints[f.name], obj[f.name], f"{where}.{f.name}")
        elif f.default is attrs.NOTHING:
            raise CodecError(where, f"{cls.__name__} needs field {f.name!r}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise CodecError(where, f"not a valid {cls.__name__}: {err}") from err


Decoder = Callable[[Json], Any]


class _Misfit(Exception):
    """Raised by a compiled decoder where ``_decode_at`` raises a ``CodecError``: the data
    does not fit, and ``decode`` asks ``_decode_at`` where and why."""


def _same(data: Json) -> Any:
    return data


def _no_decoder(data: Json) -> Any:
    raise _Misfit


def _decode_bool(data: Json) -> bool:
    if isinstance(data, bool):
        return data
    raise _Misfit


def _decode_int(data: Json) -> int:
    if type(data) is int or (isinstance(data, int) and not isinstance(data, bool)):
        return data
    raise _Misfit


def _decode_float(data: Json) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise _Misfit
    return float(data)


def _decode_str(data: Json) -> str:
    if isinstance(data, str):
        return data
    raise _Misfit


_PLAIN_DECODERS: dict[Any, Decoder] = {
    bool: _decode_bool,
    int: _decode_int,
    float: _decode_float,
    str: _decode_str,
}


@functools.cache
def _decoder(hint: Any) -> Decoder:
    """The decoder of declared type ``hint``, built once: it accepts exactly what
    ``_decode_at`` accepts, builds the same value, and raises ``_Misfit`` (or whatever
    ``_decode_at`` would let through) where ``_decode_at`` refuses."""
    if hint is Any or hint is object:
        return _same
    plain = _PLAIN_DECODERS.get(hint)
    if plain is not None:
        return plain
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_decoder(args)
    if isinstance(hint, type) and attrs.has(hint):
        return _attrs_decoder(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_decoder(hint)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence_decoder(_decoder(args[0]), tuple)
        return _fixed_tuple_decoder(tuple(_decoder(a) for a in args))
    if origin in (frozenset, set):
        return _sequence_decoder(_decoder(args[0]), frozenset)
    if origin in (list,):
        return _sequence_decoder(_decoder(args[0]), list)
    if origin in (dict, Mapping):
        return _mapping_decoder(_decoder(args[0]), _decoder(args[1]))
    return _no_decoder


def _union_decoder(args: tuple[Any, ...]) -> Decoder:
    options = [a for a in args if a is not type(None)]
    inner: Decoder
    if len(options) == 1:
        inner = _decoder(options[0])
    elif all(attrs.has(a) for a in options):
        inner = _tagged_decoder(tuple(options))
    else:
        inner = _first_fit_decoder(tuple(_decoder(o) for o in options))
    if len(options) == len(args):
        return inner

    def decode_optional(data: Json) -> Any:
        return None if data is None else inner(data)

    return decode_optional


def _first_fit_decoder(options: tuple[Decoder, ...]) -> Decoder:
    def decode_first_fit(data: Json) -> Any:
        for option in options:  # unions of plain types: the first that fits
            try:
                return option(data)
            except _Misfit:
                continue
        raise _Misfit

    return decode_first_fit


def _tagged_decoder(options: tuple[type, ...]) -> Decoder:
    by_name = {o.__name__: _attrs_decoder(o) for o in options}

    def decode_tagged(data: Json) -> Any:
        if not isinstance(data, dict):
            raise _Misfit
        tag = data.get("type")
        decoder = by_name.get(tag) if isinstance(tag, str) else None
        if decoder is None:
            raise _Misfit
        return decoder(data)

    return decode_tagged


def _enum_decoder(cls: type[enum.Enum]) -> Decoder:
    by_value = {m.value: m for m in cls}

    def decode_enum(data: Json) -> Any:
        try:
            return by_value[data]
        except (KeyError, TypeError):
            raise _Misfit from None  # or a value only ``cls(data)`` knows: _decode_at asks

    return decode_enum


def _sequence_decoder(item: Decoder, kind: Callable[[list[Any]], Any]) -> Decoder:
    def decode_sequence(data: Json) -> Any:
        if not isinstance(data, list):
            raise _Misfit
        return kind([item(v) for v in data])

    return decode_sequence


def _fixed_tuple_decoder(items: tuple[Decoder, ...]) -> Decoder:
    n = len(items)

    def decode_fixed_tuple(data: Json) -> Any:
        if not isinstance(data, list) or len(data) != n:
            raise _Misfit
        return tuple([d(v) for d, v in zip(items, data, strict=True)])

    return decode_fixed_tuple


def _mapping_decoder(key: Decoder, value: Decoder) -> Decoder:
    def decode_mapping(data: Json) -> Any:
        if not isinstance(data, dict):
            raise _Misfit
        return {key(k): value(v) for k, v in data.items()}

    return decode_mapping


_PASS_THROUGH: dict[Decoder, type] = {
    _decode_bool: bool,
    _decode_int: int,
    _decode_float: float,
    _decode_str: str,
}
"""A field of one of these decoders takes a value of exactly that type as it is: checked
in place, without a call (most fields of an entry are strings and integers)."""


_Step = tuple[str, Decoder, bool, type | None]
"""A field's name, its decoder, whether it is required, the type taken as it is."""


def _steps(cls: type) -> tuple[tuple[_Step, ...], frozenset[str]]:
    hints = _hints(cls)
    fields = attrs.fields(typing.cast(Any, cls))
    steps: list[_Step] = []
    for f in fields:
        decoder = _decoder(hints[f.name])
        steps.append((f.name, decoder, f.default is attrs.NOTHING, _PASS_THROUGH.get(decoder)))
    return tuple(steps), frozenset(f.name for f in fields) | {"type"}


@functools.cache
def _attrs_decoder(cls: type) -> Decoder:
    name = cls.__name__
    plan: list[tuple[tuple[_Step, ...], frozenset[str]]] = []
    """Filled at the first call, not here: a class may hold a value of its own type."""

    def decode_attrs(data: Json) -> Any:
        if not isinstance(data, dict):
            raise _Misfit
        if not plan:
            plan.append(_steps(cls))
        steps, allowed = plan[0]
        if data.get("type", name) != name or not allowed.issuperset(data):
            raise _Misfit
        kwargs: dict[str, Any] = {}
        for field_name, decoder, required, exact in steps:
            if field_name in data:
                v = data[field_name]
                kwargs[field_name] = v if type(v) is exact else decoder(v)
            elif required:
                raise _Misfit
        try:
            return cls(**kwargs)
        except (TypeError, ValueError):
            raise _Misfit from None

    return decode_attrs


def encode_command(cmd: commands.Command) -> Json:
    return encode(cmd)


def decode_command(data: Json, where: str = "$") -> commands.Command:
    result: commands.Command = decode(commands.Command, data, where)
    return result


def decode_observation(data: Json, where: str = "$") -> observation.Observation:
    result: observation.Observation = decode(observation.Observation, data, where)
    return result


def class_named(name: str) -> type | None:
    """The vocabulary's attrs class called ``name`` (a ``"type"`` tag), if any."""
    return _CLASSES.get(name)
