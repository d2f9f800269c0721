"""Does the built wheel work on its own? Build it, install it in a fresh virtual
environment, and run the installed ``ckpt conformance --impl fastimpl`` on the whole corpus
from a directory outside the repository (so that nothing of the source tree can stand in for
what the wheel installed).

    python -m model_tests.wheel_check               # make wheel-check: dependencies from the index
    python -m model_tests.wheel_check --deps here   # dependencies of this environment, no download

Checked, each a failure of its own:

* the wheel holds the product packages (spec, refimpl, fastimpl, pipeline, conformance,
  ckpt), the corpus and ``schema.json``, and nothing of ``model_tests``, ``bench``,
  ``examples`` or ``tests``;
* in the new environment every product module is imported from the environment's own
  site-packages, and ``model_tests``, ``bench``, ``examples`` and ``tests`` cannot be
  imported at all;
* the ``ckpt`` console script runs every case of the corpus and passes (exit 0, every case
  counted as passed).

``--deps index`` (the default) installs the wheel with its dependencies as a user would
(``pip install ckpt_ownership-*.whl``). ``--deps here`` installs the wheel alone and lets the
new environment see this environment's site-packages behind its own (a ``.pth`` line, after
the wheel's packages, and without running this environment's ``.pth`` files, so the editable
install of the project is not seen): the test suite's variant, with no download of the
dependencies. The wheel is built by pip in an isolated build environment (setuptools and
wheel from the index or pip's cache), as ``pip install .`` would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("spec", "refimpl", "fastimpl", "pipeline", "conformance", "ckpt")
NOT_SHIPPED = ("model_tests", "bench", "examples", "tests")
DATA = ("conformance/schema.json", "conformance/corpus/")


class WheelCheckError(Exception):
    """A check failed; the message says which and shows the output that shows it."""


@frozen
class Result:
    wheel: Path
    cases: int
    passed: int
    seconds: float


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        shown = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise WheelCheckError(f"{' '.join(args)} exited {done.returncode}:\n{shown}")
    return done.stdout


def source_copy(dest: Path) -> Path:
    """The repository's files as git sees them (tracked, and new files not ignored) copied
    to ``dest``: setuptools builds in the source folder, and a ``build/`` left there by an
    earlier build would put files that no longer exist into the wheel."""
    listed = _run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=ROOT)
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a file deleted in the work tree is still listed by -c
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def build(out: Path) -> Path:
    """``pip wheel`` of a copy of the repository into ``out``: the one wheel it made."""
    src = source_copy(out.parent / "src")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        cwd=out,
    )
    wheels = sorted(out.glob("ckpt_ownership-*.whl"))
    if len(wheels) != 1:
        raise WheelCheckError(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def contents_problems(wheel: Path) -> list[str]:
    """What the wheel lacks or holds that it must not."""
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info/" not in n}
    problems = [f"ships {t}/" for t in sorted(tops & set(NOT_SHIPPED))]
    problems += [f"lacks {p}/" for p in PRODUCT if p not in tops]
    problems += [
        f"ships a top-level {t}/ that is not a product package"
        for t in sorted(tops - set(PRODUCT) - set(NOT_SHIPPED))
    ]
    for d in DATA:
        if not any(n.startswith(d) and not n.endswith("/") for n in names):
            problems.append(f"lacks {d}")
    cases = [n for n in names if re.match(r"conformance/corpus/[^/]+\.json(\.gz)?$", n)]
    here = sorted((ROOT / "conformance" / "corpus").glob("*.json*"))
    if len(cases) != len(here):
        problems.append(f"ships {len(cases)} corpus cases, the repository has {len(here)}")
    return problems


def install(wheel: Path, venv: Path, deps: str) -> Path:
    """A fresh environment at ``venv`` with the wheel installed: its ``bin`` folder."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    if deps == "here":
        purelib = _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            cwd=venv.parent,
        ).strip()
        ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        Path(purelib, "zz_dependencies.pth").write_text(
            "".join(f"{p}\n" for p in sorted(ours)), encoding="utf-8"
        )
        _run([*pip, "--no-deps", "--no-index", str(wheel)], cwd=venv.parent)
    else:
        _run([*pip, str(wheel)], cwd=venv.parent)
    return venv / "bin"


def import_problems(bin_dir: Path, cwd: Path) -> list[str]:
    """Where the new environment imports each package from."""
    probe = (
        "import importlib, json, sys\n"
        "out = {}\n"
        f"for name in {PRODUCT + NOT_SHIPPED!r}:\n"
        "    try:\n"
        "        out[name] = importlib.import_module(name).__file__\n"
        "    except ModuleNotFoundError:\n"
        "        out[name] = None\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found: dict[str, str | None] = json.loads(
        _run([str(bin_dir / "python"), "-c", probe], cwd=cwd, env=env)
    )
    venv = bin_dir.parent.resolve()
    problems = []
    for name in PRODUCT:
        where = found[name]
        if where is None or not Path(where).resolve().is_relative_to(venv):
            problems.append(f"{name} imported from {where}, not from the wheel in {venv}")
    problems += [f"{n} is importable ({found[n]})" for n in NOT_SHIPPED if found[n] is not None]
    return problems


def run_corpus(bin_dir: Path, cwd: Path) -> tuple[int, int]:
    """The installed ``ckpt conformance --impl fastimpl``: (cases, passed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "200"  # one table row per line, whatever the terminal
    out = _run([str(bin_dir / "ckpt"), "conformance", "--impl", "fastimpl"], cwd=cwd, env=env)
    row = re.search(r"│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│", out)
    if row is None:
        raise WheelCheckError(f"no result table in the output of ckpt conformance:\n{out}")
    cases, passed, failed = (int(g) for g in row.groups())
    if failed or passed != cases:
        raise WheelCheckError(f"ckpt conformance: {failed} of {cases} cases failed:\n{out}")
    return cases, passed


def check(work: Path, deps: str = "index") -> Result:
    """Every check above, in ``work`` (a fresh folder outside the repository)."""
    t0 = time.perf_counter()
    work = work.resolve()
    if work.is_relative_to(ROOT):
        raise WheelCheckError(f"{work} is inside the repository, whose packages would shadow")
    dist, venv, cwd = work / "dist", work / "venv", work / "cwd"
    for d in (dist, cwd):
        d.mkdir(parents=True)
    wheel = build(dist)
    problems = contents_problems(wheel)
    bin_dir = install(wheel, venv, deps)
    problems += import_problems(bin_dir, cwd)
    if problems:
        raise WheelCheckError(f"{wheel.name}:\n  " + "\n  ".join(problems))
    cases, passed = run_corpus(bin_dir, cwd)
    here = len(list((ROOT / "conformance" / "corpus").glob("*.json*")))
    if cases != here:
        raise WheelCheckError(f"the installed ckpt ran {cases} cases, the corpus has {here}")
    return Result(wheel, cases, passed, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m model_tests.wheel_check", description=__doc__)
    ap.add_argument("--deps", choices=("index", "here"), default="index")
    ap.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    args = ap.parse_args(argv)
    try:
        if args.keep is not None:
            r = check(args.keep, args.deps)
        else:
            with tempfile.TemporaryDirectory(prefix="ckpt-wheel-") as tmp:
                r = check(Path(tmp), args.deps)
    except WheelCheckError as err:
        print(f"wheel check FAILED: {err}", file=sys.stderr)
        return 1
    print(
        f"wheel check passed: {r.wheel.name} installed in a fresh venv (dependencies: "
        f"{args.deps}); ckpt conformance --impl fastimpl: {r.passed}/{r.cases} cases; "
        f"{r.seconds:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
