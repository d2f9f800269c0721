"""One subtask's keyed state: a RocksDB (rocksdict, raw mode, WAL off) of tumbling-window
counts, keyed by window first, then key group, then word.

A key is ``window start (8 bytes) | key group (2 bytes) | word``; a value is the count
(8 bytes), all big-endian so that RocksDB's byte order is (window, group, word) order.
Event time moves forward, so a batch's keys fall in the newest windows, above nearly
everything stored: each flushed SST overlaps only the SSTs of the windows still open, and
RocksDB moves it down the levels without rewriting the older windows (with key group
first, every flush overlapped the whole state, and each level-0 compaction rewrote all of
it: the cost of a batch grew with the state). Closing windows deletes them with one
``delete_range``: a range tombstone that compactions turn into retired SSTs, so shared
state is released for real. A key-group range (a rescale, ``snapshot.restore_key_groups``)
is one key range per window (``group_ranges``).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import rocksdict
from rocksdict import RdictIter

from pipeline.stream.windows import Windowing
from spec.errors import CkptError

_PREFIX = struct.Struct(">QH")
_WINDOW = struct.Struct(">Q")
_COUNT = struct.Struct(">Q")

LAYOUT = "W1"
"""The key layout above (window start, key group, word), named in the lineage of every DB
written with it (``new_lineage``): a checkpoint of a DB whose keys are laid out otherwise
(a key group first, as before the layout had a name) is refused at restore, not misread
(``snapshot.file_of``). Change the name whenever the layout changes."""

BLOOM_BITS = 10
"""Bits per key of the SSTs' bloom filters (Flink's ``state.backend.rocksdb.bloom-filter
.bits-per-key`` default): about 1% false positives."""


def new_lineage() -> str:
    """A new DB's lineage (``snapshot``: the name its SSTs are registered under): the key
    layout, ``-``, then 12 random hex digits. Lineages written before the layout had a
    name are 12 hex digits, without ``-``."""
    return f"{LAYOUT}-{uuid.uuid4().hex[:12]}"


def layout_of(lineage: str) -> str:
    """The key layout a lineage names: ``LAYOUT``, another, or ``""`` for a lineage
    written before the layout had a name (key group first)."""
    return lineage.split("-", 1)[0] if "-" in lineage else ""


def encode_key(group: int, start: int, word: str) -> bytes:
    return _PREFIX.pack(start, group) + word.encode()


def decode_key(key: bytes) -> tuple[int, int, str]:
    start, group = _PREFIX.unpack_from(key)
    return group, start, key[_PREFIX.size :].decode()


def group_ranges(db: rocksdict.Rdict, groups: tuple[int, int]) -> list[tuple[bytes, bytes]]:
    """The key ranges ``[lo, hi)`` of key groups ``groups`` (inclusive) in ``db``: one per
    window it holds, in key order (a seek per window, no key read in between)."""
    out: list[tuple[bytes, bytes]] = []
    it: RdictIter = db.iter()
    it.seek_to_first()
    while it.valid():
        (start,) = _WINDOW.unpack_from(it.key())
        out.append((_PREFIX.pack(start, groups[0]), _PREFIX.pack(start, groups[1] + 1)))
        if start == (1 << 64) - 1:
            break
        it.seek(_WINDOW.pack(start + 1))
    it.status()  # a read error raises here rather than end the windows early
    return out


def options(
    *,
    write_buffer_size: int = 64 * 1024,
    auto_compactions: bool = True,
    l0_compaction_trigger: int = 4,
    bloom_bits: int = BLOOM_BITS,
) -> rocksdict.Options:
    """The DB options every open uses (a restore must open with the same ``raw_mode``).

    A small memtable makes an SST per checkpoint or so, and the L0 trigger (RocksDB's
    default 4) makes compactions retire them, as a long-running job's state does at a
    larger scale. ``bloom_bits`` per key of a full-key bloom filter in every SST (0: none):
    ``WindowCounts.add`` reads each key before it writes it, and a key that is new (every
    key of a window's first batch) would otherwise cost a data-block read in each level-0
    file and each level, more of them uncached as the state grows."""
    opt = rocksdict.Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.set_write_buffer_size(write_buffer_size)
    opt.set_level_zero_file_num_compaction_trigger(l0_compaction_trigger)
    opt.set_disable_auto_compactions(not auto_compactions)
    if bloom_bits > 0:
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(bloom_bits, False)  # full filters, not per block
        opt.set_block_based_table_factory(table)
    return opt


class ForeignKeyError(CkptError, ValueError):
    """The DB holds a key of a key group its subtask does not own: it is not the state
    this subtask wrote or restored."""


class WindowCounts:
    """The open windows' counts of one subtask, in a RocksDB at ``path``."""

    def __init__(self, path: Path, opt: rocksdict.Options) -> None:
        self.path = path
        self.db = rocksdict.Rdict(str(path), opt)
        wo = rocksdict.WriteOptions()
        # As Flink's RocksDB backend: durability is the checkpoint. (The stub declares a
        # method; the binding has a property, which is what takes effect.)
        wo.disable_wal = True  # type: ignore[method-assign, assignment]
        self.db.set_write_options(wo)

    def add(self, counts: Mapping[tuple[int, int, str], int]) -> None:
        """Add ``{(key group, window start, word): n}`` to the stored counts."""
        if not counts:
            return
        keys: list[str | int | float | bytes | bool] = [
            encode_key(group, start, word) for group, start, word in counts
        ]
        # One multi-get (a list key): the keys' stored counts, None where absent.
        olds: list[bytes | None] = self.db.get(keys) or []
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, n, old in zip(keys, counts.values(), olds, strict=True):
            batch.put(key, _COUNT.pack(n + (_COUNT.unpack(old)[0] if old is not None else 0)))
        self.db.write(batch)

    def close_windows(
        self, groups: Iterable[int], windowing: Windowing, watermark: int
    ) -> list[tuple[int, str, int]]:
        """Emit and delete every window closed at ``watermark``: ``(start, word, count)``."""
        hi_start = max(0, windowing.first_open_start(watermark))
        mine = set(groups)
        out: list[tuple[int, str, int]] = []
        lo, hi = _WINDOW.pack(0), _WINDOW.pack(hi_start)
        for key, value in self._scan(lo, hi):
            group, start, word = decode_key(key)
            if group not in mine:
                raise ForeignKeyError(
                    f"{self.path}: a key of key group {group}, not one of this subtask's"
                    f" ({min(mine)}-{max(mine)}): nothing was emitted or deleted"
                )
            out.append((start, word, _COUNT.unpack(value)[0]))
        if out:
            self.db.delete_range(lo, hi)
        return out

    def items(self) -> Iterator[tuple[tuple[int, int, str], int]]:
        """Every stored count, in key order."""
        for key, value in self._scan(None, None):
            yield decode_key(key), _COUNT.unpack(value)[0]

    def _scan(self, lo: bytes | None, hi: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        it = self.db.iter()
        if lo is None:
            it.seek_to_first()
        else:
            it.seek(lo)
        while it.valid():
            key = it.key()
            if hi is not None and key >= hi:
                return
            yield key, it.value()
            it.next()

    def close(self) -> None:
        self.db.close()
