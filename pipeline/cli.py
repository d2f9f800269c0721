"""``ckpt audit <base-uri>``: the storage audit from the command line (issue 6).

    ckpt audit /data/checkpoints/job-1                 # Spark local[*], report only
    ckpt audit s3://bucket/ckpts/job-1 --endpoint-url http://127.0.0.1:9000
    ckpt audit BASE --out audit/ --json audit/summary.json   # Parquet details + summary
    ckpt audit BASE --delete-orphans --dry-run          # exactly what would be deleted
    ckpt audit BASE --delete-orphans --grace 48h        # log, then delete

Exit codes: 0 the base is readable and loses no data (orphans are reported, not failed);
1 a dangling reference or an unreadable ``_metadata`` (a retained checkpoint cannot be
restored: page someone); 2 bad usage or the audit could not run; 3 a guard refused the
deletion (nothing deleted); 4 some deletes failed (see the log).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from typing import Annotated, Any

import typer
from rich.console import Console

from pipeline.location import Location, LocationError
from pipeline.result import Row, Summary

EXIT_AT_RISK = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_DELETE_FAILED = 4

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``24h``, ``2d`` or combinations such as ``1h30m``."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 24h, 90m, 3600s, 1h30m)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _options(pairs: list[str], endpoint: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p:
            raise typer.BadParameter(f"storage option {p!r} is not key=value")
        k, v = p.split("=", 1)
        opts[k] = v
    if endpoint:
        opts.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    return opts


def audit(
    base: Annotated[str, typer.Argument(help="The job's checkpoint base: a local path or s3://...")],
    master: Annotated[
        str | None,
        typer.Option(help="Spark master URL (default local[*]; under spark-submit, its own)."),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="spark, or single (one Python process, no Spark).")
    ] = "spark",
    grace: Annotated[
        str, typer.Option(help="Unreferenced files younger than this are pending, not orphans.")
    ] = "24h",
    delete_orphans: Annotated[
        bool, typer.Option("--delete-orphans", help="Delete the orphans (off by default).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="With --delete-orphans: print, delete nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Allow a grace period under 1 h, or a base without checkpoints."
        ),
    ] = False,
    log: Annotated[
        str | None,
        typer.Option(help="Deletion log (JSON lines), written before deleting. "
                     "Default: ./ckpt-audit-deletions-<UTC time>.jsonl"),
    ] = None,
    out: Annotated[
        str | None, typer.Option(help="Write the detail tables here (Parquet with Spark).")
    ] = None,
    json_out: Annotated[
        str | None, typer.Option("--json", help="Write the summary as JSON here ('-': stdout).")
    ] = None,
    storage_option: Annotated[
        list[str] | None,
        typer.Option("--storage-option", "-o", help="fsspec storage option key=value."),
    ] = None,
    endpoint_url: Annotated[
        str | None, typer.Option(help="S3 endpoint (MinIO, moto, ...).")
    ] = None,
    others: Annotated[
        bool,
        typer.Option(help="Also read the _metadata of other jobs and savepoints beside the base."),
    ] = True,
    limit: Annotated[int, typer.Option(help="Rows per table on the terminal.")] = 20,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """Audit a checkpoint base: orphans, dangling references, space amplification."""
    # Off a terminal (CI logs, pipes) rich would wrap every table at 80 columns.
    console = Console(highlight=False, width=None if os.isatty(1) else 160)
    err = Console(stderr=True, highlight=False)
    grace_s = parse_duration(grace)
    if engine not in ("spark", "single"):
        raise typer.BadParameter("--engine is spark or single")
    try:
        loc = Location.parse(base, _options(storage_option or [], endpoint_url))
    except LocationError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(EXIT_USAGE) from None
    fs = loc.fs()
    if not fs.exists(loc.full(loc.job_dir)):
        err.print(f"[red]error:[/] {loc.uri()} does not exist")
        raise typer.Exit(EXIT_USAGE)
    now = time.time()
    details: dict[str, list[Row]]
    if engine == "single":
        from pipeline.progress import AuditProgress
        from pipeline.single import audit_single

        with AuditProgress(err, enabled=not quiet) as progress:
            progress("auditing in one process")
            result = audit_single(loc, grace=grace_s, now=now, read_others=others)
        summary = result.summary
        details = result.tables
        if out:
            from pipeline.report import write_rows

            write_rows(result.tables, out)
    else:
        summary, details = _spark(loc, master, grace_s, now, others, out, limit, quiet, err)

    from pipeline.report import render, write_json

    render(console, summary, details, limit=limit)
    if json_out:
        write_json(summary, json_out)
    if out:
        write_json(summary, os.path.join(out, "summary.json"))
        console.print(f"details written to {out}")
    code = EXIT_AT_RISK if summary.at_risk else 0
    if delete_orphans:
        code = max(code, _delete(console, err, loc, summary, details["orphans"], grace_s,
                                 force=force, dry_run=dry_run, log=log, now=now))
    raise typer.Exit(code)


def _spark(
    loc: Location, master: str | None, grace: float, now: float, others: bool, out: str | None,
    limit: int, quiet: bool, err: Console,
) -> tuple[Summary, dict[str, list[Row]]]:
    from pipeline.progress import AuditProgress
    from pipeline.session import SparkUnavailable, spark_session

    try:
        spark = spark_session(master)
    except SparkUnavailable as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(EXIT_USAGE) from None
    from pyspark.sql import functions as F

    from pipeline.spark_audit import audit_spark

    if not quiet:
        err.print(f"Spark {spark.version}, master {spark.sparkContext.master}")
    with AuditProgress(err, spark, enabled=not quiet) as progress:
        result = audit_spark(spark, loc, grace=grace, now=now, read_others=others,
                             progress=progress)
        if out:
            progress(f"writing Parquet details to {out}")
            result.write_parquet(out)
        progress("collecting the report")
        f = result.frames
        details = {
            "dangling": [r.asDict() for r in f["dangling"].limit(max(limit, 1)).collect()],
            "corrupt": [r.asDict() for r in f["corrupt"].collect()],
            # Every orphan comes to the driver: deletion needs the full list.
            "orphans": [r.asDict() for r in f["orphans"].orderBy(F.desc("size")).collect()],
            "owners": [r.asDict() for r in
                       f["owners"].orderBy(F.desc("dead_bytes")).limit(limit).collect()],
            "checkpoints": [r.asDict() for r in f["checkpoints"].collect()],
        }
    return result.summary, details


def _delete(
    console: Console, err: Console, loc: Location, summary: Summary, orphans: list[Row],
    grace: float, *, force: bool, dry_run: bool, log: str | None, now: float,
) -> int:
    from pipeline.deletion import DeletionRefused, execute, plan_deletion

    try:
        plan = plan_deletion(loc, summary, orphans, grace=grace, force=force, now=now)
    except DeletionRefused as e:
        err.print(f"[red]deletion refused, nothing deleted:[/] {e}")
        return EXIT_REFUSED
    for path, why in plan.kept:
        console.print(f"keep   {path}: {why}")
    verb = "would delete" if dry_run else "delete"
    for c in plan.delete:
        console.print(f"{verb} {loc.uri(c.path)} ({c.size} bytes)")
    if dry_run:
        console.print(f"dry run: {len(plan.delete)} file(s), {plan.bytes} bytes would be "
                      "deleted; nothing was deleted")
        return 0
    if not plan.delete:
        console.print("no orphan to delete")
        return 0
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = log or f"ckpt-audit-deletions-{stamp}.jsonl"
    outcome = execute(loc, plan, path)
    console.print(f"deleted {len(outcome.deleted)} file(s), {len(outcome.failed)} failed; "
                  f"log: {outcome.log}")
    for p, why in outcome.failed:
        err.print(f"[red]failed[/] {p}: {why}")
    return EXIT_DELETE_FAILED if outcome.failed else 0
