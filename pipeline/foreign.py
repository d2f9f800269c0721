"""What the reader of an engine's own checkpoint format (Flink's, Spark's) gives the audit.

The audit's tables are computed once, by ``pipeline.single.analyse`` (and the same
definitions on Spark): files, references, dangling, orphans, owners, checkpoints. A
format's reader turns the engine's metadata into the same rows (``scan.FileRow``,
``scan.RefRow``, ``scan.CheckpointRow``) and adds only what the references cannot say:
which files are the engine's own metadata, which unreferenced files the engine itself
still owns (a Flink checkpoint in flight, a Spark version its maintenance deletes), the
owner directory of a path in that engine's layout, and what the audit could not know.

Paths baked into an engine's metadata are absolute URIs of where it wrote them; a copied
or moved checkpoint still names the old place. :class:`PathMap` maps prefixes at read
time (``--path-map OLD=NEW``) and :func:`relative` turns a URI into the audit's
container-relative form, or says it lies elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from attrs import field, frozen

from pipeline import scan
from pipeline.location import Location
from pipeline.result import Row
from spec.errors import CkptError

FORMATS = ("auto", "ckpt", "flink", "spark")


class ForeignError(CkptError):
    """The directory cannot be audited as the format it was taken for (a moved checkpoint
    without ``--path-map``, an unrecognised directory, a bad ``--path-map``): nothing is
    reported as clean and nothing is deleted."""


@frozen
class Foreign:
    format: str
    """``flink`` or ``spark``."""
    held: Mapping[str, str] = field(factory=dict)
    """Unreferenced files the engine still owns, with their status (``result.HELD``)."""
    metadata: frozenset[str] = frozenset()
    """The engine's own metadata files: never data, never deleted."""
    owner: Callable[[str], str] = scan.owner_dir
    notes: tuple[str, ...] = ()
    dangling: Sequence[Row] | None = None
    """The reader's own dangling rows when it judges references itself (Spark: exact
    sizes, changelog lineage); ``None``: the audit judges each range against the file."""


@frozen
class ForeignRead:
    """Everything the audit needs of a foreign checkpoint directory, as plain rows."""

    foreign: Foreign
    files: list[scan.FileRow]
    checkpoints: list[scan.CheckpointRow]
    references: list[scan.RefRow]
    corrupt: list[scan.ErrorRow]
    outside: list[scan.FileRow]
    """Referenced files outside the audited directory, as stat-ed (missing ones absent)."""
    problems: list[scan.Problem]


@frozen
class PathMap:
    """Prefix rewrites of the URIs an engine wrote, longest prefix first, each matched at a
    path boundary (``file:/a/b`` maps ``file:/a/b/x``, never ``file:/a/bc``)."""

    pairs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, items: Sequence[str]) -> PathMap:
        pairs = []
        for item in items:
            old, sep, new = item.partition("=")
            if not sep or not old or not new:
                raise ForeignError(f"--path-map {item!r} is not OLD=NEW (both non-empty)")
            pairs.append((old.rstrip("/") or old, new.rstrip("/") or new))
        return cls(tuple(sorted(pairs, key=lambda p: -len(p[0]))))

    def apply(self, uri: str) -> str:
        for old, new in self.pairs:
            if uri == old or uri.startswith(old + "/"):
                return new + uri[len(old):]
        return uri


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$")
_S3 = frozenset({"s3", "s3a", "s3n", "s3p"})


def split_uri(uri: str) -> tuple[str, str]:
    """(store, path) of a URI as engines write them: ``file:/x``, ``file:///x`` and ``/x``
    are local; ``s3://``, ``s3a://``, ``s3p://`` (Flink's Presto) and ``s3n://`` one S3."""
    m = _SCHEME.match(uri)
    if m is None:
        return "file", uri
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme in ("file", "local"):
        if rest.startswith("//"):
            rest = rest[2:]
            # file://host/path: only an empty host (or localhost) is this machine
            host, _, tail = rest.partition("/")
            if host not in ("", "localhost"):
                return f"file://{host}", "/" + tail
            rest = "/" + tail
        return "file", rest
    if scheme in _S3:
        return "s3", rest[2:] if rest.startswith("//") else rest
    return scheme, rest


def relative(loc: Location, uri: str) -> str | None:
    """The container-relative path of ``uri`` when it lies on the audited store under the
    audited directory's container, normalised; else ``None`` (elsewhere)."""
    store, path = split_uri(uri)
    if store != ("file" if loc.local else loc.protocol):
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None
    norm = ("/" if loc.local else "") + "/".join(parts)
    container = loc.container.rstrip("/")
    prefix = (container + "/") if container not in ("", "/") else ("/" if loc.local else "")
    if not norm.startswith(prefix):
        return None
    return norm[len(prefix):]


def on_store(loc: Location, uri: str) -> bool:
    return split_uri(uri)[0] == ("file" if loc.local else loc.protocol)
