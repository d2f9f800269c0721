"""spec.messages: every message between a coordinator and its TMs survives bytes
unchanged, and bytes that are not a message of this version are refused with the field
that is wrong, changing nothing."""

from __future__ import annotations

import json
import typing
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spec import codec
from spec import messages as m
from spec.config import Scope, StateKind
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    Handle,
    InlineHandle,
    InPlaceFile,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
)
from spec.ids import SubtaskId
from tests import codec_mutations

names = st.text(min_size=1, max_size=8).filter(lambda s: "/" not in s and "\\" not in s)
names = names.filter(lambda s: "\x00" not in s and s not in (".", ".."))
subtasks = st.builds(
    lambda v, p, i: SubtaskId(v, i % p, p),
    st.text(min_size=1, max_size=6),
    st.integers(1, 8),
    st.integers(0, 7),
)
sizes = st.integers(0, 2**40)
cids = st.integers(1, 2**40)
scopes = st.sampled_from(Scope)
handles: st.SearchStrategy[Handle] = st.one_of(
    st.builds(SegmentHandle, st.text(), sizes, sizes, st.text(), scopes),
    st.builds(FileHandle, st.text(), sizes, st.text(), scopes),
    st.builds(PlaceholderHandle, st.text()),
    st.builds(DirectoryHandle, st.text()),
)
key_groups = st.none() | st.tuples(st.integers(0, 127), st.integers(0, 127))
inline = st.builds(  # R107: private state only
    StateEntry,
    subtasks,
    st.sampled_from([k for k in StateKind if k.scope is Scope.EXCLUSIVE]),
    st.text(),
    st.builds(InlineHandle.of, st.binary(min_size=1, max_size=64), st.text()),
    sizes,
    key_groups,
    st.none() | st.tuples(sizes, sizes),
)
entries = st.lists(
    st.builds(
        StateEntry,
        subtasks,
        st.sampled_from(StateKind),
        st.text(),
        handles,
        sizes,
        key_groups,
        st.none() | st.tuples(sizes, sizes),
    )
    | inline,
    max_size=4,
).map(tuple)

in_place = st.lists(
    st.builds(
        lambda p, n, a, b: InPlaceFile(p, n, (min(a, b), max(a, b))),
        st.text(),
        st.integers(1, 2**40),
        st.integers(0, 127),
        st.integers(0, 127),
    ),
    max_size=3,
).map(tuple)
retained = st.builds(m.RetainedCheckpoint, cids, entries)
kept = st.builds(m.KeptFile, st.text(), sizes, st.none() | names)

messages: st.SearchStrategy[m.Message] = st.one_of(
    st.builds(m.Acknowledgement, names, cids, subtasks, names, entries, in_place),
    st.builds(m.Decline, names, cids, subtasks, names),
    st.builds(
        m.CheckpointComplete, names, cids, sizes, st.booleans(), st.frozensets(cids, max_size=4)
    ),
    st.builds(m.CheckpointAborted, names, cids, sizes, st.booleans()),
    st.builds(
        m.RestoreAssignment,
        names,
        subtasks,
        names,
        entries,
        st.frozensets(st.text(), max_size=4),
        cids,
        sizes,
        sizes,
    ),
    st.builds(m.AttemptStopped, names, names),
    st.builds(m.ResetTm, names, names, cids),
    st.builds(
        m.TmAssignment,
        names,
        names,
        cids,
        st.lists(subtasks, max_size=3).map(tuple),
        st.lists(retained, max_size=3).map(tuple),
        st.none() | retained,
        st.frozensets(names, max_size=3),
        st.lists(st.text(), max_size=3).map(tuple),
        st.lists(st.text(), max_size=3).map(tuple),
        st.lists(kept, max_size=2).map(tuple),
        cids,
        sizes,
        sizes,
        sizes,
    ),
    st.builds(m.ReusableFiles, names, names, sizes, cids, entries),
    st.builds(m.LostAttemptStopped, names, names, names),
    st.builds(m.EndJob, names, names, st.frozensets(st.text(), max_size=4)),
    st.builds(
        m.TmEnded,
        names,
        names,
        st.lists(st.builds(m.KeptFile, st.text(), sizes, st.none() | names), max_size=3).map(tuple),
        st.lists(st.text(), max_size=3).map(tuple),
    ),
    st.builds(m.Holdings, names, names, st.lists(st.text(), max_size=3).map(tuple)),
    st.builds(m.Held, names, names, st.lists(st.text(), max_size=3).map(tuple)),
    st.builds(m.OpenDatabase, names, names, sizes, subtasks, in_place, entries, st.booleans()),
    st.builds(m.DatabasesOpened, names, names, sizes),
    st.builds(m.DatabaseFiles, names, names),
    st.builds(m.InUse, names, names, st.lists(st.text(), max_size=3).map(tuple)),
)


def test_the_strategy_covers_every_message_type() -> None:
    assert set(m.MESSAGE_TYPES) == set(typing.get_args(m.Message))
    assert len(m.MESSAGE_TYPES) == 18
    assert set(typing.get_args(m.Duty)) <= set(m.MESSAGE_TYPES)
    assert set(typing.get_args(m.Answer)) <= set(m.MESSAGE_TYPES)


@given(messages)
def test_every_message_round_trips_through_bytes(msg: m.Message) -> None:
    data = m.encode_message(msg)
    assert isinstance(data, bytes)
    back = m.decode_message(data)
    assert back == msg
    assert type(back) is type(msg)
    assert m.encode_message(back) == data  # one encoding per value
    codec_mutations.assert_plain_encoding(msg)


SAMPLE = m.Acknowledgement(
    "job-0",
    3,
    SubtaskId("win", 1, 2),
    "tm-1",
    (
        StateEntry(
            SubtaskId("win", 1, 2),
            StateKind.KEYED_SHARED,
            "a.sst",
            SegmentHandle("job-0/shared/win-1-2/f1", 0, 10, "l1", Scope.SHARED),
            1,
            (64, 127),
        ),
    ),
)


def _envelope() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(m.encode_message(SAMPLE))
    return data


def _bytes(obj: object) -> bytes:
    return json.dumps(obj).encode()


def _with(path: tuple[str | int, ...], value: object) -> bytes:
    env = _envelope()
    node: Any = env
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return _bytes(env)


def _without(path: tuple[str | int, ...]) -> bytes:
    env = _envelope()
    node: Any = env
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    return _bytes(env)


BAD: list[tuple[str, bytes, str]] = [
    ("not json", b"\x00\x01garbage", "$"),
    ("not utf-8", b"\xff\xfe{}", "$"),
    ("a list", b"[1, 2]", "$"),
    ("a foreign version", _with(("version",), 2), "$.version"),
    ("version 0", _with(("version",), 0), "$.version"),
    ("a version as text", _with(("version",), "1"), "$.version"),
    ("a version as a bool", _with(("version",), True), "$.version"),
    ("no version", _without(("version",)), "$.version"),
    ("no message", _without(("message",)), "$"),
    ("an extra envelope field", _with(("extra",), 1), "$"),
    ("an unknown type", _with(("message", "type"), "Shutdown"), "$.message.type"),
    ("a command's type", _with(("message", "type"), "Trigger"), "$.message.type"),
    ("checkpoint 0", _with(("message", "checkpoint"), 0), "$.message.checkpoint"),
    ("a negative checkpoint", _with(("message", "checkpoint"), -4), "$.message.checkpoint"),
    ("a float checkpoint", _with(("message", "checkpoint"), 3.0), "$.message.checkpoint"),
    ("a bool checkpoint", _with(("message", "checkpoint"), True), "$.message.checkpoint"),
    ("no checkpoint", _without(("message", "checkpoint")), "$.message"),
    ("an unknown field", _with(("message", "color"), "red"), "$.message"),
    ("a path as job", _with(("message", "job"), "../job-0"), "$.message.job"),
    ("an empty attempt", _with(("message", "attempt"), ""), "$.message.attempt"),
    ("a path as attempt", _with(("message", "attempt"), "tm-1/x"), "$.message.attempt"),
    (
        "a subtask out of range",
        _with(("message", "subtask", "index"), 5),
        "$.message.subtask",
    ),
    (
        "a handle of an unknown type",
        _with(("message", "entries", 0, "handle", "type"), "Link"),
        "$.message.entries[0].handle.type",
    ),
    (
        "an offset as text",
        _with(("message", "entries", 0, "handle", "offset"), "0"),
        "$.message.entries[0].handle.offset",
    ),
    ("entries not a list", _with(("message", "entries"), {}), "$.message.entries"),
    (
        "a duplicated key",
        m.encode_message(SAMPLE).replace(b'"checkpoint":3', b'"checkpoint":3,"checkpoint":4'),
        "$",
    ),
]


ASSIGNMENT = m.TmAssignment(
    "job-0",
    "tm-3",
    2,
    (SubtaskId("win", 1, 2),),
    (m.RetainedCheckpoint(3, SAMPLE.entries),),
    m.RetainedCheckpoint(3, SAMPLE.entries),
    frozenset({"tm-2"}),
    ("job-0/shared/win-1-2",),
    (),
    (m.KeptFile("job-0/shared/win-1-2/f1", 10, "tm-1"),),
    5,
    3,
    4,
    2,
)


def _assignment_with(path: tuple[str | int, ...], value: object) -> bytes:
    env: Any = json.loads(m.encode_message(ASSIGNMENT))
    node = env
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return _bytes(env)


BAD += [
    ("an assignment's epoch 0", _assignment_with(("message", "epoch"), 0), "$.message.epoch"),
    (
        "a retained checkpoint 0",
        _assignment_with(("message", "retained", 0, "checkpoint"), 0),
        "$.message.retained[0].checkpoint",
    ),
    (
        "a lost attempt as a path",
        _assignment_with(("message", "lost"), ["a/b"]),
        "$.message.lost",
    ),
    (
        "hosted not a list",
        _assignment_with(("message", "hosted"), {"vertex": "win"}),
        "$.message.hosted",
    ),
    (
        "a kept file's negative size",
        json.dumps(
            {
                "version": 1,
                "message": {
                    "type": "TmEnded",
                    "job": "job-0",
                    "tm": "tm-1",
                    "files": [{"path": "job-0/x", "size": -2, "creator": None}],
                    "directories": [],
                },
            }
        ).encode(),
        "$.message.files[0].size",
    ),
]

WORKING_ACK = attrs.evolve(
    SAMPLE, in_place=(InPlaceFile("job-0/taskowned/working/win-1-2/db/f7", 400, (64, 127)),)
)


def _edited(msg: m.Message, path: tuple[str | int, ...], value: object) -> bytes:
    """``msg`` encoded, with the field at ``path`` of its envelope set to ``value``."""
    env: Any = json.loads(m.encode_message(msg))
    node = env
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return _bytes(env)


BAD += [
    (
        "an in-place file of no bytes",
        _edited(WORKING_ACK, ("message", "in_place", 0, "length"), 0),
        "$.message.in_place[0]",
    ),
    (
        "in-place key groups reversed",
        _edited(WORKING_ACK, ("message", "in_place", 0, "key_groups"), [9, 3]),
        "$.message.in_place[0]",
    ),
    (
        "in-place key groups not a pair",
        _edited(WORKING_ACK, ("message", "in_place", 0, "key_groups"), [9]),
        "$.message.in_place[0].key_groups",
    ),
    (
        "an in-place file without a path",
        _edited(WORKING_ACK, ("message", "in_place", 0, "path"), None),
        "$.message.in_place[0].path",
    ),
    (
        "in_place not a list",
        _edited(WORKING_ACK, ("message", "in_place"), {"path": "x"}),
        "$.message.in_place",
    ),
    (
        "an open database's negative epoch",
        json.dumps(
            {
                "version": 1,
                "message": {
                    "type": "OpenDatabase",
                    "job": "job-0",
                    "tm": "tm-1",
                    "epoch": -1,
                    "subtask": {"type": "SubtaskId", "vertex": "v", "index": 0, "parallelism": 1},
                    "in_place": [],
                    "small": [],
                },
            }
        ).encode(),
        "$.message.epoch",
    ),
]


INLINE_ACK = attrs.evolve(
    SAMPLE,
    entries=(
        StateEntry(
            SubtaskId("win", 1, 2), StateKind.KEYED_FULL, "MANIFEST", InlineHandle.of(b"m", "l9")
        ),
    ),
)


BAD += [
    (
        "inline shared state (R107)",
        _edited(INLINE_ACK, ("message", "entries", 0, "kind"), "keyed_shared"),
        "$.message.entries[0]",
    ),
    (
        "inline state whose bytes are not its length",
        _edited(INLINE_ACK, ("message", "entries", 0, "handle", "length"), 2),
        "$.message.entries[0].handle",
    ),
]


def test_an_acknowledgement_carries_its_in_place_files() -> None:
    """R103: what a snapshot refers to in place travels with the acknowledgement, and an
    acknowledgement of a peer that refers to nothing in place stays as it was."""
    back = m.decode_message(m.encode_message(WORKING_ACK))
    assert isinstance(back, m.Acknowledgement) and back.in_place == WORKING_ACK.in_place
    plain: Any = json.loads(m.encode_message(SAMPLE))
    del plain["message"]["in_place"]
    assert m.decode_message(_bytes(plain)) == SAMPLE


@pytest.mark.parametrize(("what", "data", "where"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_message_is_refused_naming_the_field(what: str, data: bytes, where: str) -> None:
    with pytest.raises(m.MessageError) as err:
        m.decode_message(data)
    assert err.value.where == where, (what, str(err.value))
    assert str(err.value).startswith(where)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: m.CheckpointComplete("job-0", 0, 0, False), "checkpoint"),
        (lambda: m.CheckpointComplete("job-0", 2, -1, False), "subsumed"),
        (lambda: m.CheckpointAborted("job-0", 2, -1, True), "latest_completed"),
        (lambda: m.AttemptStopped("job-0", ""), "tm"),
        (lambda: m.Decline("a/b", 1, SubtaskId("v", 0, 1), "tm-1"), "job"),
        (lambda: m.ResetTm("job-0", "tm-1", 0), "epoch"),
        (lambda: m.EndJob("job-0", "..", frozenset()), "tm"),
        (lambda: m.KeptFile("job-0/f", -1, None), "size"),
        (lambda: m.RetainedCheckpoint(0, ()), "checkpoint"),
        (lambda: InPlaceFile("job-0/taskowned/working/v-0-1/db/f1", 0, (0, 1)), "length"),
        (lambda: InPlaceFile("job-0/taskowned/working/v-0-1/db/f1", 5, (3, 1)), "key_groups"),
        (lambda: m.InUse("job-0", "", ()), "tm"),
    ],
)
def test_an_invalid_message_cannot_be_built(build: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()


def test_only_messages_are_encoded() -> None:
    with pytest.raises(TypeError):
        m.encode_message(SubtaskId("v", 0, 1))  # type: ignore[arg-type]


def test_messages_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        SAMPLE.checkpoint = 4  # type: ignore[misc]


@given(messages, st.data())
def test_the_compiled_decoder_refuses_exactly_what_names_the_field(
    msg: m.Message, draw: st.DataObject
) -> None:
    """``spec.codec`` decodes with decoders compiled per type and builds a JSON path
    only for data that does not fit: both ways must agree on every malformed input."""
    doc = codec_mutations.mutated(codec.encode(msg), draw)
    codec_mutations.assert_same_verdict(m.Message, doc)


def test_an_unhashable_type_tag_is_refused_naming_it() -> None:
    data = json.dumps({"version": 1, "message": {"type": ["Decline"]}}).encode()
    with pytest.raises(m.MessageError) as info:
        m.decode_message(data)
    assert info.value.where == "$.message.type"
