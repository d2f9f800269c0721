"""The goals of ``make bench-stream`` (issue 35), judged on the medians of one run.

Each goal is met, missed, or not measured (a system it compares with was not run, or a
cell is n/a): never met by default. ``ckpt`` is the streaming job with ACROSS merging, so
its files per batch are ACROSS's.

- records per second: ``ckpt`` at least 1.0x ``native`` and ``native-changelog`` at 1e5
  and 1e6 rows per batch (stretch 1.5x at 1e6), and at least 0.9x ``ckpt-off`` at every
  size;
- files per checkpoint: ``ckpt`` fewer than every Spark row at the same size, with space
  amplification at most 2.0 at the end;
- ACROSS: at most 0.5 files per checkpoint at amplification at most 2.0 at the end;
- large state (``make bench-stream-large``, ``bench.stream_large``): with the live RocksDB
  state at least 1 GiB, the cost per record of the last tenth of the growth batches at
  most 1.5x that of the first tenth. A run that stayed below 1 GiB did not examine the
  goal: not measured, with the size it reached;
- the working backend (FLIP-427) on the same workload, against the upload backend: at
  least 10x fewer bytes written per checkpoint, a restore after a worker kill at least 5x
  faster, and its space amplification at the end within the bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.common import cell

AMPLIFICATION_BOUND = 2.0
ACROSS_FILES = 0.5
SPARK = ("native", "native-changelog")
LARGE_STATE_BYTES = 1 << 30
FLAT_COST = 1.5
LARGE_GOAL = f"large state (>= 1 GiB), cost per record flat within {FLAT_COST}x"
FEWER_BYTES = 10.0
FASTER_RESTORE = 5.0


def _goal(name: str, rows: int, met: bool | None, figures: str) -> dict[str, Any]:
    return {
        "goal": name,
        "rows_per_batch": rows,
        "verdict": "not measured" if met is None else ("met" if met else "missed"),
        "figures": figures,
    }


def judge(table: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The goals at each size of ``table`` (``stream_scale``'s median rows)."""
    by: dict[int, dict[str, Mapping[str, Any]]] = {}
    for t in table:
        by.setdefault(int(t["rows_per_batch"]), {})[str(t["system"])] = t
    out: list[dict[str, Any]] = []
    for rows in sorted(by):
        row = by[rows]
        mine = row.get("ckpt", {})
        rate = mine.get("records_per_s")
        for other, floor in (("ckpt-off", 0.9), *((s, 1.0) for s in SPARK)):
            if other != "ckpt-off" and rows < 100_000:
                continue
            theirs = row.get(other, {}).get("records_per_s")
            ratio = rate / theirs if rate and theirs else None
            met = None if ratio is None else ratio >= floor
            shown = f"{ratio:.2f}x" if ratio is not None else f"n/a ({other} not run)"
            out.append(_goal(f"records/s >= {floor}x {other}", rows, met, shown))
            if rows >= 1_000_000 and other in SPARK:
                met = None if ratio is None else ratio >= 1.5
                out.append(_goal(f"stretch: records/s >= 1.5x {other}", rows, met, shown))
        files, amp = mine.get("files_per_batch"), mine.get("amplification_end")
        bounded = None if amp is None else amp <= AMPLIFICATION_BOUND
        spark = [row[s].get("files_per_batch") for s in SPARK if s in row]
        if files is None or not spark or None in spark or bounded is None:
            met = None
        else:
            met = bounded and all(files < s for s in spark if s is not None)
        theirs = ", ".join(f"{s} {cell(row[s].get('files_per_batch'), '.1f')}"
                           for s in SPARK if s in row)  # fmt: skip
        out.append(_goal(
            f"files/checkpoint below every Spark row, amplification <= {AMPLIFICATION_BOUND}",
            rows, met, f"ckpt {cell(files, '.1f')} ({theirs or 'no Spark row'}),"
            f" amplification {cell(amp, '.2f')}",
        ))  # fmt: skip
        met = None if files is None or bounded is None else files <= ACROSS_FILES and bounded
        out.append(_goal(
            f"ACROSS <= {ACROSS_FILES} files/checkpoint at amplification <= "
            f"{AMPLIFICATION_BOUND}", rows, met,
            f"{cell(files, '.1f')} files, amplification {cell(amp, '.2f')}",
        ))  # fmt: skip
    return out


def judge_large(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The large-state goal from ``bench.stream_large``'s summary of its upload-backend
    run (``None``: no such run)."""

    def verdict(met: bool | None, figures: str) -> dict[str, Any]:
        g = _goal(LARGE_GOAL, 0, met, figures)
        del g["rows_per_batch"]
        return g

    if summary is None:
        return verdict(None, "no large-state run (make bench-stream-large)")
    ratio, peak = summary.get("cost_ratio"), summary.get("live_db_bytes_peak")
    if ratio is None or peak is None:
        return verdict(None, str(summary.get("not_measured", "no cost per record or state size")))
    shown = (
        f"µs/record last/first tenth {ratio:.2f}x, live state {peak / LARGE_STATE_BYTES:.2f} GiB"
    )
    if peak < LARGE_STATE_BYTES:
        return verdict(None, f"{shown}: below 1 GiB, the goal's size was not reached")
    return verdict(ratio <= FLAT_COST, shown)


def large_goal(path: Path) -> dict[str, Any]:
    """``judge_large`` on the upload-backend run of ``bench.stream_large``'s results file
    at ``path`` (not measured when the file or the run is absent)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return judge_large(None)
    runs = [r for r in doc.get("runs", []) if r.get("backend") == "rocksdb"]
    return judge_large(runs[0].get("summary") if runs else None)


def judge_working(comparison: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The working backend's goals from ``bench.stream_large.compare`` (``None``: one of
    the two backends did not run)."""
    c = comparison or {}
    why = "" if comparison else " (no working-backend run beside the upload one)"

    def goal(name: str, met: bool | None, figures: str) -> dict[str, Any]:
        g = _goal(name, 0, met, figures + why)
        del g["rows_per_batch"]
        return g

    def mib(x: Any) -> str:
        return "n/a" if x is None else f"{x / (1 << 20):.1f} MiB"

    def s(x: Any) -> str:
        return "n/a" if x is None else f"{x:.2f} s"

    def times(x: Any) -> str:
        return "n/a" if x is None else f"{x:.2f}x"

    ratio, restore, amp = c.get("bytes_ratio"), c.get("restore_ratio"), c.get(
        "working_amplification_end"
    )
    return [
        goal(
            f"working: >= {FEWER_BYTES:.0f}x fewer bytes per checkpoint than upload",
            None if ratio is None else ratio >= FEWER_BYTES,
            f"upload {mib(c.get('upload_written_per_checkpoint'))}, working"
            f" {mib(c.get('working_written_per_checkpoint'))}: {times(ratio)}",
        ),
        goal(
            f"working: restore after a worker kill >= {FASTER_RESTORE:.0f}x faster than upload",
            None if restore is None or not c.get("same_growth") else restore >= FASTER_RESTORE,
            f"upload {s(c.get('upload_restore_seconds'))} at"
            f" {mib(c.get('upload_state_at_kill'))} held, working"
            f" {s(c.get('working_restore_seconds'))} at {mib(c.get('working_state_at_kill'))}"
            f" held: {times(restore)}"
            + ("" if c.get("same_growth") or not c else " (not the same state: not judged)"),
        ),
        goal(
            f"working: amplification at the end <= {AMPLIFICATION_BOUND}",
            None if amp is None else amp <= AMPLIFICATION_BOUND,
            f"{cell(amp, '.2f')} (peak {cell(c.get('working_amplification_peak'), '.2f')})",
        ),
    ]
