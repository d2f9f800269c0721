"""The sweep of ``make bench-stream`` as a picture: records per second and files per
checkpoint against rows per batch, one line per system (issue 35). matplotlib is the
``bench`` extra (``make bench-stream`` installs it); without it no plot is written, and
the run says so."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def plot(table: Iterable[Mapping[str, Any]], path: Path) -> str:
    """Write the plot of ``table`` (``stream_scale``'s median rows) to ``path`` (its
    suffix picks the format); what was done, in one line."""
    try:
        importlib.import_module("matplotlib").use("Agg")  # no display on a build machine
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[bench]')"
    rows = list(table)
    systems = sorted({str(t["system"]) for t in rows})
    fig, (rate, files) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, system in enumerate(systems):  # one colour per system in both panels
        mine = sorted((t for t in rows if t["system"] == system),
                      key=lambda t: int(t["rows_per_batch"]))  # fmt: skip
        xs = [int(t["rows_per_batch"]) for t in mine]
        rate.plot(xs, [t["records_per_s"] for t in mine], marker="o", label=system, color=f"C{i}")
        counted = [(x, t["files_per_batch"]) for x, t in zip(xs, mine, strict=True)
                   if t.get("files_per_batch") is not None]  # fmt: skip
        if counted:
            files.plot(*zip(*counted, strict=True), marker="o", label=system, color=f"C{i}")
    for ax, what in ((rate, "records per second"), (files, "state files per checkpoint")):
        ax.set_xscale("log")
        ax.set_xlabel("rows per batch")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    rate.set_yscale("log")
    fig.suptitle("ckpt stream against Spark's own state store (medians; make bench-stream)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"wrote {path}"
