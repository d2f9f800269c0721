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
    assert t.spec_invariants(text) == ["I1", "I2", "I3", "I4", "I5", "I6"]


def test_every_flink_bug_of_the_brief_has_a_scenario() -> None:
    _, bugs = t.test_references()
    assert bugs >= FLINK_BUGS
    brief = Path(t.ROOT).parent / "shared" / "BRIEF.md"
    if brief.exists():
        section = brief.read_text().split("## 6.", 1)[1].split("\n## ", 1)[0]
        assert set(re.findall(r"FLINK-\d+", section)) <= bugs
