"""Hostile ``_metadata``, generated structure-aware (issue 14): restore, restart and recovery
either refuse it with a clear error or keep every file that is not the job's own.

Each example starts from real storage written through the public API on local disk (where
a path that escapes its base is dangerous: the operating system resolves ``..``)::

    <tmp>/outside/secret.bin                    outside the storage root
    <tmp>/root/notes.txt                        a user's file at the storage root
    <tmp>/root/other-app/...                    a sibling application's folder
    <tmp>/root/job-0/...                        job-0, the source of a NO_CLAIM restore
    <tmp>/root/savepoints/savepoint-3/...       a savepoint of job-0 (plus a user's file)
    <tmp>/root/job-1/...                        job-1, restored from job-0 in NO_CLAIM mode

then decodes the ``_metadata`` of job-1's newest retained checkpoint, applies one to three
mutations to its payload (paths with ``..``, ``.``, empty components, backslashes, NUL,
absolute and protocol paths, paths into the other bases above, odd unicode, huge and
negative numbers, duplicate logical ids, deep nesting, wrong types), reseals it with a
valid checksum and meets it with one reader: ``restore`` in CLAIM or NO_CLAIM mode,
``restart`` (which fails over), or ``CheckpointStore.recover``, followed by three
checkpoints whose subsumes delete what the store believes it owns.

Every reader must either refuse with a clear error (``MetadataError`` naming the file and
the field, ``RecoveryError`` naming the file, or a ``CommandError`` with a reason) or run
on, and in both cases every file outside job-1 and its successors must still be there,
byte for byte. A bare ``AssertionError``, ``RecursionError``, ``OSError`` or ``KeyError``
is a failure, and so is a lost sentinel. Hypothesis prints the shrunk mutations readably
(``Mutation.__repr__``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastimpl import CheckpointStore, CounterIds, MetadataError, RecoveryError
from fastimpl.storage import WRITER_LEASE
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.errors import CommandError
from spec.layout import metadata_path

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)
SAVEPOINT = 3
"""job-0 completes checkpoints 1 and 2, then takes savepoint 3."""

_EXAMPLES = max(10, (settings.default.max_examples if settings.default else 100) // 4)
"""Each example writes two jobs and a savepoint to disk and meets one reader: a quarter
of the profile's examples keeps the ``ci`` run near a minute."""


# --------------------------------------------------------------------------- the storage


@attrs.define
class World:
    """One example's storage and the live store of job-1."""

    tmp: Path
    root: Path
    outside: Path
    store: CheckpointStore
    config: Config
    target: str
    """job-1's newest retained ``_metadata``, root-relative: the file the mutations edit."""

    def token(self, name: str) -> str:
        """The concrete path a symbolic path token stands for in this example."""
        files = sorted(
            str(p.relative_to(self.root)) for p in (self.root / "job-0").rglob("*") if p.is_file()
        )
        data = [f for f in files if not f.endswith("_metadata")]
        sp = sorted(
            str(p.relative_to(self.root))
            for p in (self.root / "savepoints" / f"savepoint-{SAVEPOINT}").rglob("*")
            if p.is_file() and not p.name.startswith("_")
        )
        dirs = sorted(
            str(p.relative_to(self.root))
            for p in (self.root / "job-0").rglob("*")
            if p.is_dir() and not p.name.startswith("chk-")
        )
        return {
            "<job-0 file>": data[0] if data else "job-0/chk-1/_metadata",
            "<job-0 dir>": dirs[0] if dirs else "job-0/shared",
            "<savepoint file>": sp[0] if sp else f"savepoints/savepoint-{SAVEPOINT}/x",
            "<outside abs>": str(self.outside / "secret.bin"),
            "<root abs>": str(self.root),
        }[name]

    def sentinels(self) -> dict[str, str]:
        """Every file that is not job-1's or a successor's, nor the writer lease: path ->
        SHA-256 of its bytes."""
        out: dict[str, str] = {}
        for top in (self.outside, self.root):
            for p in sorted(top.rglob("*")):
                if p.is_symlink() or not p.is_file():
                    continue
                rel = p.relative_to(self.tmp)
                parts = rel.parts
                if parts[:2] == ("root", WRITER_LEASE):
                    continue  # the store's own lease: written by whichever store owns the base
                if parts[0] == "root" and len(parts) > 1 and parts[1].startswith("job-"):
                    if parts[1] != "job-0":
                        continue  # job-1 and the jobs started from it are the store's own
                out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
        return out


def _checkpoint(store: CheckpointStore, *, savepoint: bool = False) -> int:
    coord = store.coordinator
    cid = coord.trigger(savepoint=savepoint)
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        mgr.write(cid, sub, KS, f"sst-{cid}", f"{sub}/sst/{cid}".encode() * 8)
        mgr.write(cid, sub, OP, "offsets", f"{sub}/offsets/{cid}".encode() * 4)
        mgr.acknowledge(cid, sub)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    store.flush()
    return cid


def _world(tmp: Path, mode: MergingMode) -> World:
    root, outside = tmp / "root", tmp / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"outside the storage root\n" * 3)
    root.mkdir()
    (root / "notes.txt").write_bytes(b"the user's notes at the storage root\n")
    (root / "other-app" / "state").mkdir(parents=True)
    (root / "other-app" / "state" / "data.bin").write_bytes(b"a sibling application\n" * 5)
    config = Config.for_mode(mode, num_retained=2)
    store = CheckpointStore(str(root), config, JOB, ids=CounterIds())
    for _ in range(2):
        _checkpoint(store)
    assert _checkpoint(store, savepoint=True) == SAVEPOINT
    (root / "savepoints" / f"savepoint-{SAVEPOINT}" / "users-note.txt").write_bytes(b"mine\n")
    assert store.coordinator.restore(2, mode=RestoreMode.NO_CLAIM) == "job-1"
    for _ in range(3):
        _checkpoint(store)
    newest = store.coordinator.retained()[-1].checkpoint
    return World(tmp, root, outside, store, config, metadata_path("job-1", newest))


# --------------------------------------------------------------------------- mutations


@attrs.frozen(repr=False)
class Mutation:
    """One edit of the decoded payload. ``where`` picks an entry (modulo their count);
    values in angle brackets are path tokens (``World.token``)."""

    kind: str
    field: str = ""
    value: Any = None
    where: int = 0
    also_base: bool = False

    def __repr__(self) -> str:
        extra = " (+ its base in shared_bases)" if self.also_base else ""
        at = f"[{self.where}]" if self.kind in ("entry", "dup-id", "deep", "digits") else ""
        return f"{self.kind}{at} {self.field} = {self.value!r}{extra}".replace("  ", " ")


_OWN = "job-1"
PATHS: list[str] = [
    # traversal: leading, inner and trailing '..', '.', empty components, separators
    f"{_OWN}/..",
    f"{_OWN}/../job-0",
    f"{_OWN}/shared/../..",
    f"{_OWN}/shared/../../other-app",
    "../outside/secret.bin",
    "..",
    ".",
    "",
    f"./{_OWN}",
    f"{_OWN}/./shared",
    f"{_OWN}//shared",
    f"{_OWN}/shared/",
    f"{_OWN}\\..\\..",
    "job-1\\..\\other-app",
    f"{_OWN}/x\0/../..",
    # absolute and protocol paths
    "<outside abs>",
    "<root abs>",
    "/",
    "file://<outside abs>",
    "memory://root/x",
    "s3://bucket/key",
    "C:/x",
    # other bases under the root
    "savepoints",
    f"savepoints/savepoint-{SAVEPOINT}",
    "<savepoint file>",
    "other-app",
    "other-app/state/data.bin",
    "job-0",
    "<job-0 file>",
    "<job-0 dir>",
    "notes.txt",
    "job-9",
    # odd unicode and encodings
    f"{_OWN}/\uff0e\uff0e",
    f"{_OWN}/\u2215..",
    f"{_OWN}/\u202e..",
    f"{_OWN}/\udcff",
    f"{_OWN}/e\u0301",
    f"{_OWN}/%2e%2e",
    # sizes
    f"{_OWN}/" + "n" * 300,
    f"{_OWN}/" + "/".join(["d"] * 2100),
]
NUMBERS: list[int] = [2**63, 2**63 - 1, 2**70, -1, -(2**63), 0, 2**31]
WRONG: list[Any] = [None, "3", 3.5, True, [], {}, [1, 2, 3], {"path": "job-1"}]
NUMBER_FIELDS = [
    "offset",
    "length",
    "checkpoint",
    "subtask.index",
    "subtask.parallelism",
    "entries",
    "key_groups.lo",
    "key_groups.hi",
]
TYPE_FIELDS = [*NUMBER_FIELDS, "path", "id", "type", "scope", "kind", "job", "savepoint"]
TYPE_FIELDS += ["directories", "shared_bases", "entries[]", "handle", "subtask", "name"]


def _mutations() -> st.SearchStrategy[Mutation]:
    where = st.integers(0, 50)
    path = st.sampled_from(PATHS)
    return st.one_of(
        st.builds(
            Mutation,
            st.just("entry"),
            st.just("handle.path"),
            path,
            where,
            st.booleans(),
        ),
        st.builds(
            Mutation, st.just("add"), st.just("directories"), path, st.just(0), st.booleans()
        ),
        st.builds(Mutation, st.just("add"), st.just("shared_bases"), path),
        st.builds(
            Mutation,
            st.just("entry"),
            st.sampled_from(NUMBER_FIELDS),
            st.sampled_from(NUMBERS),
            where,
        ),
        st.builds(
            Mutation, st.just("entry"), st.sampled_from(TYPE_FIELDS), st.sampled_from(WRONG), where
        ),
        st.builds(
            Mutation, st.just("dup-id"), st.sampled_from(["same", "moved"]), st.none(), where
        ),
        st.builds(
            Mutation,
            st.just("deep"),
            st.sampled_from(["handle", "directories", "shared_bases", "key_groups"]),
            st.sampled_from([64, 2_000, 200_000]),
            where,
        ),
        st.builds(
            Mutation,
            st.just("digits"),
            st.sampled_from(["offset", "length", "entries", "checkpoint"]),
            st.sampled_from([4300, 5000]),
            where,
        ),
        st.builds(
            Mutation,
            st.just("set"),
            st.just("job"),
            st.sampled_from(["job-0", "other-app", "job-1/..", "..", "savepoints", ""]),
        ),
        st.builds(Mutation, st.just("set"), st.just("savepoint"), st.just(True)),
        st.builds(
            Mutation,
            st.just("entry"),
            st.just("name"),
            st.sampled_from(["\u202egnp.exe", "\udcff", "a" * 10_000, "../x", "\0"]),
            where,
        ),
    )


_DEEP = "@@deep@@"


def _base_of(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "savepoints" and len(parts) > 1 else parts[0]


def _apply(m: Mutation, payload: dict[str, Any], world: World) -> bytes | None:
    """Edit ``payload`` in place; return the text to splice in at ``_DEEP`` (what
    ``json.dumps`` cannot write: nesting past the recursion limit, an integer of more
    than 4300 digits)."""
    value = m.value
    if isinstance(value, str) and "<" in value:
        for token in ("<outside abs>", "<root abs>", "<savepoint file>", "<job-0 file>"):
            value = value.replace(token, world.token(token))
        value = value.replace("<job-0 dir>", world.token("<job-0 dir>"))
    entries = payload["entries"]
    e = entries[m.where % len(entries)] if isinstance(entries, list) and entries else None
    if m.also_base and isinstance(value, str):
        payload["shared_bases"] = [*payload["shared_bases"], _base_of(value)]
    if m.kind == "add":
        payload[m.field] = [*payload[m.field], value]
    elif m.kind == "set":
        payload[m.field] = value
    elif m.kind == "dup-id" and isinstance(e, dict):
        twin = json.loads(json.dumps(e))
        if m.field == "moved" and "path" in twin["handle"]:
            twin["handle"]["path"] = world.token("<job-0 file>")
            payload["shared_bases"] = [*payload["shared_bases"], "job-0"]
        entries.append(twin)
    elif m.kind == "deep":
        if m.field in ("directories", "shared_bases"):
            payload[m.field] = _DEEP
        elif isinstance(e, dict):
            e[m.field] = _DEEP
        return b"[" * int(value) + b"]" * int(value)
    elif m.kind == "digits":
        if m.field == "checkpoint":
            payload["checkpoint"] = _DEEP
        elif isinstance(e, dict):
            _set_entry_field(e, m.field, _DEEP)
        return b"9" * int(value)
    elif m.kind == "entry" and m.field in ("checkpoint", "job", "savepoint"):
        payload[m.field] = value
    elif m.kind == "entry" and isinstance(e, dict):
        _set_entry_field(e, m.field, value)
    return None


def _set_entry_field(e: dict[str, Any], field: str, value: Any) -> None:
    h = e["handle"]
    if field in ("path", "handle.path", "offset", "length", "id", "type", "scope"):
        h[field.removeprefix("handle.")] = value
    elif field == "subtask.index":
        e["subtask"][1] = value
    elif field == "subtask.parallelism":
        e["subtask"][2] = value
    elif field in ("key_groups.lo", "key_groups.hi"):
        kg = e["key_groups"] if isinstance(e["key_groups"], list) else [0, 0]
        kg[0 if field.endswith("lo") else 1] = value
        e["key_groups"] = kg
    elif field == "entries[]":
        e.clear()
        e.update({"entries": value})
    else:
        e[field] = value


def _canonical(obj: object) -> bytes:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def _reseal(data: bytes, mutations: list[Mutation], world: World) -> bytes:
    """The file with its payload edited and a checksum that matches the edit."""
    doc = json.loads(data)
    splice = None
    for m in mutations:
        splice = _apply(m, doc["payload"], world) or splice
    body = _canonical(doc["payload"])
    if splice is not None:
        body = body.replace(json.dumps(_DEEP).encode(), splice)
    digest = hashlib.sha256(body).hexdigest()
    rest = {k: v for k, v in doc.items() if k not in ("payload", "sha256")}
    head = _canonical({**rest, "payload": None, "sha256": digest})
    return head.replace(b'"payload":null', b'"payload":' + body, 1) + b"\n"


# --------------------------------------------------------------------------- the readers


def _restore(mode: RestoreMode) -> Callable[[World], CheckpointStore]:
    def run(w: World) -> CheckpointStore:
        newest = w.store.coordinator.retained()[-1].checkpoint
        w.store.coordinator.restore(newest, mode=mode)
        return w.store

    return run


def _restart(w: World) -> CheckpointStore:
    w.store.coordinator.restart()
    return w.store


def _recover(w: World) -> CheckpointStore:
    store, _ = CheckpointStore.recover(str(w.root), w.config, JOB, crashed_job="job-1")
    return store


READERS: dict[str, Callable[[World], CheckpointStore]] = {
    "restore-claim": _restore(RestoreMode.CLAIM),
    "restore-no-claim": _restore(RestoreMode.NO_CLAIM),
    "restart": _restart,
    "recover": _recover,
}


def _clear(err: BaseException, target: str) -> str | None:
    """Why ``err`` is not a clear refusal, or ``None`` if it is one."""
    if isinstance(err, MetadataError):
        if "_metadata" not in err.source or not err.field:
            return f"MetadataError names no file or field: {err}"
        return None
    if isinstance(err, RecoveryError):
        return None if "_metadata" in str(err) else f"RecoveryError names no file: {err}"
    if isinstance(err, CommandError):
        return None if err.detail else f"CommandError without detail: {err!r}"
    return f"not a clear refusal: {type(err).__name__}: {str(err)[:300]}"


@settings(max_examples=_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(list(MergingMode)),
    reader=st.sampled_from(sorted(READERS)),
    mutations=st.lists(_mutations(), min_size=1, max_size=3),
)
def test_hostile_metadata_is_refused_or_harmless(
    mode: MergingMode, reader: str, mutations: list[Mutation]
) -> None:
    with tempfile.TemporaryDirectory(prefix="hostile-") as d:
        world = _world(Path(d), mode)
        before = world.sentinels()
        target = world.root / world.target
        hostile = _reseal(target.read_bytes(), mutations, world)
        target.write_bytes(hostile)
        problem: str | None = None
        try:
            store = READERS[reader](world)
            for _ in range(3):
                _checkpoint(store)
        except Exception as err:
            problem = _clear(err, world.target)
        after = world.sentinels()
        lost = sorted(p for p in before if p not in after)
        changed = sorted(p for p in before if p in after and after[p] != before[p])
        assert not lost and not changed, (
            f"{reader} on {mode.name}: sentinels lost {lost[:8]} changed {changed[:8]}"
            f" (of {len(before)}); the refusal, if any: {problem}"
        )
        assert problem is None, f"{reader} on {mode.name}: {problem}"
        # Nothing outside the tree's own dirs was created either (a path that escaped).
        assert sorted(os.listdir(d)) == ["outside", "root"]


def test_an_unmutated_file_passes_every_reader() -> None:
    """The harness itself: with no mutation every reader runs on and keeps every sentinel
    (so the property above fails only for what a mutation did)."""
    for mode in MergingMode:
        for reader in sorted(READERS):
            with tempfile.TemporaryDirectory(prefix="hostile-") as d:
                world = _world(Path(d), mode)
                before = world.sentinels()
                target = world.root / world.target
                resealed = _reseal(target.read_bytes(), [], world)
                assert resealed == target.read_bytes(), "the reseal changes an unedited file"
                store = READERS[reader](world)
                for _ in range(3):
                    _checkpoint(store)
                assert world.sentinels() == before, (reader, mode)
