"""Carrying out a deletion plan from the command line: plan under the base's lock, print
every outcome, delete, report (``ckpt audit --delete-orphans``, every format).

The plan itself is the format's (``pipeline.deletion.plan_deletion`` for ours,
``pipeline.foreign_deletion.plan_foreign`` for Flink's and Spark's); what is printed,
logged and deleted, and the exit codes, are the same for all.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from pipeline.exits import EXIT_DELETE_FAILED, EXIT_REFUSED, EXIT_USAGE
from pipeline.location import Location
from pipeline.names import shown


def default_log() -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"ckpt-audit-deletions-{stamp}.jsonl"


def delete_planned(
    console: Console, err: Console, loc: Location, make_plan: Callable[[], Any], *,
    dry_run: bool, log: str | None, rate: float,
) -> int:
    """Plan (``make_plan``: it raises ``DeletionRefused`` to refuse the whole run), print
    every outcome, and unless ``dry_run`` delete under the base's lock, held from before
    the plan to the last delete (one deletion run per base)."""
    from pipeline.deletion import take_lock

    path = log or default_log()
    if dry_run:
        return _plan_and_delete(console, err, loc, make_plan, None, path, rate)
    with take_lock(loc, path) as lock:
        return _plan_and_delete(console, err, loc, make_plan, lock, path, rate)


def _plan_and_delete(
    console: Console, err: Console, loc: Location, make_plan: Callable[[], Any], lock: Any,
    log_path: str, rate: float,
) -> int:
    """``lock`` None: a dry run (plan and print only)."""
    from pipeline.deletion import DELETE, OUTCOMES, execute

    plan = make_plan()
    # Names escaped and markup off: what is printed is what is deleted, one per line.
    for path, outcome, why in plan.outcomes:
        if outcome != DELETE:
            console.print(f"{outcome:<12} {shown(loc.uri(path))}: {why}", markup=False,
                          soft_wrap=True)
    dry_run = lock is None
    verb = "would delete" if dry_run else "delete"
    for c in plan.delete:
        console.print(f"{verb} {shown(loc.uri(c.path))} ({c.size} bytes)", markup=False,
                      soft_wrap=True)
    console.print("outcomes: " + ", ".join(f"{plan.count(o)} {o}" for o in OUTCOMES),
                  markup=False)
    if dry_run:
        console.print(f"dry run: {len(plan.delete)} file(s), {plan.bytes} bytes would be "
                      "deleted; nothing was deleted")
        return 0
    if not plan.delete:
        console.print("no orphan to delete")
    # Logged even when nothing is deleted: every outcome, skip-unknown included.
    try:
        done = execute(loc, plan, log_path, rate=rate, lock=lock)
    except OSError as e:  # checked before the audit; this is a change since (a full disk)
        err.print(f"[red]error:[/] the deletion log {escape(shown(log_path))} cannot be "
                  f"written: {escape(str(e))}")
        raise typer.Exit(EXIT_USAGE) from None
    for run, p, exists in done.previous:
        console.print(f"run {run} was stopped while deleting {shown(loc.uri(p))}: "
                      + ("it is gone (deleted)" if not exists else "it still exists "
                         "(not deleted)"), markup=False, soft_wrap=True)
    console.print(f"run {done.run}: deleted {len(done.deleted)} file(s), "
                  f"{len(done.gone)} gone already, {len(done.failed)} failed, "
                  f"{len(done.skipped)} refused; log: {shown(done.log)}", markup=False)
    for p, why in done.failed:
        err.print(f"failed {shown(p)}: {why}", markup=False, soft_wrap=True)
    for p, why in done.skipped:
        err.print(f"skip-unknown {shown(loc.uri(p))}: {why}", markup=False, soft_wrap=True)
    if done.failed:
        return EXIT_DELETE_FAILED
    return EXIT_REFUSED if done.skipped else 0
