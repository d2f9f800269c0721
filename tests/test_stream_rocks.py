"""The streaming job's RocksDB layout (``pipeline.stream.rocks``): window first, so that a
batch's keys land above the older windows and RocksDB never rewrites those, whatever the
state's size; what closes and what a key-group range is under that layout."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.stream.rocks import (
    ForeignKeyError,
    WindowCounts,
    decode_key,
    encode_key,
    group_ranges,
    options,
)
from pipeline.stream.windows import Windowing


def _ssts(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.suffix == ".sst"}


def test_older_windows_are_never_rewritten_as_windows_are_added(tmp_path: Path) -> None:
    """Each batch counts words of a new window over every key group, flushed as a
    checkpoint flushes. With the window first no flushed SST overlaps an older one, so
    compactions move files down and never rewrite them: every SST ever flushed is still
    there, unchanged, after twelve batches (three times RocksDB's level-0 trigger). With
    the key group first each level-0 compaction merged the flushed files into new ones."""
    db = WindowCounts(tmp_path / "db", options(write_buffer_size=1 << 20))
    rng = random.Random(7)
    seen: set[str] = set()
    for batch in range(12):
        db.add(
            {(rng.randrange(32), 1000 * batch, f"w{rng.randrange(10**5)}"): 1 for _ in range(3000)}
        )
        db.db.flush()
        db.db.compact_range(None, None)  # whatever compaction RocksDB could run, now
        now = _ssts(tmp_path / "db")
        assert seen <= now, f"batch {batch}: rewritten {sorted(seen - now)}"
        seen = now
    assert len(seen) == 12
    db.close()


def test_closing_emits_and_deletes_the_closed_windows_only(tmp_path: Path) -> None:
    windowing = Windowing(1000, 0)
    db = WindowCounts(tmp_path / "db", options())
    db.add({(3, 0, "a"): 2, (5, 0, "b"): 1, (3, 1000, "a"): 4, (7, 2000, "c"): 1})
    assert sorted(db.close_windows(range(0, 8), windowing, 2000)) == [
        (0, "a", 2),
        (0, "b", 1),
        (1000, "a", 4),
    ]
    assert list(db.items()) == [((7, 2000, "c"), 1)]
    assert db.close_windows(range(0, 8), windowing, 2000) == []
    db.close()


def test_a_key_of_another_subtasks_group_stops_the_close_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    db = WindowCounts(tmp_path / "db", options())
    db.add({(3, 0, "a"): 2, (40, 0, "b"): 1})
    with pytest.raises(ForeignKeyError, match="key group 40"):
        db.close_windows(range(0, 32), Windowing(1000, 0), 5000)
    assert sorted(db.items()) == [((3, 0, "a"), 2), ((40, 0, "b"), 1)]
    db.close()


def _keys_in(db: WindowCounts, lo: bytes, hi: bytes) -> list[bytes]:
    it = db.db.iter()
    it.seek(lo)
    out: list[bytes] = []
    while it.valid():
        key = it.key()
        assert isinstance(key, bytes)
        if key >= hi:
            break
        out.append(key)
        it.next()
    return out


_keys = st.lists(
    st.tuples(
        st.integers(0, 127), st.integers(0, 5).map(lambda w: w * 1000), st.text("ab", max_size=3)
    ),
    max_size=40,
    unique=True,
)


@given(keys=_keys, first=st.integers(0, 127), size=st.integers(0, 127))
def test_group_ranges_hold_exactly_the_keys_of_the_groups(
    tmp_path_factory: pytest.TempPathFactory,
    keys: list[tuple[int, int, str]],
    first: int,
    size: int,
) -> None:
    """A key-group range is one key range per window the DB holds; together they hold
    the keys of those groups and no other."""
    groups = (first, min(127, first + size))
    db = WindowCounts(tmp_path_factory.mktemp("db") / "db", options())
    db.add({k: 1 for k in keys})
    ranges = group_ranges(db.db, groups)
    got = sorted(decode_key(k) for lo, hi in ranges for k in _keys_in(db, lo, hi))
    assert got == sorted(k for k in keys if groups[0] <= k[0] <= groups[1])
    assert [lo for lo, _ in ranges] == sorted(lo for lo, _ in ranges)
    assert all(encode_key(*decode_key(encode_key(*k))) == encode_key(*k) for k in keys)
    db.close()
