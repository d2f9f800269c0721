"""``ckpt audit <base-uri>``: the storage audit from the command line (issue 6).

    ckpt audit /data/checkpoints/job-1                 # Spark local[*], report only
    ckpt audit s3://bucket/ckpts/job-1 --endpoint-url http://127.0.0.1:9000
    ckpt audit BASE --out audit/ --json audit/summary.json   # Parquet details + summary
    ckpt audit BASE --delete-orphans --dry-run          # exactly what would be deleted
    ckpt audit BASE --delete-orphans --grace 48h        # log, then delete
    ckpt audit BASE --delete-orphans --grace 0s --allow-short-grace   # live writer fenced

Exit codes: 0 the base is readable and loses no data (orphans are reported, not failed);
1 a dangling reference or an unreadable ``_metadata`` (a retained checkpoint cannot be
restored: page someone); 2 bad usage or the audit could not run; 3 a guard refused the
deletion, or the path is not a checkpoint base or lies inside one (nothing deleted), or
a guard refused some deletes when they came (a directory changed since the plan; another
deletion run holds the base); 4 some deletes failed (see the log).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from pipeline.deletion_run import default_log, delete_planned
from pipeline.exits import EXIT_AT_RISK, EXIT_REFUSED, EXIT_USAGE
from pipeline.location import Location, LocationError
from pipeline.names import shown
from pipeline.result import Row, Summary
from pipeline.scan import CHECKPOINT_DIR

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
    allow_short_grace: Annotated[
        bool,
        typer.Option(
            "--allow-short-grace",
            help="Allow a grace period under 1 h. Files younger than 60 s (the hard floor) "
            "or modified since the live writer's oldest pending checkpoint are still never "
            "deleted.",
        ),
    ] = False,
    no_live_writer: Annotated[
        bool,
        typer.Option(
            "--no-live-writer",
            help="With a grace under 1 h on a base whose writer publishes no state: you "
            "declare that no writer is running (only age would protect its files).",
        ),
    ] = False,
    max_deletes_per_second: Annotated[
        float, typer.Option(help="Delete rate limit (0: no limit).")
    ] = 100.0,
    log: Annotated[
        str | None,
        typer.Option(help="Append-only, write-ahead deletion log (JSON lines, exact names, "
                     "a run id on every record): the plan synced before the first delete, "
                     "each delete's intent synced before it and its result after. "
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
    format_: Annotated[
        str,
        typer.Option("--format", help="auto (recognise it and say what), ckpt (ours), flink "
                     "(execution.checkpointing.dir or one job's folder) or spark (a query's "
                     "checkpointLocation)."),
    ] = "auto",
    path_map: Annotated[
        list[str] | None,
        typer.Option("--path-map", help="OLD=NEW: read a path the engine wrote under OLD as "
                     "under NEW (a checkpoint copied or moved; repeatable)."),
    ] = None,
    savepoints: Annotated[
        list[str] | None,
        typer.Option("--savepoints", help="Flink: a savepoint directory whose references "
                     "count too (repeatable)."),
    ] = None,
    retain: Annotated[
        int,
        typer.Option(help="Spark: spark.sql.streaming.minBatchesToRetain of the query (the "
                     "files do not record it; Spark's default 100)."),
    ] = 100,
    limit: Annotated[int, typer.Option(help="Rows per table on the terminal.")] = 20,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """Audit a checkpoint base: orphans, dangling references, space amplification.

    With --delete-orphans every unreferenced file gets one outcome: delete, keep-active
    (referenced now, open in the live writer's pool, a database's working file), defer
    (younger than the grace period or the 60 s hard floor, or newer than the live
    writer's fence) or skip-unknown (not a regular file, a link, outside the base).
    No flag allows deleting in a path that is not a checkpoint base or lies inside one
    (BASE/shared, BASE/chk-34), nor with an unreadable, empty or shrunken reference set.
    Names are printed escaped (\\xNN for control characters, spaces and bytes that are
    not UTF-8; \\\\ for a backslash); the log holds them exactly.
    """
    # Off a terminal (CI logs, pipes) rich would wrap every table at 80 columns.
    console = Console(highlight=False, width=None if os.isatty(1) else 160)
    err = Console(stderr=True, highlight=False)
    grace_s = parse_duration(grace)
    if engine not in ("spark", "single"):
        raise typer.BadParameter("--engine is spark or single")
    try:
        loc = Location.parse(base, _options(storage_option or [], endpoint_url))
    except LocationError as e:
        err.print(f"[red]error:[/] {escape(shown(str(e)))}")
        raise typer.Exit(EXIT_USAGE) from None
    if delete_orphans and not dry_run and log is None:
        log = default_log()  # checked with the others, before anything is read
    _check_outputs(err, loc, [("--log", log if delete_orphans else None),
                              ("--json", json_out), ("--out", out)])
    fs = loc.fs()
    if not fs.exists(loc.full(loc.job_dir)):
        err.print(f"[red]error:[/] {escape(shown(loc.uri()))} does not exist")
        raise typer.Exit(EXIT_USAGE)
    from pipeline.deletion import DeletionRefused, NotABase, check_base
    from pipeline.fence import StateError, read_state

    try:
        check_base(loc, layout=False)  # inside a base: refused even for a report
    except NotABase as e:
        err.print(f"[red]refused:[/] {escape(str(e))}")
        raise typer.Exit(EXIT_REFUSED) from None
    fmt = _format(err, loc, format_, quiet)
    if fmt != "ckpt":
        from pipeline.foreign_cli import ForeignRun, audit_foreign

        run = ForeignRun(
            fmt=fmt, engine=engine, master=master, grace=grace_s, path_map=path_map or [],
            savepoints=savepoints or [], retain=retain, delete=delete_orphans,
            dry_run=dry_run, log=log, json_out=json_out, out=out, limit=limit, quiet=quiet,
            allow_short_grace=allow_short_grace, no_live_writer=no_live_writer,
            rate=max_deletes_per_second)
        raise typer.Exit(audit_foreign(console, err, loc, run))
    if path_map or savepoints:
        raise typer.BadParameter("--path-map and --savepoints read Flink and Spark formats only")
    state_error: str | None = None
    state = None
    try:
        state = read_state(loc)  # before listing: its fence covers what is written after
    except StateError as e:
        state_error = str(e)
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

            _write_outputs(err, f"--out {out}", lambda: write_rows(result.tables, out))
    else:
        summary, details = _spark(loc, master, grace_s, now, others, out, limit, quiet, err)

    from pipeline.report import render, write_json

    if summary.read_nothing:
        _no_checkpoint(err, loc, summary, json_out, delete_orphans)
    render(console, summary, details, limit=limit)
    if json_out:
        _write_outputs(err, f"--json {json_out}", lambda: write_json(summary, json_out))
    if out:
        _write_outputs(err, f"--out {out}",
                       lambda: write_json(summary, os.path.join(out, "summary.json")))
        console.print(f"details written to {shown(out)}", markup=False)
    code = EXIT_AT_RISK if summary.at_risk else 0
    unexamined = _unexamined_checkpoints(loc, details.get("unreadable", ()))
    if unexamined:
        # A checkpoint directory that cannot be listed hides a _metadata that may be
        # unrestorable: "nothing lost" cannot be said, whatever the other tables show.
        err.print(f"[red]not examined, restorability unknown:[/] {escape(unexamined[0])}"
                  + (f" and {len(unexamined) - 1} more" if len(unexamined) > 1 else ""),
                  markup=True)
        code = max(code, EXIT_AT_RISK)
    if delete_orphans:
        if state_error is not None:
            err.print(f"[red]deletion refused, nothing deleted:[/] {escape(state_error)}")
            raise typer.Exit(max(code, EXIT_REFUSED))
        try:
            code = max(code, _delete(
                console, err, loc, summary, details["orphans"], grace_s,
                allow_short_grace=allow_short_grace, no_live_writer=no_live_writer,
                dry_run=dry_run, log=log, now=now, state=state, rate=max_deletes_per_second,
                dangling=details.get("dangling", ())))
        except DeletionRefused as e:
            err.print(f"[red]deletion refused, nothing deleted:[/] {escape(str(e))}")
            code = max(code, EXIT_REFUSED)
    raise typer.Exit(code)


def _no_checkpoint(
    err: Console, loc: Location, summary: Summary, json_out: str | None, delete: bool
) -> None:
    """No checkpoint was read (``Summary.read_nothing``): nothing was checked, so no
    table is shown (each file would be called an orphan) and no verdict; what was found
    is said instead, a Flink or Spark checkpoint directory named as one. Exit 2, or 3
    when a deletion was asked (refused: an empty reference set never means that nothing
    is referenced)."""
    from pipeline.formats import nothing_read, recognise

    found = recognise(loc)
    if found is None and summary.corrupt_metadata:
        return  # a checkpoint of ours that does not read: the report pages (exit 1)
    said = found or nothing_read(loc, summary.files, summary.corrupt_metadata)
    err.print(f"[red]not audited:[/] {escape(said)}", soft_wrap=True)
    if json_out:
        from pipeline.report import write_json

        _write_outputs(err, f"--json {json_out}",
                       lambda: write_json(summary, json_out, {"not_audited": said}))
    if not delete:
        raise typer.Exit(EXIT_USAGE)
    from pipeline.deletion import NotABase, check_base

    try:
        check_base(loc)
        why = ("no checkpoint was read: the reference set is empty, and that never means "
               "nothing is referenced")
    except NotABase as e:
        why = str(e)
    err.print(f"[red]deletion refused, nothing deleted:[/] {escape(why)}", soft_wrap=True)
    raise typer.Exit(EXIT_REFUSED)


def _format(err: Console, loc: Location, given: str, quiet: bool) -> str:
    """The format to read: the one given, or with ``auto`` the one recognised (said on
    stderr); ``ckpt`` when neither Flink's nor Spark's is (our reader then says what it
    found if it reads nothing)."""
    from pipeline.foreign import FORMATS
    from pipeline.formats import detect

    if given not in FORMATS:
        raise typer.BadParameter(f"--format is one of {', '.join(FORMATS)}, not {given!r}")
    if given != "auto":
        return given
    found = detect(loc)
    if found is None:
        return "ckpt"
    if not quiet:
        err.print(f"recognised: {escape(found[1])}", soft_wrap=True)
    return found[0]


def _check_outputs(
    err: Console, loc: Location, outputs: list[tuple[str, str | None]]
) -> None:
    """Refuse (exit 2, one line) an output inside a checkpoint tree or one that cannot be
    written (``pipeline.outputs``), before anything is read."""
    from pipeline.outputs import OutputError, check_outputs

    try:
        check_outputs(loc, outputs)
    except OutputError as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None


def _write_outputs(err: Console, what: str, write: Any) -> None:
    """Run ``write``; an output that fails after the checks (a full disk, a folder removed
    meanwhile) is a usage error naming it, never a traceback."""
    try:
        write()
    except OSError as e:
        err.print(f"[red]error:[/] {escape(shown(what, spaces=True))} cannot be written: "
                  f"{escape(str(e))}", soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None


def _unexamined_checkpoints(loc: Location, unreadable: Iterable[Row]) -> list[str]:
    """The job base or its ``chk-*`` directories among the paths that could not be
    listed (``unreadable`` rows: path, problem)."""
    out = []
    for row in unreadable:
        parts = str(row["path"]).rstrip("/").split("/")
        if parts == [loc.job_dir] or (
            len(parts) == 2 and parts[0] == loc.job_dir and CHECKPOINT_DIR.match(parts[1])
        ):
            out.append(shown(str(row["path"])))
    return out


# ``--help`` wraps to the terminal itself: one line per paragraph.
audit.__doc__ = "\n\n".join(
    " ".join(line.strip() for line in para.splitlines())
    for para in (audit.__doc__ or "").strip().split("\n\n")
)


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
            # The summary says these are "listed below": on Spark too. All of them: an
            # unlisted checkpoint directory among them changes the exit code.
            "unreadable": [r.asDict() for r in f["unreadable"].orderBy("path").collect()],
            # Every orphan comes to the driver: deletion needs the full list.
            "orphans": [r.asDict() for r in f["orphans"].orderBy(F.desc("size")).collect()],
            "owners": [r.asDict() for r in
                       f["owners"].orderBy(F.desc("dead_bytes")).limit(limit).collect()],
            "checkpoints": [r.asDict() for r in f["checkpoints"].collect()],
        }
    return result.summary, details


def _delete(
    console: Console, err: Console, loc: Location, summary: Summary, orphans: list[Row],
    grace: float, *, allow_short_grace: bool, no_live_writer: bool, dry_run: bool,
    log: str | None, now: float, state: Any, rate: float, dangling: Iterable[Row],
) -> int:
    from pipeline.deletion import plan_deletion

    def make_plan() -> Any:
        return plan_deletion(loc, summary, orphans, grace=grace,
                             allow_short_grace=allow_short_grace,
                             no_live_writer=no_live_writer, now=now, state_before=state,
                             dangling=dangling)

    return delete_planned(console, err, loc, make_plan, dry_run=dry_run, log=log, rate=rate)
