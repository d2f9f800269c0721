"""Where the audited job lives: a file system, the container directory and the job base.

Metadata paths are relative to the directory that contains the job base (the storage root
of ``spec.layout``), so the audit keeps every path in that form: ``<job>/shared/...``,
``savepoints/savepoint-7/...``. A :class:`Location` is plain data, picklable, so Spark
ships it to the executors and each rebuilds the file system from the same options.
"""

from __future__ import annotations

from typing import Any

import fsspec  # type: ignore[import-untyped]
from attrs import field, frozen

from spec.errors import CkptError

LOCAL = frozenset({"file", "local"})
SUPPORTED = frozenset({"file", "local", "s3", "s3a"})
"""Stores every Spark executor sees the same: ``memory://`` lives in one process only."""


class LocationError(CkptError, ValueError):
    """The base URI cannot be audited (unsupported store, not a job directory, ...)."""


def _options_key(options: dict[str, Any]) -> str:
    return repr(sorted(options.items()))


@frozen
class Location:
    protocol: str
    container: str
    """The file-system path of the directory holding the job base ('' for a bucket root)."""
    job_dir: str
    """The job base's name in ``container``: the first component of every job path."""
    options: dict[str, Any] = field(factory=dict, eq=False, hash=False)

    @classmethod
    def parse(cls, uri: str, options: dict[str, Any] | None = None) -> Location:
        opts = dict(options or {})
        try:
            fs, path = fsspec.core.url_to_fs(uri, **opts)
        except (ImportError, ValueError) as err:
            raise LocationError(f"{uri}: cannot open this store: {err}") from err
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol not in SUPPORTED:
            hint = (
                " (memory:// is private to one process; Spark executors cannot see it)"
                if protocol == "memory"
                else ""
            )
            raise LocationError(
                f"{uri}: the audit reads local files and s3:// only, not {protocol}://{hint}"
            )
        path = str(path).rstrip("/")
        if protocol in LOCAL:
            path = path or "/"
        if "/" not in path.lstrip("/") or path in ("", "/"):
            raise LocationError(
                f"{uri}: name the job's base directory (the one holding chk-*, shared/ and "
                "taskowned/), not a bucket or file-system root"
            )
        container, job_dir = path.rsplit("/", 1)
        if protocol in LOCAL and not container:
            container = "/"
        return cls("file" if protocol in LOCAL else protocol, container, job_dir, opts)

    @property
    def local(self) -> bool:
        return self.protocol in LOCAL

    def fs(self) -> Any:
        """The file system (fsspec caches instances, so executors build it once).

        On S3 directory listings are never cached: the deletion guards list again just
        before deleting and must see a checkpoint that completed since the audit."""
        options = dict(self.options)
        if not self.local:
            options.setdefault("use_listings_cache", False)
        return fsspec.filesystem(self.protocol, **options)

    def full(self, rel: str) -> str:
        """The file-system path of a container-relative path."""
        if not rel:
            return self.container
        return f"{self.container.rstrip('/')}/{rel}" if self.container else rel

    def rel(self, full: str) -> str:
        prefix = self.container.rstrip("/") + "/"
        full = str(full)
        return full[len(prefix) :] if full.startswith(prefix) else full.lstrip("/")

    def uri(self, rel: str = "") -> str:
        full = self.full(rel) if rel else self.full(self.job_dir)
        return full if self.local else f"{self.protocol}://{full}"

    @property
    def key(self) -> str:
        return f"{self.protocol}://{self.container}/{self.job_dir} {_options_key(self.options)}"
