"""``slate_writes``: the direct calls into SlateDB's binding write what its public
``WriteBatch.put`` and ``delete`` write, and fail as they fail."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slatedb.uniffi as sdb  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from pipeline.stream import slate, slate_writes

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
    through ``slate_writes``. Each example writes under a prefix of its own."""

    def __init__(self, root: Path) -> None:
        self.loop = slate.Loop()
        store = slate.Place(str(root), {}).store()
        self.dbs = [
            self.loop.run(sdb.DbBuilder(name, store).build()) for name in ("public", "direct")
        ]
        self.examples = itertools.count()

    def rows(self, db: Any, prefix: bytes) -> list[tuple[bytes, bytes]]:
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        r = sdb.KeyRange(start=prefix, start_inclusive=True, end=end, end_inclusive=False)
        it = self.loop.run(db.scan(r))
        out: list[tuple[bytes, bytes]] = []
        while rows := self.loop.run(it.next_batch(1024)):
            out += [(bytes(kv.key), bytes(kv.value)) for kv in rows]
        return out

    def close(self) -> None:
        for db in self.dbs:
            self.loop.run(db.shutdown())
        self.loop.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Pair]:
    p = _Pair(tmp_path_factory.mktemp("slate_writes"))
    yield p
    p.close()


def test_the_direct_calls_are_the_ones_that_run() -> None:
    """With the pinned binding (``pyproject.toml``) the checksums match and the direct
    path runs: the property below compares it with the public one, not with itself."""
    assert slate_writes.available()


@given(ops=_OPS)
def test_direct_puts_and_deletes_leave_the_rows_the_public_methods_leave(
    pair: _Pair, ops: list[tuple[str, bytes, bytes]]
) -> None:
    """Runs of puts and deletes, interleaved and with repeated keys, in two write
    batches (the order within a batch decides which write of a key wins)."""
    prefix = b"%08d\xfe" % next(pair.examples)
    public, direct = sdb.WriteBatch(), sdb.WriteBatch()
    for kind, group in itertools.groupby(ops, key=lambda op: op[0]):
        run = [(prefix + k, v) for _, k, v in group]
        if kind == "put":
            for k, v in run:
                public.put(k, v)
            assert slate_writes.put_many(direct, run) == len(run)
        else:
            for k, _ in run:
                public.delete(k)
            assert slate_writes.delete_many(direct, [k for k, _ in run]) == len(run)
    if ops:
        pair.loop.run(pair.dbs[0].write(public))
        pair.loop.run(pair.dbs[1].write(direct))
    assert pair.rows(pair.dbs[1], prefix) == pair.rows(pair.dbs[0], prefix)


_REFUSED = [(b"", b"v"), ("text", b"v"), (b"k", 7), (5, b"v")]


@pytest.mark.parametrize("row", _REFUSED, ids=["empty", "str", "int", "key-int"])
def test_a_row_the_binding_refuses_is_refused_with_its_error(row: tuple[Any, Any]) -> None:
    with pytest.raises(Exception) as public:
        sdb.WriteBatch().put(*row)
    with pytest.raises(Exception) as direct:
        slate_writes.put_many(sdb.WriteBatch(), [row])
    assert type(direct.value) is type(public.value)
    with pytest.raises(type(public.value)):
        bad_key: Any = row[0] if row[0] != b"k" else 7
        slate_writes.delete_many(sdb.WriteBatch(), [bad_key])


def test_without_the_direct_calls_the_public_methods_write_the_same(
    pair: _Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What runs where the binding's checksums differ (``available()`` false)."""
    monkeypatch.setattr(slate_writes, "_G", None)
    assert not slate_writes.available()
    prefix = b"fallback\xfe"
    batch = sdb.WriteBatch()
    assert slate_writes.put_many(batch, [(prefix + b"a", b"1"), (prefix + b"b", b"2")]) == 2
    assert slate_writes.delete_many(batch, [prefix + b"a"]) == 1
    pair.loop.run(pair.dbs[0].write(batch))
    assert pair.rows(pair.dbs[0], prefix) == [(prefix + b"b", b"2")]
