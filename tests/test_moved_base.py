"""A job's checkpoints moved to another place and recovered there, through the public API.

Every path in a ``_metadata`` file is relative to the storage root that holds the job
bases (``job-0/``, ``job-1/``, ``savepoints/``), so the whole tree may be moved: renamed
to another parent directory on a local disk, copied to another prefix on ``memory://`` or
S3 (object stores cannot rename). ``tests/test_metadata.py`` checks the decoder
alone; here a job writes through ``CheckpointStore`` and is recovered from the new place
with ``CheckpointStore.recover(new_url, ..., crashed_job=...)``.

The job (``_run_job``, three subtasks of two vertices on one TM): ``job-0`` completes
checkpoints 1 and 2 (two keyed shared handles per subtask and checkpoint, which WITHIN and
ACROSS merge into one file per subtask, the first one reused by checkpoint 2; operator
state, exclusive, which they merge per TM on a file system) and savepoint 3, and is
restored in CLAIM mode from checkpoint 2 as ``job-1`` (checkpoint 1 stays the user's,
R70), which completes checkpoints 4 and 5 (in NONE mode reusing ``job-0``'s file, so
their ``_metadata`` names another job base) and dies.

Restoring from one checkpoint's path: the API has no call that takes a ``chk-N``
directory (Flink's ``-s <path>``). A checkpoint is addressed by its storage root and job
id, so "one retained checkpoint copied elsewhere" is its ``_metadata`` and every file it
names, copied under a new root at the same relative paths and recovered there
(``test_one_checkpoint_copied_elsewhere``).

After each recovery: every byte of every retained checkpoint and of every restored
handle reads back equal to what was written; every file that an intact ``_metadata`` of
the moved tree names (``_intact``: the retained checkpoints, the savepoint) is still
there with the same bytes, and recovery deleted none of them; ``check_invariants()`` is
empty; the job goes on (a checkpoint, then a restore from the moved savepoint, read
back); and where the tree was copied, the original is unchanged, byte for byte.

Storages: local files (the root renamed with ``shutil.move`` to another parent, or
copied with ``shutil.copytree``) and ``memory://`` (copied) in all three modes. S3
(s3fs against moto's server on 127.0.0.1, the ``s3_endpoint`` fixture of
``test_lockstep``): the whole tree in WITHIN_CHECKPOINT (segments of merged files), the
single checkpoint in NONE (whose files lie partly in ``job-0``'s base). ACROSS is
refused there (R16), and every S3 request costs moto tens of milliseconds, a run of the
job about two seconds.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl import CheckpointStore, testing
from fastimpl.metadata import decode
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.handles import extent_of, stream_of
from spec.layout import METADATA
from spec.observation import RetainedView
from tests.faultyfs import Ledger, Place, payload
from tests.lockstep import S3_BUCKET, s3

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 1), VertexSpec("win", 2)), num_tms=1)
SAVEPOINT = 3
CLAIMED = 2
RETAINED = (4, 5)
"""``job-1``'s retained checkpoints when it dies."""

_roots = itertools.count()


def _config(mode: MergingMode) -> Config:
    return Config.for_mode(mode, num_retained=2)


# --------------------------------------------------------------------------- places


@pytest.fixture
def top(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Iterator[Place]:
    """A directory (prefix) of the test's own, on ``kind`` storage, that holds the job's
    root and the places it is moved or copied to. ``Place.root`` is as the file system
    names it (``/tmp/...``, ``/moved-...``, ``lockstep/moved-...``)."""
    n = next(_roots)
    if kind == "local":
        yield Place("local", str(tmp_path), str(tmp_path), fsspec.filesystem("file"))
        return
    if kind == "memory":
        fs = fsspec.filesystem("memory")
        root = f"/moved-base-{os.getpid()}-{n}"
    else:
        fs = s3(request.getfixturevalue("s3_endpoint"))
        root = f"{S3_BUCKET}/moved-base-{os.getpid()}-{n}"
    yield Place(kind, root, root, fs)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _at(top: Place, rel: str) -> Place:
    """The place ``rel`` below ``top``: a storage root."""
    root = f"{top.root}/{rel}"
    url = {"local": root, "memory": f"memory://{root}", "s3": f"s3://{root}"}[top.kind]
    return Place(top.kind, root, url, top.inner)


def _options(place: Place) -> dict[str, Any]:
    """The storage options for ``place.url`` (S3: moto's endpoint and dummy keys)."""
    options: dict[str, Any] = place.inner.storage_options
    return options


def _tree(place: Place) -> dict[str, bytes]:
    """Every file under the root, by relative path, with its bytes."""
    fs = place.inner
    try:
        found: dict[str, dict[str, Any]] = fs.find(place.root, detail=True)
    except FileNotFoundError:
        return {}
    prefix = place.root.rstrip("/") + "/"
    files = sorted(p for p, info in found.items() if info["type"] == "file")
    data: dict[str, bytes] = fs.cat(files) if files else {}  # concurrent on S3
    out = {p[len(prefix) :]: bytes(data[p]) for p in files}
    sizes = {p[len(prefix) :]: int(found[p]["size"]) for p in files}
    assert sizes == {p: len(b) for p, b in out.items()}, "listed sizes differ from the bytes"
    return out


def _copy(src: Place, dst: Place, rels: list[str], *, whole: bool = False) -> None:
    """Copy the files ``rels`` (``whole``: the whole tree, which they are) from ``src`` to
    the same relative paths under ``dst``: ``shutil.copytree`` of the root (or a copy of
    each file) on a local disk, object copies elsewhere."""
    if whole and src.kind == "local":
        shutil.copytree(src.root, dst.root)
        return
    if src.kind == "local":
        for rel in rels:
            os.makedirs(os.path.dirname(f"{dst.root}/{rel}"), exist_ok=True)
            shutil.copyfile(f"{src.root}/{rel}", f"{dst.root}/{rel}")
        return
    src.inner.copy([f"{src.root}/{r}" for r in rels], [f"{dst.root}/{r}" for r in rels])


def _intact(tree: dict[str, bytes]) -> dict[str, set[str]]:
    """What each ``_metadata`` of ``tree`` whose every handle's bytes are all there needs:
    itself and every file its entries name.

    A checkpoint the ended ``job-0`` kept for the user (checkpoint 1) is not intact in
    WITHIN and ACROSS mode: its pooled files lie in the directories that went with the
    claimed checkpoint 2 when ``job-1`` subsumed it ("other checkpoints of the old job
    must not be used after a CLAIM restore", R72). It is left out, not required."""
    out: dict[str, set[str]] = {}
    for path in sorted(p for p in tree if p.rsplit("/", 1)[-1] == METADATA):
        streams = [s for e in decode(tree[path], source=path).entries if (s := stream_of(e.handle))]
        if all(
            len(tree.get(s.path, b""))
            >= extent_of(s).offset + s.length
            for s in streams
        ):
            out[path] = {path} | {s.path for s in streams}
    return out


def _needed(tree: dict[str, bytes]) -> set[str]:
    return set().union(*_intact(tree).values())


def _still_intact(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    """Every checkpoint intact in ``before`` is intact in ``after``, on the same bytes."""
    lost = sorted(set(_intact(before)) - set(_intact(after)))
    assert lost == [], f"no longer intact: {lost}"
    changed = sorted(p for p in _needed(before) if after.get(p) != before[p])
    assert changed == [], f"gone or changed: {changed}"


# --------------------------------------------------------------------------- the job


def _checkpoint(
    store: CheckpointStore,
    ledger: Ledger,
    new: tuple[str, ...],
    reuse: tuple[str, ...] = (),
    *,
    savepoint: bool = False,
) -> int:
    """One checkpoint (or savepoint) of every subtask: ``new`` keyed shared handles
    written, ``reuse`` ones reused, and the operator state (exclusive)."""
    coord = store.coordinator
    cid = coord.trigger(savepoint=savepoint)
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        for name in new:
            ledger.record(store.job_id, cid, sub, name, payload(sub, name))
            mgr.write(cid, sub, KS, name, payload(sub, name))
        for name in reuse:
            ledger.record(store.job_id, cid, sub, name, payload(sub, name))
            assert mgr.reuse_shared(cid, sub, name) is not None
        ledger.record(store.job_id, cid, sub, "offsets", payload(sub, "offsets", cid))
        mgr.write(cid, sub, OP, "offsets", payload(sub, "offsets", cid))
        mgr.acknowledge(cid, sub)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    return cid


def _run_job(place: Place, mode: MergingMode) -> Ledger:
    """The job of the module's docstring, left as its process died."""
    store = CheckpointStore(place.url, _config(mode), JOB, storage_options=_options(place))
    ledger = Ledger()
    assert _checkpoint(store, ledger, ("sst-1-a", "sst-1-b")) == 1
    assert _checkpoint(store, ledger, ("sst-2-a", "sst-2-b"), ("sst-1-a",)) == CLAIMED
    assert _checkpoint(store, ledger, (), ("sst-1-a",), savepoint=True) == SAVEPOINT
    assert store.coordinator.restore(CLAIMED, mode=RestoreMode.CLAIM) == "job-1"
    # After a CLAIM restore only NONE mode may reuse the claimed files (R72).
    across_bases = ("sst-1-a",) if mode is MergingMode.NONE else ()
    first, second = RETAINED
    assert _checkpoint(store, ledger, (f"sst-{first}-a", f"sst-{first}-b"), across_bases) == first
    new = (f"sst-{second}-a", f"sst-{second}-b")
    assert _checkpoint(store, ledger, new, (*across_bases, f"sst-{first}-a")) == second
    retained = store.coordinator.retained()
    assert [(r.job, r.checkpoint) for r in retained] == [("job-1", c) for c in RETAINED]
    _is_the_promised_shape(retained, mode)
    assert ledger.problems(store) == []
    assert testing.check_invariants(store) == []
    store.close()  # the process dies
    return ledger


def _is_the_promised_shape(retained: list[RetainedView], mode: MergingMode) -> None:
    """The tree holds what the test claims: merged files, or references across bases."""
    streams = [s for r in retained for e in r.entries if (s := stream_of(e.handle))]
    kinds = {e.kind for r in retained for e in r.entries}
    assert {KS, OP} <= kinds
    if mode is MergingMode.NONE:
        assert any(s.path.startswith("job-0/") for s in streams)  # job-1 names job-0's file
    else:
        per_file: dict[str, set[str]] = {}
        for s in streams:
            per_file.setdefault(s.path, set()).add(s.logical_id)
        assert max(len(ids) for ids in per_file.values()) >= 2  # merged: segments share a file


# --------------------------------------------------------------------------- checks


def _recovered(
    place: Place,
    mode: MergingMode,
    ledger: Ledger,
    checkpoints: tuple[int, ...],
    before: dict[str, bytes],
) -> CheckpointStore:
    """Recover the dead ``job-1`` at ``place``, which holds the files ``before``; check
    everything it restores from."""
    new, report = CheckpointStore.recover(
        place.url, _config(mode), JOB, crashed_job="job-1", storage_options=_options(place)
    )
    new.flush()
    assert report.crashed_job == "job-1"
    assert report.checkpoints == checkpoints
    assert [(r.job, r.checkpoint) for r in new.coordinator.retained()] == [
        ("job-1", c) for c in checkpoints
    ]
    assert not _needed(before) & set(report.garbage), "recovery deleted what is needed"
    _still_intact(before, _tree(place))
    # every byte of every retained checkpoint, read back through the store
    assert ledger.problems(new) == []
    # every byte of every handle the new job restores from (the latest, claimed)
    want = ledger.expected("job-1", checkpoints[-1])
    got: dict[tuple[Any, str], bytes] = {}
    for sub, tm in sorted(new.placement().items()):
        for e in new.task_manager(tm).state_to_restore(sub):
            if stream_of(e.handle) is not None:
                got[(e.subtask, e.name)] = new.read(e)
    assert got == want
    assert testing.check_invariants(new) == []
    return new


def _goes_on(store: CheckpointStore, ledger: Ledger, place: Place, savepoint: bytes) -> None:
    """The recovered job completes a checkpoint, then a job restores from the moved
    savepoint (whose ``_metadata`` was ``savepoint``) and reads every byte of it back."""
    cid = _checkpoint(store, ledger, ("later",))
    assert store.coordinator.retained()[-1].checkpoint == cid
    assert ledger.problems(store) == []
    assert testing.check_invariants(store) == []
    assert SAVEPOINT in store.coordinator.savepoints()
    store.coordinator.restore(SAVEPOINT)
    want = ledger.expected("job-0", SAVEPOINT)
    got: dict[tuple[Any, str], bytes] = {}
    for sub, tm in sorted(store.placement().items()):
        for e, data in store.task_manager(tm).restore(sub):
            got[(e.subtask, e.name)] = data
    assert got == want
    store.flush()
    assert testing.check_invariants(store) == []
    after = _tree(place)
    # the savepoint, and the checkpoints the new job ended with, given to the user (R70)
    assert {f"savepoints/savepoint-{SAVEPOINT}/{METADATA}", f"job-2/chk-{cid}/{METADATA}"} <= set(
        _intact(after)
    )
    assert after[f"savepoints/savepoint-{SAVEPOINT}/{METADATA}"] == savepoint


# --------------------------------------------------------------------------- the tests


def _whole_tree_cases() -> list[Any]:
    local = [
        pytest.param("local", m, how, id=f"local-{m.name}-{how}")
        for m in MergingMode
        for how in ("rename", "copy")
    ]
    memory = [pytest.param("memory", m, "copy", id=f"memory-{m.name}-copy") for m in MergingMode]
    on_s3 = [pytest.param("s3", MergingMode.WITHIN_CHECKPOINT, "copy", id="s3-WITHIN-copy")]
    return local + memory + on_s3


@pytest.mark.parametrize(("kind", "mode", "how"), _whole_tree_cases())
def test_moved_base(top: Place, mode: MergingMode, how: str) -> None:
    """The root with every job base and the savepoints moved (renamed on a local disk)
    or copied to a different parent, then recovered from there."""
    old = _at(top, "first/ckpt")
    new = _at(top, "elsewhere/deeper/moved")
    ledger = _run_job(old, mode)
    original = _tree(old)
    kept = {f"job-1/chk-{c}/{METADATA}" for c in RETAINED}
    savepoint = f"savepoints/savepoint-{SAVEPOINT}/{METADATA}"
    assert kept | {savepoint} <= set(_intact(original))
    if how == "rename":
        os.makedirs(os.path.dirname(new.root))
        shutil.move(old.root, new.root)
        assert not os.path.exists(old.root)
    else:
        _copy(old, new, sorted(original), whole=True)
    moved = _tree(new)
    assert moved == original
    store = _recovered(new, mode, ledger, RETAINED, moved)
    _goes_on(store, ledger, new, original[savepoint])
    if how == "copy":
        assert _tree(old) == original  # nothing under the old place changed


@pytest.mark.parametrize(
    ("kind", "mode"),
    [("local", m) for m in MergingMode]
    + [("memory", m) for m in MergingMode]
    + [("s3", MergingMode.NONE)],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_one_checkpoint_copied_elsewhere(top: Place, mode: MergingMode) -> None:
    """The older retained checkpoint alone (its ``_metadata`` and every file it names,
    in NONE mode some of them in ``job-0``'s base) copied under a new root: recovery
    there restores from it; the original tree is unchanged."""
    old = _at(top, "first/ckpt")
    new = _at(top, "elsewhere/one")
    ledger = _run_job(old, mode)
    original = _tree(old)
    needs = _intact(original)[f"job-1/chk-{RETAINED[0]}/{METADATA}"]
    _copy(old, new, sorted(needs))
    # _recovered checks that these are there after recovery, with these bytes
    store = _recovered(new, mode, ledger, RETAINED[:1], {p: original[p] for p in needs})
    _checkpoint(store, ledger, ("later",))
    assert ledger.problems(store) == []
    assert testing.check_invariants(store) == []
    assert _tree(old) == original
