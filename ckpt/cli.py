"""``ckpt``: the project's command line.

    ckpt conformance --impl fastimpl            # the corpus against fastimpl, in process
    ckpt conformance --impl-cmd "my-store --conformance"   # over the JSON-lines protocol
    ckpt conformance --impl fastimpl --live 200 # plus 200 random sequences per mode
    ckpt audit /data/checkpoints/job-1          # the storage audit (pipeline/cli.py)

``conformance``: exit code 0 when every case passed (and live mode found nothing), 1
otherwise, 2 on bad usage. ``audit``: see ``pipeline/cli.py``.
"""

from __future__ import annotations

import fnmatch
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

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


if __name__ == "__main__":
    app()
