"""Figure 5: the storage audit's throughput, Spark on ``local[2]`` against the same audit
in one Python process (``pipeline.single``), on one generated tree per size.

For each size (1e4, 1e5, 1e6 files; ``--quick``: 1e3, 1e4) ``pipeline.treegen`` writes a
checkpoint base once; then the two engines take turns on it (Spark first, then the single
process first, ...). A Spark run is ``audit_spark`` plus every table it produces written
to Spark's ``noop`` sink, so that it computes as much as the single-process audit does
(which builds every table). The SparkSession is started, and warmed on the smallest tree,
before any timing; its start-up is reported apart. Every run's answer is checked against
what the generator planted, and the two engines' summaries against each other: a fast
wrong answer is not a result.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Case, Figure, median, timed
from pipeline.location import Location
from pipeline.result import Summary
from pipeline.single import audit_single
from pipeline.treegen import Planted, generate

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)
GRACE = 3600.0


def _check(s: Summary, p: Planted, where: str) -> None:
    got = (s.files, s.orphans, s.pending, s.references, s.checkpoints, s.live_bytes, s.dangling)
    want = (p.files, p.orphans, p.pending, p.references, p.checkpoints, p.live_bytes, 0)
    if got != want:
        raise AssertionError(f"{where}: the audit answered {got}, the tree holds {want}")


def _same(a: Summary, b: Summary) -> None:
    x = {k: v for k, v in a.to_json().items() if k not in ("engine", "now")}
    y = {k: v for k, v in b.to_json().items() if k not in ("engine", "now")}
    if x != y:
        diff = sorted(k for k in x if x[k] != y[k])
        raise AssertionError(f"Spark and single-process summaries differ in {diff}")


def audit_throughput(
    repeats: int, quick: bool, tmp: str | None, log: Callable[[str], None]
) -> Figure:
    from pipeline.session import spark_session
    from pipeline.spark_audit import audit_spark

    sizes = QUICK_SIZES if quick else SIZES
    t0 = time.perf_counter()
    spark = spark_session("local[2]")
    startup = time.perf_counter() - t0
    log(f"  SparkSession local[2] started in {startup:.1f} s (not in any timing)")
    cases: list[Case] = []
    per_million: dict[str, dict[int, float]] = {"spark": {}, "single": {}}
    gen_seconds: dict[int, float] = {}
    work = Path(tempfile.mkdtemp(prefix="ckpt-audit-bench-", dir=tmp))
    try:
        for i, n in enumerate(sizes):
            root = work / f"n{n}"
            root.mkdir()
            g0 = time.perf_counter()
            planted = generate(root, n)
            gen_seconds[n] = round(time.perf_counter() - g0, 1)
            loc = Location.parse(str(root / "job-1"))
            results: dict[str, Summary] = {}

            def run_spark(
                loc: Location = loc,
                planted: Planted = planted,
                results: dict[str, Summary] = results,
            ) -> None:
                a = audit_spark(spark, loc, grace=GRACE)
                for df in a.frames.values():
                    df.write.format("noop").mode("overwrite").save()
                _check(a.summary, planted, f"spark, {loc.uri()}")
                results["spark"] = a.summary
                spark.catalog.clearCache()

            def run_single(
                loc: Location = loc,
                planted: Planted = planted,
                results: dict[str, Summary] = results,
            ) -> None:
                t = audit_single(loc, grace=GRACE)
                _check(t.summary, planted, f"single, {loc.uri()}")
                results["single"] = t.summary

            if i == 0:
                run_spark()  # JIT and Python workers warm, outside the timings
            reps = repeats if n < 1_000_000 else max(1, min(repeats, 3))
            samples: dict[str, list[float]] = {"spark": [], "single": []}
            for r in range(reps):
                order: list[tuple[str, Callable[[], None]]] = [
                    ("spark", run_spark),
                    ("single", run_single),
                ]
                for name, fn in order if r % 2 == 0 else reversed(order):
                    samples[name].append(timed(fn))
            _same(results["spark"], results["single"])
            sp, si = median(samples["spark"]), median(samples["single"])
            per_million["spark"][n] = sp * 1e6 / n
            per_million["single"][n] = si * 1e6 / n
            case = Case(
                label=f"{n:,} files",
                value=n / sp,
                baseline=n / si,
                ratio=si / sp,
                note=f"spark {sp:.2f} s, single {si:.2f} s (median of {reps}); "
                f"tree made in {gen_seconds[n]} s",
                samples={k: [round(x, 3) for x in v] for k, v in samples.items()},
            )
            cases.append(case)
            log(
                f"  {case.label}: spark {case.value:,.0f} files/s, single process "
                f"{case.baseline:,.0f} files/s, ratio {case.ratio:.2f} ({case.note})"
            )
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    big = cases[-1]
    small, large = sizes[-2], sizes[-1]
    growth = {k: round(v[large] / v[small], 2) for k, v in per_million.items()}
    linear = growth["spark"] <= 1.5
    return Figure(
        key="audit_throughput",
        title=f"storage audit, files/s at {sizes[-1]:,} files (Spark local[2])",
        unit="files/s",
        value=big.value,
        baseline=big.baseline,
        baseline_what="the same audit in one Python process (pipeline.single), same tree, same run",
        ratio=big.ratio,
        ratio_what="Spark speed / single-process speed at the largest size",
        goal=f"ratio >= 1.0 at {sizes[-1]:,} files, cost linear (seconds per file at "
        f"{large:,} <= 1.5x that at {small:,})",
        met=big.ratio >= 1.0 and linear,
        cases=cases,
        details={
            "spark_startup_seconds": round(startup, 1),
            "seconds_per_million_files": {
                k: {str(n): round(s, 2) for n, s in v.items()} for k, v in per_million.items()
            },
            "cost_growth_per_file_largest_vs_previous": growth,
            "linear": linear,
            "tree": "pipeline/treegen.py: 1 in 20 files exclusive, 1 in 50 orphaned, 1 in "
            "200 pending, 4 checkpoints, one 2 KiB segment per referenced 4 KiB file",
            "generation_seconds": {str(k): v for k, v in gen_seconds.items()},
        },
    )
