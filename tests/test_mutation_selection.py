"""The tests ``make mutate`` hands mutmut must be selectable by their ids.

mutmut records the id of every test that reaches a mutated function and later passes those
ids back to pytest. pytest escapes an id that is not plain ASCII (a lone surrogate becomes
``\\udc80``) and cannot select it again, and mutmut then counts the usage error of each
mutant's run as a kill: one such parameter makes a whole run report every mutant killed
(issue 14). So every id of the selection is plain printable ASCII without a backslash.

The ``-k`` expression of ``pytest_add_cli_args`` leaves out the S3 tests, the local crash
sweeps, the tests over processes and the live mode. ``-k`` matches any substring of a test's
name and id, so "not s3" also drops a test whose id merely holds "s3" (such as
``test_path_outside_base[s3://bucket/x-absolute]``, or a generated id such as
``<lambda>-words3``), and its hostile inputs never meet a mutant of the decoder. So every
test the expression leaves out must name what it means to leave out.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _config() -> dict[str, list[str]]:
    config: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "mutmut"
    ]
    return config


def _selection() -> list[str]:
    return _config()["pytest_add_cli_args_test_selection"]


def _collect(files: list[str], *args: str) -> list[str]:
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
            *args,
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "::" in line]


# What the -k expression means to leave out: "s3" as a word of its own (``[s3-...]``,
# ``test_s3_...``, ``..._on_s3_...``, not ``words3`` nor an ``s3://`` path in an id), the
# local crash sweeps, the tests over processes and the live mode.
_MEANT = re.compile(
    r"(?<![a-z0-9])s3(?![a-z0-9:])|crash_sweep|crash_between|overprocess|live_mode", re.I
)


def _unselectable(node_id: str) -> bool:
    return not node_id.isascii() or not node_id.isprintable() or "\\" in node_id


def test_the_rule_flags_an_escaped_id() -> None:
    assert _unselectable("tests/t.py::test_x['\\\\udc80']")
    assert _unselectable("tests/t.py::test_x[\udc80]")
    assert not _unselectable("tests/t.py::test_x[local-WITHIN_CHECKPOINT-trailing ..]")


def test_the_rule_flags_a_test_left_out_by_a_substring() -> None:
    assert _MEANT.search("tests/t.py::test_x[s3-WITHIN_CHECKPOINT]")
    assert _MEANT.search("tests/t.py::test_s3_refuses_bad_metadata[x]")
    assert _MEANT.search("tests/t.py::test_across_checkpoint_on_s3_is_refused")
    assert not _MEANT.search("tests/t.py::test_x[<lambda>-words3]")
    assert not _MEANT.search("tests/t.py::test_path_outside_base[s3://bucket/x-absolute]")


def test_the_k_expression_leaves_out_only_what_it_names() -> None:
    files = _selection()
    args = _config()["pytest_add_cli_args"]
    expression = args[args.index("-k") + 1]
    left_out = set(_collect(files)) - set(_collect(files, "-k", expression))
    assert left_out, f"-k {expression!r} leaves out no test: is it still needed?"
    wrong = sorted(i for i in left_out if not _MEANT.search(i))
    assert not wrong, f"-k {expression!r} also leaves out (give them other ids): {wrong}"


def test_every_id_of_the_mutation_selection_can_be_selected_again() -> None:
    files = _selection()
    assert files, "pyproject.toml names no test files for mutmut"
    ids = _collect(files)
    assert len(ids) > 1000, f"collected only {len(ids)} tests from {files}"
    bad = [i for i in ids if _unselectable(i)]
    assert not bad, f"ids pytest cannot select again (give them plain ids): {bad}"
