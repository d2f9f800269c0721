"""``bench.stream_goals.judge``: each goal of issue 35 met, missed or not measured, from
the median rows ``make bench-stream`` prints (no Spark here)."""

from __future__ import annotations

from typing import Any

from bench.stream_goals import judge


def _row(system: str, rows: int, rate: float, files: float | None,
         amp: float | None = None) -> dict[str, Any]:
    return {"system": system, "rows_per_batch": rows, "records_per_s": rate,
            "files_per_batch": files, "amplification_end": amp}  # fmt: skip


def _verdicts(table: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    return {(g["goal"], g["rows_per_batch"]): g["verdict"] for g in judge(table)}


def test_rates_are_judged_against_spark_from_1e5_and_against_ckpt_off_everywhere() -> None:
    table = [
        _row("ckpt", 1_000, 90, 1.7, 1.2), _row("ckpt-off", 1_000, 100, None),
        _row("native", 1_000, 200, 8.0),
        _row("ckpt", 1_000_000, 160, 1.7, 3.2), _row("ckpt-off", 1_000_000, 200, None),
        _row("native", 1_000_000, 100, 8.5), _row("native-changelog", 1_000_000, 110, 4.2),
    ]  # fmt: skip
    v = _verdicts(table)
    assert v[("records/s >= 0.9x ckpt-off", 1_000)] == "met"  # 0.90
    assert v[("records/s >= 0.9x ckpt-off", 1_000_000)] == "missed"  # 0.80
    assert ("records/s >= 1.0x native", 1_000) not in v  # no goal below 1e5
    assert v[("records/s >= 1.0x native", 1_000_000)] == "met"
    assert v[("stretch: records/s >= 1.5x native", 1_000_000)] == "met"  # 1.6
    assert v[("stretch: records/s >= 1.5x native-changelog", 1_000_000)] == "missed"  # 1.45
    files = "files/checkpoint below every Spark row, amplification <= 2.0"
    assert v[(files, 1_000)] == "met"  # 1.7 < 8.0 at 1.2
    assert v[(files, 1_000_000)] == "missed"  # fewer files, but amplification 3.2
    across = "ACROSS <= 0.5 files/checkpoint at amplification <= 2.0"
    assert v[(across, 1_000)] == "missed"


def test_a_goal_whose_figures_were_not_measured_is_never_met() -> None:
    v = _verdicts([_row("ckpt", 100_000, 100, None, None), _row("ckpt-off", 100_000, 0, None)])
    assert set(v.values()) == {"not measured"}
    assert ("records/s >= 1.0x native", 100_000) in v  # named, though native did not run
    files = "files/checkpoint below every Spark row, amplification <= 2.0"
    assert _verdicts([_row("ckpt", 10, 1, 0.4, 1.5)])[(files, 10)] == "not measured"
    across = "ACROSS <= 0.5 files/checkpoint at amplification <= 2.0"
    assert _verdicts([_row("ckpt", 10, 1, 0.4, 1.5)])[(across, 10)] == "met"
