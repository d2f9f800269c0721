"""A subtask's keyed state in SlateDB (``slatedb`` on PyPI, its uniffi binding): the
``--state-backend working`` of the streaming job (SPEC §11, seed ``004``, FLIP-427/428).

The database lives on the checkpoint storage itself, one directory per lineage:
``<job>/taskowned/working/<subtask>/db/<lineage>/`` (a lineage is one database from its
creation or restore on; a restore clones into a new one). SlateDB writes there
``compacted/<ULID>.sst`` (every SST, flushed L0 ones and compaction outputs alike: written
whole, never changed), ``manifest/<id>.manifest``, ``compactions/<id>.compactions``,
``wal/<id>.sst`` (empty with the WAL off: the writer's fence) and ``gc/*.boundary``. The
SSTs are the working files of §11; the rest is the database's own bookkeeping, which
SlateDB's garbage collector keeps (``docs/slatedb.md``).

A key is ``key group (2 bytes) | window start (8 bytes) | word``, key group first (not the
RocksDB backend's window first), so that a rescale projects a database on a key-group
range by one key range (``group_range``): a clone takes one range. ``add`` reads the old
counts of each key group touched within the windows touched only.

The binding is asynchronous; a task drives it from one private event loop (``Loop``).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlparse

import fsspec  # type: ignore[import-untyped]
import slatedb.uniffi as sdb  # type: ignore[import-untyped]
from attrs import frozen

from pipeline.stream.slate_direct import delete_many, next_rows, put_many
from pipeline.stream.windows import Windowing
from pipeline.stream.working_names import CHECKPOINT_PREFIX
from spec.errors import UsageError

T = TypeVar("T")
_COUNT = struct.Struct(">Q")
_GROUP = struct.Struct(">H")
_PREFIX = struct.Struct(">HQ")


def encode_key(group: int, start: int, word: str) -> bytes:
    return _PREFIX.pack(group, start) + word.encode()


def decode_key(key: bytes) -> tuple[int, int, str]:
    group, start = _PREFIX.unpack_from(key)
    return group, start, key[_PREFIX.size :].decode()


class Loop:
    """One event loop for a task's SlateDB calls (the binding's futures need one)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        self._loop.close()


@frozen
class Place:
    """Where the databases of a checkpoint base live: SlateDB's object store and the
    prefix of the base in it (SlateDB's paths are the base's paths under that prefix)."""

    url: str
    storage_options: Mapping[str, Any]

    def store(self) -> Any:
        """SlateDB's object store for the base: a local directory, or S3 (an endpoint and
        credentials as s3fs takes them: ``key``, ``secret``, ``client_kwargs.endpoint_url``)."""
        u = urlparse(self.url)
        if u.scheme in ("", "file", "local"):
            _, root = fsspec.core.url_to_fs(self.url)
            b = sdb.ObjectStoreBuilder(sdb.ObjectStoreType.LOCAL)
            b.with_config("local_path", str(root))
            return b.build()
        if u.scheme in ("s3", "s3a"):
            o = dict(self.storage_options)
            ck = dict(o.get("client_kwargs") or {})
            b = sdb.ObjectStoreBuilder(sdb.ObjectStoreType.S3)
            b.with_config("bucket", u.netloc)
            b.with_config("region", str(ck.get("region_name") or o.get("region") or "us-east-1"))
            if o.get("key"):
                b.with_config("access_key_id", str(o["key"]))
            if o.get("secret"):
                b.with_config("secret_access_key", str(o["secret"]))
            endpoint = ck.get("endpoint_url") or o.get("endpoint_url")
            if endpoint:
                b.with_config("endpoint", str(endpoint))
                if str(endpoint).startswith("http://"):
                    b.with_config("allow_http", "true")
            return b.build()
        raise UsageError(
            f"--state-backend working keeps its databases on the checkpoint storage, which"
            f" must be a local directory or S3; {self.url!r} is neither"
        )

    def prefix(self) -> str:
        """The base's path inside the object store ('' or ``<prefix>/``)."""
        u = urlparse(self.url)
        if u.scheme in ("s3", "s3a"):
            p = u.path.strip("/")
            return f"{p}/" if p else ""
        return ""


CODEC = "Snappy"
"""The SSTs' compression: RocksDB's default, so that both backends write the same data
compressed alike (uncompressed, a batch's SSTs were 3.3 times as large)."""


def db_settings(l0_max_ssts: int = 32, *, compactor: bool = True) -> Any:
    """Every database of the job: no WAL (durability is the checkpoint, as the RocksDB
    backend runs with its WAL off), its own garbage collector off (the coordinator runs
    it, R104), its compactor on and polling often enough to keep up with a flush per
    checkpoint. Without the compactor (``compactor`` off: a restored database's first
    task, ``QUIET_L0``) a flush waits only once L0 holds ``l0_max_ssts`` SSTs.

    SSTs are compressed with ``CODEC`` when flushed and when compacted: SlateDB's
    default is none, RocksDB's (the upload backend's) Snappy, and the SSTs of either
    land on the checkpoint storage."""
    s = sdb.Settings.default()
    s.set("compression_codec", f'"{CODEC}"')
    s.set("compactor_options.worker.compression_codec", f'"{CODEC}"')
    s.set("wal_enabled", "false")
    s.set("garbage_collector_options", "null")
    s.set("l0_max_ssts", str(l0_max_ssts))
    if not compactor:
        s.set("compactor_options", "null")
        s.set("l0_max_ssts_per_key", str(l0_max_ssts))
        return s
    s.set("compactor_options.poll_interval", '"100ms"')
    # the compaction worker polls for scheduled compactions every 5 s by default, and a
    # flush waits while L0 holds l0_max_ssts_per_key (8) SSTs over its keys: a task's
    # flush then stalled 3-8 s every fourth checkpoint (docs/slatedb.md)
    s.set("compactor_options.worker.compactions_poll_interval", '"50ms"')
    return s


def _next_group(group: int) -> bytes | None:
    return None if group + 1 > 0xFFFF else _GROUP.pack(group + 1)


def group_range(groups: tuple[int, int]) -> Any:
    """The key range of key groups ``groups`` (inclusive): a clone's projection."""
    return sdb.KeyRange(
        start=_GROUP.pack(groups[0]),
        start_inclusive=True,
        end=None if groups[1] + 1 > 0xFFFF else _GROUP.pack(groups[1] + 1),
        end_inclusive=False,
    )


def _memtable() -> Any:
    return sdb.FlushOptions(flush_type=sdb.FlushType.MEM_TABLE)


@frozen
class ManifestFiles:
    """The SSTs a manifest names, by path relative to the base: the database's own and
    those it refers to in the databases it was cloned from (``external_dbs``)."""

    manifest_id: int
    own: tuple[str, ...]
    external: tuple[str, ...]
    l0: int = 0
    """How many of them are L0 SSTs."""

    @property
    def all(self) -> tuple[str, ...]:
        return self.own + self.external


def manifest_files(loop: Loop, admin: Any, lineage: str, manifest_id: int | None,
                   prefix: str) -> ManifestFiles:  # fmt: skip
    """The SSTs of manifest ``manifest_id`` of the database at ``lineage`` (the latest
    when ``None``)."""
    m = loop.run(admin.read_manifest(manifest_id))
    if m is None:
        raise UsageError(f"{lineage}: no manifest {manifest_id}")
    return _files_of(m, lineage, prefix)


def _files_of(m: Any, lineage: str, prefix: str) -> ManifestFiles:
    ids = [v.sst.id.value for v in m.l0]
    ids += [v.sst.id.value for sr in m.compacted for v in sr.sst_views]
    where: dict[str, str] = {}
    for ext in m.external_dbs:
        src = ext.path[len(prefix) :] if ext.path.startswith(prefix) else ext.path
        for s in ext.sst_ids:
            where[s.value] = src
    own: list[str] = []
    external: list[str] = []
    for i in dict.fromkeys(ids):
        if i in where:
            external.append(f"{where[i]}/compacted/{i}.sst")
        else:
            own.append(f"{lineage}/compacted/{i}.sst")
    return ManifestFiles(int(m.id), tuple(own), tuple(external), len(m.l0))


@frozen
class Manifest:
    """What the publication needs of a manifest (``Admin.manifest``)."""

    files: ManifestFiles
    checkpoints: tuple[int, ...]
    """The manifests of the SlateDB checkpoints it lists (each pins what it names)."""
    newest_l0: str | None
    """The ULID of its newest L0 SST (with none, of the last L0 a compaction took)."""


QUIET_L0 = 16
"""A database restored after a kill (a clone of one database, not a rescale's) whose L0
holds at most this many SSTs opens without its compactor (``SlateCounts``, ``compactor``
off) for its first task: starting one costs the restore some requests of its own (its
state, a fence) and competes with the restore for the storage, and the task's one flush
leaves L0 far below ``l0_max_ssts`` (32), where a flush would wait. The next task opens
it with the compactor, which catches up."""


SETTLE_LIMIT = 300.0
"""The longest a task waits for its database's compactions at its end
(``SlateCounts.settle``): far above the longest merge ``bench.stream_large`` waited for
on its way to 1 GiB (batch 64's, which merged four runs of sixteen flushes each: a 44 s
batch where the others took 4.5 s)."""


class SlateCounts:
    """The open windows' counts of one subtask in a SlateDB at ``lineage`` (a path
    relative to the base), opened as its writer: opening fences every earlier writer."""

    def __init__(
        self,
        loop: Loop,
        place: Place,
        lineage: str,
        *,
        l0_max_ssts: int = 32,
        store: Any = None,
        compactor: bool = True,
    ) -> None:
        self.loop = loop
        self.place = place
        self.store = place.store() if store is None else store
        self.prefix = place.prefix()
        self.lineage = lineage
        b = sdb.DbBuilder(self.prefix + lineage, self.store)
        b.with_settings(db_settings(l0_max_ssts, compactor=compactor))
        self.db = loop.run(b.build())
        self.admin = sdb.AdminBuilder(self.prefix + lineage, self.store).build()
        self.compactor = compactor
        self._open = True

    # -- the state
    def _scan(self, lo: bytes, hi: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        it = self.loop.run(
            self.db.scan(sdb.KeyRange(start=lo, start_inclusive=True, end=hi, end_inclusive=False))
        )
        while rows := self.loop.run(next_rows(it, 4096)):
            yield from rows

    def add(self, counts: Mapping[tuple[int, int, str], int]) -> None:
        """Add ``{(key group, window start, word): n}`` to the stored counts: a scan per
        key group touched, over the windows touched, reads the old counts (a get per key
        would cross into the binding once per word; a scan of whole key groups would
        read every older window's counts too)."""
        if not counts:
            return
        groups = sorted({g for g, _, _ in counts})
        first = min(s for _, s, _ in counts)
        last = max(s for _, s, _ in counts)
        old: dict[bytes, int] = {}
        for g in groups:
            hi = _PREFIX.pack(g, last + 1) if last + 1 < 1 << 64 else _next_group(g)
            for key, value in self._scan(_PREFIX.pack(g, first), hi):
                old[key] = _COUNT.unpack(value)[0]
        batch = sdb.WriteBatch()
        encoded = ((encode_key(*k), n) for k, n in counts.items())
        put_many(batch, ((k, _COUNT.pack(n + old.get(k, 0))) for k, n in encoded))
        self.loop.run(self.db.write(batch))

    def close_windows(
        self, groups: Iterable[int], windowing: Windowing, watermark: int
    ) -> list[tuple[int, str, int]]:
        """Emit and delete every window closed at ``watermark``: ``(start, word, count)``."""
        hi_start = max(0, windowing.first_open_start(watermark))
        out: list[tuple[int, str, int]] = []
        if hi_start == 0:
            return out  # no window closed yet (SlateDB refuses an empty range)
        closed: list[bytes] = []
        for group in groups:
            for key, value in self._scan(_PREFIX.pack(group, 0), _PREFIX.pack(group, hi_start)):
                _, start, word = decode_key(key)
                out.append((start, word, _COUNT.unpack(value)[0]))
                closed.append(key)
        if closed:
            batch = sdb.WriteBatch()
            delete_many(batch, closed)
            self.loop.run(self.db.write(batch))
        return out

    def items(self) -> Iterator[tuple[tuple[int, int, str], int]]:
        for key, value in self._scan(b"\x00", None):
            yield decode_key(key), _COUNT.unpack(value)[0]

    def put_all(self, rows: Iterable[tuple[bytes, bytes]], per_write: int = 65_536) -> int:
        """Write raw rows (a NO_CLAIM restore's copy), ``per_write`` rows a write, so that
        a copy holds that many at a time rather than the whole state (a write batch of
        every row of two old databases took 4.5 GB at 0.3 GiB of state); how many. A copy
        that stops half way leaves a database no checkpoint names, which the retried
        task replaces by a new one (``working_names.new_db_dir``)."""
        it = iter(rows)
        n = 0
        while chunk := list(itertools.islice(it, per_write)):
            batch = sdb.WriteBatch()
            n += put_many(batch, chunk)
            self.loop.run(self.db.write(batch))
        return n

    # -- R101, R103
    def flush(self) -> None:
        """The memtable to an L0 SST on storage (one whole object)."""
        self.loop.run(self.db.flush_with_options(_memtable()))

    def checkpoint(self, checkpoint: int) -> tuple[str, int]:
        """A detached SlateDB checkpoint of the flushed state, named ``chk-<checkpoint>``:
        it pins its manifest and every SST that manifest names (SlateDB's GC keeps them).
        Its id and manifest id."""
        r = self.loop.run(
            self.admin.create_detached_checkpoint(
                sdb.CheckpointOptions(
                    lifetime_ms=None, source=None, name=f"{CHECKPOINT_PREFIX}{checkpoint}"
                )
            )
        )
        return str(r.id), int(r.manifest_id)

    def files(self, manifest_id: int | None = None) -> ManifestFiles:
        return manifest_files(self.loop, self.admin, self.lineage, manifest_id, self.prefix)

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self.loop.run(self.admin.delete_checkpoint(checkpoint_id))

    def settle(self, limit: float = SETTLE_LIMIT, poll: float = 0.05) -> float:
        """Wait until the compactor of this database has no compaction active, or
        ``limit`` seconds; the seconds waited. A task shuts its database down at its end,
        and SlateDB does not resume a compaction cut off by the shutdown: a merge of
        sorted runs longer than a task started again in every task and never finished,
        so sorted runs piled up and each task paid for the merge it then lost
        (``docs/slatedb.md``). Without its compactor (``QUIET_L0``) nothing runs here."""
        if not self.compactor:
            return 0.0
        start = time.monotonic()
        while time.monotonic() - start < limit and self.compacting():
            time.sleep(poll)  # the compactor runs on the binding's own threads
        return time.monotonic() - start

    def compacting(self) -> bool:
        """Whether the latest compactor state lists a compaction still active."""
        state = self.loop.run(self.admin.read_compactions(None))
        return state is not None and any(c.active for c in state.recent_compactions)

    def close(self) -> None:
        if self._open:
            self._open = False
            self.loop.run(self.db.shutdown())


def files_of(loop: Loop, place: Place, lineage: str, store: Any) -> ManifestFiles:
    """The SSTs the latest manifest of the database at ``lineage`` names (not open)."""
    admin = sdb.AdminBuilder(place.prefix() + lineage, store).build()
    return manifest_files(loop, admin, lineage, None, place.prefix())


def clone(
    loop: Loop,
    place: Place,
    target: str,
    sources: Sequence[tuple[str, str, tuple[int, int] | None]],
    store: Any = None,
) -> None:
    """R105: a new database at ``target`` from SlateDB checkpoints ``(lineage, checkpoint
    id, key groups or None)``: it refers to the sources' SSTs where they are (a projection
    on the key groups when given; several sources make a union) and copies nothing. Each
    source gets a checkpoint of SlateDB's own that pins what the clone refers to.
    ``store``: the object store to use (one per task: building one costs a client)."""
    store, prefix = place.store() if store is None else store, place.prefix()
    admin = sdb.AdminBuilder(prefix + sources[0][0], store).build()
    first, *rest = sources
    b = admin.create_clone_builder_from_source(_spec(prefix, *first))
    for s in rest:
        b.with_source(_spec(prefix, *s))
    b.with_clone_path(prefix + target)
    loop.run(b.build())


def _spec(prefix: str, lineage: str, checkpoint_id: str, groups: tuple[int, int] | None) -> Any:
    return sdb.CloneSourceSpec(
        path=prefix + lineage,
        checkpoint=checkpoint_id,
        projection_range=None if groups is None else group_range(groups),
    )


def read_checkpoint(
    loop: Loop, place: Place, lineage: str, checkpoint_id: str | None, groups: tuple[int, int]
) -> Iterator[tuple[bytes, bytes]]:
    """The rows of key groups ``groups`` at SlateDB checkpoint ``checkpoint_id`` of the
    database at ``lineage`` (``None``: its latest manifest), read by a reader pinned to
    that checkpoint (or following the latest manifest), which writes nothing there (a
    NO_CLAIM restore: the user's files are read, never changed). In key order, a scan's
    batch at a time: a copy never holds the whole database."""
    store, prefix = place.store(), place.prefix()
    b = sdb.DbReaderBuilder(prefix + lineage, store)
    b.with_reader_mode(
        sdb.ReaderMode.FOLLOW_LATEST()
        if checkpoint_id is None
        else sdb.ReaderMode.CHECKPOINT(checkpoint_id)
    )
    reader = loop.run(b.build())
    try:
        it = loop.run(reader.scan(group_range(groups)))
        while rows := loop.run(next_rows(it, 4096)):
            yield from rows
    finally:
        loop.run(reader.shutdown())


class Admin:
    """The coordinator's handle on the databases of a base (``slate_collect``)."""

    def __init__(self, loop: Loop, place: Place) -> None:
        self.loop = loop
        self.store = place.store()
        self.prefix = place.prefix()

    def _admin(self, lineage: str) -> Any:
        return sdb.AdminBuilder(self.prefix + lineage, self.store).build()

    def checkpoints(self, lineage: str) -> list[tuple[str, str | None, int]]:
        """``(id, name, manifest id)`` of every SlateDB checkpoint of the database."""
        cs = self.loop.run(self._admin(lineage).list_checkpoints(None))
        return [(str(c.id), c.name, int(c.manifest_id)) for c in cs]

    def delete_checkpoint(self, lineage: str, checkpoint_id: str) -> None:
        self.loop.run(self._admin(lineage).delete_checkpoint(checkpoint_id))

    def files(self, lineage: str, manifest_id: int | None = None) -> ManifestFiles:
        return manifest_files(self.loop, self._admin(lineage), lineage, manifest_id, self.prefix)

    def manifest(self, lineage: str, manifest_id: int) -> Manifest:
        """What manifest ``manifest_id`` of the database says (``Manifest``)."""
        m = self.loop.run(self._admin(lineage).read_manifest(manifest_id))
        if m is None:
            raise UsageError(f"{lineage}: no manifest {manifest_id}")
        l0 = [str(v.sst.id.value) for v in m.l0]
        last = [str(x) for x in (m.last_compacted_l0_sst_id, m.last_compacted_l0_sst_view_id) if x]
        return Manifest(
            _files_of(m, lineage, self.prefix),
            tuple(int(c.manifest_id) for c in m.checkpoints),
            max(l0) if l0 else (min(last) if last else None),
        )

    def oldest_compaction(self, lineage: str, compactions_id: int) -> str | None:
        """The id (a ULID) of the oldest compaction compactor state ``compactions_id``
        lists, whatever its status (``None``: none)."""
        c = self.loop.run(self._admin(lineage).read_compactions(compactions_id))
        if c is None:
            raise UsageError(f"{lineage}: no compactor state {compactions_id}")
        return min((str(x.id) for x in c.recent_compactions), default=None)

    def gc(self, lineage: str, min_age_ms: int, *, dry_run: bool = False) -> None:
        """SlateDB's garbage collector, once, on every directory of the database: it
        deletes what no manifest and no SlateDB checkpoint names, older than
        ``min_age_ms`` (its manifests, compactions, WAL fences and the SSTs below its
        last compaction; ``docs/slatedb.md``). Boundary files off: they guard against a
        writer running beside the collector, and none runs here (the coordinator
        collects between batches); with them on, no manifest was ever collected in our
        runs."""
        d = sdb.GarbageCollectorDirectoryOptions(min_age_ms=min_age_ms, dry_run=dry_run)
        opts = sdb.GarbageCollectorOptions(
            manifest_options=d,
            wal_options=d,
            wal_fence_options=d,
            compacted_options=d,
            compactions_options=d,
            detach_options=None,
            disable_boundary_files=True,
        )
        self.loop.run(self._admin(lineage).run_gc_once(opts))

    def delete_db(self, lineage: str) -> list[str]:
        """Every object of the database (and the pins it holds in its sources): the paths
        deleted, relative to the base."""
        gone = self.loop.run(self._admin(lineage).delete_db(True))
        return [p[len(self.prefix) :] if p.startswith(self.prefix) else p for p in gone]
