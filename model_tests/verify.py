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
4. The TLA+ models in ``tla/``: model-checked by TLC when ``tla2tools.jar`` is present
   (``TLA2TOOLS_JAR``, or ``.cache/tla2tools.jar``; a pinned release, checked against its
   checksum). No package registry here carries TLC: without it the output says plainly
   that no TLA+ model was model-checked, and the modules are only parsed ("syntax only").
5. The exhaustive breadth-first search of the model (``explore.py``) at the two small
   bounds, every state checked for I1-I5 and quiesced for I6 ("exhaustive for bounds").
6. Every must-fail twin (``twins.py``): the search must catch each one.

A check that did not run is listed as NOT RUN with the reason, never as passed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from model_tests import explore, tla_syntax
from model_tests.twins import TWINS

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TLA_DIR = ROOT / "tla"
TLC_VERSION = "1.7.4"
TLC_URL = f"https://github.com/tlaplus/tlaplus/releases/download/v{TLC_VERSION}/tla2tools.jar"
TLC_SHA256 = "936a262061c914694dfd669a543be24573c45d5aa0ff20a8b96b23d01e050e88"
"""The v1.7.4 release jar's SHA-256 as other projects pin it (v1.8.0's asset is rolling,
so it cannot be pinned). It could not be checked here: no machine here can download it."""
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


def fetch_tlc(dest: Path, timeout: float = 20.0) -> str | None:
    """Fill the cache with the pinned release; None if it worked, else why not. Nothing
    is kept unless its SHA-256 is the pinned one."""
    import urllib.request

    try:
        with urllib.request.urlopen(TLC_URL, timeout=timeout) as r:
            data = r.read()
    except Exception as err:  # offline, proxy, DNS: all mean the same here
        return f"downloading {TLC_URL} failed: {type(err).__name__}: {err}"
    digest = hashlib.sha256(data).hexdigest()
    if digest != TLC_SHA256:
        return f"the download has SHA-256 {digest}, not the pinned {TLC_SHA256}: not kept"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return None


def tlc_jar() -> tuple[Path | None, str]:
    """The TLC jar to use, or None and why not. Without ``TLA2TOOLS_JAR`` the cache
    ``.cache/tla2tools.jar`` is used, filled by a download of the pinned release where the
    machine can download it (``TLA2TOOLS_NO_DOWNLOAD=1`` skips the attempt)."""
    named = os.environ.get("TLA2TOOLS_JAR", "").strip()
    cache = ROOT / ".cache" / "tla2tools.jar"
    fetch_error = ""
    if not named and not cache.is_file() and not os.environ.get("TLA2TOOLS_NO_DOWNLOAD"):
        fetch_error = fetch_tlc(cache) or ""
    candidates = [Path(named)] if named else [cache]
    for jar in candidates:
        if not jar.is_file():
            continue
        digest = hashlib.sha256(jar.read_bytes()).hexdigest()
        if digest != TLC_SHA256 and not os.environ.get("TLA2TOOLS_ANY_VERSION"):
            return None, (
                f"{jar} has SHA-256 {digest}, not the pinned v{TLC_VERSION} ({TLC_SHA256}); "
                "set TLA2TOOLS_ANY_VERSION=1 to use it anyway"
            )
        if shutil.which("java") is None:
            return None, "java is not installed (apt-get install openjdk-17-jre-headless)"
        return jar, f"{jar} (sha256 {digest[:12]}...)"
    where = named or ".cache/tla2tools.jar"
    return None, (
        f"TLC is not available: no tla2tools.jar at {where} (v{TLC_VERSION} from {TLC_URL}, "
        "sha256 pinned in model_tests/verify.py). No package registry reachable here carries "
        "it; on a machine that can download it, put it there or set TLA2TOOLS_JAR"
        + (f" ({fetch_error})" if fetch_error else "")
    )


def tla_models(folder: Path = TLA_DIR) -> list[tuple[Path, Path, str]]:
    """(module, config, expectation) of every ``tla/*.cfg``. A config names its module
    and what TLC must find in comment lines: ``\\* module: MCSmall`` (default: the
    config's own name) and ``\\* expect: pass`` or ``\\* expect: violates NoDanglingInv``."""
    out = []
    for cfg in sorted(folder.glob("*.cfg")):
        text = cfg.read_text()
        mod = re.search(r"\\\*\s*module:\s*(\w+)", text)
        exp = re.search(r"\\\*\s*expect:\s*([^\n]+)", text)
        module = folder / f"{mod.group(1) if mod else cfg.stem}.tla"
        out.append((module, cfg, exp.group(1).strip() if exp else "pass"))
    return out


def check_tla(include_soak: bool) -> list[Check]:
    models = [m for m in tla_models() if include_soak or "soak" not in m[1].stem.lower()]
    checks: list[Check] = []
    syntax = Check("TLA+ syntax only (TLC not run)")
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
        syntax.summary = f"{len(results)} modules parsed ({names}): syntax only, not model-checked"
    checks.append(syntax)
    refs = Check("TLA+ configs refer to defined names (static, TLC not run)")
    problems = [e for module, cfg, _ in models for e in tla_syntax.config_problems(module, cfg)]
    refs.details = problems
    if not models:
        refs.summary = "no .cfg in tla/"
    elif problems:
        refs.status, refs.summary = "FAILED", f"{len(problems)} problem(s) in the configs"
    else:
        refs.status = "ok"
        refs.summary = (
            f"{len(models)} configs: every spec, constraint, invariant and constant is defined"
        )
    checks.append(refs)
    jar, why = tlc_jar()
    if jar is None:
        checks.append(Check("TLA+ model checking (TLC)", "NOT RUN", f"NOT model-checked: {why}"))
        return checks
    for module, cfg, expect in models:
        checks.append(_tlc(jar, module, cfg, expect))
    return checks


def _tlc(jar: Path, module: Path, cfg: Path, expect: str) -> Check:
    ck = Check(f"TLC {cfg.name}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as meta:
        _code, out = _run(
            [
                "java",
                "-XX:+UseParallelGC",
                "-cp",
                str(jar),
                "tlc2.TLC",
                "-workers",
                "auto",
                "-metadir",
                meta,
                "-config",
                cfg.name,
                module.name,
            ],
            3600,
            TLA_DIR,
        )
    ck.seconds = time.perf_counter() - t0
    states = re.findall(r"(\d[\d,]*) distinct states found", out)
    found = states[-1] if states else "?"
    violated = sorted(set(re.findall(r"Invariant (\w+) is violated", out)))
    completed = "Model checking completed. No error has been found." in out
    ck.details = out.strip().splitlines()[-15:]
    if expect == "pass":
        ok = completed and not violated
        ck.summary = f"{found} distinct states, {'no violation' if ok else f'violated {violated}'}"
    else:
        target = expect.removeprefix("violates").strip()
        ok = target in violated
        ck.summary = f"must fail on {target}: violated {violated or 'nothing'} ({found} states)"
    ck.status = "ok" if ok else "FAILED"
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
    tla = Check("TLA+ trace model tla/MCTrace (generated, syntax only here)")
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
    parser.add_argument("--soak", action="store_true", help="also the TLA+ soak model")
    args = parser.parse_args(argv)
    if args.twin:
        return explore.main(["--twin", args.twin])
    steps: list[Callable[[], list[Check]]] = [
        lambda: [check_mypy()],
        lambda: [check_contracts(args.contract_timeout)],
        lambda: [check_diffbehavior(args.diff_iterations)],
        lambda: check_tla(args.soak),
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
