"""bench/peers_count.py and bench.peers' table: the FLIP-306 table's counting on listings and
on Flink's handle records, without Flink (make bench-peers runs Flink itself)."""

from __future__ import annotations

import argparse

import pytest

from bench.peers import Row, flink_conf, key_value, render
from bench.peers_count import (
    count_flink,
    created_per_checkpoint,
    held_at_end,
    referenced,
    relative,
)

ROOT = "/tmp/x/ckpt/job"


def _seg(path: str, offset: int, length: int) -> dict[str, object]:
    return {"type": "SegmentFileStateHandle", "path": "file:" + ROOT + "/" + path,
            "offset": offset, "length": length}  # fmt: skip


def test_files_created_are_counted_from_the_second_checkpoint() -> None:
    listings = [{"a": 1, "b": 1}, {"a": 1, "b": 2, "c": 1}, {"c": 1, "d": 1, "e": 1}]
    # The first checkpoint's two files are left out; then c, then d and e.
    assert created_per_checkpoint(listings) == 1.5
    # A checkpoint missed between two listings: three taken for the same three files.
    assert created_per_checkpoint(listings, [1, 2, 4]) == 1.0
    assert created_per_checkpoint(listings[:1]) is None
    with pytest.raises(ValueError):
        created_per_checkpoint(listings, [1, 2])


def test_held_at_end_drops_deleted_files_and_keeps_the_size_at_completion() -> None:
    at_completion = {"old": 10, "open": 5, "sst": 7}
    before_next = {"open": 9, "sst": 7, "next": 3}  # "old" subsumed, "open" grew, "next" new
    assert held_at_end(at_completion, before_next) == 12


def test_referenced_counts_each_range_once_and_skips_inline_and_directories() -> None:
    handles: list[dict[str, object]] = [
        _seg("shared/f1", 0, 100),
        _seg("shared/f1", 0, 100),  # the same segment named twice
        _seg("shared/f1", 100, 50),
        {"type": "RelativeFileStateHandle", "path": "file://" + ROOT + "/chk-3/s", "offset": 0,
         "length": 40},
        {"type": "ByteStreamStateHandle", "path": "inline", "offset": 0, "length": 999},
        {"type": "DirectoryStreamStateHandle", "path": "file:" + ROOT + "/shared", "offset": 0,
         "length": 0},
        {"type": "EmptySegmentFileStateHandle", "path": None, "offset": 0, "length": 0},
        {"type": "FileStateHandle", "path": "file:/elsewhere/f", "offset": 0, "length": 5},
    ]  # fmt: skip
    got = referenced(handles, ROOT)
    assert got.bytes == 190
    assert got.files == {"shared/f1", "chk-3/s"}
    assert got.elsewhere == 1
    assert relative("file:" + ROOT + "x/f", ROOT) is None


def test_a_flink_row_from_listings_and_handles() -> None:
    listings = [{"shared/f1": 100}, {"shared/f1": 150, "shared/f2": 60}]
    before_next = {"shared/f1": 200, "shared/f2": 60}
    handles = [_seg("shared/f1", 0, 100), _seg("shared/f1", 100, 50), _seg("shared/f2", 0, 30)]
    row = count_flink(listings, [1, 2], before_next, 2, handles, ROOT)
    assert row.files_per_checkpoint == 1.0
    assert row.bytes_per_checkpoint == 105.0
    assert row.amplification_end == pytest.approx(210 / 180)
    assert row.note == ""
    # A referenced file missing from the listing: no amplification, and why.
    gone = count_flink(listings, [1, 2], before_next, 2, [_seg("shared/f3", 0, 1)], ROOT)
    assert gone.amplification_end is None and "not listed" in gone.note
    unknown = count_flink(listings, [1, 2], None, 2, None, ROOT)
    assert unknown.amplification_end is None
    assert "next trigger was not seen" in unknown.note and "not loaded" in unknown.note
    assert count_flink([], [], None, 0, None, ROOT).files_per_checkpoint is None


def test_the_table_says_n_a_and_why_for_a_row_that_did_not_run() -> None:
    rows = [
        Row("flink", "across 1MB", 8, 1.5, 290_000.0, 2.9, 40.0),
        Row("flink", "none", None, None, None, None, 3.0, "exit 1: no JVM"),
    ]
    lines = render(rows).splitlines()
    assert lines[0].split()[:3] == ["system", "mode", "ckpts"]
    assert "290,000" in lines[1] and "2.90" in lines[1]
    assert lines[2].count("n/a") == 4 and lines[2].endswith("exit 1: no JVM")


def test_flink_rows_set_merging_and_its_file_size() -> None:
    none = flink_conf("none", None)
    assert none["execution.checkpointing.file-merging.enabled"] == "false"
    assert "execution.checkpointing.file-merging.max-file-size" not in none
    across = flink_conf("across", "1MB")
    assert across["execution.checkpointing.file-merging.across-checkpoint-boundary"] == "true"
    assert across["execution.checkpointing.file-merging.max-file-size"] == "1MB"
    assert flink_conf("within", "32MB")[
        "execution.checkpointing.file-merging.across-checkpoint-boundary"] == "false"


def test_a_flink_option_is_key_equals_value() -> None:
    assert key_value(" a.b = true ") == ("a.b", "true")
    with pytest.raises(argparse.ArgumentTypeError):
        key_value("a.b")
