"""``ckpt``: the project's command line.

    ckpt conformance --impl fastimpl            # the corpus against fastimpl, in process
    ckpt conformance --impl-cmd "my-store --conformance"   # over the JSON-lines protocol
    ckpt conformance --impl fastimpl --live 200 # plus 200 random sequences per mode
    ckpt audit /data/checkpoints/job-1          # the storage audit (pipeline/cli.py)
    ckpt stream --merging across --batches 20   # the streaming word count (pipeline/stream)

``conformance``: exit code 0 when every case passed (and live mode found nothing), 1
otherwise, 2 on bad usage. ``audit``: see ``pipeline/cli.py``. ``stream``: 0 when every
closed window's count equals the batch computation's and the store's invariants hold, 1
otherwise, 2 on bad usage.
"""

from __future__ import annotations

import fnmatch
import json
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from spec.errors import UsageError

if TYPE_CHECKING:
    from conformance.adapter import Implementation

app = typer.Typer(add_completion=False, help="ckpt-ownership command line.", no_args_is_help=True)
console = Console(highlight=False)


from pipeline.cli import audit  # noqa: E402

app.command()(audit)


@app.callback()
def _main() -> None:
    """ckpt-ownership: checkpoint file ownership, specified and checked."""


@app.command()
def conformance(
    impl: Annotated[
        str | None, typer.Option(help="In-process implementation: fastimpl or refimpl.")
    ] = None,
    impl_cmd: Annotated[
        str | None,
        typer.Option(help="A command speaking the JSON-lines protocol (CONFORMANCE.md)."),
    ] = None,
    cases: Annotated[str, typer.Option(help="Only cases whose name matches this glob.")] = "*",
    corpus: Annotated[Path | None, typer.Option(help="Another corpus folder.")] = None,
    live: Annotated[
        int, typer.Option(help="Random sequences per merging mode in live mode (0: off).")
    ] = 0,
    out: Annotated[
        Path, typer.Option(help="Where live mode writes the minimal failing case.")
    ] = Path("conformance-found"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="A line per case.")] = False,
) -> None:
    """Run the conformance corpus (and optionally live mode) against an implementation."""
    from conformance.adapter import Fastimpl, Model
    from conformance.case import CORPUS, CaseError, case_name, corpus_files, load
    from conformance.process import ProcessImplementation
    from conformance.runner import CaseResult, run_case

    if (impl is None) == (impl_cmd is None):
        console.print("[red]give exactly one of --impl and --impl-cmd[/red]")
        raise typer.Exit(2)
    candidate: Implementation
    process: ProcessImplementation | None = None
    if impl_cmd is not None:
        candidate = process = ProcessImplementation(impl_cmd)
    elif impl == "fastimpl":
        candidate = Fastimpl()
    elif impl == "refimpl":
        candidate = Model()
    else:
        console.print(f"[red]unknown --impl {impl!r}: fastimpl or refimpl[/red]")
        raise typer.Exit(2)
    paths = [p for p in corpus_files(corpus or CORPUS) if fnmatch.fnmatch(case_name(p), cases)]
    if not paths:
        console.print(f"[red]no case matches {cases!r} in {corpus or CORPUS}[/red]")
        raise typer.Exit(2)
    results: list[CaseResult] = []
    t0 = time.perf_counter()
    try:
        with console.status(f"running {len(paths)} cases against {candidate.name}") as status:
            for n, path in enumerate(paths, 1):
                try:
                    case = load(path)
                except CaseError as err:
                    results.append(CaseResult(case_name(path), False, 0, str(err), 0.0))
                    continue
                r = run_case(case, candidate)
                results.append(r)
                status.update(
                    f"{n}/{len(paths)} cases, {sum(not x.passed for x in results)} failed"
                )
                if verbose:
                    mark = "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
                    console.print(f"{mark} {r.case} ({r.steps_run} steps, {r.seconds:.2f}s)")
        failed = [r for r in results if not r.passed]
        table = Table(title=f"conformance of {candidate.name}")
        for col in ("cases", "passed", "failed", "steps", "seconds"):
            table.add_column(col, justify="right")
        table.add_row(
            str(len(results)),
            str(len(results) - len(failed)),
            str(len(failed)),
            str(sum(r.steps_run for r in results)),
            f"{time.perf_counter() - t0:.1f}",
        )
        console.print(table)
        for r in failed[:20]:
            console.print(f"[red]FAIL[/red] {r.case}")
        if failed and failed[0].mismatch:
            console.print("first mismatch:", style="bold")
            console.print(failed[0].mismatch, markup=False, soft_wrap=True)
        if len(failed) > 20:
            console.print(f"... and {len(failed) - 20} more")
        found = _live(candidate, live, out) if live and not failed else []
    finally:
        if process is not None:
            process.close()
    raise typer.Exit(1 if failed or found else 0)


def _live(candidate: Implementation, examples: int, out: Path) -> list[str]:
    from conformance.live import live
    from spec.config import MergingMode

    found = []
    for mode in MergingMode:
        with console.status(f"live mode: {examples} random sequences in {mode.name}"):
            r = live(candidate, mode, examples, out)
        if r.mismatch is None:
            console.print(f"live {mode.name}: {examples} sequences, no mismatch")
        else:
            console.print(
                f"[red]live {mode.name}: mismatch[/red], minimal case written to {r.case}"
            )
            console.print(r.mismatch, markup=False, soft_wrap=True)
            found.append(str(r.case))
    return found


_MERGING = {"none": "NONE", "within": "WITHIN_CHECKPOINT", "across": "ACROSS_CHECKPOINT"}


def _pair(text: str, flag: str, form: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    if not sep or not a.strip().isdigit() or not b.strip().isdigit():
        raise UsageError(f"{flag} {text!r}: expected {form} (two whole numbers)")
    return int(a), int(b)


@app.command()
def stream(
    merging: Annotated[str, typer.Option(help="File merging: none, within or across.")] = "across",
    num_retained: Annotated[int, typer.Option(help="execution.checkpointing.num-retained.")] = 1,
    max_file_size: Annotated[
        str, typer.Option(help="execution.checkpointing.file-merging.max-file-size.")
    ] = "32mb",
    max_space_amplification: Annotated[
        float, typer.Option(help="execution.checkpointing.file-merging.max-space-amplification.")
    ] = 2.0,
    memory_threshold: Annotated[
        str,
        typer.Option(
            help="state.storage.fs.memory-threshold: private state smaller than this is kept"
            " in the _metadata, not in a file (R107; Flink's default; 0: off)."
        ),
    ] = "20kb",
    flink_option: Annotated[
        list[str] | None,
        typer.Option("-D", "--flink-option", help="Any other supported Flink key: KEY=VALUE."),
    ] = None,
    parallelism: Annotated[int, typer.Option(help="Subtasks of the keyed stage.")] = 4,
    window_ms: Annotated[int, typer.Option(help="Tumbling window size, in ms.")] = 5000,
    watermark_delay_ms: Annotated[int, typer.Option(help="Watermark delay, in ms.")] = 0,
    rows_per_batch: Annotated[int, typer.Option(help="Rows per micro-batch.")] = 1000,
    batches: Annotated[int, typer.Option(help="Micro-batches (= checkpoints) to run.")] = 20,
    vocabulary: Annotated[int, typer.Option(help="Words in the Zipf vocabulary.")] = 1000,
    base: Annotated[
        str | None, typer.Option(help="Checkpoint storage (default: a new run directory).")
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Where work/ and out/ go (default: ckpt-stream/run-<UTC time>)."),
    ] = None,
    storage_option: Annotated[
        list[str] | None,
        typer.Option("--storage-option", "-o", help="fsspec option of --base: key=value."),
    ] = None,
    endpoint_url: Annotated[
        str | None, typer.Option(help="S3 endpoint of --base (MinIO, moto, ...).")
    ] = None,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
    write_buffer_size: Annotated[
        int, typer.Option(help="RocksDB memtable size, in bytes (small: more SSTs).")
    ] = 64 * 1024,
    check: Annotated[
        bool, typer.Option(help="Compare with the batch computation at the end.")
    ] = True,
    speculation: Annotated[
        bool,
        typer.Option(
            help="Spark's speculative execution (a standalone cluster: Spark never speculates"
            " on local masters)."
        ),
    ] = False,
    kill_worker_prob: Annotated[
        float,
        typer.Option(
            help="Chance that a task SIGKILLs its Python worker at each point of its"
            " snapshot (needs a master that retries: local[N,F], F >= 2)."
        ),
    ] = 0.0,
    failure_seed: Annotated[int, typer.Option(help="Seed of the injected failures.")] = 0,
    rescale_at: Annotated[
        str | None,
        typer.Option(
            help="N:P: stop after batch N and restart with parallelism P, restoring the"
            " latest completed checkpoint with rescale (--restore-mode)."
        ),
    ] = None,
    restore_mode: Annotated[
        str | None,
        typer.Option(help="claim or no_claim (execution.state-recovery.claim-mode)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the run in --run-dir whose driver died (same options): the store"
            " recovers from the persisted _metadata, Spark from its offsets."
        ),
    ] = False,
    die_at: Annotated[
        str | None,
        typer.Option(hidden=True, help="B:POINT: the driver SIGKILLs itself (sunk, completed)."),
    ] = None,
    audit: Annotated[
        bool, typer.Option(help="Run the storage audit on the checkpoint base at the end.")
    ] = True,
    l0_compaction_trigger: Annotated[
        int, typer.Option(help="RocksDB level-0 compaction trigger (its default: 4).")
    ] = 4,
    state_backend: Annotated[
        str,
        typer.Option(
            help="rocksdb (a local RocksDB, its SSTs uploaded at each checkpoint) or working"
            " (a SlateDB on the checkpoint storage, its files referred to in place)."
        ),
    ] = "rocksdb",
    slatedb_gc_min_age: Annotated[
        float,
        typer.Option(help="--state-backend working: minimum age of what SlateDB's GC deletes, s."),
    ] = 10.0,
    stall_at: Annotated[
        list[str] | None,
        typer.Option(
            hidden=True,
            help="B:S:POINT: the first attempt of subtask S's task in batch B stalls at POINT"
            " (a straggler, for --speculation).",
        ),
    ] = None,
    stall_seconds: Annotated[
        float, typer.Option(hidden=True, help="How long a --stall-at task stalls.")
    ] = 4.0,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the run's figures to this file (JSON)."),
    ] = None,
    trace: Annotated[
        bool,
        typer.Option(
            help="Write the command trace to work/trace.ndjson (python -m model_tests.replay"
            " reads it); it stops where the model has no command for what the run does."
        ),
    ] = False,
) -> None:
    """Run the streaming word count on Spark with RocksDB state checkpointed into the store
    (or, with --state-backend working, SlateDB state on the checkpoint storage itself)."""
    from pipeline.stream.job import DRIVER_KILL_POINTS, StreamSettings, retries_tasks, run_stream
    from pipeline.stream.kills import KILL_POINTS, Failures
    from pipeline.stream.source import RateSource
    from pipeline.stream.summary import batch_line, print_summary, run_figures
    from pipeline.stream.windows import Windowing
    from spec.config import Config, MergingMode

    if merging not in _MERGING:
        console.print(f"[red]--merging must be none, within or across, not {merging!r}[/red]")
        raise typer.Exit(2)
    mode = MergingMode[_MERGING[merging]]
    flink: dict[str, object] = {
        "execution.checkpointing.file-merging.enabled": mode is not MergingMode.NONE,
        "execution.checkpointing.file-merging.across-checkpoint-boundary": (
            mode is MergingMode.ACROSS_CHECKPOINT
        ),
        "execution.checkpointing.num-retained": num_retained,
        "execution.checkpointing.file-merging.max-file-size": max_file_size,
        "execution.checkpointing.file-merging.max-space-amplification": max_space_amplification,
        "state.storage.fs.memory-threshold": memory_threshold,
    }
    if restore_mode is not None:
        if restore_mode.lower() not in ("claim", "no_claim"):
            console.print(
                f"[red]--restore-mode must be claim or no_claim, not {restore_mode!r}[/red]"
            )
            raise typer.Exit(2)
        flink["execution.state-recovery.claim-mode"] = restore_mode.upper()
    for item in flink_option or []:
        key, sep, value = item.partition("=")
        if not sep:
            console.print(f"[red]-D {item!r}: expected KEY=VALUE[/red]")
            raise typer.Exit(2)
        flink[key.strip()] = value
    options: dict[str, Any] = {}
    for item in storage_option or []:
        key, sep, value = item.partition("=")
        if not sep:
            console.print(f"[red]-o {escape(item)!r}: expected key=value[/red]")
            raise typer.Exit(2)
        options[key] = value
    if endpoint_url:
        options.setdefault("client_kwargs", {})["endpoint_url"] = endpoint_url
    # An object store shows a file only once it is closed: ACROSS is refused there (R16).
    local = base is None or urllib.parse.urlsplit(base).scheme in ("", "file")
    try:
        config = Config.from_flink(flink, open_files_readable=local)
        # Absolute: executors of a cluster run in their worker's directory, not this one.
        settings_dir = (
            run_dir or Path("ckpt-stream") / time.strftime("run-%Y%m%dT%H%M%SZ", time.gmtime())
        ).absolute()
        if base is not None and urllib.parse.urlsplit(base).scheme == "":
            base = str(Path(base).absolute())
        if resume:
            if run_dir is None or not (run_dir / "work" / "driver.json").is_file():
                raise UsageError("--resume needs the --run-dir of a run that started")
        elif settings_dir.exists() and any(settings_dir.iterdir()):
            raise UsageError(f"{settings_dir} is not empty: give a new --run-dir")
        rescale = None if rescale_at is None else _pair(rescale_at, "--rescale-at", "N:P")
        if rescale is not None and not (0 <= rescale[0] < batches - 1 and 1 <= rescale[1] <= 128):
            raise UsageError(
                f"--rescale-at {rescale_at}: N must be in 0..{batches - 2} (a batch must follow)"
                " and P in 1..128"
            )
        die = None
        if die_at is not None:
            b, _, point = die_at.partition(":")
            if not b.isdigit() or point not in DRIVER_KILL_POINTS:
                raise UsageError(f"--die-at {die_at!r}: expected B:{'|'.join(DRIVER_KILL_POINTS)}")
            die = (int(b), point)
        stalls = []
        for item in stall_at or []:
            b, s_, point = [*item.split(":", 2), "", ""][:3]
            if not b.isdigit() or not s_.isdigit() or point not in KILL_POINTS:
                raise UsageError(f"--stall-at {item!r}: expected B:S:{'|'.join(KILL_POINTS)}")
            stalls.append((int(b), int(s_), point))
        settings = StreamSettings(
            base=base or str(settings_dir / "checkpoints"),
            work_dir=str(settings_dir / "work"),
            out=str(settings_dir / "out"),
            config=config,
            storage_options=options,
            parallelism=parallelism,
            source=RateSource(rows_per_batch, vocabulary=vocabulary),
            windowing=Windowing(window_ms, watermark_delay_ms),
            batches=batches,
            master=master,
            write_buffer_size=write_buffer_size,
            failures=Failures(
                kill_worker_prob, failure_seed, stall_at=tuple(stalls), stall_s=stall_seconds
            ),
            speculation=speculation,
            rescale_at=rescale,
            die_at=die,
            l0_compaction_trigger=l0_compaction_trigger,
            state_backend=state_backend,
            gc_min_age_s=slatedb_gc_min_age,
            trace=trace,
        )
        if state_backend not in ("rocksdb", "working"):
            raise UsageError(f"--state-backend must be rocksdb or working, not {state_backend!r}")
        if slatedb_gc_min_age < 0:
            raise UsageError(f"--slatedb-gc-min-age must be >= 0, got {slatedb_gc_min_age}")
        if state_backend == "working" and speculation:
            raise UsageError(
                "--state-backend working runs without --speculation: two attempts of a"
                " subtask would open its one database directory"
            )
        if state_backend == "working" and urllib.parse.urlsplit(settings.base).scheme not in (
            "", "file", "s3", "s3a"
        ):
            raise UsageError(
                f"--state-backend working keeps its databases on the checkpoint storage, which"
                f" must be a local directory or S3; {settings.base!r} is neither"
            )
        if l0_compaction_trigger < 1:
            raise UsageError("--l0-compaction-trigger must be >= 1")
        if not 0 <= kill_worker_prob <= 1:
            raise UsageError(f"--kill-worker-prob must be in [0, 1], got {kill_worker_prob}")
        if kill_worker_prob > 0 and not retries_tasks(master):
            raise UsageError(
                f"--kill-worker-prob needs a master that retries a failed task; {master}"
                " fails the job at the first (use local[N,F] with F >= 2, or local-cluster)"
            )
    except (ValueError, TypeError) as err:
        console.print(f"[red]{escape(str(err))}[/red]")
        raise typer.Exit(2) from None
    console.print(f"run directory {settings_dir}, checkpoints in {settings.base}")
    run = run_stream(
        settings,
        on_batch=lambda r: console.print(batch_line(r), markup=False, soft_wrap=True),
        on_event=lambda m: console.print(m, markup=False, soft_wrap=True),
        check=check,
        audit=audit,
        resume=resume,
    )
    ok = print_summary(console, run)
    if json_out is not None:
        json_out.write_text(json.dumps(run_figures(run), indent=1, sort_keys=True) + "\n")
    raise typer.Exit(0 if ok else 1)


if __name__ == "__main__":
    app()
