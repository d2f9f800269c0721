"""The storages and merging modes the bad-input tests run on, and how they compare a whole
storage before and after a refusal (every file's listed size and bytes, every directory).

``setting`` is a (storage, merging mode) pair: local files and ``memory://`` in all three
modes, S3 (s3fs against moto's server, the ``s3_endpoint`` fixture of ``tests/conftest.py``)
in WITHIN_CHECKPOINT only (``tests/test_bad_input.py`` says why). ``place`` is a fresh
root on that storage.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastimpl import CheckpointStore, CompletionFailed
from fastimpl.metadata import _canonical
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.layout import metadata_path
from tests.faultyfs import Place, payload
from tests.lockstep import S3_BUCKET, s3

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)
META = metadata_path("job-0", 3)
"""The newest retained checkpoint's ``_metadata``, which every case damages."""


S3_MODE = MergingMode.WITHIN_CHECKPOINT
"""The one merging mode the S3 cases run in (see the module's docstring)."""
FILE_SETTINGS: list[tuple[str, MergingMode]] = [
    (kind, m) for kind in ("local", "memory") for m in MergingMode
]
S3_SETTINGS: list[tuple[str, MergingMode]] = [("s3", S3_MODE)]
SETTINGS = FILE_SETTINGS + S3_SETTINGS
"""(storage, merging mode) of a test; the ``setting`` fixture's default is all of them."""
_s3_roots = itertools.count()


def _setting_id(setting: tuple[str, MergingMode]) -> str:
    return f"{setting[0]}-{setting[1].name}"


on_file_systems = pytest.mark.parametrize("setting", FILE_SETTINGS, ids=_setting_id)
on_s3 = pytest.mark.parametrize("setting", S3_SETTINGS, ids=_setting_id)


@pytest.fixture(params=SETTINGS, ids=_setting_id)
def setting(request: pytest.FixtureRequest) -> tuple[str, MergingMode]:
    setting: tuple[str, MergingMode] = request.param
    return setting


@pytest.fixture
def mode(setting: tuple[str, MergingMode]) -> MergingMode:
    return setting[1]


@pytest.fixture
def place(
    setting: tuple[str, MergingMode], request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Place]:
    kind = setting[0]
    if kind != "s3":
        p = Place.make(kind, tmp_path)
        yield p
        p.cleanup()
        return
    endpoint: str = request.getfixturevalue("s3_endpoint")
    fs = s3(endpoint)
    root = f"{S3_BUCKET}/bad-input-{os.getpid()}-{next(_s3_roots)}"
    yield Place("s3", root, f"s3://{root}", fs)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _options(place: Place) -> dict[str, Any]:
    """The storage options that reach ``place`` from its URL (S3: moto's endpoint and
    the dummy credentials; nothing for local files and memory)."""
    options: dict[str, Any] = place.inner.storage_options
    return options


def _config(mode: MergingMode) -> Config:
    return Config.for_mode(mode, num_retained=2)


def _reseal(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """Edit the document and give it a valid checksum again, to reach the later checks."""
    doc = json.loads(data)
    edit(doc)
    doc["sha256"] = hashlib.sha256(_canonical(doc["payload"])).hexdigest()
    return _canonical(doc) + b"\n"


Listing = dict[str, tuple[str, int | None, bytes | None]]


def _listing(place: Place) -> Listing:
    """Everything under the place's root, by relative path: each file's type, size as
    listed and bytes; each directory's type (on S3: each prefix that holds an object)."""
    fs = place.inner
    try:
        found: dict[str, dict[str, Any]] = fs.find(place.root, withdirs=True, detail=True)
    except FileNotFoundError:
        return {}
    prefix = place.root.rstrip("/") + "/"
    files = sorted(p for p, info in found.items() if info["type"] == "file")
    data: dict[str, bytes] = fs.cat(files) if files else {}  # concurrent on S3
    out: Listing = {}
    for p, info in found.items():
        if not p.startswith(prefix):
            continue  # the root itself
        if info["type"] == "file":
            out[p[len(prefix) :]] = ("file", int(info["size"]), bytes(data[p]))
        else:
            out[p[len(prefix) :]] = (str(info["type"]), None, None)
    return out


def _changes(before: Listing, after: Listing) -> list[str]:
    out = [f"deleted {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"created {p}" for p in sorted(after.keys() - before.keys())]
    for p in sorted(before.keys() & after.keys()):
        (kind, size, data), (kind2, size2, data2) = before[p], after[p]
        if (kind, size) != (kind2, size2):
            out.append(f"{p}: {kind} of {size} bytes became {kind2} of {size2} bytes")
        elif data != data2:
            out.append(f"{p}: contents changed")
    return out


def _unchanged(place: Place, store: CheckpointStore | None, before: Listing) -> None:
    if store is not None:
        store.flush()
    changes = _changes(before, _listing(place))
    assert not changes, changes


def _checkpoint(
    store: CheckpointStore, *, savepoint: bool = False, keyed: bool = True
) -> int | None:
    """One checkpoint (or savepoint) of every subtask (keyed and operator state, or
    operator state only), completed, its notices delivered and the deletes flushed; its
    id, or None if it did not complete."""
    coord = store.coordinator
    cid = coord.trigger(savepoint=savepoint)
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        if keyed:
            mgr.write(cid, sub, KS, f"sst-{cid}", payload(sub, f"sst-{cid}"))
        mgr.write(cid, sub, OP, "offsets", payload(sub, "offsets", cid))
        mgr.acknowledge(cid, sub)
    try:
        coord.complete(cid)
    except CompletionFailed:
        done: int | None = None
    else:
        done = cid
    store.deliver_notifications()
    store.flush()
    return done
