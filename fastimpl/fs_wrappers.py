"""Which storage finally holds the bytes: seeing through fsspec wrappers (R16, issue 14).

The store asks these questions of a file system once, before any I/O: whether the flushed
bytes of a file still open for writing are readable (and durable) where they end up
(R16: ACROSS merging names bytes of open files), whether a wrapper hides that answer (then
it is refused, not guessed), and whether a ``dir::`` or a cache stands over a local disk
(``dir::`` is unwrapped so that the local path, with its syncs and its refusal of links,
runs; a cache is refused: through it fsspec would follow links).
"""

from __future__ import annotations

from typing import Any

from spec.errors import CkptError

OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "adl", "oss"})
"""Protocols whose objects appear only once closed: ACROSS merging is refused there."""
READABLE_STORES = frozenset({"file", "local", "memory", "hdfs", "arrow_hdfs"})
"""Protocols whose flushed bytes of an open file are readable (and durable) at once.
A store named in neither set is taken to hide open files: the safe guess (R16)."""


class UnknownWrapperError(CkptError, ValueError):
    """A file system wraps another one in a way the store does not know (issue 14): where
    its bytes end up, and when, cannot be told, so it is refused rather than guessed."""


class CachedLocalDiskError(CkptError, ValueError):
    """A caching wrapper (``simplecache::``, ``filecache::``, ``blockcache::``) over a
    local disk (issue 14): through the cache the store's calls go through fsspec, which
    follows links, so the store's refusal of links below its root (``UnsafePathError``)
    could not run; and a cache of a disk on the same machine buys nothing. Refused before
    any I/O: open the local path (or ``dir::`` over it) without the cache."""


def _protocol_names(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _wrapped(fs: Any) -> list[Any]:
    """The file systems ``fs`` holds as attributes: a wrapper passes calls on to them."""
    from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

    held = [v for v in vars(fs).values() if isinstance(v, AbstractFileSystem) and v is not fs]
    options = getattr(fs, "storage_options", None) or {}
    if not held and isinstance(options, dict) and "target_protocol" in options:
        held.append(options["target_protocol"])  # a target named but not held
    return held


def open_files_readable(fs: Any) -> bool:
    """R16, decided by the storage that finally holds the bytes (issue 14): whether the
    flushed bytes of a file still open for writing are readable and durable there.

    Walks a chain of fsspec wrappers (chained URLs such as ``simplecache::s3://``,
    ``DirFileSystem.fs``, a cache's ``fs``/``target_protocol``). A file system may state
    the answer itself with a boolean ``open_files_readable`` attribute (a wrapper that
    knows what it does); a wrapper that does not, and that the store does not know,
    raises ``UnknownWrapperError``: a wrong "readable" would let ACROSS merging name bytes
    that never reached the store, and a wrong guess either way is not ours to make. A
    cache whose chain ends in a local disk raises ``CachedLocalDiskError`` (issue 14):
    the same walk, so every store and recovery asks it once, before any I/O.
    """
    from fsspec.implementations.cached import CachingFileSystem  # type: ignore[import-untyped]
    from fsspec.implementations.dirfs import DirFileSystem  # type: ignore[import-untyped]

    declared = getattr(fs, "open_files_readable", None)
    if isinstance(declared, bool):
        return declared
    names = _protocol_names(fs)
    if OBJECT_STORES.intersection(names):
        return False
    if isinstance(fs, CachingFileSystem):
        _refuse_a_cache_of_a_local_disk(fs)
        # simplecache/filecache write to a local copy and upload it at close; blockcache
        # writes through but serves reads from cached blocks, stale while a file grows.
        # Either way a reader does not see an open file's flushed bytes where they end up.
        return False
    if isinstance(fs, DirFileSystem):
        return open_files_readable(fs.fs)
    inner = _wrapped(fs)
    if inner:
        kind = f"{type(fs).__module__}.{type(fs).__qualname__}"
        raise UnknownWrapperError(
            f"file system {kind} (protocol {'/'.join(names)}) wraps another one the store"
            " cannot see through: whether an open file's flushed bytes reach the storage"
            " that holds them is unknown (R16); unwrap it, or give its class a boolean"
            " open_files_readable attribute saying so"
        )
    return bool(READABLE_STORES.intersection(names))


def _refuse_a_cache_of_a_local_disk(cache: Any) -> None:
    """Follow ``cache``'s target through ``dir::`` and further caches; raise
    ``CachedLocalDiskError`` if it ends in a local disk."""
    from fsspec.implementations.cached import CachingFileSystem
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

    chain = [cache]
    inner = cache.fs
    while isinstance(inner, CachingFileSystem | DirFileSystem):
        chain.append(inner)
        inner = inner.fs
    if isinstance(inner, LocalFileSystem) or {"file", "local"} & set(_protocol_names(inner)):
        url = "".join(f"{_protocol_names(c)[0]}::" for c in chain) + "file://"
        raise CachedLocalDiskError(
            f"{url}: a cache over a local disk is refused. Through the cache the store"
            " cannot refuse symbolic links in its tree (issue 14), and a cache of a disk"
            " on this machine buys nothing: give the local path (or dir:: over it)"
            " without the cache"
        )


def through_local_dirfs(fs: Any, root: str) -> tuple[Any, str]:
    """``dir::`` over a local disk is that disk under a longer root: unwrapped, so that
    its calls take the local path (its syncs, and its refusal of links, issue 14)."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    inner = fs
    while isinstance(inner, DirFileSystem):
        inner = inner.fs
    if inner is fs or not isinstance(inner, LocalFileSystem):
        return fs, root
    while isinstance(fs, DirFileSystem):
        root = fs._join(root) if root else fs.path
        fs = fs.fs
    return fs, root
