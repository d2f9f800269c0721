"""The scripted job's output: a table per merging mode and a summary."""

from __future__ import annotations

import textwrap
from typing import TextIO

from examples.scripted_job.figures import DemoResult, ModeResult
from examples.scripted_job.rocks_like import KIB

BRIEF_LINE = (
    "BRIEF section 7, real Flink 2.3 (RocksDB incremental, word count, parallelism 4, "
    "1.1 MB state): state files created per checkpoint / space amplification: no merging "
    "13.2 / 1.0x, within 13.0 / 1.7x, across with 32 MB files 0.07 / 109x."
)


def _kib(n: int) -> str:
    return f"{n / KIB:,.0f}"


def _amp(x: float) -> str:
    return "-" if x == float("inf") else f"{x:.2f}x"


def say(out: TextIO, text: str) -> None:
    """Print prose wrapped to 100 columns."""
    print(textwrap.fill(text, width=100, break_on_hyphens=False), file=out)


def print_mode(r: ModeResult, out: TextIO, *, per_checkpoint: bool) -> None:
    print(f"\n== merging mode {r.mode.name}: {r.root}", file=out)
    if per_checkpoint:
        print(
            f"{'chk':>4} {'status':<19} {'+files':>6} {'-files':>6} {'+/-meta':>7} "
            f"{'files':>5} {'stored KiB':>10} {'live KiB':>8} {'amp':>6}  events",
            file=out,
        )
        for row in r.rows:
            print(
                f"{row.checkpoint:>4} {row.status:<19} {row.created:>6} {row.deleted:>6} "
                f"{f'{row.meta_created}/{row.meta_deleted}':>7} {row.files:>5} "
                f"{_kib(row.stored):>10} {_kib(row.live):>8} {_amp(row.amplification):>6}  "
                f"{'; '.join(row.notes)}".rstrip(),
                file=out,
            )
    if r.error is not None:
        print(f"FAILED: {r.error}", file=out)
        return
    n = max(r.completed, 1)
    say(
        out,
        f"{r.completed} checkpoints completed, {r.aborted} aborted. State files created: "
        f"{r.created} ({r.created / n:.2f} per completed checkpoint), deleted: {r.deleted} "
        f"({r.deleted / n:.2f}); _metadata created {r.meta_created}, deleted {r.meta_deleted}.",
    )
    say(
        out,
        f"At the end: {r.files_at_end} files ({r.metadata_at_end} _metadata), "
        f"{_kib(r.stored_at_end)} KiB of state files for {_kib(r.live_at_end)} KiB live: "
        f"space amplification {_amp(r.amplification)} (mean over the rows "
        f"{_amp(r.mean_amplification)}, peak {_amp(r.peak_amplification)}); "
        f"{r.empty_dirs_at_end} empty directories left on disk.",
    )
    say(
        out,
        f"Invariants I1-I5 checked on the real files after each of {r.steps} API calls, "
        f"I1-I6 once quiet: no violation. {r.seconds:.1f} s.",
    )


def print_summary(result: DemoResult, out: TextIO) -> None:
    print("\n== summary", file=out)
    print(
        f"{'mode':<18} {'done':>4} {'abort':>5} {'created/chk':>11} {'deleted/chk':>11} "
        f"{'files at end':>12} {'stored KiB':>10} {'live KiB':>8} {'amp':>6} {'mean':>6} "
        f"{'peak':>6} {'result':>6}",
        file=out,
    )
    for r in result.modes:
        n = max(r.completed, 1)
        print(
            f"{r.mode.name:<18} {r.completed:>4} {r.aborted:>5} {r.created / n:>11.2f} "
            f"{r.deleted / n:>11.2f} {r.files_at_end:>12} {_kib(r.stored_at_end):>10} "
            f"{_kib(r.live_at_end):>8} {_amp(r.amplification):>6} "
            f"{_amp(r.mean_amplification):>6} {_amp(r.peak_amplification):>6} "
            f"{'ok' if r.ok else 'FAILED':>6}",
            file=out,
        )
    for line in (
        "created/chk, deleted/chk: state files (not _metadata) per completed checkpoint.",
        "amp: space amplification = bytes of every state file on storage (every file but "
        "_metadata) / bytes of the distinct segments and files that the retained checkpoints "
        "(and a restore in progress) refer to, at the end; mean and peak over the rows. "
        "1.00x: no dead bytes.",
        "max_space_amplification is 2.0 (Flink's default) per file: a file above it is "
        "closed and no longer reused and goes once the next checkpoint has uploaded its "
        "live segments again, so the total can stay above 2.0 for a checkpoint.",
        BRIEF_LINE,
    ):
        say(out, line)
    verdict = (
        "Every invariant held on the real files."
        if result.ok
        else "FAILED: an invariant was violated or the store refused the script (see above)."
    )
    say(out, f"{verdict} Total {result.seconds:.1f} s.")
