"""The exhaustive search finds no violation within small bounds, and it catches every
must-fail twin of model_tests/twins.py (a known bug swapped in by test code)."""

from __future__ import annotations

import pytest

from model_tests.explore import Bounds, explore, main, report, twin_bounds
from model_tests.twins import TWINS, swapped_in
from spec.config import MergingMode


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_no_violation_in_any_state_within_small_bounds(mode: MergingMode) -> None:
    r = explore(Bounds("test", mode, max_checkpoints=2, max_depth=6))
    assert r.violations == (), report(r)
    assert r.states > 500 and r.depth == 6


@pytest.mark.parametrize("name", sorted(TWINS))
def test_every_must_fail_twin_is_caught(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A known bug swapped into the model is found within its bounds, with the invariant
    it breaks; the command line (``make verify TWIN=...``) exits 1 for it."""
    twin = TWINS[name]
    assert main(["--twin", name]) == 1
    out = capsys.readouterr().out
    assert f"twin {name}: caught" in out and "VIOLATION" in out
    message = out.split("VIOLATION: ", 1)[1].splitlines()[0]
    assert f"{twin.breaks}:" in message, message


def test_the_twins_leave_the_model_as_it_was() -> None:
    """Swapping a twin in is undone on leaving the block: the model passes again."""
    for name in TWINS:
        with swapped_in(name):
            pass
    r = explore(twin_bounds(TWINS["flink-38347"]))
    assert r.violations == (), report(r)
