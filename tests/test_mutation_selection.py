"""The tests ``make mutate`` hands mutmut must be selectable by their ids.

mutmut records the id of every test that reaches a mutated function and later passes those
ids back to pytest. pytest escapes an id that is not plain ASCII (a lone surrogate becomes
``\\udc80``) and cannot select it again, and mutmut then counts the usage error of each
mutant's run as a kill: one such parameter made a whole run report every mutant killed
(issue 14, run 4). So every id of the selection is plain printable ASCII without a backslash.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _selection() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    files: list[str] = config["pytest_add_cli_args_test_selection"]
    return files


def _unselectable(node_id: str) -> bool:
    return not node_id.isascii() or not node_id.isprintable() or "\\" in node_id


def test_the_rule_flags_an_escaped_id() -> None:
    assert _unselectable("tests/t.py::test_x['\\\\udc80']")
    assert _unselectable("tests/t.py::test_x[\udc80]")
    assert not _unselectable("tests/t.py::test_x[local-WITHIN_CHECKPOINT-trailing ..]")


def test_every_id_of_the_mutation_selection_can_be_selected_again() -> None:
    files = _selection()
    assert files, "pyproject.toml names no test files for mutmut"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    assert len(ids) > 1000, f"collected only {len(ids)} tests from {files}"
    bad = [i for i in ids if _unselectable(i)]
    assert not bad, f"ids pytest cannot select again (give them plain ids): {bad}"
