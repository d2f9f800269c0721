"""The goals of ``make bench-stream`` (issue 35), judged on the medians of one run.

Each goal is met, missed, or not measured (a system it compares with was not run, or a
cell is n/a): never met by default. ``ckpt`` is the streaming job with ACROSS merging, so
its files per batch are ACROSS's.

- records per second: ``ckpt`` at least 1.0x ``native`` and ``native-changelog`` at 1e5
  and 1e6 rows per batch (stretch 1.5x at 1e6), and at least 0.9x ``ckpt-off`` at every
  size;
- files per checkpoint: ``ckpt`` fewer than every Spark row at the same size, with space
  amplification at most 2.0 at the end;
- ACROSS: at most 0.5 files per checkpoint at amplification at most 2.0 at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bench.common import cell

AMPLIFICATION_BOUND = 2.0
ACROSS_FILES = 0.5
SPARK = ("native", "native-changelog")


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
