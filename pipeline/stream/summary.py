"""What ``ckpt stream`` prints: a line per micro-batch and a summary of the run."""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
from rich.console import Console
from rich.table import Table

from pipeline.stream.driver import BatchReport
from pipeline.stream.job import StreamRun


def batch_line(r: BatchReport) -> str:
    if r.in_place or r.db_written_bytes:  # --state-backend working
        return (
            f"batch {r.batch_id:>4}  checkpoint {r.checkpoint:>4}  records {r.records:>7}"
            f"  closed windows {r.closed_windows:>5}  SSTs in place {r.in_place:>3}"
            f" ({r.in_place_bytes / 1024:.0f} KiB)  written by the checkpoint"
            f" {r.exclusive_bytes / 1024:.1f} KiB  restored {r.restored}  retried {r.retried}"
        )
    return (
        f"batch {r.batch_id:>4}  checkpoint {r.checkpoint:>4}  records {r.records:>7}"
        f"  closed windows {r.closed_windows:>5}  SSTs uploaded {r.uploaded:>3}"
        f" ({r.uploaded_bytes / 1024:.0f} KiB) reused {r.reused:>3}"
        f"  exclusive {r.exclusive:>3}  restored {r.restored}  retried {r.retried}"
    )


def run_figures(run: StreamRun) -> dict[str, Any]:
    """The run's figures as JSON values (``ckpt stream --json``): what the summary
    prints, and the records behind it (every batch, kill and task attempt)."""
    cmp = run.comparison
    return {
        "batches": [attrs.asdict(r) for r in run.reports],
        "jobs": list(run.jobs),
        "rescaled": None if run.rescaled is None else list(run.rescaled),
        "recovered": run.recovered,
        "abandoned": list(run.abandoned),
        "skipped": list(run.skipped),
        "seconds": run.seconds,
        "violations": list(run.violations),
        "audits": [attrs.asdict(a) | {"clean": a.clean} for a in run.audits],
        "comparison": None
        if cmp is None
        else {
            "windows": cmp.windows,
            "counts": cmp.counts,
            "equal": cmp.equal,
            "mismatches": [list(m) for m in cmp.mismatches[:20]],
        },
        "kills": [attrs.asdict(k) for k in run.kills],
        "attempts": [attrs.asdict(a) for a in run.attempts],
        "speculative_copies": [attrs.asdict(a) for a in run.speculative_copies()],
        "storage": [attrs.asdict(x) for x in run.storage],
        "trace": run.trace,
        "trace_commands": run.trace_commands,
        "trace_stopped": run.trace_stopped,
        "trace_outside": list(run.trace_outside),
    }


def print_summary(console: Console, run: StreamRun) -> bool:
    """Print the run's figures; whether it is correct (the counts equal the batch
    computation's, and the store's invariants hold)."""
    reports = run.reports
    n = max(len(reports), 1)
    records = sum(r.records for r in reports)
    created = sum(r.created for r in reports)  # counted by the TMs, on the workers
    deleted = sum(x.deleted for x in run.storage)
    amps = [a for x in run.storage if (a := x.amplification) is not None]
    cfg = run.settings.config
    t = Table(title=f"ckpt stream: {cfg.merging_mode.name}, parallelism {run.settings.parallelism}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("micro-batches (= checkpoints completed)", str(len(reports)))
    t.add_row("records", str(records))
    t.add_row(
        "records per second (wall clock, Spark start excluded)",
        f"{records / run.seconds:.0f}" if run.seconds > 0 else "-",
    )
    if run.kills:
        points = Counter(k.point for k in run.kills)
        t.add_row(
            "worker kills injected (by point, as the killed tasks logged them)",
            f"{len(run.kills)}: " + ", ".join(f"{p} {n}" for p, n in sorted(points.items())),
        )
    if run.settings.speculation:
        copies = run.speculative_copies()
        ends = Counter(a.end or "not seen" for a in copies)
        t.add_row(
            "speculative attempts launched (of snapshot tasks / all; how they ended)",
            f"{len(copies)} / {sum(a.speculative for a in run.attempts)}; "
            + (", ".join(f"{e} {n}" for e, n in sorted(ends.items())) or "-"),
        )
    if run.settings.failures.any:
        t.add_row("tasks retried after an injected kill", str(sum(r.retried for r in reports)))
        t.add_row(
            "restores of a subtask's state from storage", str(sum(r.restored for r in reports))
        )
    working = run.settings.state_backend == "working"
    if working:
        t.add_row("state backend", "working (SlateDB on the checkpoint storage)")
        t.add_row(
            "SSTs referred to in place per checkpoint",
            f"{sum(r.in_place for r in reports) / n:.2f}",
        )
        t.add_row(
            "bytes the checkpoint wrote per checkpoint (manifest copies, operator state)",
            f"{sum(r.uploaded_bytes + r.exclusive_bytes for r in reports) / n:,.0f}",
        )
        t.add_row(
            "bytes of SSTs the databases wrote per checkpoint",
            f"{sum(r.db_written_bytes for r in reports) / n:,.0f}",
        )
        if run.slatedb is not None:
            t.add_row("SlateDB checkpoints released / databases dropped",
                      f"{run.slatedb[0]} / {run.slatedb[1]}")  # fmt: skip
            t.add_row("objects SlateDB still keeps (its manifests, pins, GC min age)",
                      f"{run.slatedb[2]} ({run.slatedb[3]:,} bytes)")  # fmt: skip
    else:
        t.add_row("SSTs uploaded per checkpoint", f"{sum(r.uploaded for r in reports) / n:.2f}")
        t.add_row("SSTs reused per checkpoint", f"{sum(r.reused for r in reports) / n:.2f}")
        t.add_row(
            "bytes uploaded per checkpoint",
            f"{sum(r.uploaded_bytes + r.exclusive_bytes for r in reports) / n:,.0f}",
        )
    t.add_row("state files created per checkpoint (by the TMs)", f"{created / n:.2f}")
    t.add_row("state files deleted per checkpoint", f"{deleted / n:.2f}")
    if run.storage:
        t.add_row("state files on storage at the end", str(run.storage[-1].files))
    if amps:
        t.add_row(
            "space amplification at the end (state bytes / latest checkpoint's)", f"{amps[-1]:.2f}"
        )
        t.add_row("space amplification, peak", f"{max(amps):.2f}")
    if run.rescaled is not None:
        after, new_p, mode = run.rescaled
        t.add_row("rescale", f"after batch {after}: parallelism -> {new_p} ({mode})")
    if run.recovered is not None:
        gone = f"; abandoned {', '.join(run.abandoned)} (no checkpoint)" if run.abandoned else ""
        t.add_row("driver restarted", f"recovered job {run.recovered}{gone}")
        t.add_row(
            "batches Spark re-ran that the state held (not counted again)", str(len(run.skipped))
        )
    if run.settings.trace:
        t.add_row(
            "command trace (model_tests.replay)",
            f"{run.trace_commands} commands"
            + (f"; stops early: {run.trace_stopped}" if run.trace_stopped else ", the whole run")
            + (
                f"; {len(run.trace_outside)} event(s) outside the model left out"
                if run.trace_outside
                else ""
            ),
        )
    t.add_row(
        f"store invariants I1-{'I7' if working else 'I6'} (quiet)",
        "hold" if not run.violations else "VIOLATED",
    )
    for job_audit in run.audits:
        t.add_row(
            f"storage audit of {job_audit.job} ({job_audit.files} files,"
            f" {job_audit.checkpoints} checkpoints)",
            "clean" if job_audit.clean else f"NOT CLEAN: {job_audit.verdict}",
        )
    cmp = run.comparison
    if cmp is not None:
        verdict = "equal" if cmp.equal else f"DIFFERENT ({len(cmp.mismatches)} counts)"
        t.add_row(
            f"closed windows vs batch computation ({cmp.windows} windows, {cmp.counts} counts)",
            verdict,
        )
    console.print(t)
    for v in run.violations[:10]:
        console.print(v, style="red", markup=False)
    if cmp is not None:
        for start, word, want, got in cmp.mismatches[:10]:
            console.print(f"window {start} word {word}: batch computation {want}, sink {got}")
    return not run.violations and all(a.clean for a in run.audits) and (cmp is None or cmp.equal)
