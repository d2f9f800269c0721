"""The exhaustive search finds no violation within small bounds, and it does catch a
buggy rule swapped in by the test (the off-by-one subsume watermark)."""

from __future__ import annotations

import pytest

from model_tests.explore import Bounds, explore, report
from refimpl.machine import _Work
from spec.config import MergingMode
from spec.ids import TmId


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_no_violation_in_any_state_within_small_bounds(mode: MergingMode) -> None:
    r = explore(Bounds("test", mode, max_checkpoints=2, max_depth=6))
    assert r.violations == (), report(r)
    assert r.states > 500 and r.depth == 6


def test_off_by_one_watermark_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = _Work.tm_complete

    def subsume_one_too_many(
        self: _Work, tm: TmId, checkpoint: int, watermark: int, savepoint: bool
    ) -> None:
        original(self, tm, checkpoint, watermark + 1, savepoint)

    monkeypatch.setattr(_Work, "tm_complete", subsume_one_too_many)
    r = explore(Bounds("twin", MergingMode.WITHIN_CHECKPOINT, max_checkpoints=2, max_depth=6))
    assert r.violations, "the buggy watermark went unnoticed"
    message, _trail = r.violations[0]
    assert "I1" in message and "missing file" in message  # a retained checkpoint lost data
