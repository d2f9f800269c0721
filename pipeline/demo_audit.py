"""The end of ``make demo``: the Spark audit of every job base the demo wrote.

    python -m pipeline.demo_audit DEMO_DIR [--master local[*]]

The demo leaves each job quiet (every notification delivered, two clean checkpoints), so
the audit runs with no grace period: every unreferenced file counts as an orphan, and the
verdict must be clean (no orphan, no dangling reference, every ``_metadata`` readable).
Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.location import Location
from pipeline.session import SparkUnavailable, spark_session


def job_bases(demo_dir: Path) -> list[Path]:
    """``<mode>/<job>`` directories, in order."""
    return sorted(p for mode in sorted(demo_dir.iterdir()) if mode.is_dir()
                  for p in mode.iterdir() if p.is_dir())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.demo_audit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("demo_dir", type=Path)
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args(argv)
    console = Console(highlight=False, width=160)
    bases = job_bases(args.demo_dir)
    if not bases:
        console.print(f"[red]no job base under {args.demo_dir}[/]")
        return 1
    t0 = time.monotonic()
    try:
        spark = spark_session(args.master)
    except SparkUnavailable as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    from pipeline.spark_audit import audit_spark

    console.print(f"Spark {spark.version} on {args.master}: started in "
                  f"{time.monotonic() - t0:.1f} s; auditing {len(bases)} job bases "
                  "(grace 0: the demo's jobs are quiet, so any unreferenced file is an orphan)")
    t = Table(title="Storage audit of the demo's checkpoint directories")
    for col in ("base", "files", "checkpoints", "references", "orphans", "dangling",
                "bad _metadata", "space ampl.", "shared reused", "seconds"):
        t.add_column(col)
    bad = []
    for base in bases:
        started = time.monotonic()
        if not any(files for _d, _s, files in os.walk(base)):
            # A job whose files were all deleted (a CLAIM restore's predecessor): nothing
            # to audit, and no Spark job needed to say so.
            t.add_row(str(base.relative_to(args.demo_dir)), "0", "-", "-", "0", "0", "0",
                      "-", "-", "0.0")
            continue
        s = audit_spark(spark, Location.parse(str(base)), grace=0.0).summary
        if s.at_risk or s.orphans:
            bad.append(f"{base}: {s.verdict}")
        amp = "-" if s.space_amplification is None else f"{s.space_amplification:.2f}x"
        share = "-" if s.reused_share is None else f"{100 * s.reused_share:.0f}%"
        t.add_row(str(base.relative_to(args.demo_dir)), str(s.files), str(s.checkpoints),
                  str(s.references), str(s.orphans), str(s.dangling), str(s.corrupt_metadata),
                  amp, share, f"{time.monotonic() - started:.1f}")
    console.print(t)
    if bad:
        for line in bad:
            console.print(f"[red]audit verdict: {line}[/]")
        return 1
    console.print("[green]audit verdict: clean: no orphan, no dangling reference, every "
                  "_metadata reads, in every job base the demo wrote[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
