"""``bench.stream_goals.judge``: each goal of issue 35 met, missed or not measured, from
the median rows ``make bench-stream`` prints, and ``judge_large`` from the summary
``make bench-stream-large`` writes (no Spark here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.stream_goals import judge, judge_large, judge_working, large_goal


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


LARGE = "large state (>= 1 GiB), cost per record flat within 1.5x"


def _large(ratio: float | None, peak: float | None) -> dict[str, Any]:
    return {"cost_ratio": ratio, "live_db_bytes_peak": peak}


def test_the_large_state_goal_is_judged_on_the_cost_ratio_at_1_gib_or_more() -> None:
    gib = 1 << 30
    met = judge_large(_large(1.49, 1.2 * gib))
    assert (met["goal"], met["verdict"]) == (LARGE, "met")
    assert "1.49x" in met["figures"] and "1.20 GiB" in met["figures"]
    assert judge_large(_large(1.51, 1.2 * gib))["verdict"] == "missed"
    assert judge_large(_large(3.0, gib))["verdict"] == "missed"


def test_the_large_state_goal_is_not_measured_without_a_run_or_below_1_gib() -> None:
    assert judge_large(None)["verdict"] == "not measured"
    assert judge_large(_large(None, 2 << 30))["verdict"] == "not measured"
    assert judge_large(_large(1.0, None))["verdict"] == "not measured"  # working: no local DB
    small = judge_large(_large(1.0, 0.5 * (1 << 30)))
    assert small["verdict"] == "not measured" and "below 1 GiB" in small["figures"]
    reason = judge_large({"not_measured": "1 growth batches: at least 2 are needed"})
    assert reason["verdict"] == "not measured" and "at least 2" in reason["figures"]


def test_the_large_state_goal_reads_the_upload_backend_run_of_the_results_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "stream_large_results.json"
    assert large_goal(path)["verdict"] == "not measured"  # no file
    runs = [{"backend": "working", "summary": _large(1.0, 2 << 30)}]
    path.write_text(json.dumps({"runs": runs}))
    assert large_goal(path)["verdict"] == "not measured"  # no upload-backend run
    runs.append({"backend": "rocksdb", "summary": _large(2.0, 2 << 30)})
    path.write_text(json.dumps({"runs": runs}))
    assert large_goal(path)["verdict"] == "missed"


def _compared(bytes_ratio: float | None, restore_ratio: float | None, amp: float | None,
              *, same: bool = True) -> dict[str, Any]:
    return {"bytes_ratio": bytes_ratio, "restore_ratio": restore_ratio, "same_growth": same,
            "working_amplification_end": amp}  # fmt: skip


def test_the_working_backend_goals_are_judged_against_the_upload_run() -> None:
    names = [g["goal"] for g in judge_working(None)]
    assert names == [
        "working: >= 10x fewer bytes per checkpoint than upload",
        "working: restore after a worker kill >= 5x faster than upload",
        "working: amplification at the end <= 2.0",
    ]
    assert [g["verdict"] for g in judge_working(None)] == ["not measured"] * 3
    assert [g["verdict"] for g in judge_working(_compared(10.0, 5.0, 2.0))] == ["met"] * 3
    assert [g["verdict"] for g in judge_working(_compared(9.9, 4.9, 2.1))] == ["missed"] * 3
    partial = judge_working(_compared(0.5, None, None))
    assert [g["verdict"] for g in partial] == ["missed", "not measured", "not measured"]


def test_a_restore_on_a_smaller_working_state_is_not_judged() -> None:
    restore = judge_working(_compared(12.0, 50.0, 1.0, same=False))[1]
    assert restore["verdict"] == "not measured"
    assert "not the same state" in restore["figures"]
