"""spec.codec: every command and observation survives JSON, and bad data is refused
with the place and the reason."""

from __future__ import annotations

import json
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import Harness
from spec import codec
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.ids import SubtaskId
from spec.observation import Observation
from tests import codec_mutations

subtasks = st.builds(
    lambda v, p, i: SubtaskId(v, i % p, p),
    st.text(min_size=1, max_size=6),
    st.integers(1, 8),
    st.integers(0, 7),
)
COMMAND_TYPES: tuple[type, ...] = typing.get_args(c.Command)


def _command(t: type) -> st.SearchStrategy[c.Command]:
    """``t`` with every field drawn from its type; counts are non-negative, as the
    validators require, and subtasks valid."""
    hints = typing.get_type_hints(t, globalns=vars(c))
    special: dict[str, st.SearchStrategy[object]] = {}
    for name, hint in hints.items():
        if hint is int:
            special[name] = st.integers(0, 2**40)
        elif hint is SubtaskId:
            special[name] = subtasks
        else:
            special[name] = st.from_type(hint)
    return st.builds(t, **special)


@given(st.one_of(*[_command(t) for t in COMMAND_TYPES]))
def test_every_command_round_trips_through_json_text(cmd: c.Command) -> None:
    text = json.dumps(codec.encode_command(cmd))
    assert codec.decode_command(json.loads(text)) == cmd
    codec_mutations.assert_plain_encoding(cmd)


def test_the_tag_names_the_command() -> None:
    sub = SubtaskId("win", 1, 4)
    data = codec.encode_command(c.WriteState(3, sub, StateKind.KEYED_SHARED, "a.sst", 10))
    assert data["type"] == "WriteState"
    assert data["kind"] == "keyed_shared"
    assert data["subtask"] == {"type": "SubtaskId", "vertex": "win", "index": 1, "parallelism": 4}


def _observations() -> list[Observation]:
    """Observations of a short job: files, retained entries with segment handles, the
    registry, deletions and, after a rescaling CLAIM restore, restored entries."""
    job = JobSpec((VertexSpec("w", 2),), num_tms=1)
    h = Harness(Config.for_mode(MergingMode.WITHIN_CHECKPOINT), job)
    seen = [h.observe()]
    for n in (1, 2, 3):
        h.run(c.Trigger())
        for sub in h.subtasks:
            h.run(c.WriteState(n, sub, StateKind.KEYED_SHARED, f"{n}.sst", 100 * n))
            h.run(c.WriteState(n, sub, StateKind.OPERATOR_LIST, "offsets", 8, entries=3))
            h.run(c.Acknowledge(n, sub))
        h.run(c.Complete(n))
        seen.append(h.observe())
        while h.try_run(c.DeliverNotification(0)) is None:  # until none is in flight
            seen.append(h.observe())
    h.run(c.Restore(3, (("w", 3),), RestoreMode.CLAIM))
    seen.append(h.observe())
    return seen


def test_observations_round_trip() -> None:
    seen = _observations()
    assert any(o.retained for o in seen) and any(o.deletions for o in seen)
    assert any(o.restoring for o in seen) and any(o.registry for o in seen)
    for obs in seen:
        codec_mutations.assert_plain_encoding(obs)
        text = json.dumps(codec.encode(obs), sort_keys=True)
        assert codec.decode_observation(json.loads(text)) == obs


@pytest.mark.parametrize(
    ("data", "where", "problem"),
    [
        ({"type": "Explode"}, "$.type", "'Explode' is not one of"),
        ({"type": "Complete"}, "$", "Complete needs field 'checkpoint'"),
        ({"type": "Complete", "checkpoint": "7"}, "$.checkpoint", "expected int"),
        ({"type": "Complete", "checkpoint": True}, "$.checkpoint", "expected an integer"),
        ({"type": "Complete", "checkpoint": 1, "x": 2}, "$", "unknown field(s) x"),
        ({"type": "FailNextCall", "op": "explode"}, "$.op", "is not one of 'create'"),
        (
            {"type": "Restore", "checkpoint": 1, "parallelism": [["w", 2, 3]]},
            "$.parallelism[0]",
            "expected 2 items, got 3",
        ),
        (
            {
                "type": "Acknowledge",
                "checkpoint": 1,
                "subtask": {"vertex": "w", "index": 5, "parallelism": 2},
            },
            "$.subtask",
            "not a valid SubtaskId",
        ),
        ({"type": "WriteState", "checkpoint": 1, "subtask": None}, "$.subtask", "expected dict"),
        ([1, 2], "$", "expected dict"),
    ],
)
def test_bad_command_data_is_refused_naming_where_and_why(
    data: object, where: str, problem: str
) -> None:
    with pytest.raises(codec.CodecError) as info:
        codec.decode_command(data)
    assert info.value.where == where
    assert problem in info.value.problem


@given(st.one_of(*[_command(t) for t in COMMAND_TYPES]), st.data())
def test_the_compiled_decoder_refuses_exactly_what_names_the_field(
    cmd: c.Command, draw: st.DataObject
) -> None:
    """Commands, as traces and conformance cases carry them: the decoder compiled per
    type and the one that builds a JSON path agree on every malformed input."""
    doc = codec_mutations.mutated(codec.encode_command(cmd), draw)
    codec_mutations.assert_same_verdict(c.Command, doc)


def test_observations_decode_the_same_both_ways() -> None:
    """Observations hold mappings and sets the commands do not."""
    for obs in _observations():
        codec_mutations.assert_same_verdict(Observation, json.loads(json.dumps(codec.encode(obs))))
