"""The versioned, checksummed, relative-path ``_metadata`` format (issue 3)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest
from attrs import evolve
from hypothesis import given
from hypothesis import strategies as st

from fastimpl.metadata import (
    MAGIC,
    MANAGED,
    Metadata,
    MetadataError,
    _canonical,
    base_of,
    decode,
    encode,
    metadata_bytes,
    resolve,
)
from fastimpl.storage import Storage
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
from spec.layout import job_base, metadata_path, savepoint_dir, shared_dir
from tests.metadata_samples import JOB, SUB, sample, sample_entries

BASE = job_base(JOB)
_roots = itertools.count()

# --------------------------------------------------------------------------- strategies

names = st.text(min_size=1, max_size=8)
components = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=6
).filter(lambda s: s not in (".", ".."))


@st.composite
def rel_paths(draw: st.DrawFn, base: str) -> str:
    parts = draw(st.lists(components, min_size=1, max_size=3))
    return "/".join([base, *parts])


@st.composite
def subtasks(draw: st.DrawFn) -> SubtaskId:
    p = draw(st.integers(1, 8))
    return SubtaskId(draw(names), draw(st.integers(0, p - 1)), p)


def handles(base: str) -> st.SearchStrategy[Handle]:
    """The handles a completed checkpoint's entry holds (placeholders and directory
    handles never: ``test_an_entry_names_the_bytes_it_holds``)."""
    n = st.integers(0, 2**40)
    scopes = st.sampled_from(Scope)
    return st.one_of(
        st.builds(SegmentHandle, rel_paths(base), n, n, names, scopes),
        st.builds(FileHandle, rel_paths(base), n, names, scopes),
    )


pairs = st.none() | st.tuples(st.integers(0, 1000), st.integers(0, 1000))


def entries_of(base: str) -> st.SearchStrategy[StateEntry]:
    return st.builds(
        StateEntry,
        subtasks(),
        st.sampled_from(StateKind),
        names,
        handles(base),
        st.integers(0, 10**6),
        pairs,
        pairs,
    )


@st.composite
def metadatas(draw: st.DrawFn) -> Metadata:
    job = draw(names)
    checkpoint = draw(st.integers(1, 10**9))
    savepoint = draw(st.booleans())
    base = savepoint_dir(checkpoint) if savepoint and draw(st.booleans()) else job_base(job)
    drawn = draw(st.lists(entries_of(base), max_size=5))
    # a logical id names one extent (R54): ids are unique, as the store draws them
    entries = tuple(
        attrs.evolve(e, handle=attrs.evolve(e.handle, logical_id=f"{i}-{e.handle.logical_id}"))
        if isinstance(e.handle, SegmentHandle | FileHandle)
        else e
        for i, e in enumerate(drawn)
    )
    managed = st.sampled_from(MANAGED).map(lambda m: f"{job_base(job)}/{m}")
    dirs = tuple(draw(st.lists(managed.flatmap(rel_paths), max_size=3, unique=True)))
    return Metadata(job, checkpoint, savepoint, entries, dirs)


# --------------------------------------------------------------------------- helpers


def reseal(doc: dict[str, Any]) -> bytes:
    """Re-encode a tampered document with a valid checksum, to reach later checks."""
    import hashlib

    doc["sha256"] = hashlib.sha256(_canonical(doc["payload"])).hexdigest()
    return _canonical(doc)


def tampered(edit: Any) -> bytes:
    doc = json.loads(sample())
    edit(doc)
    return reseal(doc)


def expect(data: bytes, *words: str, **kw: Any) -> MetadataError:
    with pytest.raises(MetadataError) as info:
        decode(data, source="j/chk-3/_metadata", **kw)
    msg = str(info.value)
    assert "j/chk-3/_metadata" in msg
    for w in words:
        assert w in msg, (w, msg)
    assert isinstance(info.value, ValueError)
    return info.value


# --------------------------------------------------------------------------- round trip


@given(metadatas(), st.none() | st.integers(1001, 32768))
def test_round_trip(meta: Metadata, max_par: int | None) -> None:
    """Without a max parallelism a version-1 file, with one a version-2 file (R77), whose
    key-group ranges must then lie within it (ordered pairs here)."""
    if max_par is not None:
        meta = evolve(
            meta,
            entries=tuple(
                e
                if e.key_groups is None
                else evolve(e, key_groups=(min(e.key_groups), max(e.key_groups)))
                for e in meta.entries
            ),
        )
    meta = evolve(meta, version=1 if max_par is None else 2, max_parallelism=max_par)
    args = (meta.checkpoint, meta.job, meta.savepoint, meta.entries, meta.directories)
    data = encode(*args, max_parallelism=max_par)
    back = decode(data, expected_job=meta.job)
    assert back == meta
    assert resolve(back) == meta
    assert metadata_bytes(*args, max_parallelism=max_par) == data


@pytest.mark.parametrize(
    "handle", [PlaceholderHandle("u1"), DirectoryHandle(f"{job_base(JOB)}/shared/src-0-2")]
)
@pytest.mark.parametrize("at", [0, 1])
def test_an_entry_names_the_bytes_it_holds(handle: Handle, at: int) -> None:
    """A subtask acknowledges placeholders (R22) and directories, but the coordinator
    resolves the one and lists the other apart before it writes ``_metadata``: an entry
    holding either is refused, naming the entry, wherever it stands (it restored as
    state nobody can read, I1)."""
    entries = list(sample_entries())
    entries[at] = evolve(entries[at], handle=handle)
    data = encode(3, JOB, False, tuple(entries), (f"{job_base(JOB)}/taskowned/tm1",))
    expect(data, f"entries[{at}].handle.type", "no state of a completed checkpoint")


def test_format_header() -> None:
    doc = json.loads(sample())
    assert doc["format"] == MAGIC
    assert doc["version"] == 1
    assert len(doc["sha256"]) == 64
    assert doc["payload"]["job"] == JOB
    assert doc["payload"]["checkpoint"] == 3
    for e in doc["payload"]["entries"]:
        assert not e["handle"]["path"].startswith("/")


def test_the_file_is_canonical_and_its_checksum_ignores_the_key_order() -> None:
    """The payload's digest is over its canonical form (keys sorted, no spaces), which
    encode writes; a file whose keys come in another order (another writer, a JSON tool)
    has the same digest and is read."""
    data = sample()
    doc = json.loads(data)
    assert data == _canonical(doc) + b"\n"

    def reversed_keys(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: reversed_keys(v[k]) for k in sorted(v, reverse=True)}
        if isinstance(v, list):
            return [reversed_keys(x) for x in v]
        return v

    shuffled = json.dumps(reversed_keys(doc)).encode()
    assert shuffled != data
    assert decode(shuffled) == decode(data)


@pytest.mark.parametrize(
    ("path", "base"),
    [
        ("savepoints/savepoint-3/_metadata", "savepoints/savepoint-3"),
        ("savepoints/savepoint-3/shared/x/f", "savepoints/savepoint-3"),
        ("savepoints", "savepoints"),
        ("job-1/chk-3/_metadata", "job-1"),
        ("job-1", "job-1"),
    ],
)
def test_the_base_of_a_path_is_its_job_base_or_savepoint_directory(path: str, base: str) -> None:
    assert base_of(path) == base


# --------------------------------------------------------------------------- bad input


def test_empty_file() -> None:
    expect(b"", "truncated")


def test_truncated() -> None:
    data = sample()
    for cut in (1, len(data) // 2, len(data) - 3):
        expect(data[:cut], "truncated or invalid JSON")


def test_invalid_json() -> None:
    expect(b"{not json", "invalid JSON")


def test_not_utf8() -> None:
    expect(b"\xff\xfe\x00", "UTF-8")


def test_not_an_object() -> None:
    expect(b"[1, 2]", "file", "expected an object")


def test_bad_magic() -> None:
    expect(tampered(lambda d: d.update(format="something-else")), "format", "bad magic")


def test_missing_magic() -> None:
    expect(tampered(lambda d: d.pop("format")), "format", "missing field")


def test_unsupported_version() -> None:
    expect(tampered(lambda d: d.update(version=99)), "version", "unsupported version 99")
    expect(tampered(lambda d: d.update(version=[1])), "version", "unsupported version")
    expect(tampered(lambda d: d.update(version=True)), "version", "unsupported version")


# --------------------------------------------------------------------------- inline state (R107)

INLINE = StateEntry(
    SUB, StateKind.KEYED_FULL, "MANIFEST", InlineHandle.of(b"\x00manifest\xff", "u3")
)


def inline_sample() -> bytes:
    return encode(
        3, JOB, False, (*sample_entries(), INLINE), (f"{BASE}/taskowned/tm1",), max_parallelism=128
    )


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=4))
def test_inline_state_round_trips_in_version_4(contents: list[bytes]) -> None:
    """A checkpoint with inline state writes version 4, whose handles carry the bytes;
    one without keeps writing version 2."""
    inline = tuple(
        StateEntry(SUB, StateKind.OPERATOR_LIST, f"op-{i}", InlineHandle.of(b, f"i{i}"))
        for i, b in enumerate(contents)
    )
    data = encode(3, JOB, False, (*sample_entries(), *inline), (), max_parallelism=128)
    back = decode(data, expected_job=JOB)
    assert back.version == (4 if inline else 2)
    assert back.entries == (*sample_entries(), *inline)
    got = [e.handle.content() for e in back.entries if isinstance(e.handle, InlineHandle)]
    assert got == contents


def _inline_doc(edit: Any) -> bytes:
    doc = json.loads(inline_sample())
    edit(doc, doc["payload"]["entries"][2]["handle"])
    return reseal(doc)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d, h: h.update(data="not base64!"), ("handle.data", "not base64")),
        (lambda d, h: h.update(length=99), ("handle.data", "where the handle says 99")),
        (lambda d, h: h.update(length=0), ("handle.length", "an integer >= 1, got 0")),
        (lambda d, h: h.update(data=7), ("handle.data", "expected a string")),
        (lambda d, h: h.pop("data"), ("handle", "data")),
        (lambda d, h: d.update(version=3), ("handle.type", "needs version 4, not 3")),
        (lambda d, h: d.update(version=2), ("handle.type", "needs version 4, not 2")),
        (
            lambda d, h: d["payload"]["entries"][2].update(kind="keyed_shared"),
            ("handle", "EXCLUSIVE state only (R107), not keyed_shared"),
        ),
    ],
    ids=["not-base64", "wrong-length", "empty", "data-not-text", "no-data", "v3", "v2", "shared"],
)
def test_damaged_inline_state_is_refused_naming_the_field(
    edit: Any, words: tuple[str, ...]
) -> None:
    assert decode(inline_sample()).entries[2] == INLINE
    expect(_inline_doc(edit), "payload.entries[2]", *words)


def test_checksum_mismatch() -> None:
    doc = json.loads(sample())
    doc["payload"]["entries"][0]["handle"]["length"] = 11  # a flipped value
    expect(_canonical(doc), "sha256", "checksum mismatch")


def test_bit_flip_in_file() -> None:
    data = bytearray(sample())
    i = data.index(b'"length":10')
    data[i + len(b'"length":')] = ord("9")
    expect(bytes(data), "checksum mismatch")


def test_missing_field() -> None:
    expect(
        tampered(lambda d: d["payload"]["entries"][0].pop("kind")),
        "payload.entries[0].kind",
        "missing field",
    )
    expect(tampered(lambda d: d["payload"].pop("checkpoint")), "payload.checkpoint", "missing")


def test_wrong_type() -> None:
    def edit(d: dict[str, Any]) -> None:
        d["payload"]["entries"][0]["handle"]["offset"] = "zero"

    expect(tampered(edit), "payload.entries[0].handle.offset", "expected an integer")


def test_unknown_kind_and_handle_type() -> None:
    expect(
        tampered(lambda d: d["payload"]["entries"][0].update(kind="nope")),
        "payload.entries[0].kind",
        "unknown state kind",
    )
    expect(
        tampered(lambda d: d["payload"]["entries"][0]["handle"].update(type="nope")),
        "handle.type",
        "unknown handle type",
    )


def test_foreign_job() -> None:
    expect(sample("other-job"), "payload.job", "foreign job id 'other-job'", expected_job=JOB)
    assert decode(sample(), expected_job=JOB).job == JOB


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc/passwd", "absolute path"),
        (f"{BASE}/../other/x", "'..' component"),
        ("../x", "'..' component"),
        ("other-job/shared/x", "outside the job base"),
        (f"{BASE}x/shared/f", "outside the job base"),
        (f"{BASE}//x", "not normalised"),
        ("s3://bucket/x", "absolute"),
    ],
    # Plain ids: make mutate's ``-k "not s3 ..."`` matches any id holding "s3", so an id
    # such as "s3://bucket/x-absolute" would leave this case out of every mutation run.
    ids=[
        "absolute",
        "inner-dotdot",
        "leading-dotdot",
        "other-job",
        "base-prefix",
        "empty-part",
        "protocol",
    ],
)
def test_path_outside_base(path: str, problem: str) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["payload"]["entries"][0]["handle"]["path"] = path

    err = expect(tampered(edit), "entries[0].handle.path", problem)
    assert err.field.endswith("entries[0].handle.path")


def test_directory_outside_base() -> None:
    expect(
        tampered(lambda d: d["payload"]["directories"].append("elsewhere/tm")),
        "directories[1]",
        "outside the job base",
    )


def test_savepoint_paths() -> None:
    sp = savepoint_dir(5)
    h = FileHandle(f"{sp}/f", 3, "u", Scope.EXCLUSIVE)
    e = StateEntry(SUB, StateKind.KEYED_FULL, "k", h)
    assert decode(encode(5, JOB, True, (e,), ())).entries == (e,)
    # no checkpoint refers to a savepoint's files (R55, R73: a savepoint restore never
    # claims, its first checkpoint is full): a file that does is refused, as a shared base
    with pytest.raises(MetadataError, match=r"shared_bases\[0\].*savepoint's directory"):
        encode(5, JOB, False, (e,), ())
    doc = json.loads(encode(5, JOB, True, (e,), ()))
    doc["payload"].update(savepoint=False, shared_bases=[sp])
    expect(reseal(doc), "shared_bases[0]", "savepoint's directory")


def test_cross_job_reference_is_declared() -> None:
    """A restored job's checkpoint may reference its predecessor's shared files (R95)."""
    prev = shared_dir("job-0", SUB)
    e = StateEntry(SUB, StateKind.KEYED_SHARED, "k", FileHandle(f"{prev}/f", 3, "u", Scope.SHARED))
    meta = decode(encode(7, "job-2", False, (e,), ()), expected_job="job-2")
    assert meta.shared_bases == ("job-0",)
    assert resolve(meta).entries == (e,)
    # an undeclared foreign base (tampered, resealed) is refused
    doc = json.loads(encode(7, "job-2", False, (e,), ()))
    doc["payload"]["shared_bases"] = []
    expect(reseal(doc), "entries[0].handle.path", "outside the job base")
    # a declared base must itself be a base directory, relative and without '..'
    for bad, problem in (("job-0/shared", "not a base directory"), ("..", "'..'")):
        doc["payload"]["shared_bases"] = [bad]
        expect(reseal(doc), "shared_bases[0]", problem)


def test_encode_refuses_bad_paths() -> None:
    e = StateEntry(SUB, StateKind.CHANNEL, "c", FileHandle("/abs/f", 1, "u", Scope.EXCLUSIVE))
    with pytest.raises(MetadataError, match="absolute path"):
        encode(1, JOB, False, (e,), ())


def test_encode_names_the_bad_path_it_refuses() -> None:
    """The write side names itself and the place of the path among those it checks (the
    entries' paths, then the directories, then the working files)."""
    bad = StateEntry(SUB, StateKind.CHANNEL, "c", FileHandle("/abs/f", 1, "u", Scope.EXCLUSIVE))
    with pytest.raises(MetadataError) as info:
        encode(1, JOB, False, (*sample_entries(JOB), bad), ())
    assert (info.value.source, info.value.field) == ("<encode>", "paths[2]")


def test_encode_refuses_a_working_file_outside_a_database_directory() -> None:
    """R103 on the write side: a working file outside a database directory is refused
    before any byte is written, as the reader would refuse the file."""
    stray = InPlaceFile(f"{BASE}/shared/win-1-2/f9", 400, (64, 127))
    with pytest.raises(MetadataError) as info:
        encode(
            3, JOB, False, sample_entries(JOB), (), max_parallelism=128, working=((W_SUB, stray),)
        )
    assert (info.value.source, info.value.field) == ("<encode>", "working[0].path")
    assert "not a working file" in info.value.problem


def test_resolve_refuses_bad_records() -> None:
    meta = Metadata(JOB, 1, False, (), (f"{BASE}/../x",))
    with pytest.raises(MetadataError, match=r"directories\[0\].*'\.\.' component"):
        resolve(meta)
    with pytest.raises(MetadataError, match="base"):
        resolve(decode(sample()), "../up")


def test_resolve_names_the_file_and_moves_every_path() -> None:
    """A refusal names the file it came from; a base prefixes every handle path and every
    directory once, and no base leaves them as stored."""
    bad = Metadata(JOB, 1, False, (), (f"{BASE}/../x",))
    with pytest.raises(MetadataError) as caught:
        resolve(bad, source="moved/job-1/chk-1/_metadata")
    assert caught.value.source == "moved/job-1/chk-1/_metadata"
    for wrong in ("/abs", "/abs/", "up/../..", ".."):
        with pytest.raises(MetadataError, match="base"):
            resolve(decode(sample()), wrong)
    meta = decode(sample())
    stored = [h.path for e in meta.entries if isinstance(h := e.handle, SegmentHandle | FileHandle)]
    assert stored and meta.directories
    assert resolve(meta) == meta
    assert resolve(meta, "") == meta
    # A base ending in characters a wrong strip would eat ("dirX", ".X": a valid name
    # whose stripped form "." is not) is checked and prefixed exactly as given.
    bases = (("Xdir", "Xdir/"), ("Xdir/", "Xdir/"), ("a/b", "a/b/"), ("dirX", "dirX/"))
    for base, prefix in (*bases, ("moved/.X", "moved/.X/"), ("a/..X/", "a/..X/")):
        moved = resolve(meta, base)
        paths = [
            h.path for e in moved.entries if isinstance(h := e.handle, SegmentHandle | FileHandle)
        ]
        assert paths == [prefix + p for p in stored], base
        assert moved.directories == tuple(prefix + d for d in meta.directories), base


# --------------------------------------------------------------------------- moving


def _mem_root() -> tuple[Any, str]:
    return fsspec.filesystem("memory"), f"/metadata-test-{next(_roots)}"


def _write_checkpoint(storage: Storage) -> dict[str, bytes]:
    files = {
        f"{shared_dir(JOB, SUB)}/seg-1": b"x" * 10,
        f"{BASE}/chk-3/f-2": b"y" * 7,
    }
    for p, data in files.items():
        full = storage.full(p)
        storage.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        storage.fs.pipe_file(full, data)
    storage.write_metadata(metadata_path(JOB, 3), sample())
    return files


def test_moved_checkpoint_still_decodes_and_resolves() -> None:
    fs, root = _mem_root()
    old = Storage(fs, root)
    files = _write_checkpoint(old)
    new_root = f"{root}-moved/elsewhere"
    fs.mv(f"{root}/{BASE}", f"{new_root}/{BASE}", recursive=True)
    assert not fs.exists(f"{root}/{BASE}")
    new = Storage(fs, new_root)
    meta = new.read_metadata(metadata_path(JOB, 3), expected_job=JOB)
    resolved = resolve(meta)
    paths = {e.handle.path for e in resolved.entries if isinstance(e.handle, SegmentHandle)}
    paths |= {e.handle.path for e in resolved.entries if isinstance(e.handle, FileHandle)}
    assert paths == set(files)
    for p in paths:
        assert fs.cat_file(new.full(p)) == files[p]
    # moved one level deeper below a storage root: resolve against the new container
    deeper = Storage(fs, f"{root}-moved")
    again = deeper.read_metadata(f"elsewhere/{metadata_path(JOB, 3)}", expected_job=JOB)
    for e in resolve(again, "elsewhere").entries:
        if isinstance(e.handle, SegmentHandle | FileHandle):
            assert fs.cat_file(deeper.full(e.handle.path)) == files[e.handle.path[10:]]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: b[: len(b) // 2],
        lambda b: b.replace(b'"length":10', b'"length":12'),
        lambda b: b"",
        lambda b: b.replace(MAGIC.encode(), b"foreign/format"),
    ],
    ids=["truncated", "checksum", "empty", "magic"],
)
def test_corrupt_metadata_through_storage_deletes_nothing(corrupt: Any) -> None:
    fs, root = _mem_root()
    storage = Storage(fs, root)
    _write_checkpoint(storage)
    path = metadata_path(JOB, 3)
    fs.pipe_file(storage.full(path), corrupt(fs.cat_file(storage.full(path))))
    before = storage.list_files()
    assert path in before and len(before) == 3
    with pytest.raises(MetadataError) as info:
        storage.read_metadata(path, expected_job=JOB)
    assert path in str(info.value)
    assert storage.list_files() == before


def test_foreign_metadata_through_storage_deletes_nothing() -> None:
    fs, root = _mem_root()
    storage = Storage(fs, root)
    _write_checkpoint(storage)
    before = storage.list_files()
    with pytest.raises(MetadataError, match="foreign job id"):
        storage.read_metadata(metadata_path(JOB, 3), expected_job="someone-else")
    assert storage.list_files() == before


# --------------------------------------------------------------------------- working files (§11)

W_SUB = SubtaskId("win", 1, 2)
W_FILE = InPlaceFile(f"{BASE}/taskowned/working/win-1-2/db/f9", 400, (64, 127))


def working_sample(*extra: tuple[SubtaskId, InPlaceFile]) -> bytes:
    return encode(
        3,
        JOB,
        False,
        sample_entries(JOB),
        (),
        max_parallelism=128,
        working=((W_SUB, W_FILE), *extra),
    )


def test_working_files_round_trip_in_version_3() -> None:
    """R103: the files a checkpoint refers to in place are listed beside its entries, in
    a version-3 file (a version-2 reader refuses it rather than restoring without
    them); one in a restored predecessor's base is declared as a shared base."""
    other = InPlaceFile("j0/taskowned/working/win-0-2/db/f1", 7, (0, 63))
    data = working_sample((SubtaskId("win", 0, 2), other))
    meta = decode(data, expected_job=JOB)
    assert json.loads(data)["version"] == 3
    assert meta.working == ((W_SUB, W_FILE), (SubtaskId("win", 0, 2), other))
    assert meta.shared_bases == ("j0",)
    moved = resolve(meta, "moved")
    assert moved.working[0][1].path == f"moved/{W_FILE.path}"
    nested = f"{BASE}/taskowned/working/win-1-2/db/compacted/01J.sst"  # SlateDB keeps folders
    data = working_sample((W_SUB, InPlaceFile(nested, 9, (64, 127))))
    assert decode(data).working[1][1].path == nested
    plain = encode(3, JOB, False, sample_entries(JOB), (), max_parallelism=128)
    assert json.loads(plain)["version"] == 2 and decode(plain).working == ()


def _working_tampered(edit: Any) -> bytes:
    doc = json.loads(working_sample())
    edit(doc["payload"]["working"][0])
    return reseal(doc)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda w: w.update(length=0), ("working[0].length", "expected an integer >= 1")),
        (lambda w: w.update(key_groups=[9, 3]), ("working[0].key_groups", "[9, 3]")),
        (lambda w: w.update(key_groups=[0, 128]), ("working[0].key_groups", "max parallelism")),
        (lambda w: w.update(key_groups=None), ("working[0].key_groups",)),
        (lambda w: w.pop("path"), ("working[0].path", "missing field")),
        (lambda w: w.update(color=1), ("working[0]", "unknown field(s) color")),
        (lambda w: w.update(path="../x"), ("working[0].path", "'..'")),
        (
            lambda w: w.update(path=f"{BASE}/shared/win-1-2/f9"),
            ("working[0].path", "not a working file"),
        ),
        (
            lambda w: w.update(path="elsewhere/taskowned/working/win-1-2/db/f9"),
            ("working[0].path", "outside the job base"),
        ),
        (lambda w: w.update(subtask=["win", 5, 2]), ("working[0].subtask",)),
        (
            lambda w: w.update(path=f"{BASE}/taskowned/working/win-1-2/db"),
            ("working[0].path", "not a working file"),
        ),
        (
            lambda w: w.update(path=f"{BASE}/shared/win-1-2/x/db/f9"),
            ("working[0].path", "not a working file"),
        ),
        # R105: a restore opens a file only for its referring subtask's operator
        (
            lambda w: w.update(path=f"{BASE}/taskowned/working/join-1-2/db/f9"),
            ("working[0].path", "not in a working directory of operator 'win'"),
        ),
        (
            lambda w: w.update(subtask=["join", 1, 2]),
            ("working[0].path", "of operator 'join'", "join[1/2]"),
        ),
        (
            lambda w: w.update(path=f"{BASE}/taskowned/working/win-1-1-2/db/f9"),
            ("working[0].path", "operator 'win'"),
        ),
    ],
    # Plain ids that say what is wrong: the ids pytest made ("<lambda>-words3") hold "s3",
    # which make mutate's ``-k "not s3 ..."`` leaves out.
    ids=[
        "no-bytes",
        "reversed-range",
        "past-max-parallelism",
        "no-range",
        "no-path",
        "unknown-field",
        "dotdot",
        "not-working",
        "outside-base",
        "subtask-index",
        "the-db-directory",
        "db-outside-working",
        "another-operators-file",
        "another-operators-subtask",
        "an-operator-named-like-a-prefix",
    ],
)
def test_a_bad_working_file_is_refused_naming_it(edit: Any, words: tuple[str, ...]) -> None:
    expect(_working_tampered(edit), *words)


def test_a_working_file_of_one_key_group_is_accepted() -> None:
    """A working file's key-group range is inclusive at both ends (as an entry's): a file
    holding one key group, ``[k, k]``, is a valid range."""
    one = InPlaceFile(f"{BASE}/taskowned/working/win-0-2/db/f1", 7, (5, 5))
    meta = decode(working_sample((SubtaskId("win", 0, 2), one)), expected_job=JOB)
    assert meta.working[1] == (SubtaskId("win", 0, 2), one)


def test_a_savepoint_refers_to_no_working_file() -> None:
    """R103: a savepoint is self-contained and refers to nothing in place, so a working
    file under its own directory (``savepoints/savepoint-N/taskowned/working/...``) is
    refused, though the path lies under one of the file's bases."""
    doc = json.loads(working_sample())
    doc["payload"]["savepoint"] = True
    doc["payload"]["working"][0]["path"] = f"{savepoint_dir(3)}/taskowned/working/win-1-2/db/f9"
    with pytest.raises(MetadataError) as info:
        decode(reseal(doc), source="savepoints/savepoint-3/_metadata")
    assert info.value.field == "working[0].path"
    assert "not a working file" in info.value.problem


def test_a_working_file_that_is_no_object_is_named() -> None:
    doc = json.loads(working_sample())
    doc["payload"]["working"] = [7]
    err = expect(reseal(doc), "expected an object")
    assert err.field == "payload.working[0]"


def test_working_files_not_a_list_and_missing_in_version_3() -> None:
    doc = json.loads(working_sample())
    doc["payload"]["working"] = {"path": "x"}
    expect(reseal(doc), "payload.working", "expected a list")
    doc["payload"].pop("working")
    expect(reseal(doc), "payload.working", "missing field")


# --------------------------------------------------------------------------- fields named


@pytest.mark.parametrize("field", ["key_groups", "entry_range"])
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0-63", "expected a list"),
        (["0", 63], "expected an integer"),
        ([0, "63"], "expected an integer"),
        ([0, True], "expected an integer"),
    ],
)
def test_a_bad_range_names_its_field(field: str, value: object, problem: str) -> None:
    """Either end of a key-group or entry range that is not an integer is refused with
    the range's field named, so a user can find it in the file."""

    def edit(d: dict[str, Any]) -> None:
        d["payload"]["entries"][0][field] = value

    err = expect(tampered(edit), f"payload.entries[0].{field}", problem)
    assert err.field == f"payload.entries[0].{field}"


@pytest.mark.parametrize("bounds", [(-2, 5), (-5, -2)])
def test_a_range_is_checked_for_type_not_sign(bounds: tuple[int, int]) -> None:
    """The decoder checks either bound of a range for type, not sign (a range's bounds
    are the store's business: ``StateEntry`` holds them as written)."""
    doc = json.loads(sample())
    doc["payload"]["entries"][1]["entry_range"] = list(bounds)
    assert decode(reseal(doc)).entries[1].entry_range == bounds


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda h: h.update(type=7), "expected a string"),
        (lambda h: h.pop("type"), "missing field"),
    ],
    ids=["not-a-string", "missing"],
)
def test_a_bad_handle_type_names_its_field(edit: Any, problem: str) -> None:
    err = expect(
        tampered(lambda d: edit(d["payload"]["entries"][0]["handle"])),
        "payload.entries[0].handle.type",
        problem,
    )
    assert err.field == "payload.entries[0].handle.type"


@pytest.mark.parametrize(
    ("checkpoint", "savepoint", "field", "words"),
    [
        (2, True, "payload.checkpoint", "names checkpoint 2, not savepoint 3"),
        (3, False, "payload.savepoint", "is false in a savepoint's file"),
    ],
)
def test_a_savepoint_file_in_another_place_is_named_as_a_savepoint(
    checkpoint: int, savepoint: bool, field: str, words: str
) -> None:
    """``savepoints/savepoint-3/_metadata`` must hold savepoint 3: the refusal says which
    of the two the path names, so the user knows what was moved where."""
    from fastimpl.metadata import check_named

    meta = Metadata(JOB, checkpoint, savepoint, sample_entries(), ())
    with pytest.raises(MetadataError) as info:
        check_named(meta, "savepoints/savepoint-3/_metadata")
    assert info.value.field == field
    assert words in str(info.value), str(info.value)


def _fields(doc: object, at: str) -> list[tuple[str, tuple[str | int, ...]]]:
    """Every field of a payload as (its name in an error, its key path), descending into
    the entries and their handles (lists of scalars are fields of their own)."""
    out: list[tuple[str, tuple[str | int, ...]]] = []

    def walk(v: object, name: str, keys: tuple[str | int, ...]) -> None:
        if isinstance(v, dict):
            for k in sorted(v):
                walk(v[k], f"{name}.{k}", (*keys, k))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for i, item in enumerate(v):
                walk(item, f"{name}[{i}]", (*keys, i))
        if (
            keys
            and not isinstance(v, dict)
            and not (isinstance(v, list) and v and isinstance(v[0], dict))
        ):
            out.append((name, keys))

    walk(doc, at, ())
    return out


_PAYLOAD_FIELDS = _fields(json.loads(sample())["payload"], "payload")


def _at(doc: dict[str, Any], keys: tuple[str | int, ...]) -> Any:
    for k in keys:
        doc = doc[k]  # type: ignore[index]
    return doc


@pytest.mark.parametrize(("name", "keys"), _PAYLOAD_FIELDS, ids=[n for n, _ in _PAYLOAD_FIELDS])
def test_every_field_missing_is_named(name: str, keys: tuple[str | int, ...]) -> None:
    """A field left out is refused with its whole name (``payload.entries[1].handle.length``),
    whichever field it is."""
    err = expect(tampered(lambda d: _at(d["payload"], keys[:-1]).pop(keys[-1])), name, "missing")
    assert err.field == name


@pytest.mark.parametrize(("name", "keys"), _PAYLOAD_FIELDS, ids=[n for n, _ in _PAYLOAD_FIELDS])
def test_every_field_of_the_wrong_type_is_named(name: str, keys: tuple[str | int, ...]) -> None:
    """A field holding an object where a value belongs is refused with its whole name."""

    def edit(d: dict[str, Any]) -> None:
        _at(d["payload"], keys[:-1])[keys[-1]] = {"x": 1}

    err = expect(tampered(edit), name)
    assert err.field == name


def _working_fields() -> list[tuple[str, tuple[str | int, ...]]]:
    payload = json.loads(working_sample())["payload"]
    return [(n, k) for n, k in _fields(payload, "payload") if k[0] == "working"]


@pytest.mark.parametrize(("name", "keys"), _working_fields(), ids=[n for n, _ in _working_fields()])
def test_every_field_of_a_working_file_missing_or_of_the_wrong_type_is_named(
    name: str, keys: tuple[str | int, ...]
) -> None:
    """As for the entries: a working file's field left out, or holding an object, is
    refused with its whole name (``payload.working[0].length``)."""
    for edit in ("missing", "object"):
        doc = json.loads(working_sample())
        parent = _at(doc["payload"], keys[:-1])
        if edit == "missing":
            parent.pop(keys[-1])
        else:
            parent[keys[-1]] = {"x": 1}
        err = expect(reseal(doc), name)
        assert err.field == name, (edit, err)


@pytest.mark.parametrize("edit", ["missing", "object"])
def test_the_entries_list_missing_or_no_list_is_named(edit: str) -> None:
    """The list of entries itself (a list of objects, which the field walk above steps
    into rather than tries) left out or holding an object is refused as ``payload.entries``."""

    def change(d: dict[str, Any]) -> None:
        if edit == "missing":
            d["payload"].pop("entries")
        else:
            d["payload"]["entries"] = {"x": 1}

    err = expect(tampered(change), "missing field" if edit == "missing" else "expected a list")
    assert err.field == "payload.entries"


@pytest.mark.parametrize("key", ["directories", "shared_bases"])
def test_a_path_of_a_list_that_is_no_string_is_named(key: str) -> None:
    """An item of ``directories`` or ``shared_bases`` that is no string is refused with its
    place (``payload.directories[0]``), not only the list's name."""
    err = expect(tampered(lambda d: d["payload"].update({key: [7]})), "expected a string")
    assert err.field == f"payload.{key}[0]"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "missing field"),
        ({"x": 1}, "expected an integer"),
        (0, "expected an integer >= 1"),
        (-3, "expected an integer >= 1"),
        (32769, "exceeds 32768"),
    ],
    ids=["missing", "object", "zero", "negative", "over-the-limit"],
)
def test_a_bad_max_parallelism_is_named(value: object, problem: str) -> None:
    """R77's record in a version-2 file (the sample above is version 1): left out, of the
    wrong type, below 1 or over Flink's limit, it is refused as ``payload.max_parallelism``,
    also in a file with no keyed entry, whose key groups would not catch a 0."""
    doc = json.loads(encode(3, JOB, False, (), (), max_parallelism=128))
    if value is None:
        doc["payload"].pop("max_parallelism")
    else:
        doc["payload"]["max_parallelism"] = value
    err = expect(reseal(doc), problem)
    assert err.field == "payload.max_parallelism"


@pytest.mark.parametrize("value", [1, 32768])
def test_max_parallelism_is_accepted_from_one_to_the_limit(value: int) -> None:
    assert decode(encode(3, JOB, False, (), (), max_parallelism=value)).max_parallelism == value


@pytest.mark.parametrize(
    ("key_groups", "ok"),
    [((5, 5), True), ((0, 127), True), ((9, 3), False), ((-2, 5), False), ((0, 128), False)],
    ids=["one-group", "all-groups", "reversed", "negative", "past-the-last"],
)
def test_an_entrys_key_groups_lie_within_the_max_parallelism(
    key_groups: tuple[int, int], ok: bool
) -> None:
    """R77 in a version-2 file: an entry's key groups are an inclusive range [first, last]
    with 0 <= first <= last < max parallelism; one group, [k, k], is a range."""
    entries = (attrs.evolve(sample_entries(JOB)[0], key_groups=key_groups),)
    doc = json.loads(encode(3, JOB, False, sample_entries(JOB)[:1], (), max_parallelism=128))
    doc["payload"]["entries"][0]["key_groups"] = list(key_groups)
    if ok:
        assert decode(reseal(doc)).entries == entries
    else:
        err = expect(reseal(doc), "outside the key groups of max parallelism 128")
        assert err.field == "payload.entries[0].key_groups"


_OBJECTS = [
    "payload",
    "payload.entries[0]",
    "payload.entries[0].handle",
    "payload.entries[1].handle",
]


@pytest.mark.parametrize("name", _OBJECTS)
def test_an_object_that_is_no_object_is_named(name: str) -> None:
    keys = [k for k in name.replace("[", ".").replace("]", "").split(".")[1:]]

    def edit(d: dict[str, Any]) -> None:
        path = [int(k) if k.isdigit() else k for k in keys]
        parent: Any = d["payload"] if path else d
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1] if path else "payload"] = 7

    err = expect(tampered(edit), name, "expected an object")
    assert err.field == name


@pytest.mark.parametrize("at", [0, 1, 2])
def test_a_bad_subtask_part_names_the_subtask(at: int) -> None:
    def edit(d: dict[str, Any]) -> None:
        d["payload"]["entries"][0]["subtask"][at] = {"x": 1}

    err = expect(tampered(edit), "payload.entries[0].subtask")
    assert err.field == "payload.entries[0].subtask"


@pytest.mark.parametrize("name", ["format", "version", "sha256", "payload"])
def test_every_header_field_missing_is_named(name: str) -> None:
    doc = json.loads(sample())
    doc.pop(name)
    with pytest.raises(MetadataError) as info:
        decode(_canonical(doc), source="j/chk-3/_metadata")
    assert info.value.field == name
    assert "missing field" in str(info.value)


def test_a_document_that_is_no_object_is_named_as_the_file() -> None:
    with pytest.raises(MetadataError) as info:
        decode(b"[1, 2]", source="j/chk-3/_metadata")
    assert info.value.field == "file"


def test_a_sha256_that_is_no_string_is_named() -> None:
    doc = json.loads(sample())
    doc["sha256"] = 7
    with pytest.raises(MetadataError) as info:
        decode(_canonical(doc), source="j/chk-3/_metadata")
    assert info.value.field == "sha256"


def test_the_size_limit_refuses_only_what_is_over_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MAX_BYTES`` is the largest file read: one of exactly that size is parsed."""
    import fastimpl.metadata as m

    data = sample()
    monkeypatch.setattr(m, "MAX_BYTES", len(data))
    assert decode(data).checkpoint == 3
    monkeypatch.setattr(m, "MAX_BYTES", len(data) - 1)
    with pytest.raises(MetadataError, match="more than"):
        decode(data)


@pytest.mark.parametrize("n", [2**63 - 1, -(2**63 - 1)])
def test_the_largest_integer_is_accepted(n: int) -> None:
    doc = json.loads(sample())
    doc["payload"]["entries"][1]["entry_range"] = [0, n] if n > 0 else [n, 0]
    assert n in decode(reseal(doc)).entries[1].entry_range  # type: ignore[operator]


@pytest.mark.parametrize("at", [0, 1])
def test_an_entry_without_a_handle_names_it(at: int) -> None:
    err = expect(
        tampered(lambda d: d["payload"]["entries"][at].pop("handle")),
        f"payload.entries[{at}].handle",
        "missing field",
    )
    assert err.field == f"payload.entries[{at}].handle"
