"""The TLA+ syntax check (model_tests/tla_syntax.py): every module in tla/ parses, and the
check does fail on a broken module. Syntax only: TLC is not run by these tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_tests.tla_syntax import LABEL, check, main, parse_text, tla_files

MODULES = tla_files()

GOOD = """---- MODULE Good ----
EXTENDS Naturals, FiniteSets, Sequences, TLC
CONSTANT N
VARIABLES x, f
vars == <<x, f>>
Put(g, k, v) == [y \\in DOMAIN g \\cup {k} |-> IF y = k THEN v ELSE g[y]]
RECURSIVE Sum(_, _)
Sum(Op(_, _), S) == IF S = {} THEN 0 ELSE LET e == CHOOSE y \\in S : TRUE
                                          IN  Op(e, 0) + Sum(Op, S \\ {e})
Init == x = 0 /\\ f = [i \\in 1..N |-> [a |-> 0, b |-> {}]]
Step(i) == /\\ x < N
           /\\ LET r == f[i] IN f' = [f EXCEPT ![i].a = @ + 1, ![i].b = r.b \\cup {x}]
           /\\ x' = Sum(LAMBDA a, b : a + b, {x, 1})
Next == \\E i \\in 1..N : Step(i)
Spec == Init /\\ [][Next]_vars
Inv == \\A i \\in DOMAIN f : Cardinality({j \\in f[i].b : j >= 0}) <= x
====
"""


def test_the_tla_folder_has_the_spec_the_wrapper_and_three_must_fail_models() -> None:
    names = {p.name for p in MODULES}
    assert {"CheckpointOwnership.tla", "MCCheckpointOwnership.tla"} <= names
    assert len(names - {"CheckpointOwnership.tla", "MCCheckpointOwnership.tla"}) >= 3


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_module_parses(path: Path) -> None:
    [result] = check([path])
    assert result.ok, result.describe()
    assert result.describe().endswith("syntax only: parsed")


def test_the_constructs_the_spec_uses_parse() -> None:
    assert parse_text(GOOD) is None


@pytest.mark.parametrize(
    "broken",
    [
        GOOD.replace("Inv == \\A", "Inv == /\\ 1 +"),  # an expression cut short
        GOOD.replace("![i].a = @ + 1", "![i].a = @ + 1 ]]"),  # unbalanced brackets
        GOOD.replace("IN  Op(e, 0)", "Op(e, 0)"),  # LET without IN
        GOOD.replace("====\n", ""),  # no end of module
    ],
    ids=["cut-short", "brackets", "let-without-in", "no-end"],
)
def test_broken_text_is_rejected(broken: str) -> None:
    error = parse_text(broken)
    assert error is not None


def test_main_reports_syntax_only_and_fails_on_a_broken_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "Good.tla", tmp_path / "Bad.tla"
    good.write_text(GOOD)
    bad.write_text(GOOD.replace("Inv == \\A", "Inv == /\\ 1 +"))
    assert main([str(good)]) == 0
    assert main([str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert LABEL in out and "TLC not run" in out
    assert "Good.tla: syntax only: parsed" in out
    assert "Bad.tla: syntax only: PARSE ERROR" in out
