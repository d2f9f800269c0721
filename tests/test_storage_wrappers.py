"""R16 through fsspec wrappers (issue 14, defect 3): the store decides whether an open
file's flushed bytes are readable by the storage that finally holds them, through any
chain of wrappers, and refuses a wrapper it does not know rather than guess.

``simplecache::s3://`` and ``filecache::s3://`` must not pass for durable storage with
ACROSS merging: the wrapper's protocol is not ``s3``, so a store judging by it would take
the bytes of a pooled file for durable while they sit in a local temporary copy, and a
completed checkpoint would name a segment that never reached S3 (I1). Here every
wrapper over S3 (moto) is refused with ACROSS before any I/O, works in WITHIN (and
leaves every byte a completed checkpoint names on S3 itself), and made-up wrapper
classes are refused in every mode.

A cache over a local disk (``simplecache::file://`` and the like) is refused in every
mode, by the same walk of the chain (issue 14, threat 50): through the cache the store's
calls would go through fsspec, which follows links, so its refusal of links below the
root would never run; and a cache of a disk on the same machine buys nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.dirfs import DirFileSystem  # type: ignore[import-untyped]
from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

from fastimpl import CachedLocalDiskError, CheckpointStore, testing
from fastimpl.recovery import recover
from fastimpl.storage import Storage, UnknownWrapperError, open_files_readable
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.handles import FileHandle, SegmentHandle, extent_of, stream_of
from tests.faultyfs import FaultyFileSystem
from tests.lockstep import S3_BUCKET, s3

JOB = JobSpec((VertexSpec("src", 2),), num_tms=1)
S3_OPTIONS = {"key": "testing", "secret": "testing"}
WRAPPERS = ["simplecache", "filecache", "blockcache", "dir"]
_n = iter(range(1_000_000))


def _options(endpoint: str) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": endpoint}, **S3_OPTIONS}


@pytest.fixture
def prefix(s3_endpoint: str) -> Iterator[str]:
    root = f"{S3_BUCKET}/wrappers-{os.getpid()}-{next(_n)}"
    yield root
    fs = s3(s3_endpoint)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _objects(endpoint: str, root: str) -> dict[str, int]:
    fs = s3(endpoint)
    if not fs.exists(root):
        return {}
    found = fs.find(root, detail=True)
    return {p[len(root) + 1 :]: int(i["size"]) for p, i in found.items()}


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_across_is_refused_through_a_wrapper_over_s3(
    wrapper: str,
    prefix: str,
    s3_endpoint: str,
) -> None:
    url = f"{wrapper}::s3://{prefix}"
    cfg = Config.for_mode(MergingMode.ACROSS_CHECKPOINT)
    with pytest.raises(ValueError, match=r"across-checkpoint-boundary .* \(R16\)"):
        CheckpointStore(url, cfg, JOB, storage_options={"s3": _options(s3_endpoint)})
    with pytest.raises(ValueError, match=r"\(R16\)"):
        CheckpointStore.recover(url, cfg, JOB, storage_options={"s3": _options(s3_endpoint)})
    assert _objects(s3_endpoint, prefix) == {}  # refused before any I/O


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_within_through_a_wrapper_leaves_every_named_byte_on_s3(
    wrapper: str,
    prefix: str,
    s3_endpoint: str,
) -> None:
    """The modes R16 allows work through the wrapper, and what a completed checkpoint
    names is on S3 itself (I1 where the bytes finally live), not only in a cache."""
    url = f"{wrapper}::s3://{prefix}"
    cfg = Config.for_mode(MergingMode.WITHIN_CHECKPOINT)
    store = CheckpointStore(url, cfg, JOB, storage_options={"s3": _options(s3_endpoint)})
    assert not store.config.open_files_readable
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        mgr = store.task_manager(tm)
        mgr.write(cid, sub, StateKind.KEYED_SHARED, "sst", b"k" * 100)
        mgr.write(cid, sub, StateKind.OPERATOR_LIST, "offsets", b"o" * 10)
        mgr.acknowledge(cid, sub)
    done = coord.complete(cid)
    assert done is not None
    # fsspec's url_to_fs gives ``dir::s3://P`` a DirFileSystem rooted at P *and* the
    # path P inside it: the objects land under P/P, consistently for every call.
    base = f"{prefix}/{prefix}" if wrapper == "dir" else prefix
    on_s3 = _objects(s3_endpoint, base)
    assert done.metadata in on_s3
    for e in done.entries:
        s = stream_of(e.handle)
        assert isinstance(s, SegmentHandle | FileHandle)
        end = extent_of(s).offset + s.length
        assert on_s3.get(s.path, -1) >= end, (s.path, on_s3)
    assert testing.check_invariants(store) == []
    store.close()


class _MadeUpWrapper(AbstractFileSystem):  # type: ignore[misc]
    """A wrapper the store has never heard of: it holds its target under a name of its
    own, so only holding another file system gives it away."""

    protocol = "madeupwrap"

    def __init__(self, target: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backing_store = target if target is not None else fsspec.filesystem("memory")


class _TargetOnly(AbstractFileSystem):  # type: ignore[misc]
    """A wrapper that names its target only in its options (``target_protocol``)."""

    protocol = "madeuptarget"
    cachable = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class _PlainStore(AbstractFileSystem):  # type: ignore[misc]
    """A store (no wrapper) the store knows nothing about."""

    protocol = "madeupstore"
    cachable = False


@pytest.mark.parametrize("mode", list(MergingMode))
def test_an_unknown_wrapper_is_refused_in_every_mode(
    mode: MergingMode,
    prefix: str,
    s3_endpoint: str,
) -> None:
    fsspec.register_implementation("madeupwrap", _MadeUpWrapper, clobber=True)
    target = s3(s3_endpoint)
    cfg = Config.for_mode(mode)
    with pytest.raises(UnknownWrapperError, match=r"_MadeUpWrapper .* open_files_readable"):
        CheckpointStore(f"madeupwrap://{prefix}", cfg, JOB, storage_options={"target": target})
    with pytest.raises(UnknownWrapperError, match="madeupwrap"):
        CheckpointStore.recover(
            f"madeupwrap://{prefix}", cfg, JOB, storage_options={"target": target}
        )
    with pytest.raises(UnknownWrapperError, match="madeuptarget"):
        open_files_readable(_TargetOnly(target_protocol="s3"))
    assert _objects(s3_endpoint, prefix) == {}


def test_the_answer_follows_the_chain_to_the_store() -> None:
    """Through ``dir::`` the target decides; a cache hides open files whatever its
    target; an unknown store is taken to hide them (the safe guess: ACROSS refused); a
    wrapper that says what it does is believed."""
    mem = fsspec.filesystem("memory")
    local = fsspec.filesystem("file")
    dirfs = DirFileSystem
    assert open_files_readable(mem) and open_files_readable(local)
    assert open_files_readable(dirfs(path="/x", fs=local))
    assert open_files_readable(dirfs(path="/x", fs=dirfs(path="/y", fs=mem)))
    assert not open_files_readable(dirfs(path="/x", fs=FaultyFileSystem(mem, object_store=True)))
    for cache in ("simplecache", "filecache", "blockcache"):
        assert not open_files_readable(fsspec.filesystem(cache, fs=mem))
        with pytest.raises(CachedLocalDiskError, match=f"{cache}::file://"):
            open_files_readable(fsspec.filesystem(cache, fs=local))
    assert not open_files_readable(_PlainStore())
    assert open_files_readable(FaultyFileSystem(mem))
    with pytest.raises(UnknownWrapperError):
        open_files_readable(dirfs(path="/x", fs=_MadeUpWrapper(mem)))
    cfg = Config.for_mode(MergingMode.ACROSS_CHECKPOINT)
    fsspec.register_implementation("madeupstore", _PlainStore, clobber=True)
    with pytest.raises(ValueError, match=r"\(R16\)"):
        CheckpointStore("madeupstore://x", cfg, JOB)


CACHED_LOCAL = [
    "{cache}::file://{base}",
    "{cache}::{base}",
    "dir::{cache}::file://{base}",
    "{cache}::dir::file://{base}",
]


@pytest.mark.parametrize("form", CACHED_LOCAL)
@pytest.mark.parametrize("cache", ["simplecache", "filecache", "blockcache"])
@pytest.mark.parametrize("mode", list(MergingMode))
def test_a_cache_over_a_local_disk_is_refused_before_any_io(
    tmp_path: Path, mode: MergingMode, cache: str, form: str
) -> None:
    """Every caching wrapper over a local disk, however it is chained, in every merging
    mode: a new store, a recovery and a bare ``Storage`` are refused with
    ``CachedLocalDiskError`` naming the chain, and nothing is created on the disk."""
    base = tmp_path / "base"
    url = form.format(cache=cache, base=base)
    cfg = Config.for_mode(mode)
    with pytest.raises(CachedLocalDiskError, match=rf"{cache}::(dir::)?file://: a cache over"):
        CheckpointStore(url, cfg, JOB)
    with pytest.raises(CachedLocalDiskError, match="symbolic links"):
        CheckpointStore.recover(url, cfg, JOB)
    fs, root = fsspec.core.url_to_fs(url)
    with pytest.raises(CachedLocalDiskError):
        Storage(fs, root)
    with pytest.raises(CachedLocalDiskError):
        recover(cfg, JOB, fs, root)
    with pytest.raises(CachedLocalDiskError):
        # what the store runs with when told the store hides open files (R16): the
        # configuration does not decide it
        CheckpointStore(url, Config.for_mode(MergingMode.NONE, open_files_readable=False), JOB)
    assert not base.exists()


def test_the_local_disk_itself_works_where_its_cache_is_refused(tmp_path: Path) -> None:
    """The refusal's advice holds: the same disk without the cache, and ``dir::`` over
    it, complete a checkpoint and read its bytes back."""
    for url in (str(tmp_path / "plain"), f"dir::{tmp_path / 'wrapped'}"):
        store = CheckpointStore(url, Config.for_mode(MergingMode.WITHIN_CHECKPOINT), JOB)
        coord = store.coordinator
        cid = coord.trigger()
        for sub, tm in sorted(store.placement().items()):
            store.task_manager(tm).write(cid, sub, StateKind.KEYED_SHARED, "sst", b"k" * 10)
            store.task_manager(tm).acknowledge(cid, sub)
        done = coord.complete(cid)
        assert done is not None
        assert [store.read(e) for e in done.entries] == [b"k" * 10] * len(done.entries)
        store.close()
