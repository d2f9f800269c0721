"""``python -m bench``: run the benchmarks, print a table, write ``bench/results.json``.

Options: ``--quick`` (smaller, for a smoke run; writes no file unless ``--out`` is
given), ``--only NAME[,NAME]`` (``write``, ``small``, ``subsume``, ``memory``, ``steady``,
``audit``; and ``working``, issue 18's state backends, which runs only when asked),
``--repeats N`` (runs per timed measurement, default 7), ``--out PATH``, ``--tmp DIR``
(where the local-disk benchmark writes; default: the system temp dir).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.audit import audit_throughput
from bench.common import REPO, Figure, machine_info, table
from bench.memory import memory_over_checkpoints
from bench.tables import memory_per_segment, subsume_cost
from bench.throughput import small_segments, write_throughput
from bench.working_state import figure as working_figure

NAMES = ("write", "small", "subsume", "memory", "steady", "audit")
"""What ``python -m bench`` (``make bench``) runs."""
OPT_IN = ("working",)
"""Run only when ``--only`` names them (``bench.working_state``: its own module has the
S3 run and other workloads)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument(
        "--only",
        default=",".join(NAMES),
        help="comma-separated: " + ", ".join((*NAMES, *OPT_IN)),
    )
    ap.add_argument("--repeats", type=int, default=7, help="runs per timed measurement")
    ap.add_argument("--out", type=Path, default=None, help="where to write the results JSON")
    ap.add_argument("--tmp", default=None, help="directory for the local-disk benchmark")
    args = ap.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(NAMES) - set(OPT_IN))
    if unknown or args.repeats < 1:
        ap.error(f"unknown benchmark {unknown}" if unknown else "--repeats must be >= 1")
    out: Path | None = args.out
    if out is None and not args.quick:
        out = REPO / "bench" / "results.json"

    def log(msg: str) -> None:
        print(msg, flush=True)

    runs: dict[str, Callable[[], Figure]] = {
        "write": lambda: write_throughput(args.repeats, args.quick, args.tmp, log),
        "small": lambda: small_segments(args.repeats, args.quick, log),
        "subsume": lambda: subsume_cost(args.repeats, args.quick, log),
        "memory": lambda: memory_per_segment(args.repeats, args.quick, log),
        "steady": lambda: memory_over_checkpoints(args.quick, log),
        "audit": lambda: audit_throughput(min(args.repeats, 5), args.quick, args.tmp, log),
        "working": lambda: working_figure(log, args.tmp),
    }
    info = machine_info()
    log(
        f"ckpt-ownership benchmarks: {info['cpus_usable']} usable CPUs, Python "
        f"{info['python']}, load average {info['load_average_at_start']}, "
        f"{args.repeats} runs per timing (medians)"
    )
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in (*NAMES, *OPT_IN):
        if name in chosen:
            log(f"[{name}]")
            t0 = time.perf_counter()
            figures.append(runs[name]())
            log(f"  ({time.perf_counter() - t0:.1f} s)")
    info["seconds"] = round(time.perf_counter() - started, 1)
    try:
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    info["repeats"] = args.repeats
    info["quick"] = args.quick
    log("")
    log(table(figures))
    missed = [f.title for f in figures if not f.met]
    log("")
    log(
        f"goals met: {len(figures) - len(missed)} of {len(figures)}"
        + (f"; missed: {'; '.join(missed)}" if missed else "")
    )
    if out is not None:
        # A run of some figures keeps the others' last results; each figure carries the
        # machine it was measured on when that differs from the file's "machine".
        doc: dict[str, object] = {}
        if out.exists() and set(chosen) != set(NAMES):
            doc = json.loads(out.read_text())
            for f in figures:
                f.details["machine"] = info
        else:
            doc["machine"] = info
        doc.update({f.key: f.as_json() for f in figures})
        out.write_text(json.dumps(doc, indent=2) + "\n")
        log(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
