"""The text of ``docs/flink-divergences.md``."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.flink.groups import Group, QuietGroup

METHOD = """\
How it runs (`conformance/flink/`): one py4j gateway (pyflink's, Java 17) per run; per case
a fresh local directory, and one `FileMergingSnapshotManager` per TM attempt built with
`FileMergingSnapshotManagerBuilder(JobID, ResourceID, FileMergingType)`, `setMaxFileSize`,
`setMaxSpaceAmplification`, `setFilePoolType` and no I/O executor (deletes run inside the
call), then `initFileSystem(local, <job>, <job>/shared, <job>/taskowned, 4096)` and
`registerSubtaskForSharedStates` for its subtasks. The translation of each command is in
`conformance/flink/session.py`'s docstring. Flink's manager is the task-manager side only,
so the reference model plays the coordinator (the *stand-in*): it decides refusals, which
notification reaches which TM, and what the JobManager deletes in a handed-over directory
(done on Flink's disk by the adapter). The state backend's reuse choice (the last completed
checkpoint's handle, if `couldReusePreviousStateHandle`) is emulated as RocksDB's
incremental strategy makes it.

What Flink is judged on (the profile, `conformance/flink/profile.py`): after every step, the
files in the job's `shared/` and `taskowned/` directories with their sizes, and which of them
were deleted. Flink's random file names are paired with the model's (`f000001`...) by
directory and order of creation. Every other field of an observation (owners, claims,
ref counts, live segments, pools, registry, retained checkpoints) is the stand-in's and is
not evidence about Flink: private fields are never read for a verdict. A case passes only
when every step of it ran on Flink and matched; a case with a command the adapter cannot
translate is out of reach and is never run."""

NOT_JUDGED = """\
- **Managed directories.** Flink creates a subtask's and a TM's directory when the manager
  is set up, not at the first write (R40), and the adapter does not compare directories:
  an empty directory is not a file, and comparing them would mark every case at its first
  step.
- **Refusals.** The stand-in decides them; a refusal says nothing about Flink.
- **The JobManager side** (`SharedStateRegistry`, `CheckpointsCleaner`): not driven.
  `SharedStateRegistryImpl` can be built and called one call at a time
  (`registerReference`, `checkpointCompleted`, `unregisterUnusedState`), but what it is fed
  (which directory and segment handles a task's snapshot carries, wrapped in
  `FileMergingOperatorStreamStateHandle` or a keyed backend's handle) is the state
  backends' choice, which the adapter would have to invent; `CheckpointsCleaner` works on
  `CompletedCheckpoint`s built from a job's `OperatorState`s. The stand-in plays that side,
  so the profile stays on the task-manager rules.
- **Savepoints, merging mode NONE, rescaling restores, object stores, fault injection and
  working state**: out of reach (the counts above say how many cases each leaves out)."""


_RANK = {"Flink bug": 0, "unclassified": 1, "deliberate difference (We)": 2}


def _section(i: int, gs: list[Group], root: Path) -> list[str]:
    v = gs[0].verdict
    out = ["", f"### {i}. {v.title}", ""]
    out += [f"**Verdict: {v.kind}.** Rules: {v.rules or '-'}.", "", v.text, ""]
    out += ["Where it shows (merging mode, command at the diverging step, what differs):", ""]
    for g in gs:
        names = ", ".join(f"`{c}`" for c in g.cases[:4])
        more = f" and {len(g.cases) - 4} more" if len(g.cases) > 4 else ""
        where = f"{len(g.cases)} cases: {names}{more}" if g.cases else "live mode only"
        runs, leak, loss = g.quiet
        once = f"; once quiet, {leak} of {runs} leak, {loss} dangle" if runs else ""
        out.append(f"- `{g.signature[0]}` / `{g.signature[1]}` / `{g.signature[2]}`: {where}{once}")
    shown: dict[str, Group] = {}
    for g in gs:
        mode = g.signature[0]
        if mode not in shown or len(g.minimal) < len(shown[mode].minimal):
            shown[mode] = g
    for mode, g in sorted(shown.items()):
        cfg = g.config
        out += [
            "",
            f"Minimal sequence, `{mode}` ({len(g.minimal)} commands; max_file_size="
            f"{cfg.max_file_size}, max_space_amplification={cfg.max_space_amplification}, "
            f"num_retained={cfg.num_retained}; job "
            + ", ".join(f"{vx.name} x{vx.parallelism}" for vx in g.job.vertices)
            + f" on {g.job.num_tms} TMs):",
            "",
            _code(g.minimal),
        ]
        if g.outcome.divergence is not None:
            out += ["", "At the last step:", "", "```", g.outcome.divergence.detail, "```"]
    for g in gs:
        if g.repro:
            rel = os.path.relpath(g.repro, root)
            out += ["", f"Reproduction (`{g.signature[0]}`, no Java needed): [`{rel}`]({rel})"]
    return out


def _quiet_section(counts: dict[str, int], qgs: list[QuietGroup], root: Path) -> list[str]:
    out = [
        "",
        "## Once quiet: leaks and losses left for good",
        "",
        "Step by step, a divergence can be a delay. So every case in reach is also run to "
        "its end and quiesced on Flink (lost attempts stopped, every notification delivered, "
        "pending checkpoints aborted, num_retained + 1 fault-free checkpoints completed), and "
        "Flink's disk judged against the handles Flink returned for the retained checkpoints: "
        "a file no retained checkpoint uses is a *leak* (I6), a handle whose bytes are not on "
        "disk is *dangling* (I1: data lost). This judges Flink without pairing names. An "
        "ACROSS file still open in Flink's pool counts as a leak here when only dead bytes "
        "are left in it (the quiescing writes shared state only, so a TM's exclusive pool "
        "file keeps the dead bytes of before): that is verdict *An ACROSS pool keeps dead "
        "bytes while the file is open*.",
        "",
        f"Quiet once quiesced: {counts.get('quiet_clean', 0)} of "
        f"{counts.get('quiet_ran', 0)} cases in reach.",
        "",
        "| mode | what | likely cause (from the shortest sequence) | verdict | cases |",
        "|---|---|---|---|---|",
    ]
    for g in qgs:
        out.append(
            f"| `{g.mode}` | {g.kind} | {g.cls} | {g.verdict.kind}: {g.verdict.title} | "
            f"{len(g.cases)} |"
        )
    for g in qgs:
        cfg = g.config
        out += [
            "",
            f"### Once quiet, `{g.mode}`: {g.kind} ({g.cls})",
            "",
            f"**Verdict: {g.verdict.kind}: {g.verdict.title}.** Rules: {g.verdict.rules}.",
        ]
        if g.cls in ("failover", "cancel", "open pool"):
            out += ["", "(The divergence of that name above explains it.)"]
        else:
            out += ["", g.verdict.text]
        names = ", ".join(f"`{c}`" for c in g.cases[:6])
        more = f" and {len(g.cases) - 6} more" if len(g.cases) > 6 else ""
        out += [
            "",
            f"Cases ({len(g.cases)}): {names}{more}.",
            "",
            f"Shortest sequence found ({len(g.minimal)} commands, then the quiescing; "
            f"max_file_size={cfg.max_file_size}, num_retained={cfg.num_retained}; job "
            + ", ".join(f"{vx.name} x{vx.parallelism}" for vx in g.job.vertices)
            + f" on {g.job.num_tms} TMs):",
            "",
            _code(g.minimal),
            "",
            "Left on Flink's disk once quiet: "
            + (
                ", ".join(
                    f"`{os.path.basename(os.path.dirname(p))}/{os.path.basename(p)}`"
                    for p in (g.quiet.leaked or g.quiet.dangling)[:6]
                )
            ),
        ]
        if g.repro:
            rel = os.path.relpath(g.repro, root)
            out += ["", f"Reproduction (no Java needed): [`{rel}`]({rel})"]
    return out


def _code(commands: object) -> str:
    lines = [f"    {c!r}," for c in commands]  # type: ignore[attr-defined]
    return "```python\n[\n" + "\n".join(lines) + "\n]\n```"


def render(
    counts: dict[str, int],
    why_out: collections.Counter[str],
    groups: list[Group],
    live_notes: list[str],
    quiet_groups: list[QuietGroup],
    live_examples: int,
    root: Path,
    tm_rules: tuple[str, ...],
) -> str:
    out = [
        "# Flink 2.3's file-merging manager against our rules",
        "",
        "Written by `make conformance-flink` (`python -m conformance.flink.report`); the "
        "verdicts are `conformance/flink/verdicts.py`. Apache Flink 2.3.0 (`apache-flink==2.3.0`), "
        "`org.apache.flink.runtime.checkpoint.filemerging.FileMergingSnapshotManager`.",
        "",
        "## How it was run",
        "",
        METHOD,
        "",
        f"The rules whose effect on storage the profile judges: {', '.join(tm_rules)}.",
        "",
        "## Counts",
        "",
        "| corpus cases | in reach (run) | passed | diverged | out of reach (not run) |",
        "|---|---|---|---|---|",
        f"| {counts['corpus']} | {counts['in_reach']} | {counts['passed']} | "
        f"{counts['diverged']} | {counts['out_of_reach']} |",
        "",
        "Out of reach, by the first reason:",
        "",
        "| reason | cases |",
        "|---|---|",
    ]
    out += [f"| {why} | {n} |" for why, n in why_out.most_common()]
    out += [
        "",
        f"Live mode ({live_examples} random sequences per merging mode, "
        "commands out of reach left out):",
        "",
    ]
    out += [f"- {note}" for note in live_notes] or ["- not run"]
    by_verdict: dict[str, list[Group]] = {}
    for g in groups:
        by_verdict.setdefault(g.verdict.title, []).append(g)
    order = sorted(
        by_verdict.values(),
        key=lambda gs: (_RANK.get(gs[0].verdict.kind, 9), -sum(len(g.cases) for g in gs)),
    )
    out += ["", "## Divergences", ""]
    out += [
        "Once quiet: each diverging case run to its end and then quiesced on Flink (lost "
        "attempts stopped, every notification delivered, pending checkpoints aborted, "
        "num_retained + 1 fault-free checkpoints completed), then Flink's disk judged against "
        "the handles Flink returned for the retained checkpoints: *leak* counts the cases "
        "that leave a file no retained checkpoint uses (I6), *dangling* those that leave a "
        "handle whose bytes are not on disk (I1: data lost).",
        "",
        "| # | verdict | what | rules | cases | once quiet: leak / dangling |",
        "|---|---|---|---|---|---|",
    ]
    for i, gs in enumerate(order, 1):
        v = gs[0].verdict
        n = sum(len(g.cases) for g in gs)
        live = " + live mode" if any(g.live_only for g in gs) else ""
        runs, leak, loss = (sum(g.quiet[k] for g in gs) for k in range(3))
        q = f"{leak} / {loss} of {runs}" if runs else "-"
        out.append(f"| {i} | {v.kind} | {v.title} | {v.rules or '-'} | {n}{live} | {q} |")
    out += [
        "",
        "In ACROSS mode most leaks once quiet are the open pool's dead bytes, whatever the "
        "first divergence of the case was; *Once quiet*, below, sorts the leaks by cause.",
    ]
    for i, gs in enumerate(order, 1):
        out += _section(i, gs, root)
    out += _quiet_section(counts, quiet_groups, root)
    out += ["", "## Not judged", "", NOT_JUDGED, ""]
    return "\n".join(out)
