"""The audit on the terminal (rich tables) and as files (JSON summary, details)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.names import shown
from pipeline.result import Row, Summary


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def render(
    console: Console,
    summary: Summary,
    details: Mapping[str, Sequence[Row]],
    *,
    limit: int = 20,
) -> None:
    """The summary, then the rows that need attention (dangling, unreadable metadata,
    orphans), then the owners with the most dead bytes and the checkpoints."""
    s = summary
    fmt = "" if s.format == "ckpt" else f"{s.format.capitalize()} checkpoints, "
    t = Table(title=f"Storage audit of {escape(shown(s.base))} ({fmt}{s.engine})",
              show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("files", f"{s.files:,} ({_bytes(s.bytes)})")
    t.add_row("retained checkpoints", f"{s.checkpoints:,} (+{s.other_metadata} read beside)")
    t.add_row("references", f"{s.references:,}")
    t.add_row("referenced files", f"{s.referenced_files:,}: {_bytes(s.live_bytes)} live, "
              f"{_bytes(s.dead_bytes)} dead")
    t.add_row("space amplification", f"{_x(s.space_amplification)} of referenced files, "
              f"{_x(s.total_amplification)} of all data")
    t.add_row("shared state reused", f"{_pct(s.reused_share)} of {_bytes(s.shared_bytes)}")
    t.add_row("dangling references",
              f"[{'red' if s.dangling else 'green'}]{s.dangling:,}[/] "
              f"({s.dangling_missing} missing file, {s.dangling_beyond} beyond size)")
    t.add_row("unreadable _metadata",
              f"[{'red' if s.corrupt_metadata else 'green'}]{s.corrupt_metadata}[/]")
    t.add_row("orphans", f"[{'yellow' if s.orphans else 'green'}]{s.orphans:,}[/] "
              f"({_bytes(s.orphan_bytes)}), older than {s.grace_seconds:g} s")
    t.add_row("pending", f"{s.pending:,} unreferenced but younger than the grace period "
              f"({_bytes(s.pending_bytes)})")
    if s.working:
        t.add_row("database working files", f"{s.working:,} ({_bytes(s.working_bytes)})")
    if s.in_flight:
        t.add_row("in flight", f"{s.in_flight:,} held by a checkpoint in flight "
                  f"({_bytes(s.in_flight_bytes)})")
    if s.stale:
        t.add_row("stale", f"{s.stale:,} the engine's own cleanup deletes "
                  f"({_bytes(s.stale_bytes)})")
    if s.restore_source_of:
        t.add_row("restore source of", escape(", ".join(shown(x) for x in s.restore_source_of)))
    if s.unreadable:
        t.add_row("unreadable paths", f"[red]{s.unreadable}[/] (listed below; never deleted)")
    t.add_row("verdict", f"[bold {'red' if s.at_risk else 'green'}]{escape(s.verdict)}[/]")
    console.print(t)
    _rows(console, "Dangling references (data loss)", details.get("dangling", ()),
          ("checkpoint", "subtask", "name", "path", "offset", "length", "file_size", "reason"),
          limit, style="red")
    _rows(console, "Unreadable _metadata", details.get("corrupt", ()),
          ("metadata", "field", "problem"), limit, style="red")
    _rows(console, "Paths not listed or not examined", details.get("unreadable", ()),
          ("path", "problem"), limit, style="red")
    orphans = sorted(details.get("orphans", ()), key=lambda r: -int(r["size"]))
    _rows(console, "Orphans (largest first)", orphans, ("path", "owner", "size"), limit,
          style="yellow", total=s.orphans)
    owners = sorted(details.get("owners", ()), key=lambda r: -int(r["dead_bytes"] or 0))
    _rows(console, "Owner directories (most dead bytes first)", owners,
          ("owner", "files", "bytes", "live_bytes", "dead_bytes", "orphans", "amplification"),
          limit)
    ckpts = [c for c in details.get("checkpoints", ())]
    _rows(console, "Checkpoints", ckpts,
          ("checkpoint", "references", "files", "state_bytes", "physical_bytes",
           "amplification", "shared_bytes", "reused_shared_bytes", "dangling"), limit)


def _cell(col: str, v: Any) -> str:
    if v is None:
        return "-"
    if col in ("size", "bytes", "live_bytes", "dead_bytes", "state_bytes", "physical_bytes",
               "shared_bytes", "reused_shared_bytes", "file_size", "orphan_bytes"):
        return _bytes(int(v))
    if col == "amplification":
        return _x(float(v))
    # Names escaped (no markup, no control character, no raw byte); messages keep spaces.
    return escape(shown(str(v), spaces=col not in _NAMES))


_NAMES = frozenset({"path", "owner", "checkpoint", "metadata", "name", "subtask"})


def _rows(
    console: Console,
    title: str,
    rows: Sequence[Row],
    cols: Sequence[str],
    limit: int,
    *,
    style: str | None = None,
    total: int | None = None,
) -> None:
    """``rows`` may be the first rows only; ``total`` then says how many there are."""
    if not rows:
        return
    n = len(rows) if total is None else total
    more = f" (first {limit} of {n:,})" if n > limit else ""
    t = Table(title=title + more, title_style=style)
    for c in cols:
        t.add_column(c, overflow="fold")
    for r in list(rows)[:limit]:
        t.add_row(*(_cell(c, r.get(c)) for c in cols))
    console.print(t)


def render_rows(
    console: Console, title: str, rows: Sequence[Row], cols: Sequence[str], limit: int,
    *, style: str | None = None,
) -> None:
    """One detail table (the first ``limit`` rows)."""
    _rows(console, title, rows, cols, limit, style=style)


def write_json(summary: Summary, path: str, extra: dict[str, Any] | None = None) -> None:
    doc = summary.to_json()
    if extra:
        doc.update(extra)
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if path == "-":
        print(text, end="")
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_rows(tables: dict[str, list[Row]], out: str) -> list[str]:
    """Detail tables as JSON lines (the single-process engine; Spark writes Parquet)."""
    os.makedirs(out, exist_ok=True)
    written = []
    for name, rows in tables.items():
        path = os.path.join(out, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        written.append(path)
    return written
