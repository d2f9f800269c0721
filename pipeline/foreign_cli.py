"""``ckpt audit --format flink|spark``: a Flink or Spark checkpoint directory (issue 33).

The engine's own metadata is read into the audit's rows (``pipeline.flink_audit``,
``pipeline.spark_location``), then the same tables, report, exit codes and deletion
guards as for our own format. Exit 2 when no checkpoint was read: every file would look
unreferenced, so nothing is called an orphan and no deletion runs.
"""

from __future__ import annotations

import os
import time
from typing import Any

from attrs import frozen
from rich.console import Console
from rich.markup import escape

from pipeline.exits import EXIT_AT_RISK, EXIT_REFUSED, EXIT_USAGE
from pipeline.foreign import ForeignError, ForeignRead, PathMap
from pipeline.location import Location
from pipeline.names import shown
from pipeline.result import Row, Summary, Tables
from pipeline.session import SparkUnavailable


@frozen
class ForeignRun:
    fmt: str
    engine: str
    master: str | None
    grace: float
    path_map: list[str]
    savepoints: list[str]
    retain: int
    delete: bool
    dry_run: bool
    log: str | None
    json_out: str | None
    out: str | None
    limit: int
    quiet: bool
    allow_short_grace: bool
    no_live_writer: bool
    rate: float


def read(loc: Location, run: ForeignRun, now: float) -> tuple[ForeignRead, object]:
    """The directory read as ``run.fmt``, and the format's marker of a live writer."""
    if run.fmt == "flink":
        from pipeline.flink_audit import read_flink

        return read_flink(loc, path_map=PathMap.parse(run.path_map),
                          savepoints=run.savepoints, grace=run.grace, now=now), None
    if run.savepoints:
        raise ForeignError("--savepoints is for Flink checkpoint directories")
    from pipeline.spark_location import read_spark

    return read_spark(loc, retain=run.retain, grace=run.grace, now=now)


def tables(loc: Location, got: ForeignRead, run: ForeignRun, now: float,
           err: Console | None = None) -> Tables:
    """The audit's tables from the reader's rows: on Spark (the DataFrame audit) or in
    one process, by the same definitions."""
    if run.engine == "spark":
        from pipeline.session import spark_session
        from pipeline.spark_audit import audit_foreign_spark

        spark = spark_session(run.master)
        if err is not None and not run.quiet:
            err.print(f"Spark {spark.version}, master {spark.sparkContext.master}")
        return audit_foreign_spark(spark, loc, got, grace=run.grace, now=now).collect()
    from pipeline.single import analyse

    return analyse(loc, got.files, got.checkpoints, got.references, got.corrupt, got.outside,
                   grace=run.grace, now=now, engine="single-process", problems=got.problems,
                   foreign=got.foreign)


def audit_foreign(console: Console, err: Console, loc: Location, run: ForeignRun) -> int:
    """The whole run; returns the exit code."""
    from pipeline.report import render, write_json, write_rows

    now = time.time()
    try:
        got, marker = read(loc, run, now)
    except ForeignError as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return EXIT_USAGE
    try:
        result = tables(loc, got, run, now, err)
    except SparkUnavailable as e:
        err.print(f"[red]error:[/] {e}")
        return EXIT_USAGE
    summary = result.summary
    if summary.read_nothing:
        return _nothing_read(console, err, loc, run, result)
    render(console, summary, result.tables, limit=run.limit)
    for note in summary.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    try:
        if run.json_out:
            write_json(summary, run.json_out)
        if run.out:
            write_rows(result.tables, run.out)
            write_json(summary, os.path.join(run.out, "summary.json"))
            console.print(f"details written to {shown(run.out)}", markup=False)
    except OSError as e:
        err.print(f"[red]error:[/] an output cannot be written: {escape(str(e))}")
        return EXIT_USAGE
    code = EXIT_AT_RISK if summary.at_risk else 0
    if not run.delete:
        return code
    return max(code, _delete(console, err, loc, run, summary, result.tables, marker, now))


def _nothing_read(
    console: Console, err: Console, loc: Location, run: ForeignRun, result: Tables
) -> int:
    """No checkpoint read: every file would look unreferenced, so no table of files is
    shown and nothing is called an orphan. Unreadable metadata is listed and pages (exit
    1: a retained checkpoint may be lost); else exit 2. A deletion is refused (3)."""
    from pipeline.report import render_rows, write_json

    summary = result.summary
    said = (f"no {run.fmt.capitalize()} checkpoint was read in {shown(loc.uri())} "
            f"({summary.files} file(s), {summary.corrupt_metadata} unreadable metadata "
            "file(s)): nothing references anything read, so no file is called unreferenced")
    err.print(f"[red]not audited:[/] {escape(said)}", soft_wrap=True)
    render_rows(console, "Unreadable metadata", result["corrupt"],
                ("metadata", "field", "problem"), run.limit, style="red")
    if run.json_out:
        write_json(summary, run.json_out, {"not_audited": said})
    code = EXIT_AT_RISK if summary.corrupt_metadata else EXIT_USAGE
    if run.delete:
        err.print("[red]deletion refused, nothing deleted:[/] no checkpoint was read: the "
                  "reference set is empty, and that never means nothing is referenced",
                  soft_wrap=True)
        return EXIT_REFUSED
    return code


def _delete(
    console: Console, err: Console, loc: Location, run: ForeignRun, summary: Summary,
    details: dict[str, list[Row]], marker: object, now: float,
) -> int:
    from pipeline.deletion import DeletionRefused
    from pipeline.deletion_run import delete_planned
    from pipeline.foreign_deletion import plan_foreign

    def reread() -> tuple[ForeignRead, object]:
        return read(loc, run, time.time())

    def make_plan() -> Any:
        return plan_foreign(loc, summary, details["orphans"], grace=run.grace, reread=reread,
                            marker=marker, allow_short_grace=run.allow_short_grace,
                            no_live_writer=run.no_live_writer, now=now,
                            dangling=details.get("dangling", ()))

    try:
        return delete_planned(console, err, loc, make_plan, dry_run=run.dry_run, log=run.log,
                              rate=run.rate)
    except (DeletionRefused, ForeignError) as e:
        err.print(f"[red]deletion refused, nothing deleted:[/] {escape(str(e))}",
                  soft_wrap=True)
        return EXIT_REFUSED
