"""Every rule of SPEC.md is carried out by named code and tested by a named test; every
Flink bug of the design brief has a scenario; the table in SPEC.md is up to date."""

from __future__ import annotations

import re
from pathlib import Path

from model_tests import traceability as t

FLINK_BUGS = {
    "FLINK-38347",
    "FLINK-35803",
    "FLINK-36125",
    "FLINK-35570",
    "FLINK-35784",
    "FLINK-32086",
    "FLINK-35400",
    "FLINK-25395",
    "FLINK-26985",
    "FLINK-29913",
    "FLINK-35778",
}
"""BRIEF §6, as of this writing; checked against the brief itself where it is present."""


def test_every_rule_has_code_and_tests_and_the_table_is_current() -> None:
    assert t.problems(t.SPEC.read_text()) == []


def test_spec_numbers_rules_and_invariants() -> None:
    text = t.SPEC.read_text()
    rules = t.spec_rules(text)
    assert len(rules) == len(set(rules)) >= 50
    assert t.spec_invariants(text) == ["I1", "I2", "I3", "I4", "I5", "I6", "I7"]


def test_every_flink_bug_of_the_brief_has_a_scenario() -> None:
    _, bugs = t.test_references()
    assert bugs >= FLINK_BUGS
    brief = Path(t.ROOT).parent / "shared" / "BRIEF.md"
    if brief.exists():
        section = brief.read_text().split("## 6.", 1)[1].split("\n## ", 1)[0]
        assert set(re.findall(r"FLINK-\d+", section)) <= bugs


def test_the_table_has_the_fastimpl_tla_and_test_file_columns() -> None:
    text = t.SPEC.read_text()
    assert "| rule | reference model (and spec) | fastimpl | TLA+ | test files | tests |" in text
    assert "| invariant | predicate | TLA+ | test files | tests |" in text


def test_every_place_the_table_names_exists() -> None:
    """Read back from SPEC.md: every ``module.function`` is defined in that module, every
    TLA+ operator in a module of tla/, every test file and test function is there."""
    assert t.dangling(t.SPEC.read_text()) == []


def _row(text: str, rule: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {rule} |"))


def test_a_stale_name_in_any_column_is_reported() -> None:
    """A function renamed or moved (cluster.py split into modules), a TLA+ operator
    renamed, a test file moved: the table still naming the old place fails."""
    text = t.SPEC.read_text()
    row = _row(text, "R10")
    cells = row.strip().strip("|").split(" | ")
    header = ["rule", "reference model (and spec)", "fastimpl", "TLA+", "test files", "tests"]
    stale = {
        "reference model (and spec)": "refimpl/machine.no_such_function",
        "fastimpl": "fastimpl/no_such_module.write_state",
        "TLA+": "NoSuchOperator",
        "test files": "tests/test_no_such_file.py",
        "tests": "test_r10_no_such_test",
    }
    for column, bad in stale.items():
        broken = [*cells]
        broken[header.index(column)] = f"`{bad}`"
        found = t.dangling(text.replace(row, "| " + " | ".join(broken).strip() + " |"))
        assert found == [f"R10: {column} names `{bad}`, which does not exist"], found


def test_every_rule_without_a_tla_operator_says_why() -> None:
    """``TLA_ABSTRACTED`` lists exactly the rules no TLA+ operator names: a rule newly
    modelled, or a new rule left out of the model, fails here until the list says so."""
    text = t.SPEC.read_text()
    tla = t.tla_references()
    unmodelled = {r for r in t.spec_rules(text) if r not in tla}
    assert unmodelled == set(t.TLA_ABSTRACTED)
    for rule in unmodelled:
        assert f"{t.NOT_MODELLED}: {t.TLA_ABSTRACTED[rule]}" in _row(text, rule)


def test_tla_operators_are_found_by_their_comments() -> None:
    """The boxed comment before a definition names it; a ``\\*`` comment inside one names
    it; the header (followed by EXTENDS) and the comments on CONSTANT and VARIABLES
    name no operator."""
    tla = t.tla_references()
    assert {"WriterOk", "FinishedFor"} <= tla["R56"] | tla["R10"]
    assert "DoReuseWith" in tla["R20"]  # "\* R20: not reusable: upload ..."
    assert "NoDangling" in tla["I1"]
    assert not any(r in tla for r in ("R95", "R35"))  # only the header names them
    assert all(ops <= t.tla_operators() for ops in tla.values())
