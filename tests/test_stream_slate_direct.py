"""``slate_direct``: the direct calls into SlateDB's binding write what its public
``WriteBatch.put`` and ``delete`` write, read what its ``next_batch`` reads, and fail as
they fail."""

from __future__ import annotations

import ctypes
import itertools
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slatedb.uniffi as sdb  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from pipeline.stream import slate, slate_direct

_KEYS = st.binary(min_size=1, max_size=6)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _KEYS, st.binary(max_size=40)),
        st.tuples(st.just("delete"), _KEYS, st.just(b"")),
    ),
    max_size=60,
)


class _Pair:
    """Two databases in one directory: one written through the public methods, one
    through ``slate_direct``. Each example writes under a prefix of its own."""

    def __init__(self, root: Path) -> None:
        self.loop = slate.Loop()
        store = slate.Place(str(root), {}).store()
        self.dbs = [
            self.loop.run(sdb.DbBuilder(name, store).build()) for name in ("public", "direct")
        ]
        self.examples = itertools.count()

    def scan(self, db: Any, prefix: bytes) -> Any:
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        r = sdb.KeyRange(start=prefix, start_inclusive=True, end=end, end_inclusive=False)
        return self.loop.run(db.scan(r))

    def rows(self, db: Any, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Through the public ``next_batch``."""
        it = self.scan(db, prefix)
        out: list[tuple[bytes, bytes]] = []
        while rows := self.loop.run(it.next_batch(1024)):
            out += [(bytes(kv.key), bytes(kv.value)) for kv in rows]
        return out

    def direct_rows(self, db: Any, prefix: bytes, n: int) -> list[tuple[bytes, bytes]]:
        """Through ``next_rows``, ``n`` at a time: every batch but the last is full."""
        it = self.scan(db, prefix)
        out: list[tuple[bytes, bytes]] = []
        while rows := self.loop.run(slate_direct.next_rows(it, n)):
            assert len(rows) <= n
            out += rows
        return out

    def close(self) -> None:
        for db in self.dbs:
            self.loop.run(db.shutdown())
        self.loop.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Pair]:
    p = _Pair(tmp_path_factory.mktemp("slate_direct"))
    yield p
    p.close()


def test_the_direct_calls_are_the_ones_that_run() -> None:
    """With the pinned binding (``pyproject.toml``) the checksums match and the direct
    path runs: the property below compares it with the public one, not with itself."""
    assert slate_direct.available()


@given(ops=_OPS, n=st.integers(1, 70))
def test_direct_puts_and_deletes_leave_the_rows_the_public_methods_leave(
    pair: _Pair, ops: list[tuple[str, bytes, bytes]], n: int
) -> None:
    """Runs of puts and deletes, interleaved and with repeated keys, in two write
    batches (the order within a batch decides which write of a key wins); read back
    through the public ``next_batch`` and through ``next_rows``, ``n`` rows a call."""
    prefix = b"%08d\xfe" % next(pair.examples)
    public, direct = sdb.WriteBatch(), sdb.WriteBatch()
    for kind, group in itertools.groupby(ops, key=lambda op: op[0]):
        run = [(prefix + k, v) for _, k, v in group]
        if kind == "put":
            for k, v in run:
                public.put(k, v)
            assert slate_direct.put_many(direct, run) == len(run)
        else:
            for k, _ in run:
                public.delete(k)
            assert slate_direct.delete_many(direct, [k for k, _ in run]) == len(run)
    if ops:
        pair.loop.run(pair.dbs[0].write(public))
        pair.loop.run(pair.dbs[1].write(direct))
    expected = pair.rows(pair.dbs[0], prefix)
    assert pair.rows(pair.dbs[1], prefix) == expected
    assert pair.direct_rows(pair.dbs[1], prefix, n) == expected


def test_a_scan_reads_rows_with_and_without_an_expiry_time(pair: _Pair) -> None:
    """A row's optional ``expire_ts`` is a flag and eight more bytes when set: rows
    with and without one, side by side, cut alike."""
    prefix = b"ttl\xfe"
    db = pair.dbs[0]
    never = sdb.PutOptions(ttl=sdb.Ttl.NO_EXPIRY())
    later = sdb.PutOptions(ttl=sdb.Ttl.EXPIRE_AFTER_MILLIS(3_600_000))
    batch = sdb.WriteBatch()
    for i in range(9):
        batch.put_with_options(prefix + bytes([i]), b"v" * i, later if i % 3 else never)
    pair.loop.run(db.write(batch))
    it = pair.scan(db, prefix)
    stamped = pair.loop.run(it.next_batch(100))
    assert {kv.expire_ts is None for kv in stamped} == {True, False}
    expected = [(bytes(kv.key), bytes(kv.value)) for kv in stamped]
    assert pair.direct_rows(db, prefix, 4) == expected


_REFUSED = [(b"", b"v"), ("text", b"v"), (b"k", 7), (5, b"v")]


@pytest.mark.parametrize("row", _REFUSED, ids=["empty", "str", "int", "key-int"])
def test_a_row_the_binding_refuses_is_refused_with_its_error(row: tuple[Any, Any]) -> None:
    with pytest.raises(Exception) as public:
        sdb.WriteBatch().put(*row)
    with pytest.raises(Exception) as direct:
        slate_direct.put_many(sdb.WriteBatch(), [row])
    assert type(direct.value) is type(public.value)
    with pytest.raises(type(public.value)):
        bad_key: Any = row[0] if row[0] != b"k" else 7
        slate_direct.delete_many(sdb.WriteBatch(), [bad_key])


def _buffer(raw: bytes) -> Any:
    """A Rust buffer holding ``raw`` as it is (what a lift receives)."""
    b = slate_direct._B
    assert b is not None
    status = b.status.default()
    foreign = b.foreign(len(raw), ctypes.cast(ctypes.c_char_p(raw), _CHAR_P))
    return b.from_bytes(foreign, ctypes.byref(status))


_CHAR_P = ctypes.POINTER(ctypes.c_char)
_ROW = struct.pack(">i", 3) + b"key" + struct.pack(">i", 1) + b"v" + bytes(16) + b"\x01" + bytes(8)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (struct.pack(">i", 1) + _ROW, None),
        (struct.pack(">i", 2) + _ROW, "truncated"),
        (struct.pack(">i", 1) + _ROW[:-3], "truncated"),
        (struct.pack(">i", 1) + _ROW + b"\x00", "1 bytes past the last row"),
        (struct.pack(">i", -1), "negative row count"),
        (b"", "truncated"),
    ],
    ids=["whole", "a row short", "cut", "junk after", "negative", "empty"],
)
def test_a_returned_batch_that_is_not_whole_is_refused(raw: bytes, error: str | None) -> None:
    """What the binding's own lift refuses, ``next_rows``' refuses too, by name."""
    if error is None:
        assert slate_direct._rows(_buffer(raw)) == [(b"key", b"v")]
    else:
        with pytest.raises(slate_direct.BindingError, match=error):
            slate_direct._rows(_buffer(raw))


def test_without_the_direct_calls_the_public_methods_write_the_same(
    pair: _Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What runs where the binding's checksums differ (``available()`` false)."""
    monkeypatch.setattr(slate_direct, "_B", None)
    assert not slate_direct.available()
    prefix = b"fallback\xfe"
    batch = sdb.WriteBatch()
    assert slate_direct.put_many(batch, [(prefix + b"a", b"1"), (prefix + b"b", b"2")]) == 2
    assert slate_direct.delete_many(batch, [prefix + b"a"]) == 1
    pair.loop.run(pair.dbs[0].write(batch))
    assert pair.rows(pair.dbs[0], prefix) == [(prefix + b"b", b"2")]
    assert pair.direct_rows(pair.dbs[0], prefix, 1) == [(prefix + b"b", b"2")]
