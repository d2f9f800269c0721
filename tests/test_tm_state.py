"""A TM's saved state (``spec.tm_state``) is data: every field round-trips through its
bytes, and anything else is refused with the field named, touching nothing.

* Hypothesis draws states with every kind of record, and the encoding of one, mutated
  at any node (a value of the wrong type, a field dropped, an unknown field added, the
  version or format changed), is refused naming that node (or the object missing the
  field); a mutation drawn at random is refused or decodes, never anything else, and the
  compiled decoder agrees with the one that names the field.
* No module of the product imports ``pickle``, and a worker given a forged state file
  (a pickle that would run code, a JSON state naming a path outside the base) starts a
  new TM attempt, runs nothing, deletes nothing, and says why.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.stream import worker_tm
from pipeline.stream.worker_tm import OLD_TM_STATE, TM_STATE, TaskManagerRecipe, deliver_mail
from spec import codec
from spec import tm_state as t
from spec.config import Config, MergingMode, Scope, StateKind
from spec.handles import (
    DirectoryHandle,
    FileHandle,
    Handle,
    InPlaceFile,
    PlaceholderHandle,
    SegmentHandle,
    StateEntry,
)
from spec.ids import SubtaskId
from spec.messages import KeptFile, TmEnded
from spec.observation import DeletionRecord
from tests import codec_mutations

ROOT = Path(__file__).resolve().parent.parent

names = st.sampled_from(["tm-1", "tm-2", "job-0", "a", "ops", "x.y"])
actors = st.sampled_from(["tm:tm-1", "coordinator", "user", "tm:tm-2"])
paths = st.lists(
    st.sampled_from(["job-0", "shared", "map-0-2", "chk-3", "f1.tm-1", "taskowned", "db"]),
    min_size=1,
    max_size=4,
).map("/".join)
counts = st.integers(0, 2**40)
cids = st.integers(0, 50)
subtasks = st.builds(
    lambda v, p, i: SubtaskId(v, i % p, p), st.sampled_from(["map", "sink"]), st.integers(1, 4),
    st.integers(0, 3),
)  # fmt: skip
scopes = st.sampled_from(Scope)
pool_keys = st.tuples(names, st.sampled_from(["shared", "exclusive"]), names, st.text(max_size=3))
handles: st.SearchStrategy[Handle] = st.one_of(
    st.builds(SegmentHandle, paths, counts, counts, names, scopes),
    st.builds(FileHandle, paths, counts, names, scopes),
    st.builds(PlaceholderHandle, names),
    st.builds(DirectoryHandle, paths),
)
key_groups = st.tuples(st.integers(0, 60), st.integers(60, 127))
entries = st.lists(
    st.builds(
        StateEntry,
        subtasks,
        st.sampled_from(StateKind),
        names,
        handles,
        counts,
        st.none() | key_groups,
        st.none() | st.tuples(counts, counts),
    ),
    max_size=3,
).map(tuple)
configs = st.sampled_from(
    [
        Config(),
        Config.for_mode(MergingMode.WITHIN_CHECKPOINT, max_file_size=4096),
        Config.for_mode(MergingMode.ACROSS_CHECKPOINT, num_retained=3, max_parallelism=256),
    ]
)


def _unique_by(strategy: st.SearchStrategy[Any], key: Any) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(strategy, max_size=4, unique_by=key).map(tuple)


def _sorted(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(strategy, max_size=4, unique=True).map(lambda xs: tuple(sorted(xs)))


deletion_records = st.builds(
    DeletionRecord, paths, actors, st.none() | actors, st.booleans(), st.booleans()
)


@st.composite
def tm_states(draw: st.DrawFn) -> t.TmState:
    """A state with records of every kind, consistent as a TM's are (each key once,
    every segment and pool in a physical file of the TM, every database file known)."""
    pfiles = draw(
        _unique_by(
            st.builds(
                t.PhysicalFile,
                paths,
                scopes,
                st.none() | pool_keys,
                st.none() | cids,
                st.booleans(),
                counts,
                counts,
                counts,
                st.booleans(),
            ),
            lambda p: p.path,
        )
    )
    pf_paths = [p.path for p in pfiles]
    segments: tuple[t.SegmentRecord, ...] = ()
    pools: tuple[t.Pool, ...] = ()
    if pf_paths:
        segments = draw(
            _unique_by(
                st.builds(
                    t.SegmentRecord,
                    st.text(min_size=1, max_size=5),
                    st.sampled_from(pf_paths),
                    counts,
                    counts,
                    cids,
                    cids,
                    st.booleans(),
                ),
                lambda s: s.logical_id,
            )
        )
        pools = draw(
            _unique_by(st.builds(t.Pool, pool_keys, st.sampled_from(pf_paths)), lambda p: p.key)
        )
    known = draw(
        _unique_by(
            st.builds(InPlaceFile, paths, st.integers(1, 2**40), key_groups), lambda k: k.path
        )
    )
    known_paths = [k.path for k in known]
    files_of_known = (
        st.lists(st.sampled_from(known_paths), max_size=3, unique=True).map(tuple)
        if known_paths
        else st.just(())
    )
    working = t.WorkingRecords(
        uses=draw(
            _unique_by(st.builds(t.DatabaseUse, subtasks, files_of_known), lambda u: u.subtask)
        ),
        pins=draw(
            _unique_by(
                st.builds(t.Pin, subtasks, cids, files_of_known),
                lambda p: (p.subtask, p.checkpoint),
            )
        ),
        known=known,
        written=draw(_sorted(paths)),
        opened=draw(st.lists(st.builds(t.Opened, cids, subtasks), max_size=3).map(tuple)),
        users=draw(_sorted(paths)),
    )
    written = st.builds(t.Written, subtasks, cids, entries)
    records = t.TaskManagerState(
        job=draw(names),
        tm=draw(names),
        config=draw(configs),
        first_checkpoint=draw(cids),
        hosted=draw(st.lists(subtasks, max_size=3).map(tuple)),
        savepoints=draw(_sorted(cids)),
        known_completed=draw(cids),
        finished_mark=draw(cids),
        known_aborted=draw(_sorted(cids)),
        known_watermark=draw(cids),
        finished_savepoints=draw(_sorted(cids)),
        reset_epoch=draw(cids),
        assigned_epoch=draw(cids),
        lost=draw(_sorted(names)),
        ended=draw(
            st.none()
            | st.builds(
                TmEnded,
                names,
                names,
                st.lists(st.builds(KeptFile, paths, counts, st.none() | names), max_size=2).map(
                    tuple
                ),
                st.lists(paths, max_size=2).map(tuple),
            )
        ),
        files=draw(
            _unique_by(
                st.builds(t.FileRecord, paths, counts, st.booleans(), actors, st.none() | names),
                lambda f: f.path,
            )
        ),
        directories=draw(
            _unique_by(
                st.builds(t.DirectoryRecord, paths, names, _sorted(cids), st.booleans()),
                lambda d: d.path,
            )
        ),
        directory_owners=draw(
            _unique_by(st.builds(t.DirectoryOwner, paths, actors), lambda d: d.path)
        ),
        failed_uploads=draw(_sorted(paths)),
        deferred_deletes=draw(
            st.lists(
                st.builds(t.DeferredDelete, actors, paths, st.booleans(), st.none() | names),
                max_size=3,
            ).map(tuple)
        ),
        refused_deletes=draw(
            st.lists(
                st.builds(t.RefusedDelete, st.text(max_size=5), actors, st.booleans(), st.text()),
                max_size=2,
            ).map(tuple)
        ),
        failed_deletes=draw(
            _unique_by(
                st.builds(
                    t.FailedDelete,
                    paths,
                    st.booleans(),
                    st.text(max_size=8),
                    counts,
                    st.lists(st.builds(t.DeletedBy, paths, actors), max_size=2).map(tuple),
                ),
                lambda f: f.path,
            )
        ),
        bad_deletions=draw(st.lists(deletion_records, max_size=2).map(tuple)),
        deletions=draw(st.none() | st.lists(deletion_records, max_size=3).map(tuple)),
        segments=segments,
        physical_files=pfiles,
        pools=pools,
        outputs=draw(_unique_by(written, lambda w: (w.subtask, w.checkpoint))),
        acked=draw(_unique_by(written, lambda w: (w.subtask, w.checkpoint))),
        backend=draw(
            _unique_by(
                st.builds(
                    t.BackendRecord,
                    subtasks,
                    names,
                    entries.filter(bool).map(lambda es: es[0]),
                    cids,
                    st.booleans(),
                ),
                lambda b: (b.subtask, b.name),
            )
        ),
        subtask_pools=draw(
            _unique_by(
                st.builds(t.SubtaskPool, subtasks, cids, st.none() | pool_keys), lambda s: s.subtask
            )
        ),
        working=working,
    )
    return t.TmState(records, draw(counts), draw(st.none() | paths))


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------- round trips


@SETTINGS
@given(tm_states())
def test_every_field_round_trips_through_bytes(state: t.TmState) -> None:
    data = t.encode_tm_state(state)
    assert t.decode_tm_state(data) == state
    assert t.decode_tm_state(data) is not state
    doc = json.loads(data)
    assert doc["format"] == t.TM_STATE_FORMAT and doc["version"] == t.TM_STATE_VERSION


def test_every_field_of_the_state_is_drawn() -> None:
    """The strategy leaves no field empty for ever: every field of every record class
    is non-empty (or not None) in some drawn state."""
    seen: set[str] = set()

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tm_states())
    def collect(state: t.TmState) -> None:
        for f in attrs.fields(t.TaskManagerState):
            v = getattr(state.records, f.name)
            if v not in ((), None):
                seen.add(f.name)
        for f in attrs.fields(t.WorkingRecords):
            if getattr(state.records.working, f.name):
                seen.add(f"working.{f.name}")

    collect()
    want = {f.name for f in attrs.fields(t.TaskManagerState)}
    want |= {f"working.{f.name}" for f in attrs.fields(t.WorkingRecords)}
    assert want <= seen, want - seen


# ---------------------------------------------------------------------------- refusals


def _nodes(doc: Any, at: str = "$.state") -> list[tuple[str, Any, Any, Any]]:
    """Every node under ``doc``: its JSON path as the codec names it, its parent, its
    key in the parent, its value."""
    out: list[tuple[str, Any, Any, Any]] = []

    def walk(value: Any, where: str, parent: Any, key: Any) -> None:
        out.append((where, parent, key, value))
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}", value, k)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]", value, i)

    walk(doc, at, None, None)
    return out


def _refused(doc: Any) -> t.TmStateError:
    with pytest.raises(t.TmStateError) as info:
        t.decode_tm_state(json.dumps(doc).encode())
    return info.value


def _wrong_type(value: Any) -> Any:
    """A JSON value no field holding ``value`` accepts."""
    if value is None:
        return {"zz": 1}  # no field is an object with a field zz, none is only null
    if isinstance(value, str):
        return 12345 if value != "*" else [1]
    return "x"


OUR_CLASSES = {
    c.__name__
    for c in vars(t).values()
    if isinstance(c, type) and attrs.has(c) and c.__module__ == t.__name__
}
"""The record classes of ``spec.tm_state``: every field required."""


@SETTINGS
@given(tm_states(), st.data())
def test_a_value_of_the_wrong_type_is_refused_naming_it(
    state: t.TmState, data: st.DataObject
) -> None:
    doc = json.loads(t.encode_tm_state(state))
    nodes = [n for n in _nodes(doc["state"]) if n[1] is not None]
    where, parent, key, value = data.draw(st.sampled_from(nodes), label="node")
    parent[key] = _wrong_type(value)
    err = _refused(doc)
    assert err.where == where, (where, str(err))


@SETTINGS
@given(tm_states(), st.data())
def test_a_missing_or_unknown_field_is_refused_naming_its_object(
    state: t.TmState, data: st.DataObject
) -> None:
    doc = json.loads(t.encode_tm_state(state))
    objects = [
        n
        for n in _nodes(doc["state"])
        if isinstance(n[3], dict) and n[3].get("type") in OUR_CLASSES
    ]
    where, _, _, obj = data.draw(st.sampled_from(objects), label="object")
    if data.draw(st.booleans(), label="drop"):
        field = data.draw(st.sampled_from(sorted(set(obj) - {"type"})), label="field")
        del obj[field]
        err = _refused(doc)
        assert err.where == where and repr(field) in err.problem, str(err)
    else:
        obj["zz"] = 1
        err = _refused(doc)
        assert err.where == where and "zz" in err.problem, str(err)


@SETTINGS
@given(tm_states(), st.sampled_from([0, 2, -1, "1", 1.0, True, None]))
def test_another_version_is_refused(state: t.TmState, version: Any) -> None:
    doc = json.loads(t.encode_tm_state(state))
    doc["version"] = version
    assert _refused(doc).where == "$.version"
    del doc["version"]
    assert _refused(doc).where == "$.version"


@pytest.mark.parametrize("fmt", ["ckpt-message", "", None, 1, "CKPT-TM-STATE"])
def test_another_format_is_refused(fmt: Any) -> None:
    doc = json.loads(t.encode_tm_state(_small_state()))
    doc["format"] = fmt
    assert _refused(doc).where == "$.format"


@SETTINGS
@given(tm_states(), st.data())
def test_any_mutation_is_refused_or_decodes(state: t.TmState, data: st.DataObject) -> None:
    doc = json.loads(t.encode_tm_state(state))
    bad = codec_mutations.mutated(doc, data)
    try:
        decoded = t.decode_tm_state(json.dumps(bad).encode())
    except t.TmStateError:
        pass
    else:
        assert isinstance(decoded, t.TmState)
    if isinstance(bad, dict) and "state" in bad:
        codec_mutations.assert_same_verdict(t.TmState, bad["state"])


def _small_state(**records: Any) -> t.TmState:
    base = t.TaskManagerState(
        job="job-0", tm="tm-1", config=Config(), first_checkpoint=1, hosted=(),
        savepoints=(), known_completed=0, finished_mark=0, known_aborted=(), known_watermark=0,
        finished_savepoints=(), reset_epoch=0, assigned_epoch=0, lost=(), ended=None,
        files=(
            t.FileRecord("job-0/chk-1/f1.tm-1", 3, False, "tm:tm-1", "tm-1"),
            t.FileRecord("job-0/chk-1/f2.tm-1", 3, False, "tm:tm-1", "tm-1"),
            t.FileRecord("job-0/chk-1/f3.tm-1", 3, False, "tm:tm-1", "tm-1"),
            t.FileRecord("job-0/chk-1/f4.tm-1", 3, False, "tm:tm-1", "tm-1"),
        ),
        directories=(), directory_owners=(), failed_uploads=(), deferred_deletes=(),
        refused_deletes=(), failed_deletes=(), bad_deletions=(), deletions=None, segments=(),
        physical_files=(), pools=(), outputs=(), acked=(), backend=(), subtask_pools=(),
        working=t.WorkingRecords((), (), (), (), (), ()),
    )  # fmt: skip
    return t.TmState(attrs.evolve(base, **records), 0, None)


def test_the_error_names_the_field_path() -> None:
    doc = json.loads(t.encode_tm_state(_small_state()))
    doc["state"]["records"]["files"][3]["size"] = "3"
    err = _refused(doc)
    assert str(err) == "$.state.records.files[3].size: expected int, got str '3'"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"path": "../outside"}, "$.state.records.files[1].path"),
        ({"path": "/etc/passwd"}, "$.state.records.files[1].path"),
        ({"path": "job-0//f"}, "$.state.records.files[1].path"),
        ({"path": "job-0/./f"}, "$.state.records.files[1].path"),
        ({"path": "job-0\\f"}, "$.state.records.files[1].path"),
        ({"path": ""}, "$.state.records.files[1].path"),
        ({"size": -1}, "$.state.records.files[1].size"),
        ({"path": "job-0/chk-1/f1.tm-1"}, "$.state.records.files[1]"),
    ],
)
def test_a_record_no_tm_could_have_made_is_refused(change: dict[str, Any], where: str) -> None:
    doc = json.loads(t.encode_tm_state(_small_state()))
    doc["state"]["records"]["files"][1].update(change)
    err = _refused(doc)
    assert err.where == where, str(err)
    state = _small_state()
    files = list(state.records.files)
    files[1] = attrs.evolve(files[1], **change)
    with pytest.raises(t.TmStateError):  # what is written can be read back
        t.encode_tm_state(
            attrs.evolve(state, records=attrs.evolve(state.records, files=tuple(files)))
        )


def test_a_segment_of_no_file_and_a_database_file_of_no_size_are_refused() -> None:
    seg = t.SegmentRecord("s1", "job-0/shared/f9", 0, 3, 1, 1, False)
    err = _refused(json.loads(t.encode_tm_state(_small_state()).replace(
        b'"segments":[]', json.dumps({"segments": [codec.encode(seg)]})[1:-1].encode()
    )))  # fmt: skip
    assert err.where == "$.state.records.segments[0].path"
    use = t.DatabaseUse(SubtaskId("map", 0, 1), ("job-0/taskowned/working/map-0-1/db/a",))
    with pytest.raises(t.TmStateError) as info:
        t.encode_tm_state(_small_state(working=t.WorkingRecords((use,), (), (), (), (), ())))
    assert info.value.where == "$.state.records.working.uses[0].files[0]"


def test_bytes_that_are_not_a_state_are_refused() -> None:
    for data, where in [
        (b"\x80\x04K\x01.", "$"),  # a pickle
        (b"[]", "$"),
        (b'{"format":"ckpt-tm-state","version":1}', "$"),
        (b'{"format":"ckpt-tm-state","version":1,"state":{},"x":1}', "$"),
        (b'{"format":"ckpt-tm-state","format":"ckpt-tm-state"}', "$"),
        (b'{"format":"ckpt-tm-state","version":1,"state":[]}', "$.state"),
    ]:
        with pytest.raises(t.TmStateError) as info:
            t.decode_tm_state(data)
        assert info.value.where == where, (data, str(info.value))


# ---------------------------------------------------------------------------- no pickle

PRODUCT = ("spec", "refimpl", "fastimpl", "pipeline", "conformance")
PICKLERS = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve", "marshal"}


def _pickle_uses(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in PICKLERS]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PICKLERS:
                found.append(node.module)
        elif isinstance(node, ast.Name) and node.id in PICKLERS:
            found.append(node.id)
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            named = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            arg = node.args[0]
            if named in ("__import__", "import_module") and isinstance(arg, ast.Constant):
                if str(arg.value).split(".")[0] in PICKLERS:
                    found.append(str(arg.value))
    return found


def test_no_module_of_the_product_pickles() -> None:
    offenders = {}
    files = [p for d in PRODUCT for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    for path in files:
        uses = _pickle_uses(path.read_text(encoding="utf-8"))
        if uses:
            offenders[str(path.relative_to(ROOT))] = uses
    assert offenders == {}


def test_the_check_for_pickle_finds_one() -> None:
    assert _pickle_uses("import pickle\n") == ["pickle"]
    assert _pickle_uses("from pickle import loads\n") == ["pickle"]
    assert _pickle_uses("import cloudpickle as c\n") == ["cloudpickle"]
    assert _pickle_uses("importlib.import_module('pickle')\n") == ["pickle"]
    assert _pickle_uses("x = __import__('json')\n") == []


# ---------------------------------------------------------------------------- forged files

SUB = SubtaskId("words", 0, 2)


class _RunsCode:
    """Unpickling it creates ``marker``: what a forged pickle could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Path.touch, (self.marker,))


def _setting(tmp_path: Path) -> tuple[TaskManagerRecipe, Path, Path]:
    store = tmp_path / "store"
    store.mkdir()
    db = tmp_path / "db"
    db.mkdir()
    config = Config.for_mode(MergingMode.ACROSS_CHECKPOINT, max_file_size=4096)
    return TaskManagerRecipe(f"file://{store}", "job-0", config), store, db


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_saved_state_is_taken_up_by_the_next_task(tmp_path: Path) -> None:
    recipe, _store, db = _setting(tmp_path)
    party = recipe.open(db, SUB, 1)
    assert party.new and party.not_taken is None
    party.write(1, SUB, StateKind.KEYED_SHARED, "a", b"x" * 100)
    party.acknowledge(1, SUB)
    party.lineage = "lineage-1"
    report = party.report()
    party.save(db)
    party.close()
    assert (db / TM_STATE).is_file() and json.loads((db / TM_STATE).read_bytes())["version"] == 1
    again = recipe.open(db, SUB, 2)
    assert not again.new and again.tm_id == party.tm_id and again.lineage == "lineage-1"
    assert not (db / TM_STATE).exists()  # the task's now
    assert json.loads(again.report())["owned"] == json.loads(report)["owned"]
    again.write(2, SUB, StateKind.KEYED_SHARED, "a", b"y" * 10)  # appends to the reopened pool
    assert again.created == 0  # no new file: the open pooled file was taken up
    again.close()


def test_a_forged_pickle_is_never_unpickled(tmp_path: Path) -> None:
    recipe, store, db = _setting(tmp_path)
    marker = tmp_path / "ran"
    forged = pickle.dumps(_RunsCode(marker))
    (store / "job-0").mkdir()
    (store / "job-0" / "keep").write_bytes(b"k")
    before = _tree(store)
    for name in (TM_STATE, OLD_TM_STATE):
        (db / name).write_bytes(forged)
    party = recipe.open(db, SUB, 5)
    assert party.new and not marker.exists()
    assert party.not_taken is not None and "undecodable" in party.not_taken
    assert not (db / OLD_TM_STATE).exists()  # an earlier version's pickle: removed unread
    party.close()
    (db / OLD_TM_STATE).write_bytes(forged)
    assert deliver_mail(recipe, db, SUB, ()) == b"" and not marker.exists()
    assert not (db / OLD_TM_STATE).exists()
    assert _tree(store) == before


PLAIN = "job-0/chk-1/f1.tm-1"


def _forged_state(store: Path, path: str) -> bytes:
    """A state of this job and subtask whose TM owns ``path`` and will delete it at the
    first notice (a whole file written for checkpoint 1, never acknowledged)."""
    entry = StateEntry(
        SUB, StateKind.OPERATOR_LIST, "ops", FileHandle(PLAIN, 1, "s1", Scope.EXCLUSIVE)
    )
    state = _small_state(
        hosted=(SUB,),
        files=(t.FileRecord(PLAIN, 1, False, "tm:tm-1", "tm-1"),),
        outputs=(t.Written(SUB, 1, (entry,)),),
    )
    doc = json.loads(t.encode_tm_state(state))
    doc["state"]["records"]["files"][0]["path"] = path  # encode refuses it: written by hand
    doc["state"]["records"]["outputs"][0]["entries"][0]["handle"]["path"] = path
    return json.dumps(doc).encode()


@pytest.mark.parametrize("path", ["../outside/victim", "/ABS/victim", "job-0/../../outside/victim"])
def test_a_forged_state_naming_a_path_out_of_the_base_deletes_nothing(
    path: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe, store, db = _setting(tmp_path)
    victim = tmp_path / "outside" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(b"v")
    path = path.replace("/ABS", str(tmp_path / "outside").replace("/victim", ""))
    (db / TM_STATE).write_bytes(_forged_state(store, path))
    party = recipe.open(db, SUB, 2)
    assert party.new and party.not_taken is not None
    assert "$.state.records.files[0].path" in party.not_taken
    assert any("not taken" in r.getMessage() for r in caplog.records)
    from spec.messages import CheckpointComplete, encode_message

    party.apply_mail([(party.tm_id, 1, encode_message(CheckpointComplete("job-0", 1, 1, False)))])
    party.close()
    assert victim.read_bytes() == b"v"


def test_another_jobs_or_subtasks_or_an_ended_state_is_not_taken(tmp_path: Path) -> None:
    recipe, _, db = _setting(tmp_path)
    ended = TmEnded("job-0", "tm-1", (), ())
    cases: list[tuple[dict[str, Any], str]] = [
        ({"job": "job-9", "hosted": (SUB,)}, "of job job-9"),
        ({"hosted": (SubtaskId("words", 1, 2),)}, "hosts"),
        ({"hosted": (SUB,), "ended": ended}, "ended"),
    ]
    for records, why in cases:
        (db / TM_STATE).write_bytes(t.encode_tm_state(_small_state(**records)))
        party = recipe.open(db, SUB, 3)
        assert party.new and party.not_taken is not None and why in party.not_taken
        assert not (db / TM_STATE).exists()
        party.close()


def test_the_worker_counts_creates_and_stops_at_a_delete_through_its_hooks(tmp_path: Path) -> None:
    """The worker's storage hooks (``WorkerHooks``) count what the TM creates and call
    ``on_delete`` once a delete is done, then clear it."""
    recipe, store, db = _setting(tmp_path)
    party = recipe.open(db, SUB, 1)
    party.write(1, SUB, StateKind.KEYED_SHARED, "a", b"x" * 100)
    party.write(1, SUB, StateKind.OPERATOR_LIST, "ops", b"o" * 100)
    assert party.created == 2  # one SHARED pool, one EXCLUSIVE pool
    gone: list[bool] = []
    from spec.messages import CheckpointAborted, encode_message

    paths = sorted(party.tm.m.pfiles)
    party.on_delete = lambda: gone.append(not any((store / p).exists() for p in paths[:1]))
    party.apply_mail([(party.tm_id, 1, encode_message(CheckpointAborted("job-0", 1, 0, False)))])
    assert gone == [True] and party.on_delete is None
    assert type(party.tm.catalog.storage).__name__ == "HookedStorage"
    assert isinstance(party.hooks, worker_tm.WorkerHooks)
    party.close()
    assert os.listdir(store / "job-0" / "shared" / SUB.dir_name()) == []


def test_a_state_naming_a_file_of_another_base_is_taken_but_the_file_never_deleted(
    tmp_path: Path,
) -> None:
    """A path inside the root but outside the job's base decodes (it is a path a TM may
    name: a handle of another job's checkpoint); the TM's guard refuses its delete (I5)."""
    recipe, store, db = _setting(tmp_path)
    victim = store / "job-7" / "chk-1" / "f1.tm-1"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"v")
    (db / TM_STATE).write_bytes(_forged_state(store, "job-7/chk-1/f1.tm-1"))
    party = recipe.open(db, SUB, 2)
    assert not party.new
    from spec.messages import CheckpointComplete, encode_message

    party.apply_mail([(party.tm_id, 1, encode_message(CheckpointComplete("job-0", 1, 1, False)))])
    assert json.loads(party.report())["refused"] == ["job-7/chk-1/f1.tm-1"]
    party.close()
    assert victim.read_bytes() == b"v"
