"""Malformed JSON made from a valid encoding: one node of the document replaced by any
JSON value, a field dropped or an unknown one added. For checking that ``spec.codec``'s
compiled decoders accept exactly what the decoder that names the field accepts."""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from hypothesis import strategies as st

from spec import codec

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 2**41)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.sampled_from(["SubtaskId", "SegmentHandle", "keyed_shared", "shared", "type"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "x", "path", "index"]) | st.text(max_size=3), inner
        )
    ),
    max_leaves=6,
)


def _nodes(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _nodes(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _nodes(v, (*at, i))


def mutated(doc: Any, draw: st.DataObject) -> Any:
    """A copy of ``doc`` with one node changed (drawn with ``draw``)."""
    doc = copy.deepcopy(doc)
    at = draw.draw(st.sampled_from(list(_nodes(doc))), label="node")
    value = draw.draw(json_values, label="value")
    if not at:
        return value
    parent = doc
    for step in at[:-1]:
        parent = parent[step]
    how = draw.draw(st.sampled_from(["replace", "drop", "add"]), label="how")
    if how == "replace" or not isinstance(parent, dict):
        parent[at[-1]] = value
    elif how == "drop":
        del parent[at[-1]]
    else:
        parent[draw.draw(st.text(max_size=3), label="key")] = value
    return doc


def assert_same_verdict(hint: Any, doc: Any) -> None:
    """The compiled decoder of ``hint`` refuses ``doc`` exactly when the field-naming one
    does, and otherwise builds the same value (compared by type and by its encoding, so
    that ``1`` and ``True`` and ``1.0`` differ)."""
    try:
        slow = codec._decode_at(hint, doc, "$")
    except codec.CodecError:
        slow = codec.CodecError
    try:
        fast = codec._decoder(hint)(doc)
    except codec._Misfit:
        fast = codec.CodecError
    if slow is codec.CodecError or fast is codec.CodecError:
        assert fast is slow, f"compiled: {fast!r}, field-naming: {slow!r}"
        return
    assert type(fast) is type(slow)
    assert fast == slow
    as_text = json.dumps(codec.encode(fast), sort_keys=True)
    assert as_text == json.dumps(codec.encode(slow), sort_keys=True)


def plain_encoding(value: Any) -> Any:
    """What ``codec.encode`` makes of ``value``, written out the plain way (the module
    docstring's rules), to check the encoders it writes per attrs class against."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if attrs.has(type(value)):
        out = {"type": type(value).__name__}
        for f in attrs.fields(type(value)):
            out[f.name] = plain_encoding(getattr(value, f.name))
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, frozenset | set):
        return sorted((plain_encoding(v) for v in value), key=repr)
    if isinstance(value, tuple | list):
        return [plain_encoding(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain_encoding(v) for k, v in sorted(value.items())}
    raise TypeError(f"cannot encode {value!r}")


def assert_plain_encoding(value: Any) -> None:
    """``codec.encode(value)`` is ``plain_encoding(value)``, key order included."""
    got, want = codec.encode(value), plain_encoding(value)
    assert json.dumps(got) == json.dumps(want)
