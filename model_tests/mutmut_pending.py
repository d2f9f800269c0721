"""The mutants of a selection that have no verdict yet in ``mutants/``, and the verdicts of
those that have one.

``mutmut run NAME...`` runs again every mutant a name or pattern matches, whatever verdict
it already has: only a run with no names at all resumes (mutmut 3.8.1,
``if not mutant_names and result is not None: continue``). ``make mutate`` always names its
selection (``MUTATE_FUNCS``), so a stopped run is resumed by naming only the mutants still
without a verdict, which this prints (``make mutate-resume``):

    python -m model_tests.mutmut_pending PATTERN...            # names with no verdict
    python -m model_tests.mutmut_pending --verdicts PATTERN... # name and verdict of each

The patterns are mutmut's: a mutant's full name or an ``fnmatch`` pattern over it. The
verdicts come from the ``.meta`` files mutmut keeps beside each mutated source file; a
mutant whose function changed since its run is back to no verdict there (mutmut resets it
when the function's hash changes). ``--verdicts`` writes a listing that can be kept with the
survivors' record, since ``mutants/`` is a working directory that does not last.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import sys
from pathlib import Path

# mutmut's names for its exit codes (mutmut/stats.py, status_by_exit_code), used when
# mutmut itself cannot be imported (it is the optional ``mutate`` extra)
_STATUS: dict[int | None, str] = {
    None: "not checked",
    0: "survived",
    1: "killed",
    2: "check was interrupted by user",
    3: "killed",
    5: "no tests",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    33: "no tests",
    34: "skipped",
    35: "suspicious",
    36: "timeout",
    37: "caught by type check",
    -11: "segfault",
    -9: "segfault",
}
# a mutant with one of these has no verdict: never run, or its run was stopped
_PENDING = ("not checked", "check was interrupted by user")


def status(code: int | None) -> str:
    try:
        table = importlib.import_module("mutmut.stats").status_by_exit_code
    except ImportError:
        return _STATUS.get(code, "suspicious")
    return str(table[code])


def verdicts(root: Path) -> dict[str, int | None]:
    """Every mutant's exit code (None: not run) from the ``.meta`` files under ``root``."""
    found: dict[str, int | None] = {}
    for meta in sorted(root.rglob("*.meta")):
        data = json.loads(meta.read_text(encoding="utf-8"))
        found.update(data.get("exit_code_by_key", {}))
    return found


def select(names: dict[str, int | None], patterns: list[str]) -> list[str]:
    """The names ``mutmut run`` would take for these patterns (its own matching)."""
    wanted = set(patterns)
    return sorted(
        n for n in names if n in wanted or any(fnmatch.fnmatch(n, p) for p in patterns)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="+", help="mutant names or fnmatch patterns")
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--verdicts", action="store_true", help="print each name's verdict")
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        print(f"error: {args.mutants}/ does not exist: no mutation run here yet", file=sys.stderr)
        return 2
    codes = verdicts(args.mutants)
    chosen = select(codes, args.patterns)
    if not chosen:
        print(f"error: no mutant in {args.mutants}/ matches {args.patterns}", file=sys.stderr)
        return 2
    if args.verdicts:
        for name in chosen:
            print(f"{name}\t{status(codes[name])}")
    else:
        for name in chosen:
            if status(codes[name]) in _PENDING:
                print(name)
    pending = sum(1 for n in chosen if status(codes[n]) in _PENDING)
    print(f"{len(chosen)} mutants selected, {pending} without a verdict", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
