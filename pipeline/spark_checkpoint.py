"""A Spark Structured Streaming checkpointLocation on the RocksDB state store, read in
pure Python: which files a restart needs, which Spark's own maintenance deletes, which
nobody will ever read or delete, and which needed files are missing.

The rules are Spark 4.3's (``RocksDBFileManager``, ``RocksDB.load``, the commit log),
checked against Spark's own classes on the fixtures ``tests/fixtures/regen_spark.py``
writes (see ``/work/shared/FORMATS.md``, Spark section):

- The last committed batch ``L`` (the highest ``commits/<L>``) restarts from state
  version ``V = L + 1`` of every store (``state/<op>/<partition>[/<store name>]``).
- A version without changelog is its zip (``<v>.zip``, format 2 ``<v>_<uid>.zip``), whose
  ``metadata`` entry (``v1\\n{json}``) names the SSTs (``SSTs/<dfsSstFileName>``, with
  ``sizeBytes``) and archived logs (``logs/...``) a load copies, checking each size.
- With changelog checkpointing a load takes the newest snapshot zip at or below the
  version and replays the changelogs after it: format 1 by listing the zips, format 2
  by the lineage the version's changelog names in its header (``writeUTF`` version, then
  ``writeUTF`` lineage JSON, inside the LZ4 block stream).
- Format 2: ``commits/<b>`` is ``v2\\n{json}`` whose ``stateUniqueIds[op][partition]``
  lists the unique ids of version ``b + 1`` (one per store name).
- Maintenance (``deleteOldVersions(retain)``) keeps the newest snapshot ``m`` at or
  below ``max snapshot - retain + 1`` and everything from it; below ``m`` it deletes
  zips, changelogs and their checksum files, the SSTs whose last user is a deleted zip,
  and the SSTs no zip lists that are older than the oldest listed one. With no version
  below ``m`` it deletes nothing at all. ``retain`` is ``minBatchesToRetain``: the files
  do not record it.

The versions judged retained in a store are ``V - retain + 1 .. V`` and, further down,
every version Spark's maintenance keeps (so a file Spark keeps for its own reasons is
never called leaked). Everything is read through ``pipeline.safe_read`` (regular files
only, never a link, sizes capped) and listed through ``pipeline.scan``.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import struct
import zipfile
from collections.abc import Iterable
from typing import Any

from attrs import frozen

from pipeline import scan
from pipeline.location import Location
from pipeline.names import shown
from pipeline.safe_read import Refused, kind_of, read_regular
from spec.errors import CkptError, UsageError

NEEDED = "needed"
STALE = "stale"
ORPHAN = "orphan"
METADATA = "metadata"
STATUSES = (NEEDED, STALE, ORPHAN, METADATA)

DEFAULT_RETAIN = 100
"""Spark's ``spark.sql.streaming.minBatchesToRetain`` default."""

COMMIT_LIMIT = 1 << 20
"""Largest commit file read: a commit names one id per partition and store."""
ZIP_LIMIT = 64 << 20
"""Largest snapshot zip opened (it holds RocksDB's MANIFEST, OPTIONS and the metadata)."""
ZIP_METADATA_LIMIT = 16 << 20
"""Largest ``metadata`` entry read from a zip (uncompressed): ~100 bytes an SST."""
CHANGELOG_HEADER_LIMIT = 4 << 20
"""Most bytes of a changelog read (and decompressed) to reach its lineage header."""

META_DIRS = ("offsets", "commits", "sources")
STORE_SUBDIRS = ("SSTs", "logs", "_metadata")
VERSIONED = re.compile(r"^(\d+)(?:_([^_./]+))?\.(zip|changelog)$")


class SparkCheckpointError(CkptError, ValueError):
    """A file the reader must understand is malformed: which file, which field, what."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        super().__init__(f"{path}: {field}: {problem}")
        self.path = path
        self.field = field
        self.problem = problem


@frozen
class Ref:
    """One reference of a retained version to a file."""

    version: int
    store: str
    path: str
    size: int | None
    """The size the reference records (an SST's ``sizeBytes``); ``None`` if none."""
    role: str
    """``zip``, ``sst``, ``log`` or ``changelog``."""


@frozen
class Dangling:
    version: int
    store: str
    path: str
    size: int | None
    actual: int | None
    reason: str
    """``missing`` or ``size differs``."""


@frozen
class CommitMarker:
    """What a deleter re-reads before deleting: a batch committed meanwhile changes it."""

    name: str
    size: int
    mtime: float


@frozen
class SparkCheckpoint:
    files: list[scan.FileRow]
    status: dict[str, tuple[str, str]]
    refs: list[Ref]
    dangling: list[Dangling]
    last_batch: int | None
    retained: dict[str, list[tuple[int, str | None]]]
    """Per store directory, the (version, unique id) pairs judged retained."""
    stale: frozenset[str]
    """Everything Spark's maintenance deletes now (a needed file among them too)."""
    marker: CommitMarker | None
    retain: int
    problems: list[scan.Problem]

    def paths(self, status: str) -> set[str]:
        return {p for p, (s, _w) in self.status.items() if s == status}

    @property
    def needed(self) -> set[str]:
        return {r.path for r in self.refs}


# --------------------------------------------------------------------------- decoding


def parse_commit(data: bytes, path: str) -> dict[str, Any]:
    """``commits/<b>``: ``v1`` or ``v2``, a newline, one JSON object."""
    head, nl, body = data.partition(b"\n")
    if not nl or head not in (b"v1", b"v2"):
        raise SparkCheckpointError(path, "version", f"expected 'v1' or 'v2', got {head[:20]!r}")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SparkCheckpointError(path, "json", f"not JSON: {err}") from err
    if not isinstance(obj, dict):
        raise SparkCheckpointError(path, "json", "not a JSON object")
    ids = obj.get("stateUniqueIds")
    if ids is not None:
        ok = isinstance(ids, dict) and all(
            isinstance(parts, list)
            and all(isinstance(u, list) and all(isinstance(x, str) for x in u) for u in parts)
            for parts in ids.values())
        if not ok:
            raise SparkCheckpointError(
                path, "stateUniqueIds", "expected {operator: [[unique id, ...] per partition]}")
    return obj


def parse_zip_metadata(data: bytes, path: str) -> list[tuple[str, int]]:
    """The immutable files a snapshot zip's ``metadata`` entry names: (path relative to
    the store, recorded size). The entry is read with a size cap."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as err:
        raise SparkCheckpointError(path, "zip", f"not a zip file: {err}") from err
    with zf:
        try:
            info = zf.getinfo("metadata")
        except KeyError as err:
            raise SparkCheckpointError(path, "metadata", "the zip has no metadata entry") from err
        if info.file_size > ZIP_METADATA_LIMIT:
            raise SparkCheckpointError(
                path, "metadata", f"{info.file_size} bytes, more than {ZIP_METADATA_LIMIT}")
        try:
            with zf.open(info) as f:
                raw = f.read(ZIP_METADATA_LIMIT + 1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            raise SparkCheckpointError(path, "metadata", f"cannot be read: {err}") from err
    if len(raw) > ZIP_METADATA_LIMIT:
        raise SparkCheckpointError(path, "metadata", f"more than {ZIP_METADATA_LIMIT} bytes")
    head, nl, body = raw.partition(b"\n")
    if not nl or head != b"v1":
        raise SparkCheckpointError(path, "metadata.version", f"expected 'v1', got {head[:20]!r}")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SparkCheckpointError(path, "metadata.json", f"not JSON: {err}") from err
    if not isinstance(obj, dict):
        raise SparkCheckpointError(path, "metadata.json", "not a JSON object")
    out: list[tuple[str, int]] = []
    for key, name_key, sub in (("sstFiles", "dfsSstFileName", "SSTs"),
                               ("logFiles", "dfsLogFileName", "logs")):
        entries = obj.get(key) or []
        if not isinstance(entries, list):
            raise SparkCheckpointError(path, f"metadata.{key}", "not a list")
        for i, e in enumerate(entries):
            name = e.get(name_key) if isinstance(e, dict) else None
            size = e.get("sizeBytes") if isinstance(e, dict) else None
            if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                raise SparkCheckpointError(path, f"metadata.{key}[{i}].{name_key}",
                                           f"not a file name: {name!r}")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise SparkCheckpointError(path, f"metadata.{key}[{i}].sizeBytes",
                                           f"not a size: {size!r}")
            out.append((f"{sub}/{name}", size))
    return out


def _lz4_block(src: bytes, limit: int, path: str) -> bytes:
    """One LZ4 raw block (the format lz4-java's LZ4BlockOutputStream compresses with)."""
    out = bytearray()
    i, n = 0, len(src)

    def more(i: int) -> tuple[int, int]:
        total = 0
        while True:
            if i >= n:
                raise SparkCheckpointError(path, "changelog.lz4", "truncated length")
            b = src[i]
            i += 1
            total += b
            if b != 255:
                return total, i

    while i < n:
        token = src[i]
        i += 1
        lit = token >> 4
        if lit == 15:
            extra, i = more(i)
            lit += extra
        if i + lit > n or len(out) + lit > limit:
            raise SparkCheckpointError(path, "changelog.lz4", "literals beyond the block")
        out += src[i:i + lit]
        i += lit
        if i >= n:
            break
        if i + 2 > n:
            raise SparkCheckpointError(path, "changelog.lz4", "truncated match offset")
        off = src[i] | src[i + 1] << 8
        i += 2
        mlen = token & 15
        if mlen == 15:
            extra, i = more(i)
            mlen += extra
        mlen += 4
        start = len(out) - off
        if off == 0 or start < 0 or len(out) + mlen > limit:
            raise SparkCheckpointError(path, "changelog.lz4", "match outside the block")
        for k in range(mlen):
            out.append(out[start + k])
    return bytes(out)


LZ4_MAGIC = b"LZ4Block"


def lz4_prefix(data: bytes, want: int, path: str) -> bytes:
    """The first ``want`` decompressed bytes (or all, if fewer) of an lz4-java block
    stream; each block's declared sizes are checked against the cap."""
    out = bytearray()
    p = 0
    while len(out) < want:
        if p >= len(data):
            break
        if data[p:p + 8] != LZ4_MAGIC:
            raise SparkCheckpointError(path, "changelog.lz4", f"no LZ4Block magic at byte {p}")
        if p + 21 > len(data):
            raise SparkCheckpointError(path, "changelog.lz4", f"truncated block header at {p}")
        token = data[p + 8]
        clen, olen, _check = struct.unpack_from("<iii", data, p + 9)
        p += 21
        if olen == 0:
            break  # the end mark
        if clen < 0 or olen < 0 or olen > CHANGELOG_HEADER_LIMIT or p + clen > len(data):
            raise SparkCheckpointError(path, "changelog.lz4",
                                       f"block at byte {p - 21} declares bad sizes")
        body = data[p:p + clen]
        p += clen
        if token & 0xF0 == 0x10:
            block = body
        elif token & 0xF0 == 0x20:
            block = _lz4_block(body, olen, path)
        else:
            raise SparkCheckpointError(path, "changelog.lz4", f"unknown block method {token:#x}")
        if len(block) != olen:
            raise SparkCheckpointError(path, "changelog.lz4", "block size differs from header")
        out += block
    return bytes(out)


def _utf(buf: bytes, at: int, path: str, field: str) -> tuple[str, int]:
    if at + 2 > len(buf):
        raise SparkCheckpointError(path, field, "truncated (no length)")
    (n,) = struct.unpack_from(">H", buf, at)
    if at + 2 + n > len(buf):
        raise SparkCheckpointError(path, field, f"truncated ({n} bytes declared)")
    try:
        return buf[at + 2:at + 2 + n].decode("utf-8"), at + 2 + n
    except UnicodeDecodeError as err:
        raise SparkCheckpointError(path, field, f"not UTF-8: {err}") from err


def parse_lineage(data: bytes, path: str) -> list[tuple[int, str]]:
    """A format-2 changelog's header: ``writeUTF`` version (``v2``..``v4``) and
    ``writeUTF`` lineage JSON ``[{version, checkpointUniqueId}, ...]``, the first bytes
    of the LZ4 stream; the records after it are never decompressed."""
    buf = lz4_prefix(data, 4 + 0xFFFF + 2, path)
    version, at = _utf(buf, 0, path, "changelog.version")
    if version not in ("v2", "v3", "v4"):
        raise SparkCheckpointError(path, "changelog.version",
                                   f"not a changelog with lineage: {version[:20]!r}")
    text, _ = _utf(buf, at, path, "changelog.lineage")
    try:
        items = json.loads(text)
    except ValueError as err:
        raise SparkCheckpointError(path, "changelog.lineage", f"not JSON: {err}") from err
    out: list[tuple[int, str]] = []
    if not isinstance(items, list):
        raise SparkCheckpointError(path, "changelog.lineage", "not a list")
    for i, it in enumerate(items):
        v = it.get("version") if isinstance(it, dict) else None
        u = it.get("checkpointUniqueId") if isinstance(it, dict) else None
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or not isinstance(u, str):
            raise SparkCheckpointError(path, f"changelog.lineage[{i}]",
                                       "expected {version, checkpointUniqueId}")
        out.append((v, u))
    return out


# --------------------------------------------------------------------------- layout


def is_temp(name: str) -> bool:
    """A temp file of Hadoop's atomic create (``.<name>.<uuid>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def is_hadoop_crc(name: str) -> bool:
    """Hadoop's checksum sidecar ``.<name>.crc`` (hidden from Hadoop's listings)."""
    return name.startswith(".") and name.endswith(".crc")


def main_of(rel: str) -> str | None:
    """The file a checksum sidecar belongs to: Hadoop's ``.<name>.crc`` or Spark's
    ``<name>.crc`` beside a zip or changelog."""
    d, _, n = rel.rpartition("/")
    pre = f"{d}/" if d else ""
    if is_hadoop_crc(n):
        return pre + n[1:-4]
    if n.endswith((".zip.crc", ".changelog.crc")):
        return pre + n[:-4]
    return None


def _query_metadata(sub: list[str]) -> bool:
    if is_temp(sub[-1]):
        return False
    if sub == ["metadata"] or sub[0] in META_DIRS:
        return True
    return sub[0] == "state" and ("_metadata" in sub[1:-1] or "_stateSchema" in sub[1:-1])


@frozen
class _Store:
    rel: str
    op: str
    part: str
    names: dict[str, scan.FileRow]
    """Direct files, by name."""
    immutable: dict[str, scan.FileRow]
    """``SSTs/<name>`` and ``logs/<name>``, by path relative to the store."""


def _stores(root: str, rows: Iterable[scan.FileRow]) -> list[_Store]:
    found: dict[str, tuple[dict[str, scan.FileRow], dict[str, scan.FileRow]]] = {}
    for row in rows:
        sub = row[0][len(root) + 1:].split("/")
        if len(sub) < 4 or sub[0] != "state" or not sub[1].isdigit() or not sub[2].isdigit():
            continue
        inner = sub[3:]
        cut = next((i for i, c in enumerate(inner[:-1]) if c in STORE_SUBDIRS), None)
        if cut is not None and inner[cut] == "_metadata":
            continue
        if cut is None:
            store = "/".join([root, *sub[:3], *inner[:-1]])
            found.setdefault(store, ({}, {}))[0][inner[-1]] = row
        elif cut == len(inner) - 2:
            store = "/".join([root, *sub[:3], *inner[:cut]])
            found.setdefault(store, ({}, {}))[1][f"{inner[cut]}/{inner[-1]}"] = row
    out = []
    for store, (names, imm) in sorted(found.items()):
        if not imm and not any(VERSIONED.match(n) for n in names):
            continue
        parts = store[len(root) + 1:].split("/")
        out.append(_Store(store, parts[1], parts[2], names, imm))
    return out


def walk(loc: Location, root: str) -> tuple[list[scan.FileRow], list[scan.Problem]]:
    """Every file under ``root``, level by level through ``scan.entries``: Spark keeps
    directories named ``_metadata`` (operator and schema metadata), which
    ``scan.list_dir`` lists as files by Flink's layout. A link is a row (never followed);
    a FIFO, socket or device is a problem, never a file."""
    rows: list[scan.FileRow] = []
    problems: list[scan.Problem] = []
    stack = [root]
    while stack:
        d = stack.pop()
        for _name, is_dir, row in scan.entries(loc, d):
            if is_dir:
                stack.append(row[0])
                continue
            if loc.local and not row[3]:
                try:
                    mode = os.lstat(loc.full(row[0])).st_mode
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(mode):
                    problems.append((shown(row[0]), f"not a regular file (a {kind_of(mode)})"))
                    continue
            rows.append(row)
    return rows, problems


def _ms(mtime: float) -> int:
    return math.floor(mtime * 1000)


# --------------------------------------------------------------------------- the reader


class _Reader:
    def __init__(self, loc: Location, root: str, retain: int) -> None:
        self.loc = loc
        self.root = root
        self.retain = retain
        self.zip_cache: dict[str, list[tuple[str, int]]] = {}

    def read(self, rel: str, limit: int) -> bytes:
        try:
            return read_regular(self.loc, rel, limit)
        except Refused as err:
            raise SparkCheckpointError(rel, "file", str(err)) from err

    def zip_files(self, rel: str) -> list[tuple[str, int]]:
        if rel not in self.zip_cache:
            self.zip_cache[rel] = parse_zip_metadata(self.read(rel, ZIP_LIMIT), rel)
        return self.zip_cache[rel]

    def lineage(self, rel: str) -> list[tuple[int, str]]:
        return parse_lineage(self.read(rel, CHANGELOG_HEADER_LIMIT), rel)


def _versioned(names: Iterable[str], ext: str) -> dict[tuple[int, str | None], str]:
    out: dict[tuple[int, str | None], str] = {}
    for n in names:
        m = VERSIONED.match(n)
        if m and m.group(3) == ext:
            out[(int(m.group(1)), m.group(2))] = n
    return out


def _spark_deletes(r: _Reader, st: _Store) -> tuple[set[str], str]:
    """What ``RocksDBFileManager.deleteOldVersions(retain)`` deletes in one store (paths
    relative to the store), and the oldest version it keeps, in words."""
    zips = _versioned(st.names, "zip")
    if not zips or any(n.endswith(".zip") and not VERSIONED.match(n) and not n.startswith(".")
                       for n in st.names):
        return set(), "no snapshot Spark can parse: maintenance deletes nothing"
    versions = sorted(v for v, _u in zips)
    top = versions[-1]
    keep = max((v for v in versions if v <= top - r.retain + 1), default=0)
    doomed = {k for k in zips if k[0] < keep}
    if not doomed:
        return set(), f"no snapshot below {keep}: maintenance deletes nothing"
    last_user: dict[str, int] = {}
    for (v, _u), name in sorted(zips.items(), key=lambda kv: kv[0][0]):
        for f, _size in r.zip_files(f"{st.rel}/{name}"):
            base = f.split("/", 1)[1]
            last_user[base] = max(v, last_user.get(base, v))
    doomed_versions = {v for v, _u in doomed}
    out = {f"SSTs/{b}" if b.endswith(".sst") else f"logs/{b}" if b.endswith(".log") else b
           for b, v in last_user.items() if v in doomed_versions}
    listed = {p: row for p, row in st.immutable.items()
              if not is_hadoop_crc(p.split("/")[1])}
    by_name = {p.split("/")[1]: row for p, row in listed.items()}
    if last_user and len(listed) > len(last_user):
        times = [_ms(by_name[b][2]) for b in last_user if b in by_name]
        if not times:
            return set(), "no listed SST is present: Spark's maintenance fails"
        oldest = min(times)
        out |= {p for p, row in listed.items() if _ms(row[2]) < oldest}
    for n in st.names:
        m = VERSIONED.match(n)
        if m and int(m.group(1)) < keep:
            out.add(n)
        if n.endswith(".crc") and not n.startswith("."):
            head = n.split("_", 1)[0]
            if head.isdigit() and int(head) < keep:
                out.add(n)
    present = set(st.names) | set(st.immutable)
    out &= present
    for p in list(out):  # Hadoop's delete takes the hidden checksum along
        d, _, n = p.rpartition("/")
        side = f"{d}/.{n}.crc" if d else f".{n}.crc"
        if side in present:
            out.add(side)
    return out, f"below version {keep}, the oldest Spark's maintenance keeps (retain {r.retain})"


def read_spark_checkpoint(loc: Location, root: str, *,
                          retain: int = DEFAULT_RETAIN) -> SparkCheckpoint:
    """Read the checkpointLocation at container-relative ``root`` (``loc.job_dir`` when
    the Location names the checkpointLocation itself)."""
    if retain < 1:
        raise UsageError(f"retain must be at least 1, not {retain}")
    rows, problems = walk(loc, root)
    files = {row[0]: row for row in rows}
    r = _Reader(loc, root, retain)
    commits = sorted(int(p.rsplit("/", 1)[1]) for p in files
                     if p.startswith(f"{root}/commits/") and p.count("/") == root.count("/") + 2
                     and p.rsplit("/", 1)[1].isdigit())
    last = commits[-1] if commits else None
    marker = None
    uids: dict[int, dict[tuple[str, str], set[str]]] = {}
    for b in commits:
        rel = f"{root}/commits/{b}"
        row = files[rel]
        if b == last:
            marker = CommitMarker(f"commits/{b}", row[1], row[2])
        obj = parse_commit(r.read(rel, COMMIT_LIMIT), rel)
        per: dict[tuple[str, str], set[str]] = {}
        for op, parts in (obj.get("stateUniqueIds") or {}).items():
            for i, us in enumerate(parts):
                per[(str(op), str(i))] = set(us)
        if per:
            uids[b + 1] = per

    status: dict[str, tuple[str, str]] = {}
    refs: list[Ref] = []
    dangling: list[Dangling] = []
    stale_all: set[str] = set()
    retained: dict[str, list[tuple[int, str | None]]] = {}
    top = last + 1 if last is not None else None
    for st in _stores(root, rows):
        doomed, why_stale = _spark_deletes(r, st)
        for p in doomed:
            stale_all.add(f"{st.rel}/{p}")
            status[f"{st.rel}/{p}"] = (STALE, f"Spark's maintenance deletes it: {why_stale}")
        if top is None:
            continue
        _needed(r, st, top, uids, doomed, files, refs, dangling, retained)

    for ref in refs:
        was = status.get(ref.path)
        why = f"{ref.role} of version {ref.version} a restart needs"
        if was is not None and was[0] == STALE:
            why += f"; yet {was[1][0].lower()}{was[1][1:]}"
        status[ref.path] = (NEEDED, why)

    def classify(rel: str) -> tuple[str, str]:
        if rel in status:
            return status[rel]
        name = rel.rsplit("/", 1)[1]
        sub = rel[len(root) + 1:].split("/")
        if _query_metadata(sub):
            got = (METADATA, f"the query's own {sub[0]}")
        elif is_temp(name):
            got = (ORPHAN, "a temp file of a writer that never renamed it")
        else:
            main = main_of(rel)
            if main is not None and main in files:
                ms, _mw = classify(main)
                got = (METADATA, "checksum of a file in use") if ms in (NEEDED, METADATA) \
                    else (ms, f"checksum of {main.rsplit('/', 1)[1]}, itself {ms}")
            elif main is not None:
                got = (ORPHAN, "checksum of a file that is gone")
            else:
                got = (ORPHAN, _orphan_why(rel, root, top))
        status[rel] = got
        return got

    for rel in files:
        classify(rel)
    for rel in [p for p in status if p not in files]:
        del status[rel]
    return SparkCheckpoint(
        files=sorted(rows), status=status, refs=refs, dangling=dangling, last_batch=last,
        retained=retained, stale=frozenset(stale_all), marker=marker, retain=retain,
        problems=problems)


def _orphan_why(rel: str, root: str, top: int | None) -> str:
    """Why nothing reads the file, and whether Spark may still remove it later: an
    uncommitted format-1 version is rewritten under the same name when its batch runs
    again, and maintenance deletes an unlisted SST once every listed one is newer; a
    temp file or a file outside the layout is never touched."""
    m = VERSIONED.match(rel.rsplit("/", 1)[1])
    if m and top is not None and int(m.group(1)) > top:
        again = ("a rerun of the batch writes another unique id" if m.group(2)
                 else "a rerun of the batch rewrites this name")
        return f"version {m.group(1)} is beyond the last committed version {top} ({again})"
    if m and m.group(2):
        return f"version {m.group(1)}'s unique id {m.group(2)} is named by no commit or lineage"
    if "/SSTs/" in rel or "/logs/" in rel:
        return ("no retained version lists it (Spark's maintenance deletes it once every "
                "listed SST is newer)")
    if m:
        return f"version {m.group(1)} is no retained version"
    return "not a file of Spark's checkpoint layout"


def _needed(r: _Reader, st: _Store, top: int,
            uids: dict[int, dict[tuple[str, str], set[str]]], doomed: set[str],
            files: dict[str, scan.FileRow], refs: list[Ref], dangling: list[Dangling],
            retained: dict[str, list[tuple[int, str | None]]]) -> None:
    zips = _versioned(st.names, "zip")
    logs = _versioned(st.names, "changelog")
    changelog = bool(logs)
    format2 = any(u is not None for _v, u in [*zips, *logs]) or any(uids.values())
    present = set(zips) | set(logs)
    kept = [v for (v, u) in present if v <= top
            and any(n not in doomed for n in (zips.get((v, u)), logs.get((v, u))) if n)]
    lo = max(1, min([top - r.retain + 1, *kept]))
    seen: set[str] = set()

    def need(version: int, rel_in_store: str, size: int | None, role: str) -> None:
        path = f"{st.rel}/{rel_in_store}"
        if path in seen:
            return
        seen.add(path)
        refs.append(Ref(version, st.rel, path, size, role))
        row = files.get(path)
        if row is None or row[3]:
            dangling.append(Dangling(version, st.rel, path, size, None, "missing"))
        elif size is not None and row[1] != size:
            dangling.append(Dangling(version, st.rel, path, size, row[1], "size differs"))

    def load_zip(version: int, name: str) -> None:
        need(version, name, None, "zip")
        if name in st.names and not st.names[name][3]:
            for f, size in r.zip_files(f"{st.rel}/{name}"):
                need(version, f, size, "sst" if f.startswith("SSTs/") else "log")

    lineage_uids: dict[int, set[str]] = {}
    versions: list[tuple[int, str | None]] = []
    for v in range(top, lo - 1, -1):
        vuids: list[str | None]
        if format2:
            named = uids.get(v, {}).get((st.op, st.part))
            have = {u for (pv, u) in present if pv == v and u is not None}
            vuids = [u for u in sorted(
                (named & have) if named else (lineage_uids.get(v) or have))]
            if not vuids and named:
                vuids = [u for u in sorted(named)]
        else:
            vuids = [None] if any(pv == v for pv, _u in present) or v == top else []
        for uid in vuids:
            versions.append((v, uid))
            stem = f"{v}_{uid}" if uid else str(v)
            if not changelog:
                load_zip(v, f"{stem}.zip")
                continue
            own = f"{stem}.changelog"
            if own in st.names:
                need(v, own, None, "changelog")
            chain: list[str] = []
            base: str | None = None
            if not format2:
                snap = max((w for (w, _u) in zips if w <= v), default=0)
                base = f"{snap}.zip" if snap > 0 else None
                chain = [f"{w}.changelog" for w in range(snap + 1, v + 1)]
            elif (v, uid) in zips:
                base = f"{stem}.zip"
            else:
                items = r.lineage(f"{st.rel}/{own}") if own in st.names else []
                for w, u in items:
                    lineage_uids.setdefault(w, set()).add(u)
                snaps = [(w, u) for w, u in items if (w, u) in zips]
                s = max(snaps)[0] if snaps else 0
                if snaps:
                    w, u = max(snaps)
                    base = f"{w}_{u}.zip"
                chain = [f"{w}_{u}.changelog" for w, u in items if w > s] + [own]
            for c in chain:
                need(v, c, None, "changelog")
            if base is not None:
                load_zip(v, base)
    retained[st.rel] = sorted(versions, key=lambda t: (t[0], t[1] or ""))
