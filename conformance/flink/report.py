"""``python -m conformance.flink.report``: the corpus and live mode on Flink 2.3's manager,
and the divergence report (``docs/flink-divergences.md``) with a reproduction script per Flink bug.

Every corpus case is either out of the profile's reach (``profile.out_of_reach``: never
run, never counted as passed) or run on Flink; a case that runs passes only when every step's
judged observation equals the model's. Divergences are grouped by ``judge.signature``; each
group's shortest failing case is shrunk to a minimal sequence."""

from __future__ import annotations

import argparse
import collections
import fnmatch
import functools
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from conformance.case import Case, load_corpus
from conformance.flink import judge
from conformance.flink.groups import Group, QuietGroup
from conformance.flink.live import sequences
from conformance.flink.profile import TM_RULES, out_of_reach
from conformance.flink.report_text import render
from conformance.flink.repro import script
from conformance.flink.session import Flink, job_hex
from conformance.flink.verdicts import FLINK_BUG, Verdict, quiet_class, quiet_verdict, verdict
from spec.commands import Command
from spec.config import Config, JobSpec, MergingMode


def _slug(sig: tuple[str, str, str]) -> str:
    return re.sub(r"[^a-z0-9]+", "-", "-".join(sig).lower()).strip("-")[:80]


def _minimal(
    config: Config,
    job: JobSpec,
    commands: Sequence[Command],
    impl: Flink,
    sig: tuple[str, str, str],
) -> tuple[list[Command], judge.Outcome]:
    def same(out: judge.Outcome) -> bool:
        return out.divergence is not None and judge.signature(config, out.divergence) == sig

    short = judge.shrink(config, job, commands, impl, same)
    out = judge.run(config, job, short, impl, "minimal")
    if not same(out):  # shrinking lost it: keep the case's own prefix
        short = list(commands)
        out = judge.run(config, job, short, impl, "minimal")
    assert out.divergence is not None
    return short[: out.divergence.step], out


def _write_repro(
    folder: Path,
    group_sig: tuple[str, str, str],
    v: Verdict,
    config: Config,
    job: str,
    out: judge.Outcome,
) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_slug(group_sig)}.py"
    body = f"{v.text}\n\nRules: {v.rules}."
    path.write_text(script(v.title, body, config, job_hex(job), list(out.calls), out.expected))
    return str(path)


def run(
    cases: list[Case], live_examples: int, repro_dir: Path, log: bool = True
) -> tuple[dict[str, int], collections.Counter[str], list[Group], list[str], list[QuietGroup]]:
    impl = Flink()
    counts = {"corpus": len(cases), "in_reach": 0, "passed": 0, "diverged": 0, "out_of_reach": 0}
    why_out: collections.Counter[str] = collections.Counter()
    failing: dict[tuple[str, str, str], list[tuple[Case, judge.Outcome]]] = {}
    in_reach: list[Case] = []
    t0 = time.perf_counter()
    for case in cases:
        why = out_of_reach(case.config, [s.command for s in case.steps])
        if why is not None:
            counts["out_of_reach"] += 1
            why_out[why.split(":")[0]] += 1
            continue
        counts["in_reach"] += 1
        in_reach.append(case)
        out = judge.run_case(case, impl)
        if out.divergence is None:
            counts["passed"] += 1
        else:
            counts["diverged"] += 1
            failing.setdefault(judge.signature(case.config, out.divergence), []).append((case, out))
        if log and counts["in_reach"] % 50 == 0:
            print(f"  {counts['in_reach']} cases run, {time.perf_counter() - t0:.0f} s", flush=True)
    if log:
        print("  every case in reach once more, to its end and quiesced", flush=True)
    quiet_of = {
        c.name: _quiet(c.config, c.job, [st.command for st in c.steps], impl) for c in in_reach
    }
    groups: list[Group] = []
    for sig, found in sorted(failing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        case, first = min(found, key=lambda co: co[1].divergence.step if co[1].divergence else 0)
        commands = [s.command for s in case.steps][
            : first.divergence.step if first.divergence else None
        ]
        short, out = _minimal(case.config, case.job, commands, impl, sig)
        names = tuple(sorted(c.name for c, _o in found))
        q = [x for x in (quiet_of.get(c.name) for c, _o in found) if x is not None]
        quiet = (len(q), sum(1 for x in q if x.leaked), sum(1 for x in q if x.dangling))
        groups.append(
            Group(
                sig,
                names,
                case.config,
                case.job,
                tuple(short),
                out,
                False,
                verdict(sig),
                None,
                quiet,
            )
        )
        if log:
            print(f"  {sig}: {len(found)} cases, minimal {len(short)} commands", flush=True)
    live_notes: list[str] = []
    for mode in (MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT):
        if live_examples <= 0:
            break
        tapes = sequences(mode, live_examples)
        kinds: collections.Counter[str] = collections.Counter()
        passed = raised = 0
        for i, (config, job, tape) in enumerate(tapes):
            try:
                out = judge.run(config, job, tape, impl, f"live-{mode.value}-{i + 1}")
            except Exception:  # the model refused its own replay: not a verdict on Flink
                raised += 1
                continue
            if out.divergence is None:
                passed += 1
                continue
            sig = judge.signature(config, out.divergence)
            v = verdict(sig)
            kinds[f"{v.kind}: {v.title}"] += 1
            if not any(g.signature == sig for g in groups):
                short, out = _minimal(config, job, tape[: out.divergence.step], impl, sig)
                x = _quiet(config, job, tape, impl)
                quiet = (1, int(bool(x.leaked)), int(bool(x.dangling))) if x else (0, 0, 0)
                groups.append(Group(sig, (), config, job, tuple(short), out, True, v, None, quiet))
        sorted_kinds = "; ".join(f"{k} ({n})" for k, n in kinds.most_common()) or "none"
        live_notes.append(
            f"`{mode.value}`: {len(tapes)} random sequences ({sum(len(t[2]) for t in tapes)} "
            f"commands), {passed} passed, {len(tapes) - passed - raised} diverged"
            + (f", {raised} not replayed" if raised else "")
            + f". Divergences by verdict: {sorted_kinds}"
        )
        if log:
            print(f"  live {live_notes[-1]}", flush=True)
    ran, clean, quiet_groups = once_quiet(in_reach, quiet_of, impl, repro_dir, log)
    counts["quiet_ran"], counts["quiet_clean"] = ran, clean
    shutil.rmtree(impl.base, ignore_errors=True)
    return counts, why_out, _with_repros(groups, repro_dir), live_notes, quiet_groups


def once_quiet(
    cases: list[Case],
    results: dict[str, judge.Quiet | None],
    impl: Flink,
    repro_dir: Path,
    log: bool,
) -> tuple[int, int, list[QuietGroup]]:
    """Every case in reach, run to its end and quiesced on Flink (``results``): how many
    ran, how many were quiet, and the others grouped, each group shrunk."""
    found: dict[tuple[str, str, str], list[tuple[Case, judge.Quiet]]] = {}
    ran = clean = 0
    for case in cases:
        commands = [s.command for s in case.steps]
        q = results.get(case.name)
        if q is None:
            continue
        ran += 1
        if not q.leaked and not q.dangling:
            clean += 1
        mode = case.config.merging_mode.value
        cls = quiet_class(mode, {type(cmd).__name__ for cmd in commands})
        for kind, bad in (("dangling", q.dangling), ("leak", q.leaked)):
            if bad:
                found.setdefault((mode, kind, cls), []).append((case, q))
    groups = []
    for (mode, kind, cls), items in sorted(found.items()):
        case, _q = min(items, key=lambda cq: len(cq[0].steps))

        keeps = functools.partial(_not_quiet, case.config, case.job, impl, mode, kind, cls)
        short = judge.shrink_by([s.command for s in case.steps], keeps, budget=80)
        q2 = _quiet(case.config, case.job, short, impl)
        assert q2 is not None
        v = quiet_verdict(cls) if kind == "leak" else quiet_verdict("dangling handle: data lost")
        names = tuple(sorted(c.name for c, _q in items))
        repro = None
        if v.kind == FLINK_BUG and cls == "lost notification":
            path = repro_dir / f"{_slug((v.title, mode, ''))}.py"
            repro_dir.mkdir(parents=True, exist_ok=True)
            body = f"{v.text}\n\nRules: {v.rules}."
            path.write_text(
                script(v.title, body, case.config, job_hex("job-0"), list(q2.calls), q2.expected)
            )
            repro = str(path)
        groups.append(
            QuietGroup(mode, kind, cls, names, case.config, case.job, tuple(short), q2, v, repro)
        )
        if log:
            print(f"  once quiet: {mode} {kind} ({cls}): {len(items)} cases, minimal {len(short)}")
    return ran, clean, groups


def _not_quiet(
    config: Config,
    job: JobSpec,
    impl: Flink,
    mode: str,
    kind: str,
    cls: str,
    commands: Sequence[Command],
) -> bool:
    """Whether ``commands`` still leave Flink not quiet in the same way (for shrinking)."""
    q = _quiet(config, job, commands, impl)
    names = {type(cmd).__name__ for cmd in commands}
    bad = q is not None and bool(q.dangling if kind == "dangling" else q.leaked)
    return bad and quiet_class(mode, names) == cls


def _quiet(
    config: Config, job: JobSpec, commands: Sequence[Command], impl: Flink
) -> judge.Quiet | None:
    try:
        return judge.quiet(config, job, commands, impl)
    except Exception:  # a Flink call failed on the way: no verdict from this one
        return None


def _with_repros(groups: list[Group], folder: Path) -> list[Group]:
    """One reproduction script per Flink bug and merging mode, from its shortest sequence."""
    shortest: dict[tuple[str, str], Group] = {}
    for g in groups:
        if g.verdict.kind == FLINK_BUG:
            k = (g.verdict.title, g.signature[0])
            if k not in shortest or len(g.minimal) < len(shortest[k].minimal):
                shortest[k] = g
    out = []
    for g in groups:
        k = (g.verdict.title, g.signature[0])
        if shortest.get(k) is g:
            name = (g.verdict.title, g.signature[0], "")
            path = _write_repro(folder, name, g.verdict, g.config, "job-0", g.outcome)
            g = attrs.evolve(g, repro=path)
        out.append(g)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.flink.report", description=__doc__)
    ap.add_argument("--live", type=int, default=30, help="random sequences per merging mode")
    ap.add_argument("--cases", default="*", help="a glob over case names")
    ap.add_argument("--out", default="docs/flink-divergences.md")
    ap.add_argument("--repros", default="docs/flink-repros")
    args = ap.parse_args(argv)
    cases = [c for c in load_corpus() if fnmatch.fnmatch(c.name, args.cases)]
    print(f"Flink 2.3 conformance: {len(cases)} corpus cases", flush=True)
    counts, why_out, groups, live_notes, quiet_groups = run(cases, args.live, Path(args.repros))
    root = Path(os.path.dirname(os.path.abspath(args.out)))
    text = render(counts, why_out, groups, live_notes, quiet_groups, args.live, root, TM_RULES)
    Path(args.out).write_text(text)
    print(
        f"in reach {counts['in_reach']}, passed {counts['passed']}, diverged "
        f"{counts['diverged']}, out of reach {counts['out_of_reach']}; "
        f"{len(groups)} kinds of divergence; once quiet {counts['quiet_clean']} of "
        f"{counts['quiet_ran']} clean; report: {args.out}"
    )
    for note in live_notes:
        print(f"live {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
