"""Syntax check of the TLA+ modules in ``tla/``, without TLC: a quick first gate.

The PyPI package ``tla`` (a TLA+ parser in Python) builds each module's syntax tree, or
reports where it failed; ``config_problems`` checks that each ``tla/*.cfg`` names only
things its module defines. Both run without Java. A module that parses may still hold
errors a parser cannot see (an undefined name, a wrong arity, a type error TLC would raise
while evaluating): this check says nothing about those, and nothing about whether any
invariant holds. Model checking is TLC's (``model_tests/tlc.py``), in ``make verify`` and in
the tests (``tests/test_tlc.py``) wherever a ``tla2tools.jar`` is found.

    python -m model_tests.tla_syntax            # every tla/*.tla file
    python -m model_tests.tla_syntax FILE...    # the named files
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import sys
from pathlib import Path
from typing import Any

from attrs import frozen

# Imported by name: the repository's own tla/ folder (TLA+ files, no __init__.py) would
# otherwise be taken by mypy for this package. At run time the installed package wins, as a
# regular package always does over a namespace folder; _parser() checks it.
_TLA_PACKAGE = "tla"

TLA_DIR = Path(__file__).resolve().parent.parent / "tla"
LABEL = "syntax only (TLC not run)"


@frozen
class ParseResult:
    path: Path
    error: str | None
    """None when the module parsed; otherwise the parser's message and where it stopped."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        if self.error is None:
            return f"{self.path.name}: syntax only: parsed"
        return f"{self.path.name}: syntax only: PARSE ERROR: {self.error}"


def _where(report: str) -> str:
    """The parser prints its stack on failure; keep the lines that say where it stopped."""
    keep = [ln for ln in report.splitlines() if "line" in ln and ("start" in ln or "symbol" in ln)]
    return " | ".join(keep[-2:])


def _parser() -> Any:
    module = importlib.import_module(_TLA_PACKAGE)
    if not callable(getattr(module, "parse", None)):
        raise RuntimeError(
            "the `tla` package (a TLA+ parser, pip install tla) is not installed: "
            f"`import tla` found {getattr(module, '__path__', module)}"
        )
    return module


def parser_version() -> str:
    return str(getattr(_parser(), "__version__", "?"))


def parse_text(text: str) -> str | None:
    """Parse one module's text; return None if it parses, else an error message."""
    parse = _parser().parse
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            tree = parse(text)
    except Exception as err:  # the parser raises bare exceptions of several kinds
        where = _where(printed.getvalue())
        return f"{type(err).__name__}: {err}" + (f" [{where}]" if where else "")
    if tree is None:
        return "the parser returned no syntax tree"
    return None


def parse_file(path: Path) -> ParseResult:
    return ParseResult(path, parse_text(path.read_text(encoding="utf-8")))


def tla_files(directory: Path = TLA_DIR) -> list[Path]:
    return sorted(directory.glob("*.tla"))


def check(paths: list[Path]) -> list[ParseResult]:
    return [parse_file(p) for p in paths]


_DEFINITION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*==", re.M)
_DECLARATION = re.compile(r"^CONSTANTS?\s+([^\n]+)", re.M)
_EXTENDS = re.compile(r"^EXTENDS\s+([^\n]+)", re.M)
_CFG_NAMES = re.compile(
    r"^(SPECIFICATION|INIT|NEXT|CONSTRAINTS?|ACTION_CONSTRAINTS?|INVARIANTS?|PROPERT(?:Y|IES)"
    r"|CONSTANTS?|SYMMETRY|VIEW|ALIAS|POSTCONDITION|CHECK_DEADLOCK)\b",
    re.M,
)
_CFG_SECTION = {
    "SPECIFICATION": "SPEC",
    "INIT": "SPEC",
    "NEXT": "SPEC",
    "CONSTRAINTS": "CONSTRAINT",
    "ACTION_CONSTRAINT": "CONSTRAINT",
    "ACTION_CONSTRAINTS": "CONSTRAINT",
    "INVARIANTS": "INVARIANT",
    "PROPERTY": "INVARIANT",
    "PROPERTIES": "INVARIANT",
    "CONSTANTS": "CONSTANT",
    "SYMMETRY": "SPEC",
    "VIEW": "SPEC",
    "ALIAS": "SPEC",
    "POSTCONDITION": "SPEC",
    "CHECK_DEADLOCK": "FLAG",
}
"""Each config keyword and the kind of name it is followed by; CHECK_DEADLOCK takes a
boolean, not a name."""


def _module_text(directory: Path, name: str, seen: set[str]) -> str:
    """The module's text and that of every module of ``directory`` it EXTENDS."""
    path = directory / f"{name}.tla"
    if name in seen or not path.exists():
        return ""
    seen.add(name)
    text = path.read_text(encoding="utf-8")
    parents = [n.strip() for m in _EXTENDS.findall(text) for n in m.split(",")]
    return text + "".join(_module_text(directory, n, seen) for n in parents)


def _config_sections(cfg: str) -> dict[str, list[str]]:
    """The names a TLC config mentions, by the kind of definition each must be (``SPEC``,
    ``CONSTRAINT``, ``INVARIANT``; for ``CONSTANT``, the left-hand sides); ``FLAG`` holds
    a CHECK_DEADLOCK value that is not a boolean."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in cfg.splitlines():
        line = raw.split("\\*", 1)[0].strip()
        if not line:
            continue
        head = _CFG_NAMES.match(line)
        if head:
            section = _CFG_SECTION.get(head.group(1), head.group(1))
            line = line[head.end() :].strip()
            if section == "FLAG":
                if line not in ("TRUE", "FALSE"):
                    out.setdefault("FLAG", []).append(line or "(nothing)")
                continue
        if not line or not section or section == "FLAG":
            continue
        if section == "CONSTANT":
            out.setdefault(section, []).append(line.split("=", 1)[0].split("<-", 1)[0].strip())
        else:
            out.setdefault(section, []).extend(line.split())
    return out


def config_problems(module: Path, cfg: Path) -> list[str]:
    """What a TLC config refers to that its module (with what it EXTENDS in the same folder)
    does not define: the names a parser cannot check, and TLC would reject at start-up."""
    if not module.exists():
        return [f"{cfg.name}: module {module.name} does not exist"]
    text = _module_text(module.parent, module.stem, set())
    defined = set(_DEFINITION.findall(text))
    declared = {n.strip() for m in _DECLARATION.findall(text) for n in m.split(",")}
    sections = _config_sections(cfg.read_text(encoding="utf-8"))
    problems = [
        f"{cfg.name}: {kind} {name} is not defined in {module.name} or what it extends"
        for kind in ("SPEC", "CONSTRAINT", "INVARIANT")
        for name in sections.get(kind, [])
        if name not in defined
    ]
    problems += [
        f"{cfg.name}: CHECK_DEADLOCK {v} is not TRUE or FALSE" for v in sections.get("FLAG", [])
    ]
    given = set(sections.get("CONSTANT", []))
    problems += [f"{cfg.name}: constant {n} is not declared" for n in sorted(given - declared)]
    problems += [f"{cfg.name}: constant {n} has no value" for n in sorted(declared - given)]
    return problems


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] if argv else tla_files()
    print(
        f"TLA+ {LABEL}: parsing {len(paths)} module(s) with the `tla` package "
        f"{parser_version()}; no model was checked",
        flush=True,
    )
    if not paths:
        print(f"  no .tla file found in {TLA_DIR}")
        return 1
    results = check(paths)
    for r in results:
        print(f"  {r.describe()}")
    failed = [r for r in results if not r.ok]
    print(f"{LABEL}: {len(results) - len(failed)} parsed, {len(failed)} failed to parse")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
