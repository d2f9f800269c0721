"""What every benchmark shares: repeated timing with medians, the result record, the
machine description and the printed table."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]

from spec.config import Config, MergingMode

REPO = Path(__file__).resolve().parent.parent

NEVER_ROLL = 1 << 40
"""``max_file_size`` large enough that no physical file rolls over in a benchmark."""


def within_config(num_retained: int = 1) -> Config:
    return Config.for_mode(
        MergingMode.WITHIN_CHECKPOINT, max_file_size=NEVER_ROLL, num_retained=num_retained
    )


def memory_fs() -> Any:
    return fsspec.filesystem("memory")


def local_fs() -> Any:
    return fsspec.filesystem("file")


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes; a full garbage collection first, outside the timing."""
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


@dataclass
class Case:
    """One measured case of a figure (a segment size, a number of live segments...)."""

    label: str
    value: float
    baseline: float
    ratio: float
    note: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)
    """Every measured sample, by series, in run order."""


@dataclass
class Figure:
    """One benchmark figure as written to ``results.json``.

    The headline ``value``, ``baseline`` and ``ratio`` are those the goal is judged on
    (the worst case where there are several); ``cases`` lists every case measured, and
    ``details`` the parameters of the run and any breakdown."""

    key: str
    title: str
    unit: str
    value: float
    baseline: float
    baseline_what: str
    ratio: float
    ratio_what: str
    goal: str
    met: bool
    cases: list[Case] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["key"]
        return out


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def machine_info() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    try:
        load: list[float] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    dirty = _git("status", "--porcelain", "--", "fastimpl", "spec")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "load_average_at_start": load,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "fsspec": str(fsspec.__version__),
        "git_commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes_in_fastimpl_or_spec": dirty.splitlines() if dirty else [],
    }


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def table(figures: list[Figure]) -> str:
    """A plain-text table: per figure, the headline judged against its goal (met or
    MISSED), then one indented line per case."""
    head = ("figure / case", "value", "baseline", "ratio", "goal")
    rows: list[tuple[str, ...]] = []
    for f in figures:
        verdict = "met" if f.met else "MISSED"
        rows.append(
            (
                f.title,
                f"{_fmt(f.value)} {f.unit}",
                f"{_fmt(f.baseline)} {f.unit}",
                f"{f.ratio:.3f}",
                f"{f.goal}: {verdict}",
            )
        )
        for case in f.cases:
            rows.append(
                (
                    f"  {case.label}",
                    f"{_fmt(case.value)}",
                    f"{_fmt(case.baseline)}",
                    f"{case.ratio:.3f}",
                    case.note,
                )
            )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


@contextlib.contextmanager
def counting_fsyncs() -> Iterator[list[int]]:
    """Count ``os.fsync`` calls made inside the block (by fastimpl or by the loop)."""
    real = os.fsync
    count = [0]

    def counted(fd: Any) -> None:
        count[0] += 1
        real(fd)

    setattr(os, "fsync", counted)  # noqa: B010 (mypy would refuse a plain assignment)
    try:
        yield count
    finally:
        setattr(os, "fsync", real)  # noqa: B010


def cell(x: float | None, fmt: str) -> str:
    """A figure of a printed table: ``x`` in ``fmt``, or ``n/a`` where it could not be
    told (never a zero standing in for a figure not measured)."""
    return "n/a" if x is None else format(x, fmt)
