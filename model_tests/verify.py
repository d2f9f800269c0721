"""``make verify``: every static and symbolic check we have, each labelled for what it is.

    python -m model_tests.verify              # everything; exit 1 if any check failed
    python -m model_tests.verify --twin NAME  # search with a must-fail twin: exit 1 (caught)

The checks, in order:

1. ``mypy --strict`` over every layer.
2. CrossHair on the pure functions that carry PEP 316 contracts (``spec.keygroups``,
   ``spec.ids``): a symbolic search for an input that breaks a contract. What it finds
   nothing for is reported as "no counterexample found within limits", never "proved".
   A planted wrong contract is checked first, so that a silent CrossHair cannot pass.
3. CrossHair ``diffbehavior`` between fastimpl's redistribution (``assign``) and the
   model's (``redistribute``): the two must return the same for every input it tries.
4. The TLA+ models in ``tla/``: every module parsed, every config's names checked, and
   every model checked by TLC when a usable ``tla2tools.jar`` is found (``model_tests/tlc.py``
   says where it looks and how a jar is accepted): each passing model must pass with the
   state count its config records, each must-fail model must fail on the invariant it
   names. Without a jar the output says plainly that no TLA+ model was model-checked.
5. The exhaustive breadth-first search of the model (``explore.py``) at the two small
   bounds, every state checked for I1-I5 and quiesced for I6 ("exhaustive for bounds").
6. Every must-fail twin (``twins.py``): the search must catch each one.

A check that did not run is listed as NOT RUN with the reason, never as passed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from model_tests import explore, tla_syntax, tlc
from model_tests.twins import TWINS

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TLA_DIR = ROOT / "tla"
CONTRACT_MODULES = ("spec.keygroups", "spec.ids")
DIFF_PAIR = ("fastimpl.redistribute.assign", "refimpl.redistribute.redistribute")


@attrs.define
class Check:
    name: str
    status: str = "NOT RUN"
    """``ok``, ``FAILED`` or ``NOT RUN``."""
    summary: str = ""
    details: list[str] = attrs.Factory(list)
    seconds: float = 0.0


def _run(args: list[str], timeout: float, cwd: Path = ROOT) -> tuple[int, str]:
    proc = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def check_mypy() -> Check:
    ck = Check("mypy --strict")
    code, out = _run([str(BIN / "mypy")], 900)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    ck.status, ck.summary = ("ok" if code == 0 else "FAILED"), last
    if code:
        ck.details = out.strip().splitlines()[-20:]
    return ck


_PLANTED = '''
def half(n: int) -> int:
    """
    pre: 0 <= n <= 1000
    post: __return__ * 2 == n
    """
    return n // 2
'''


def _crosshair_check(modules: list[str], timeout: float, cwd: Path) -> tuple[int, list[str]]:
    code, out = _run(
        [
            str(BIN / "crosshair"),
            "check",
            "--analysis_kind=PEP316",
            f"--per_condition_timeout={timeout}",
            "--report_all",
            *modules,
        ],
        1800,
        cwd,
    )
    return code, [line for line in out.splitlines() if line.strip()]


def planted_contract_caught() -> tuple[bool, list[str]]:
    """Whether CrossHair reports a contract that is wrong (``half(1) * 2 != 1``)."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "planted_contract.py").write_text(textwrap.dedent(_PLANTED))
        code, lines = _crosshair_check(["planted_contract"], 5, Path(tmp))
    return code != 0 and any(": error:" in line for line in lines), lines


def check_contracts(timeout: float) -> Check:
    ck = Check("CrossHair contracts")
    if not (BIN / "crosshair").exists():
        ck.summary = "crosshair is not installed in this environment"
        return ck
    caught, lines = planted_contract_caught()
    if not caught:
        ck.status = "FAILED"
        ck.summary = "CrossHair did not report a planted wrong contract: its silence means nothing"
        ck.details = lines
        return ck
    code, lines = _crosshair_check(list(CONTRACT_MODULES), timeout, ROOT)
    confirmed = sum("Confirmed over all paths" in line for line in lines)
    unconfirmed = sum("Not confirmed" in line for line in lines)
    errors = [line for line in lines if ": error:" in line]
    ck.details = lines
    if errors:
        ck.status = "FAILED"
        ck.summary = f"counterexample(s) found: {len(errors)}"
        return ck
    if code != 0:
        ck.status = "FAILED"
        ck.summary = f"crosshair failed (exit {code}) without a counterexample"
        return ck
    if confirmed + unconfirmed == 0:
        ck.status = "FAILED"
        ck.summary = "no condition was analysed (a contract went missing?)"
        return ck
    ck.status = "ok"
    ck.summary = (
        f"no counterexample found within limits ({timeout:g} s per condition) for "
        f"{confirmed + unconfirmed} conditions in {', '.join(CONTRACT_MODULES)}: "
        f"{confirmed} with every path explored within those limits, {unconfirmed} searched "
        "until the limit (a planted wrong contract was caught first). Not a proof."
    )
    return ck


def check_diffbehavior(iterations: int) -> Check:
    ck = Check("CrossHair diffbehavior")
    if not (BIN / "crosshair").exists():
        ck.summary = "crosshair is not installed in this environment"
        return ck
    code, out = _run(
        [
            str(BIN / "crosshair"),
            "diffbehavior",
            f"--max_uninteresting_iterations={iterations}",
            "--per_path_timeout=4",
            *DIFF_PAIR,
        ],
        1800,
    )
    ck.details = out.strip().splitlines()
    m = re.search(r"No differences found\. \(attempted (\d+) iterations\)", out)
    if code == 0 and m:
        ck.status = "ok"
        ck.summary = (
            f"no difference found within limits between {DIFF_PAIR[0]} and {DIFF_PAIR[1]} "
            f"({m.group(1)} inputs tried). Not a proof."
        )
    else:
        ck.status = "FAILED"
        ck.summary = f"the two differ, or CrossHair failed (exit {code})"
    return ck


def check_tla(include_soak: bool) -> list[Check]:
    found = tlc.models()
    chosen = [m for m in found if include_soak or "soak" not in m.name.lower()]
    checks: list[Check] = []
    t0 = time.perf_counter()
    syntax = Check("TLA+ syntax (the `tla` parser)")
    modules = tla_syntax.tla_files(TLA_DIR)
    try:
        results = tla_syntax.check(modules)
    except RuntimeError as err:  # the parser package is missing
        syntax.status, syntax.summary = "FAILED", str(err)
        results = []
    bad = [r for r in results if not r.ok]
    syntax.details = [r.describe() for r in results]
    if not modules:
        syntax.summary = "no .tla module in tla/"
    elif bad:
        syntax.status, syntax.summary = "FAILED", f"{len(bad)} module(s) do not parse"
    elif results:
        syntax.status = "ok"
        names = ", ".join(r.path.name for r in results)
        syntax.summary = f"{len(results)} modules parsed ({names})"
    syntax.seconds = time.perf_counter() - t0
    checks.append(syntax)
    refs = Check("TLA+ configs refer to defined names (static)", seconds=0.01)
    problems = [e for m in found for e in tla_syntax.config_problems(m.module, m.cfg)]
    refs.details = problems
    if not found:
        refs.summary = "no .cfg in tla/"
    elif problems:
        refs.status, refs.summary = "FAILED", f"{len(problems)} problem(s) in the configs"
    else:
        refs.status = "ok"
        refs.summary = (
            f"{len(found)} configs: every spec, constraint, invariant and constant is defined"
        )
    checks.append(refs)
    t0 = time.perf_counter()
    jar, where = tlc.find_jar()
    if jar is None:
        checks.append(Check("TLA+ model checking (TLC)", "NOT RUN", f"NOT model-checked: {where}"))
        return checks
    print(f"TLC: {where}, accepted in {time.perf_counter() - t0:.1f} s", flush=True)
    skipped = [m.name for m in found if m not in chosen]
    for model in chosen:
        checks.append(_tlc(jar, model))
    if skipped:
        checks.append(
            Check(
                f"TLC {', '.join(skipped)}",
                "NOT RUN",
                "left out by --no-soak: not model-checked in this run",
            )
        )
    return checks


def _tlc(jar: Path, model: tlc.Model) -> Check:
    ck = Check(f"TLC {model.cfg.name}")
    r = tlc.run(jar, model.module, model.cfg, simulate=model.simulate)
    ok, ck.summary = tlc.judge(model, r)
    ck.status = "ok" if ok else "FAILED"
    ck.seconds = r.seconds
    ck.details = list(r.tail)
    return ck


def check_search() -> list[Check]:
    out = []
    for b in explore.BOUNDS["small"]:
        r = explore.explore(b)
        ck = Check(f"search {b.name} {b.mode.name}", seconds=r.seconds)
        ck.status = "ok" if not r.violations else "FAILED"
        ck.summary = explore.report(r).splitlines()[1].strip()
        ck.details = explore.report(r).splitlines()
        out.append(ck)
    return out


def check_twins() -> list[Check]:
    out = []
    for name, twin in sorted(TWINS.items()):
        r = explore.run_twin(name)
        ck = Check(f"twin {name} (must fail)", seconds=r.seconds)
        if r.violations and f"{twin.breaks}:" in r.violations[0][0]:
            ck.status = "ok"
            ck.summary = f"caught after {r.states} states: {r.violations[0][0][:90]}"
        elif r.violations:
            ck.status = "FAILED"
            ck.summary = f"caught, but as {r.violations[0][0][:60]}, not {twin.breaks}"
        else:
            ck.status = "FAILED"
            ck.summary = (
                f"NOT caught within its bounds ({r.states} states): the search is blind to it"
            )
        out.append(ck)
    return out


def check_trace() -> list[Check]:
    """fastimpl's example job, traced: replayed through the model (outcomes and every
    observation compared), and the TLA+ trace model in tla/ still the one it converts to
    (TLC replays that one through the spec with the other configs, where it runs)."""
    from model_tests import replay, trace_tla

    out = []
    t0 = time.perf_counter()
    lines = trace_tla.example_trace(observations=True)
    rep = replay.replay(lines)
    ck = Check("trace replay through the model", seconds=time.perf_counter() - t0)
    ck.status = "ok" if rep.agrees and rep.stopped is None else "FAILED"
    ck.summary = " ".join(rep.summary().splitlines())
    ck.details = rep.summary().splitlines()
    out.append(ck)
    fresh = trace_tla.convert(lines, "MCTrace")
    module, cfg = TLA_DIR / "MCTrace.tla", TLA_DIR / "MCTrace.cfg"
    current = module.exists() and cfg.exists()
    same = current and module.read_text() == fresh.module and cfg.read_text() == fresh.cfg
    tla = Check("TLA+ trace model tla/MCTrace is current (TLC checks it with the models)")
    if same:
        tla.status = "ok"
        tla.summary = f"{fresh.records} accepted commands, matches the example trace"
    else:
        tla.status = "FAILED"
        tla.summary = "stale: run python -m model_tests.trace_tla --example --out tla"
    out.append(tla)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--twin", choices=sorted(TWINS), help="search with a must-fail twin")
    parser.add_argument("--contract-timeout", type=float, default=10.0)
    parser.add_argument("--diff-iterations", type=int, default=50)
    parser.add_argument(
        "--no-soak", action="store_true", help="leave out the TLA+ soak models (MCSoak*)"
    )
    args = parser.parse_args(argv)
    if args.twin:
        return explore.main(["--twin", args.twin])
    steps: list[Callable[[], list[Check]]] = [
        lambda: [check_mypy()],
        lambda: [check_contracts(args.contract_timeout)],
        lambda: [check_diffbehavior(args.diff_iterations)],
        lambda: check_tla(not args.no_soak),
        check_trace,
        check_search,
        check_twins,
    ]
    checks: list[Check] = []
    for run in steps:
        t0 = time.perf_counter()
        new = run()
        for ck in new:
            ck.seconds = ck.seconds or (time.perf_counter() - t0) / len(new)
            print(f"[{ck.status:>7}] {ck.name}: {ck.summary} ({ck.seconds:.1f} s)", flush=True)
            if ck.status == "FAILED":
                print(textwrap.indent("\n".join(ck.details[-25:]), "          "), flush=True)
        checks.extend(new)
    failed = [ck.name for ck in checks if ck.status == "FAILED"]
    not_run = [ck.name for ck in checks if ck.status == "NOT RUN"]
    print()
    print(
        f"make verify: {len(checks) - len(failed) - len(not_run)} ok, {len(failed)} FAILED, "
        f"{len(not_run)} NOT RUN" + (f" ({'; '.join(not_run)})" if not_run else "")
    )
    if any(ck.name.startswith("TLA+ model checking") and ck.status == "NOT RUN" for ck in checks):
        print("No TLA+ model was model-checked on this machine: TLC is not available here.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
