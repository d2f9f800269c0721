"""Issue 15: every hostile base of ``tests.hostile_bases`` through both engines.

Each case must give a report, not a hang or a traceback: the hostile part is a row (an
unreadable ``_metadata`` or a path not listed), the valid part is audited as usual, the
two engines give the same tables, and ``--delete-orphans`` deletes nothing it must not
(a FIFO, a link, a name that is not UTF-8, anything while a ``_metadata`` is unreadable).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpt.cli import app
from pipeline.location import Location
from pipeline.names import shown, unshown
from pipeline.result import Tables
from pipeline.single import audit_single
from tests.audit_fixtures import comparable
from tests.hostile_bases import CASES, MARKUP_NAMES, Hostile, check, deadline

HOUR = 3600.0


def tree(root: Path) -> set[str]:
    """Every name under ``root`` (links not followed; what the OS cannot reach skipped)."""
    out: set[str] = set()
    for d, dirs, files in os.walk(root):
        out |= {os.path.relpath(os.path.join(d, n), root) for n in [*dirs, *files]}
    return out


def _tree_but_lock(top: Path) -> set[str]:
    """The tree but the deletion run's lock file, the one thing it writes beside the base
    (``pipeline.deletion_log``: one run per base at a time)."""
    return {p for p in tree(top) if not p.startswith(".ckpt-audit-")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_base_single_engine_and_cli(case: str, tmp_path: Path) -> None:
    h = CASES[case](tmp_path)
    before = tree(h.base.parent)
    with deadline(60, case):
        t = audit_single(Location.parse(str(h.base)), grace=HOUR)
        check(h, t)
        log = tmp_path / "log.jsonl"
        r = CliRunner().invoke(
            app,
            [
                "audit",
                str(h.base),
                "--engine",
                "single",
                "-q",
                "--delete-orphans",
                "--log",
                str(log),
                "--json",
                "-",
            ],
        )
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert "Traceback" not in r.output
    if h.dangling:
        # A checkpoint that cannot be restored: pages (exit 1), or the deletion is refused
        # (exit 3), and what the reference names is never touched.
        assert r.exit_code in (1, 3) and "DATA LOSS" in r.output, r.output
        assert {p for p in h.dangling if os.path.lexists(h.base.parent / p)} == set(h.dangling)
    elif h.corrupt or h.refuses:
        assert r.exit_code == 3 and "refused" in r.output, r.output  # unknown references
        assert _tree_but_lock(h.base.parent) == before
    else:
        assert r.exit_code == 0, r.output
        events = [json.loads(x) for x in log.read_text().splitlines()]
        gone = {e["path"] for e in events if e["event"] == "deleted"}
        assert gone == h.orphans
        assert _tree_but_lock(h.base.parent) == before - gone


def test_names_are_printed_escaped_and_logged_exactly(tmp_path: Path) -> None:
    """Rich markup is not interpreted, control characters and newlines do not reach the
    terminal, the dry run lists exactly what the real run deletes, and the log holds
    the exact names (a name that is not UTF-8 too, as path_hex)."""
    h = CASES["names_with_markup_and_control_characters"](tmp_path)
    base = str(h.base)
    dry = CliRunner().invoke(
        app, ["audit", base, "--engine", "single", "-q", "--delete-orphans", "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    assert "\x1b" not in dry.output
    lines = [x for x in dry.output.splitlines() if x.startswith("would delete ")]
    would = {unshown(x.split(" ")[2]) for x in lines}
    assert would == {str(h.base.parent / p) for p in h.orphans}
    for n in MARKUP_NAMES:
        assert shown(n) in dry.output
    log = tmp_path / "log.jsonl"
    real = CliRunner().invoke(
        app, ["audit", base, "--engine", "single", "-q", "--delete-orphans", "--log", str(log)]
    )
    assert real.exit_code == 0, real.output
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert {e["path"] for e in events if e["event"] == "deleted"} == h.orphans
    assert {e["shown"] for e in events if e["event"] == "will-delete"} == {
        shown(p) for p in h.orphans
    }
    assert not any((h.base.parent / p).exists() for p in h.orphans)


LOOK_ALIKES = (
    ("caf\u00e9", "cafe\u0301"),  # NFC and NFD
    ("data", "d\u0430ta"),  # Latin a, Cyrillic a
    ("x.sst", "\uff58.sst"),  # fullwidth x
    ("ab", "a\u200db"),  # zero-width joiner
    ("abc", "\u202eabc"),  # right-to-left override
)


def test_names_that_differ_in_bytes_never_print_the_same(tmp_path: Path) -> None:
    """Finding 8 of issue 32: every name of each look-alike pair is an orphan; the dry run
    prints each in printable ASCII, the two of a pair differently, each back to its exact
    name; the real run's log holds the exact names."""
    for pair in LOOK_ALIKES:
        a, b = (shown(n) for n in pair)
        assert a != b and a.isascii() and b.isascii(), (a, b)
    h = CASES["valid"](tmp_path)
    names = {n for pair in LOOK_ALIKES for n in pair}
    for n in names:
        p = h.base / "shared/v-0-1" / n
        p.write_bytes(b"s" * 10)
        os.utime(p, (time.time() - 3 * 86400.0,) * 2)
    expected = {f"{h.base.parent}/j/shared/v-0-1/{n}" for n in names}
    dry = CliRunner().invoke(
        app, ["audit", str(h.base), "--engine", "single", "-q", "--delete-orphans", "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    lines = [x for x in dry.output.splitlines() if x.startswith("would delete ")]
    printed = [x.split(" ")[2] for x in lines]
    assert all(p.isascii() for p in printed), printed
    assert {unshown(p) for p in printed} >= expected
    assert len(set(printed)) == len(printed)
    log = tmp_path / "log.jsonl"
    real = CliRunner().invoke(
        app, ["audit", str(h.base), "--engine", "single", "-q", "--delete-orphans", "--log",
              str(log)]
    )
    assert real.exit_code == 0, real.output
    events = [json.loads(x) for x in log.read_text().splitlines()]
    deleted = {e["path"] for e in events if e["event"] == "deleted"}
    assert {f"j/shared/v-0-1/{n}" for n in names} <= deleted
    assert not any((h.base / "shared/v-0-1" / n).exists() for n in names)


def test_every_hostile_base_gives_the_same_tables_on_both_engines(
    tmp_path: Path, spark: Any
) -> None:
    from pipeline.spark_audit import audit_spark

    bases = {name: make(tmp_path / name) for name, make in sorted(CASES.items())}
    now = time.time()

    def on_spark(h: Hostile) -> Tables:
        return audit_spark(spark, Location.parse(str(h.base)), grace=HOUR, now=now).collect()

    # Four audits at a time share the session, as a user's threads may: each waits on
    # Spark's scheduling more than it computes (the 23 bases took 45 s so, 79 s one by one).
    pool = ThreadPoolExecutor(4)
    try:
        with deadline(600, "the Spark audits of the hostile bases"):
            on_spark_tables = dict(zip(bases, pool.map(on_spark, bases.values()), strict=True))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung audit: the test fails now
    for name, h in bases.items():
        got = on_spark_tables[name]
        check(h, got)
        single = audit_single(Location.parse(str(h.base)), grace=HOUR, now=now)
        assert comparable(got) == comparable(single), name
