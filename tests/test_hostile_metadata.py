"""Hostile (or merely confused) ``_metadata``: checksum-valid files that name what is not
the store's (issue 14, defects 1 and 6).

1. Paths: ``fastimpl.metadata.path_parts`` is the one check of every path a file names.
   Each malformed form (leading, inner and trailing ``..``, ``.``, empty components,
   doubled separators, backslashes, NUL, control characters, unpaired surrogates,
   absolute and protocol paths, over-long components and paths) is refused in each field:
   a handle's path, ``directories``, ``shared_bases``, the job id, and the base a moved
   job is resolved against.
2. Ownership: a file that gets past the decoder (well-formed, inside the bases it
   declares) still cannot make a CLAIM restore, a coordinator restart or a recovery give
   the coordinator a file outside the job's lineage. Sentinel files are planted in a
   completed savepoint, in a NO_CLAIM source, in a sibling application's folder, in an
   unrelated job's base and outside the root; every deleting path runs (subsume, abort,
   failover cleanup, ``cancel(retain=False)``, recovery's garbage collection, the
   background deleter) and every sentinel survives, byte for byte.
3. The guard: a delete outside what the store can prove it owns is refused before it
   happens, recorded, and reported by ``check_invariants()`` as I5.
4. Crashes instead of reports (defect 6): duplicate logical ids, deep nesting, huge
   integers, unpaired surrogates and an unreadable directory give a
   ``MetadataError``/``RecoveryError`` naming the file and the problem; nothing changes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastimpl import CheckpointStore, MetadataError, RecoveryError, testing
from fastimpl.metadata import (
    MAX_PATH,
    Metadata,
    _canonical,
    check_ids,
    decode,
    encode,
    path_parts,
    resolve,
)
from fastimpl.recovery import RecoveryReport, recover
from spec.config import Config, MergingMode, RestoreMode, Scope, StateKind
from spec.effects import COORDINATOR, USER
from spec.handles import PlaceholderHandle, SegmentHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.layout import metadata_path, savepoint_dir, shared_dir
from tests.faultyfs import FaultyFileSystem, Ledger, Place, payload
from tests.metadata_samples import sample
from tests.storage_settings import (
    FILE_SETTINGS,
    JOB,
    KS,
    OP,
    SETTINGS,
    _config,
    _listing,
    _options,
    _setting_id,
    _unchanged,
    setting,  # noqa: F401 (a fixture)
)
from tests.storage_settings import place as place

SUB = SubtaskId("src", 0, 2)

# --------------------------------------------------------------------------- 1. paths

BAD_FORMS: dict[str, Callable[[str], str]] = {
    "leading ..": lambda p: "../" + p,
    "inner ..": lambda p: p.replace("/", "/../", 1),
    "trailing ..": lambda p: p + "/..",
    "bare ..": lambda p: "..",
    "leading .": lambda p: "./" + p,
    "inner .": lambda p: p.replace("/", "/./", 1),
    "trailing .": lambda p: p + "/.",
    "empty component": lambda p: p.replace("/", "//", 1),
    "trailing separator": lambda p: p + "/",
    "backslash": lambda p: p.replace("/", "\\", 1),
    "backslash dotdot": lambda p: p + "\\..\\..",
    "NUL": lambda p: p + "\0x",
    "control character": lambda p: p + "\nx",
    "DEL": lambda p: p + "\x7fx",
    "absolute": lambda p: "/" + p,
    "windows absolute": lambda p: "C:\\" + p,
    "protocol": lambda p: "s3://bucket/" + p,
    "chained protocol": lambda p: "simplecache::" + p,
    "drive": lambda p: "C:/" + p,
    "bare drive": lambda p: "C:",
    "unpaired surrogate": lambda p: p + "/\udc80",
    "long component": lambda p: p + "/" + "x" * 256,
    "past PATH_MAX": lambda p: p + ("/" + "y" * 200) * (MAX_PATH // 200 + 1),
    "empty": lambda p: "",
}


def _sample() -> bytes:
    return sample("job-0")


def _reseal_doc(doc: dict[str, Any]) -> bytes:
    doc["sha256"] = hashlib.sha256(_canonical(doc["payload"])).hexdigest()
    return _canonical(doc)


def _field_edits(bad: Callable[[str], str]) -> dict[str, Callable[[dict[str, Any]], None]]:
    def handle(d: dict[str, Any]) -> None:
        h = d["entries"][0]["handle"]
        h["path"] = bad(h["path"])

    def directory(d: dict[str, Any]) -> None:
        d["directories"][0] = bad(d["directories"][0])

    def shared_base(d: dict[str, Any]) -> None:
        # a base has one component: an inner form is applied to one with two, which
        # ``base_of`` would refuse on its own too, so the single-component forms count
        d["shared_bases"] = [bad("job-9") if bad("job-9") != "job-9" else bad("job-9/x")]

    return {"handle": handle, "directories": directory, "shared_bases": shared_base}


FIELD_NAMES = {
    "handle": "entries[0].handle.path",
    "directories": "directories[0]",
    "shared_bases": "shared_bases[0]",
}


@pytest.mark.parametrize("form", list(BAD_FORMS))
@pytest.mark.parametrize("field", list(FIELD_NAMES))
def test_every_malformed_path_is_refused_in_every_field(field: str, form: str) -> None:
    doc = json.loads(_sample())
    _field_edits(BAD_FORMS[form])[field](doc["payload"])
    try:
        data = _reseal_doc(doc)
    except UnicodeEncodeError:
        # a lone surrogate cannot even be written canonically: write it escaped, as a
        # hostile writer would, with the checksum of what the reader will compute
        raw = json.dumps(doc, ensure_ascii=True).encode()
        with pytest.raises(MetadataError) as info:
            decode(raw, source="job-0/chk-3/_metadata")
        assert "job-0/chk-3/_metadata" in str(info.value)
        return
    with pytest.raises(MetadataError) as info:
        decode(data, source="job-0/chk-3/_metadata")
    msg = str(info.value)
    assert "job-0/chk-3/_metadata" in msg
    assert FIELD_NAMES[field] in msg, msg


@pytest.mark.parametrize("form", list(BAD_FORMS))
def test_every_malformed_base_of_a_moved_job_is_refused(form: str) -> None:
    meta = decode(_sample())
    base = BAD_FORMS[form]("moved/here")
    if not base or base.rstrip("/") == "moved/here":
        pytest.skip("a trailing separator on a base is the same base")
    with pytest.raises(MetadataError, match="base"):
        resolve(meta, base)


# Plain ASCII ids: mutmut hands pytest the ids it collected, and pytest cannot select an
# id it escaped (a backslash), so such a test would count every mutant it covers "killed".
@pytest.mark.parametrize(
    "job",
    ["savepoints", "\udc80", "x" * 300, 7, None],
    ids=["savepoints", "surrogate", "300-chars", "an-int", "None"],
)
def test_a_job_id_that_is_no_job_base_is_refused(job: object) -> None:
    """Any string escapes to one safe component (R3), but never to ``savepoints`` (the
    user's) nor to an over-long or non-UTF-8 one; a non-string is refused too."""
    doc = json.loads(_sample())
    doc["payload"]["job"] = job
    raw = json.dumps(
        {**doc, "sha256": hashlib.sha256(_canonical_or_ascii(doc["payload"])).hexdigest()},
        ensure_ascii=True,
    ).encode()
    with pytest.raises(MetadataError) as info:
        decode(raw, source="job-0/chk-3/_metadata")
    assert info.value.source == "job-0/chk-3/_metadata"
    assert info.value.field in ("payload", "payload.job")  # a surrogate fails the checksum


@pytest.mark.parametrize("job", ["savepoints", "x" * 300], ids=["savepoints", "300-chars"])
def test_the_store_refuses_to_write_a_metadata_for_a_job_that_is_no_job_base(job: str) -> None:
    """The write side checks what the read side does, and names the field."""
    with pytest.raises(MetadataError) as info:
        encode(3, job, False, (), ())
    assert (info.value.source, info.value.field) == ("<encode>", "job")


@pytest.mark.parametrize("form", list(BAD_FORMS))
def test_the_one_path_check_refuses_every_malformed_form_itself(form: str) -> None:
    """``path_parts`` is the one place (each field above may also be refused later, for
    lying outside a base: that must not be what saves it)."""
    path = BAD_FORMS[form]("job-0/shared/src-0-2/f")
    if path == "job-0/shared/src-0-2/f":
        pytest.skip("the form leaves this path as it is")
    with pytest.raises(MetadataError):
        path_parts(path, "<test>", "path")


@pytest.mark.parametrize(
    "path",
    [
        "job-0/shared/a b",  # a space is no control character
        "job-0/~$x;y=z",
        ("job-0/" + ("c" * 254 + "/") * 16 + "c" * MAX_PATH)[:MAX_PATH],  # exactly MAX_PATH
        "job-0/" + "d" * 255,  # exactly MAX_COMPONENT
        "C",
        "Cx",
    ],
    ids=["space", "punctuation", "max-path", "max-component", "one-letter", "two-letters"],
)
def test_the_one_path_check_accepts_what_is_no_malformed_form(path: str) -> None:
    assert path_parts(path, "<test>", "path") == tuple(path.split("/"))


@pytest.mark.parametrize("value", [7, None, b"job-0/x", ["job-0", "x"], ""])
def test_a_path_that_is_no_non_empty_string_is_refused(value: object) -> None:
    with pytest.raises(MetadataError) as info:
        path_parts(value, "<test>", "entries[0].handle.path")
    assert info.value.field == "entries[0].handle.path"


def _segment(logical_id: str, path: str, offset: int, length: int) -> StateEntry:
    return StateEntry(
        SUB,
        StateKind.KEYED_SHARED,
        logical_id,
        SegmentHandle(path, offset, length, logical_id, Scope.SHARED),
    )


@pytest.mark.parametrize("placeholder_first", [False, True])
@pytest.mark.parametrize("other", ["offset", "path", "length"])
def test_one_id_for_two_extents_in_one_metadata_is_refused(
    placeholder_first: bool, other: str
) -> None:
    """R54 in one file: each extent counts, and a placeholder before them hides nothing."""
    first = ("job-0/shared/src-0-2/a", 0, 10)
    second = {
        "offset": ("job-0/shared/src-0-2/a", 5, 10),
        "path": ("job-0/shared/src-0-2/b", 0, 10),
        "length": ("job-0/shared/src-0-2/a", 0, 11),
    }[other]
    head = (
        (StateEntry(SUB, StateKind.KEYED_SHARED, "p", PlaceholderHandle("p")),)
        if placeholder_first
        else ()
    )
    meta = Metadata("job-0", 3, False, (*head, _segment("x", *first), _segment("x", *second)), ())
    with pytest.raises(MetadataError, match="duplicate id") as info:
        check_ids(meta, "<test>")
    assert info.value.field == f"entries[{len(head) + 1}].handle.id"
    check_ids(
        Metadata("job-0", 3, False, (*head, _segment("x", *first), _segment("x", *first)), ()),
        "<test>",
    )


def _canonical_or_ascii(obj: object) -> bytes:
    try:
        return _canonical(obj)
    except UnicodeEncodeError:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "directory",
    ["job-0", "job-0/shared", "job-0/taskowned", "job-0/chk-3", "job-0/elsewhere/x"],
)
def test_a_directory_must_be_a_managed_one(directory: str) -> None:
    """R40: what a coordinator may delete whole is a subtask's or a TM's directory, never
    a base or a folder of one (``job-0/..`` reaches the same through ``..``)."""
    doc = json.loads(_sample())
    doc["payload"]["directories"] = [directory]
    with pytest.raises(MetadataError, match=r"directories\[0\]: .*not a managed directory"):
        decode(_reseal_doc(doc), source="job-0/chk-3/_metadata")


@pytest.mark.parametrize("kind", ["shared/src-0-2", "taskowned/tm-1"])
def test_a_savepoint_holds_no_managed_directory(kind: str) -> None:
    """R55: a savepoint is self-contained and the user's: a directory inside its own
    folder shaped like a managed one is refused all the same (a CLAIM-less restore never
    deletes it, but nothing the store reads may name it as deletable whole)."""
    doc = json.loads(_sample())
    doc["payload"].update(savepoint=True, directories=[f"{savepoint_dir(3)}/{kind}"])
    with pytest.raises(MetadataError, match=r"directories\[0\]: .*not a managed directory"):
        decode(_reseal_doc(doc), source=f"{savepoint_dir(3)}/_metadata")
    # the same directory under the job's base is a managed one
    doc["payload"].update(directories=[f"job-0/{kind}"])
    assert decode(_reseal_doc(doc)).directories == (f"job-0/{kind}",)


# --------------------------------------------------------------------------- 2. ownership


def _write_all(store: CheckpointStore, ledger: Ledger, cid: int, *, reuse: bool = False) -> None:
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        data = payload(sub, f"sst-{cid}")
        ledger.record(store.job_id, cid, sub, f"sst-{cid}", data)
        mgr.write(cid, sub, KS, f"sst-{cid}", data)
        ops = payload(sub, "offsets", cid)
        ledger.record(store.job_id, cid, sub, "offsets", ops)
        mgr.write(cid, sub, OP, "offsets", ops)
        mgr.acknowledge(cid, sub)


def _checkpoint(store: CheckpointStore, ledger: Ledger, *, savepoint: bool = False) -> int:
    coord = store.coordinator
    cid = coord.trigger(savepoint=savepoint)
    _write_all(store, ledger, cid)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    return cid


class World:
    """A store whose root holds sentinels that are never the store's: a completed
    savepoint of the job, the files of a NO_CLAIM source (``job-0``, after a NO_CLAIM
    restore started ``job-1``), a sibling application's folder, an unrelated job base
    without ``_metadata`` and (local and memory) a file beside the root."""

    def __init__(self, place: Place, mode: MergingMode, *, background: bool = True) -> None:
        self.place = place
        self.mode = mode
        self.config = _config(mode)
        self.ledger = Ledger()
        self.store = CheckpointStore(
            place.url,
            self.config,
            JOB,
            storage_options=_options(place),
            background_deletes=background,
        )
        _checkpoint(self.store, self.ledger)
        self.savepoint = _checkpoint(self.store, self.ledger, savepoint=True)
        _checkpoint(self.store, self.ledger)
        self.no_claim_source = _checkpoint(self.store, self.ledger)
        assert self.store.coordinator.restore(self.no_claim_source, mode=RestoreMode.NO_CLAIM)
        assert self.store.job_id == "job-1"
        _checkpoint(self.store, self.ledger)
        _checkpoint(self.store, self.ledger)
        self.store.flush()
        files = testing.observe(self.store).files
        _plant(place, "other-app/shared/x/data", b"the sibling's")
        _plant(place, "other-app/f", b"the sibling's too")
        _plant(place, "job-9/shared/src-0-2/f", b"an unrelated job's")
        self.outside = f"{place.root}-outside/f"
        if place.kind != "s3":
            place.inner.makedirs(f"{place.root}-outside", exist_ok=True)
            place.inner.pipe_file(self.outside, b"beside the root")
        sp = savepoint_dir(self.savepoint)
        self.sentinel_paths = [
            *sorted(p for p in files if p.startswith(sp + "/") or p.startswith("job-0/")),
            "other-app/shared/x/data",
            "other-app/f",
            "job-9/shared/src-0-2/f",
        ]
        assert any(p.startswith(sp + "/") for p in self.sentinel_paths)
        assert any(p.startswith("job-0/shared/") for p in self.sentinel_paths)
        self.before = {p: self.place.read(p) for p in self.sentinel_paths}

    def a_job0_file(self) -> str:
        """A data file of the NO_CLAIM source (not its ``_metadata``)."""
        return next(
            p for p in self.sentinel_paths if p.startswith("job-0/") and "_metadata" not in p
        )

    def retained_meta(self) -> str:
        return self.store.coordinator.retained()[-1].metadata

    def forge(self, path: str, edit: Callable[[dict[str, Any]], None]) -> None:
        doc = json.loads(self.place.read(path))
        edit(doc["payload"])
        self.place.write(path, _reseal_doc(doc) + b"\n")

    def problems(self, store: CheckpointStore | None = None, *, quiet: bool = False) -> list[str]:
        """Violations other than what the planted files are by construction (files the
        store does not know have no owner, I3; the forged checkpoint's foreign
        references, I1): an I5 is never one of those."""
        planted = ("other-app/", "job-9/", "job-0/", "savepoints/")
        out = []
        for v in testing.check_invariants(store or self.store, quiet=quiet):
            if v.invariant in ("I1", "I3", "I6") and any(p in v.detail for p in planted):
                continue
            out.append(str(v))
        return out

    def lost(self) -> list[str]:
        self.store.flush()
        out = []
        for p, data in self.before.items():
            try:
                now = self.place.read(p)
            except FileNotFoundError:
                out.append(f"deleted {p}")
                continue
            if now != data:
                out.append(f"changed {p}")
        if self.place.kind != "s3" and not self.place.inner.exists(self.outside):
            out.append(f"deleted {self.outside}")
        return out


def _plant(place: Place, rel: str, data: bytes) -> None:
    place.inner.makedirs(f"{place.root}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
    place.write(rel, data)


def _naming_foreign_files(w: World, cid_meta: str) -> None:
    """Forge the latest retained ``_metadata`` (valid checksum, every path inside a base
    it declares) to name a NO_CLAIM source's file, a sibling's file and an unrelated
    job's file as its own state (the sibling's as exclusive state, which a subsumption
    deletes without asking the registry), and their folders as managed directories."""
    job0 = w.a_job0_file()

    def edit(d: dict[str, Any]) -> None:
        template = d["entries"][0]
        for n, path in enumerate([job0, "other-app/f", "job-9/shared/src-0-2/f"]):
            size = len(w.before.get(path, b"")) or 1
            d["entries"].append(
                {
                    **template,
                    "name": f"forged-{n}",
                    "handle": {
                        "type": "file",
                        "path": path,
                        "length": size,
                        "id": f"forged-{n}",
                        "scope": "exclusive" if path.startswith("other-app/") else "shared",
                    },
                }
            )
        d["directories"] += ["other-app/shared/x", "job-9/shared/src-0-2"]
        d["directories"] += sorted({"/".join(job0.split("/")[:3])} - {job0})
        d["shared_bases"] = sorted({*d["shared_bases"], "job-0", "other-app", "job-9"})

    w.forge(cid_meta, edit)


def _more(w: World, n: int) -> None:
    for _ in range(n):
        _checkpoint(w.store, w.ledger)


@pytest.fixture
def world(
    setting: tuple[str, MergingMode],  # noqa: F811
    place: Place,
) -> Iterator[World]:
    w = World(place, setting[1])
    yield w
    w.store.close()


@pytest.mark.parametrize("setting", FILE_SETTINGS, ids=_setting_id)
def test_a_claim_of_a_changed_metadata_is_refused(world: World) -> None:
    """A live store recorded what the checkpoint held when it completed: a CLAIM of a
    ``_metadata`` changed since is refused, naming the file, before anything changes."""
    w = world
    meta = w.retained_meta()
    _naming_foreign_files(w, meta)
    before = _listing(w.place)
    with pytest.raises(MetadataError) as info:
        w.store.coordinator.restore(
            int(meta.split("chk-")[1].split("/")[0]), mode=RestoreMode.CLAIM
        )
    assert meta in str(info.value) and "did not hold when it completed" in str(info.value)
    _unchanged(w.place, w.store, before)
    assert w.store.job_id == "job-1"


@pytest.mark.parametrize("setting", SETTINGS, ids=_setting_id)
def test_every_deleting_path_keeps_every_sentinel(world: World) -> None:
    """The forged ``_metadata`` is read back by a coordinator restart (R95), so the
    retained checkpoint in memory names the foreign files; then subsume, abort, failover
    cleanup, a CLAIM restore of the forged checkpoint and its subsumption, and
    ``cancel(retain=False)`` run, with the deleter in the background. No sentinel is
    deleted or changed, and the invariants (I5 included) hold throughout."""
    w = world
    coord = w.store.coordinator
    _naming_foreign_files(w, w.retained_meta())
    coord.restart()
    assert w.lost() == [] and w.problems() == []
    _more(w, 1)  # subsume (num_retained 2: the forged one stays)
    cid = coord.trigger()  # an abort, of a checkpoint half acknowledged
    sub, tm = sorted(w.store.placement().items())[0]
    w.store.task_manager(tm).write(cid, sub, KS, "half", b"aborted")
    coord.abort(cid)
    w.store.deliver_notifications()
    testing.crash(w.store, tm)  # failover cleanup (R62)
    coord.failover()
    w.store.deliver_notifications()
    assert w.lost() == [] and w.problems() == []
    forged = coord.retained()[0].checkpoint
    coord.restore(forged, mode=RestoreMode.CLAIM)  # the store's record is the file now
    _more(w, 3)  # the claimed (forged) checkpoint is subsumed
    assert w.lost() == [], w.lost()
    assert w.problems() == []
    coord.cancel(retain=False)
    assert w.lost() == [], w.lost()
    assert w.problems() == []


WITHIN_SETTINGS = [s for s in FILE_SETTINGS if s[1] is MergingMode.WITHIN_CHECKPOINT]
"""Checkpoints that name directories (R42) and each write files of their own there (ACROSS
shares its pool files between them; NONE names no directory)."""


def _stored_files(place: Place) -> set[str]:
    return {p for p, (kind, _, _) in _listing(place).items() if kind == "file"}


@pytest.mark.parametrize("setting", WITHIN_SETTINGS, ids=_setting_id)
def test_a_claim_naming_a_foreign_directory_first_still_takes_its_own(world: World) -> None:
    """R72, I5: a forged ``_metadata`` (read back by a restart) whose first directory is
    the NO_CLAIM source's, outside the lineage, is claimed: that directory stays the
    user's, and each directory of the job's own that follows it is still the
    coordinator's with everything in it, the older retained checkpoint's files there
    included (the user's since the ended job retained it, R91). Once the claimed
    checkpoint is subsumed, nothing is left in those directories and no sentinel is lost."""
    w = world
    coord = w.store.coordinator
    meta = w.retained_meta()
    payload_doc = json.loads(w.place.read(meta))["payload"]
    own = list(payload_doc["directories"])
    assert own and all(d.startswith("job-1/") for d in own), own
    named = {e["handle"]["path"] for e in payload_doc["entries"] if "path" in e["handle"]}
    in_own = {p for p in _stored_files(w.place) if any(p.startswith(d + "/") for d in own)}
    assert in_own - named, "the older retained checkpoint wrote nothing in these directories"
    foreign = "/".join(w.a_job0_file().split("/")[:3])

    def edit(d: dict[str, Any]) -> None:
        d["directories"] = [foreign, *d["directories"]]
        d["shared_bases"] = sorted({*d["shared_bases"], "job-0"})

    w.forge(meta, edit)
    coord.restart()
    claimed = coord.retained()[-1].checkpoint
    assert coord.restore(claimed, mode=RestoreMode.CLAIM) == "job-2"
    _more(w, 3)  # the claimed checkpoint is subsumed
    w.store.flush()
    left = sorted(p for p in _stored_files(w.place) if any(p.startswith(d + "/") for d in own))
    assert left == [], left
    assert w.lost() == [], w.lost()
    assert w.problems() == []


@pytest.mark.parametrize("setting", FILE_SETTINGS, ids=_setting_id)
def test_a_claim_of_a_metadata_naming_less_registers_only_what_it_names(world: World) -> None:
    """R72, R54, I4: a ``_metadata`` changed since the checkpoint completed to name less
    than the store recorded (one shared handle dropped) is claimed as it now reads: the
    registry holds what the claimed checkpoint uses, and once it is subsumed nothing that
    no retained checkpoint uses; no sentinel is lost."""
    w = world
    coord = w.store.coordinator
    meta = w.retained_meta()
    dropped: list[str] = []

    def edit(d: dict[str, Any]) -> None:
        shared = [e for e in d["entries"] if e["handle"].get("scope") == "shared"]
        dropped.append(shared[-1]["handle"]["id"])
        d["entries"].remove(shared[-1])

    w.forge(meta, edit)
    claimed = coord.retained()[-1].checkpoint
    assert coord.restore(claimed, mode=RestoreMode.CLAIM) == "job-2"
    [kept] = coord.retained()
    assert dropped[0] not in {s.logical_id for e in kept.entries if (s := stream_of(e.handle))}
    assert w.problems() == []
    _more(w, 3)  # the claimed checkpoint is subsumed
    assert w.problems() == []
    unused = [k for k, v in testing.observe(w.store).registry.items() if not v.refs]
    assert unused == [], f"registered, yet no retained checkpoint uses them: {unused}"
    assert w.lost() == [], w.lost()


@pytest.mark.parametrize("setting", SETTINGS, ids=_setting_id)
def test_recovery_keeps_every_sentinel(world: World) -> None:
    """``recover(crashed_job='job-1')`` with the forged ``_metadata``: only job-1's own
    base is the new coordinator's; its garbage collection and the checkpoints after it
    delete no sentinel, and every other base is listed in ``report.left_alone``."""
    w = world
    _naming_foreign_files(w, w.retained_meta())
    w.store.close()
    new, report = CheckpointStore.recover(
        w.place.url, w.config, JOB, crashed_job="job-1", storage_options=_options(w.place)
    )
    try:
        assert {"job-0", "job-9", "other-app"} <= set(report.left_alone)
        assert not any(p.split("/")[0] != "job-1" for p in report.garbage)
        assert w.problems(new) == []
        for _ in range(4):
            _checkpoint(new, w.ledger)
        new.flush()
        assert w.lost() == [], w.lost()
        assert w.problems(new, quiet=True) == []
    finally:
        new.close()


@pytest.mark.parametrize("setting", FILE_SETTINGS, ids=_setting_id)
def test_recovering_job_0_leaves_an_unrelated_job_alone(world: World) -> None:
    """``recover(crashed_job='job-0')``: ``job-9`` (no ``_metadata``) and ``job-1`` are
    not job-0's to delete, whatever their names suggest."""
    w = world
    w.store.close()
    job1 = {p: w.place.read(p) for p in testing.observe(w.store).files if p.startswith("job-1/")}
    new, report = CheckpointStore.recover(
        w.place.url, w.config, JOB, crashed_job="job-0", storage_options=_options(w.place)
    )
    try:
        assert {"job-1", "job-9", "other-app"} <= set(report.left_alone)
        _checkpoint(new, w.ledger)
        _checkpoint(new, w.ledger)
        new.flush()
        assert {p: w.place.read(p) for p in job1} == job1
        lost = [p for p in w.lost() if not p.startswith("deleted job-0/")]
        assert lost == [], lost
    finally:
        new.close()


@pytest.mark.parametrize("crashed", ["savepoints", "\udc80"], ids=["savepoints", "surrogate"])
def test_recovering_a_job_id_that_is_no_job_base_is_refused(tmp_path: Path, crashed: str) -> None:
    p = Place.make("local", tmp_path)
    _plant(p, "savepoints/savepoint-1/f", b"the user's")
    with pytest.raises(RecoveryError, match="crashed_job"):
        CheckpointStore.recover(p.url, _config(MergingMode.NONE), JOB, crashed_job=crashed)
    assert p.read("savepoints/savepoint-1/f") == b"the user's"


# --------------------------------------------------------------------------- 3. the guard


@pytest.mark.parametrize("setting", SETTINGS, ids=_setting_id)
def test_the_guard_refuses_a_foreign_delete_before_it_happens(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug anywhere (simulated: the coordinator's delete called directly) cannot delete
    a savepoint, a NO_CLAIM source's file, a sibling's file, a base or what lies past
    ``..``: the guard refuses, records and reports each (I5) saying why, logs it as an
    error naming the path, who tried and why, and the file stays."""
    caplog.set_level(logging.ERROR)
    w = world
    cl = w.store._engine
    sp_file = next(p for p in w.sentinel_paths if p.startswith("savepoints/"))
    for path in [sp_file, w.a_job0_file(), "other-app/f", "job-1/../other-app/f", "job-1/.."]:
        cl.catalog.delete_file(path, COORDINATOR)
    for d in [
        "savepoints",
        savepoint_dir(w.savepoint),
        "job-1",
        "job-1/shared",
        "other-app",
        "job-1/..",
        "job-0/shared",
    ]:
        cl.catalog.delete_dir(d, COORDINATOR)
    # the NO_CLAIM source's directories (R73: the user's, as its files are; NONE names none)
    users = sorted(d for d, o in cl.catalog.dir_owner.items() if o == USER)
    assert bool(users) is (w.mode is not MergingMode.NONE)
    for d in users:
        cl.catalog.delete_dir(d, COORDINATOR)
    assert w.lost() == []
    refused = {r.path for r in cl.catalog.refused_deletes}
    assert {sp_file, "other-app/f", "job-1/..", "savepoints", "job-1", *users} <= refused
    assert {r.actor for r in cl.catalog.refused_deletes} == {COORDINATOR}, "each names who tried"
    violations = testing.check_invariants(w.store)
    assert (
        len([v for v in violations if v.invariant == "I5"])
        == len(cl.catalog.refused_deletes)
        == 12 + len(users)
    )
    details = [v.detail for v in violations if v.invariant == "I5"]
    for path, why in [
        # a completed savepoint is the user's; once no attempt may write in it the store
        # forgets it triggered it (issue 16, bounded tables), so its directory is no
        # longer a base this store writes in: refused all the same, for that reason
        (sp_file, "not a base this store made or claimed"),
        (w.a_job0_file(), "the user's"),
        ("other-app/f", "not a base this store made or claimed"),
        ("job-1/..", "'..' component"),
        ("job-1", "never deleted whole"),
        ("job-0/shared", "never deleted whole"),
    ]:
        said = [d for d in details if d.startswith(f"{COORDINATOR} tried to delete {path}: ")]
        assert said and all(why in d for d in said), (path, said)
    for d in users:
        # refused for being the user's, before what it holds is looked at
        assert f"{COORDINATOR} tried to delete {d}: refused, the user's" in details, d
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    for r in cl.catalog.refused_deletes:
        assert any(r.path in m and f"({r.actor})" in m and r.reason in m for m in logged), r


# --------------------------------------------------------------------------- 4. defect 6


def _store2(place: Place, mode: MergingMode) -> CheckpointStore:
    store = CheckpointStore(place.url, _config(mode), JOB, storage_options=_options(place))
    ledger = Ledger()
    for _ in range(3):
        _checkpoint(store, ledger)
    store.flush()
    return store


def _recover(place: Place, mode: MergingMode) -> tuple[CheckpointStore, RecoveryReport]:
    return CheckpointStore.recover(place.url, _config(mode), JOB, storage_options=_options(place))


def _deep(data: bytes) -> bytes:
    return b'{"format":' + b"[" * 200_000 + b"]" * 200_000 + b"}"


def _huge_int(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["payload"]["entries"][0]["entries"] = 10**30
    return _reseal_doc(doc)


def _huge_literal(data: bytes) -> bytes:
    return data.replace(b'"checkpoint":3', b'"checkpoint":' + b"9" * 5000, 1)


def _surrogate(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["payload"]["entries"][0]["name"] = "\udc80"
    return json.dumps(doc, ensure_ascii=True).encode()


def _dup_ids(data: bytes) -> bytes:
    doc = json.loads(data)
    es = [e for e in doc["payload"]["entries"] if e["handle"]["type"] in ("file", "segment")]
    es[1]["handle"]["id"] = es[0]["handle"]["id"]
    return _reseal_doc(doc)


def _checkpoint_0(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["payload"]["checkpoint"] = 0
    return _reseal_doc(doc)


def _wrong_type(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["payload"]["entries"][0]["subtask"] = ["src", "0", 2]
    return _reseal_doc(doc)


HOSTILE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "deep nesting": (_deep, "nested too deeply"),
    "huge integer": (_huge_int, "out of range"),
    "huge literal": (_huge_literal, "invalid JSON"),
    "surrogate": (_surrogate, "cannot be encoded"),
    "duplicate ids": (_dup_ids, "duplicate id"),
    "wrong type": (_wrong_type, "expected an integer"),
    "checkpoint 0": (_checkpoint_0, "expected an integer >= 1"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize(
    "setting",
    [
        ("local", MergingMode.NONE),
        ("memory", MergingMode.WITHIN_CHECKPOINT),
        ("local", MergingMode.ACROSS_CHECKPOINT),
    ],
    ids=_setting_id,
)
def test_hostile_metadata_is_reported_not_crashed_on(
    place: Place,
    setting: tuple[str, MergingMode],  # noqa: F811
    case: str,
) -> None:
    mode = setting[1]
    store = _store2(place, mode)
    meta = metadata_path("job-0", 3)
    edit, problem = HOSTILE[case]
    place.write(meta, edit(place.read(meta)))
    before = _listing(place)
    for call in (
        store.coordinator.restart,
        lambda: store.coordinator.restore(3, mode=RestoreMode.CLAIM),
    ):
        with pytest.raises(MetadataError) as info:
            call()
        assert meta in str(info.value) and problem in str(info.value), str(info.value)
        _unchanged(place, store, before)
    store.close()
    with pytest.raises(MetadataError) as info:
        _recover(place, mode)
    assert meta in str(info.value) and problem in str(info.value)
    _unchanged(place, None, before)


@pytest.mark.parametrize("twin", ["another file", "offset"])
@pytest.mark.parametrize("setting", FILE_SETTINGS, ids=_setting_id)
def test_one_id_for_two_extents_across_kept_checkpoints(
    place: Place,
    setting: tuple[str, MergingMode],  # noqa: F811
    twin: str,
) -> None:
    """Each file is fine on its own, but checkpoint 3 names under one of checkpoint 2's
    logical ids another extent: recovery refuses naming chk-3, deleting nothing (it raised
    a bare ``AssertionError`` from the registry before). The twin names another file, or
    (merging modes) the same file and length at another offset."""
    mode = setting[1]
    if twin == "offset" and mode is MergingMode.NONE:
        pytest.skip("NONE writes whole files: a handle has no offset")
    store = _store2(place, mode)
    store.close()

    def extent(h: dict[str, Any]) -> tuple[Any, ...]:
        return (h.get("path"), h.get("offset", 0), h.get("length"))

    two = json.loads(place.read(metadata_path("job-0", 2)))["payload"]["entries"]
    meta = metadata_path("job-0", 3)
    doc = json.loads(place.read(meta))
    ids2 = {e["handle"]["id"]: extent(e["handle"]) for e in two if "path" in e["handle"]}
    # the offset twin needs a later segment of a pooled file to move back by one byte
    lid, old = next(i for i in sorted(ids2.items()) if twin != "offset" or i[1][1] > 0)
    targets = [
        e
        for e in doc["payload"]["entries"]
        if "path" in e["handle"] and extent(e["handle"]) != old and e["handle"]["id"] not in ids2
    ]
    target = targets[0]
    target["handle"]["id"] = lid
    if twin == "offset":
        path, offset, length = old
        target["handle"].update(path=path, offset=offset - 1, length=length)
    place.write(meta, _reseal_doc(doc))
    before = _listing(place)
    with pytest.raises(MetadataError) as info:
        _recover(place, mode)
    assert meta in str(info.value) and "conflicting registration" in str(info.value)
    _unchanged(place, None, before)


@pytest.mark.parametrize("setting", FILE_SETTINGS, ids=_setting_id)
def test_one_extent_named_whole_and_as_a_segment_at_offset_0_is_one_extent(
    place: Place,
    setting: tuple[str, MergingMode],  # noqa: F811
) -> None:
    """R54 counts bytes, not the form of a handle: checkpoint 3 names one of checkpoint
    2's extents at offset 0 under its logical id, as a segment where checkpoint 2 has a
    whole file (NONE) or as a whole file where it has a segment. One extent, as the
    decoder's check of one file says (a whole file starts at offset 0): recovery keeps
    both."""
    mode = setting[1]
    if mode is MergingMode.ACROSS_CHECKPOINT:
        pytest.skip("the pool goes on from checkpoint 1: none of 2's segments starts a file")
    store = _store2(place, mode)
    store.close()
    two = json.loads(place.read(metadata_path("job-0", 2)))["payload"]["entries"]
    ids2 = {e["handle"]["id"] for e in two}
    lid, old = next(
        (e["handle"]["id"], e["handle"]) for e in two if e["handle"].get("offset", 0) == 0
    )
    meta = metadata_path("job-0", 3)
    doc = json.loads(place.read(meta))
    target = next(e for e in doc["payload"]["entries"] if e["handle"]["id"] not in ids2)
    twin = {"id": lid, "path": old["path"], "length": old["length"], "scope": old["scope"]}
    if old["type"] == "file":
        twin.update(type="segment", offset=0)
    else:
        twin.update(type="file")
    target["handle"] = twin
    place.write(meta, _reseal_doc(doc))
    new, report = _recover(place, mode)
    try:
        assert report.checkpoints == (2, 3)
        assert testing.check_invariants(new) == []
    finally:
        new.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 directory")
def test_an_unreadable_directory_is_a_recovery_error(tmp_path: Path) -> None:
    p = Place.make("local", tmp_path)
    store = _store2(p, MergingMode.WITHIN_CHECKPOINT)
    store.close()
    locked = Path(p.root) / "job-0" / "shared"
    before = _listing(p)
    locked.chmod(0)
    try:
        with pytest.raises(RecoveryError) as info:
            _recover(p, MergingMode.WITHIN_CHECKPOINT)
        assert "PermissionError" in str(info.value) and str(locked) in str(info.value)
    finally:
        locked.chmod(0o755)
    _unchanged(p, None, before)


@pytest.mark.parametrize("named", [True, False], ids=["names-the-directory", "names-nothing"])
@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_directory_the_os_refuses_to_list_is_a_recovery_error(
    tmp_path: Path, kind: str, named: bool
) -> None:
    """What chmod 000 does, for any user (root reads such a directory): the listing's
    call fails with ``PermissionError`` (through the fault wrapper, on the local-disk path
    and on fsspec's); recovery refuses naming it, and nothing changes. An error that
    names no file (a file system's own exception) names the root instead."""
    p = Place.make(kind, tmp_path)
    store = _store2(p, MergingMode.WITHIN_CHECKPOINT)
    store.close()
    before = _listing(p)
    locked = f"{p.root}/job-0/shared"
    fs = FaultyFileSystem(p.inner, local_root=p.root if kind == "local" else None)
    denied: Exception = PermissionError(errno.EACCES, "Permission denied", locked)
    if not named:
        denied = RuntimeError("Permission denied by the service")
    fs.fail("scandir" if kind == "local" else "find", exc=denied, times=100)
    with pytest.raises(RecoveryError) as info:
        recover(_config(MergingMode.WITHIN_CHECKPOINT), JOB, fs, p.root)
    msg = str(info.value)
    where = f"{locked}: PermissionError" if named else f"{p.root}: RuntimeError"
    assert where in msg and "Permission denied" in msg, msg
    _unchanged(p, None, before)
    p.cleanup()


@pytest.mark.parametrize("lie", ["another-checkpoint", "a-savepoint"])
def test_a_checkpoint_metadata_naming_another_checkpoint_or_a_savepoint_is_refused(
    place: Place,
    setting: tuple[str, MergingMode],  # noqa: F811
    lie: str,
) -> None:
    """``chk-3/_metadata`` resealed to say it is checkpoint 4, or a savepoint: recovery
    refuses naming the file and the field, and deletes nothing. The reader's own check
    (``check_named``) is what refuses both: recovery has no second check of its own, which
    could never fire behind the reader's."""
    mode = setting[1]
    store = _store2(place, mode)
    store.close()
    meta = metadata_path("job-0", 3)
    doc = json.loads(place.read(meta))
    if lie == "another-checkpoint":
        doc["payload"]["checkpoint"] = 4
    else:
        doc["payload"]["savepoint"] = True
    place.write(meta, _reseal_doc(doc))
    before = _listing(place)
    field, why = {
        "another-checkpoint": ("payload.checkpoint", "names checkpoint 4, not checkpoint 3"),
        "a-savepoint": ("payload.savepoint", "is true in a checkpoint's file"),
    }[lie]
    with pytest.raises(MetadataError, match=why) as info:
        _recover(place, mode)
    assert (info.value.source, info.value.field) == (meta, field)
    _unchanged(place, None, before)


def test_a_tree_past_path_max_is_walked_and_left_alone(tmp_path: Path) -> None:
    """A chain of directories deeper than PATH_MAX at the root, a file at its bottom.
    Listed by path it would be a ``RecoveryError`` ("File name too long"); the store walks
    its tree by descriptors (issue 14), so no path it hands the OS is long: recovery
    lists the chain like any other directory, keeps it whole (it is not the crashed
    job's), and recovers the job unchanged."""
    p = Place.make("local", tmp_path)
    store = _store2(p, MergingMode.WITHIN_CHECKPOINT)
    store.close()
    before = _listing(p)
    depth = MAX_PATH // 200 + 2
    fd = os.open(p.root, os.O_RDONLY)
    try:
        for _ in range(depth):  # each step relative to the last: no long path
            os.mkdir("d" * 200, dir_fd=fd)
            nxt = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"precious")
        os.close(leaf)
    finally:
        os.close(fd)
    deep = "/".join(["d" * 200] * depth) + "/bottom"
    assert len(f"{p.root}/{deep}") > MAX_PATH
    again, report = _recover(p, MergingMode.WITHIN_CHECKPOINT)
    assert report.checkpoints == (2, 3)
    assert testing.check_invariants(again) == []
    files = again._engine.storage.list_files()
    assert files[deep] == len(b"precious")
    again.close()
    assert p.read(metadata_path("job-0", 3)) == before[metadata_path("job-0", 3)][2]


def test_encode_never_writes_what_decode_refuses() -> None:
    """The store's own files pass its checks (a sanity check of the rules above)."""
    e = encode(3, "job-0", False, (), ("job-0/shared/src-0-2", "job-0/taskowned/tm-1"))
    assert decode(e).directories == ("job-0/shared/src-0-2", "job-0/taskowned/tm-1")
    assert shared_dir("job-0", SUB).startswith("job-0/shared/")
    assert StateKind.KEYED_SHARED.scope.value == "shared"
    assert isinstance(Config.for_mode(MergingMode.NONE), Config)
