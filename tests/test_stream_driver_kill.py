"""Issue 17's second correctness test: the driver of ``ckpt stream`` killed (SIGKILL) three
times and started again on the same run directory each time (``--resume``), with the
worker failures on as well: worker kills (``--kill-worker-prob``), speculation (a
straggler, on the two-host loopback cluster of ``tests.spark_cluster``) and a rescale from
2 to 3 subtasks. The driver dies

1. after batch 5's checkpoint completed, before Spark committed the batch (R96: Spark runs
   it again, and the recovered state already holds it);
2. while batch 9's snapshot tasks run (the TMs write checkpoint files as the application
   dies: the recovery deletes what the crashed job left unfinished);
3. after batch 9's windows are in the sink, before its checkpoint completed: the job the
   second restart recovered dies in its first batch, before its first checkpoint (the
   re-run replaces the sink's output).

Each restart recovers the store from the persisted ``_metadata`` (a new job that claims
the latest completed checkpoint) and Spark from its own offsets. The last one recovers
job-2, not job-3, which completed no checkpoint: job-3 is abandoned and its base deleted
(R96; recovering job-3 would start from nothing and lose every count before batch 9).
At the end: 14 batches, every closed window equal to the batch computation, the
invariants I1-I6 on the real files (the last run's), the storage audit of every job base
clean, and the command trace of the whole run (each restarted driver writes on the
crashed one's) replayed through the model and agreeing. ACROSS merging (the test of the
worker failures alone runs WITHIN). The driver runs in a subprocess.
It runs in the ``long`` profile: in ``ci`` the
driver is killed at R96's points in the harness (``test_stream_driver_kill_local``), a
crash at every storage operation is recovered (``test_recovery``), and the cluster's worker
kills, speculation and rescale run in ``test_stream_failures``."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

from model_tests.replay import replay
from pipeline.stream.source import RateSource
from pipeline.stream.windows import Windowing
from tests.profile import long_only
from tests.spark_cluster import LoopbackCluster
from tests.stream_run_checks import audit_bases, sink_against_batch

BATCHES = 14
ROWS, VOCABULARY, WINDOW_MS = 200, 200, 2000
DEATHS = ((5, "completed"), (9, "running"), (9, "sunk"))
ARGS = [
    "--parallelism", "2", "--batches", str(BATCHES), "--rows-per-batch", str(ROWS),
    "--vocabulary", str(VOCABULARY), "--window-ms", str(WINDOW_MS),
    "--write-buffer-size", "4096", "--merging", "across", "--num-retained", "1",
    "--rescale-at", "3:3", "--speculation", "--stall-at", "7:1:mid-upload",
    "--kill-worker-prob", "0.03", "--failure-seed", "7", "--no-audit", "--trace",
]  # fmt: skip


@long_only(
    "the driver killed on a cluster, four Spark applications; in ci the harness kills it"
    " (test_stream_driver_kill_local) and test_stream_failures runs the cluster's failures"
)
def test_r96_the_driver_killed_three_times_with_worker_failures_counts_every_record_once(
    loopback_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    seconds = []
    last = -1
    for n, (batch, point) in enumerate(DEATHS):
        extra = ["--die-at", f"{batch}:{point}", *(["--resume"] if n else [])]
        died, took = loopback_cluster.stream(run_dir, *ARGS, *extra)
        seconds.append(took)
        # the supervisor (tests.supervised) exits 128 + N for a command killed by signal N
        assert died.returncode == 128 + signal.SIGKILL, died.stdout[-4000:]
        out = died.stdout
        if n:
            assert f"driver restarted: job job-{n} recovered as job-{n + 1}" in out, out[-4000:]
            assert "parallelism 2 -> 3" not in out  # the recovered job runs at 3 already
        else:
            assert "parallelism 2 -> 3" in out, out[-4000:]
        # The batches this driver completed: from the one after the last run's, to the
        # one before its death (its own batch did not complete).
        assert f"batch {batch:>4}  " not in out, out[-4000:]
        if batch - 1 > last:
            assert f"batch {batch - 1:>4}  " in out, out[-4000:]
        if last >= 0 and last + 1 < batch:
            assert f"batch {last + 1:>4}  " in out, out[-4000:]
        if n and DEATHS[n - 1][1] == "completed":
            # Spark ran again the batch the state held (its checkpoint had completed).
            assert f"batch {last}: already in the latest completed checkpoint" in out
        last = batch - 1 if point != "completed" else batch
    figures = tmp_path / "figures.json"
    done, took = loopback_cluster.stream(run_dir, *ARGS, "--resume", "--json", str(figures))
    seconds.append(took)
    assert done.returncode == 0, done.stdout[-5000:]
    assert f"batch {last + 1:>4}  " in done.stdout and f"batch {BATCHES - 1:>4}  " in done.stdout
    run = json.loads(figures.read_text())
    # job-3 died in batch 9, its first: the state is job-2's checkpoint of batch 8
    assert (run["recovered"], run["abandoned"]) == ("job-2", ["job-3"])
    assert "recovered as job-4 (abandoned, no checkpoint: job-3)" in done.stdout
    assert run["violations"] == []
    assert run["comparison"]["equal"], run["comparison"]["mismatches"]
    # Independently of what the driver said: the sink against the batch computation, and
    # the audit of every job base (the rescale's old job, the last recovery's).
    cmp = sink_against_batch(
        run_dir, RateSource(ROWS, vocabulary=VOCABULARY), Windowing(WINDOW_MS), BATCHES
    )
    assert cmp.windows >= 5 and cmp.equal, (cmp.mismatches[:10], cmp.duplicates[:10])
    base = run_dir / "checkpoints"
    jobs = sorted(p.name for p in base.iterdir() if p.is_dir())
    assert jobs == [f"job-{n}" for n in range(len(DEATHS) + 2)], jobs
    audits = audit_bases(base)
    assert audits, jobs
    for job, s in audits.items():
        assert (s.orphans, s.dangling, s.corrupt_metadata) == (0, 0, 0), (job, s.verdict)
    # The command trace of the whole run: each restarted driver wrote on the crashed
    # one's (the crash of the job's TMs, their stop, a CLAIM restore into the new job).
    assert run["trace"] is not None and run["trace_stopped"] is None, run["trace_stopped"]
    lines = (run_dir / "work" / "trace.ndjson").read_text().splitlines()
    replayed = replay(lines)
    assert replayed.agrees and replayed.stopped is None, replayed.summary()
    assert replayed.commands == len(lines) - 1 == run["trace_commands"]
    restores = [c for x in lines[1:] if (c := json.loads(x)["command"])["type"] == "Restore"]
    assert [r["mode"] for r in restores[1:]] == ["claim"] * len(DEATHS), restores
    assert len(restores) == len(DEATHS) + 1 and restores[0]["num_tms"] == 3
    crashed = Counter(json.loads(x)["command"]["type"] for x in lines[1:])
    kills = run["kills"]  # every run's, as the killed tasks logged them
    assert kills, "no worker was killed"
    copies = run["speculative_copies"]  # the last run's listener
    points = ", ".join(f"{p} {n}" for p, n in sorted(Counter(k["point"] for k in kills).items()))
    print(
        f"\nissue 17, driver killed {len(DEATHS)} times"
        f" ({', '.join(f'batch {b} {p}' for b, p in DEATHS)}) on a loopback standalone cluster;"
        f" driver runs {', '.join(f'{s:.0f} s' for s in seconds)}: {BATCHES} micro-batches,"
        f" rescale 2 -> 3 after batch 3, jobs {', '.join(jobs)}; worker kills injected"
        f" {len(kills)} ({points}), every batch completed; speculative attempts of snapshot"
        f" tasks in the last run {len(copies)}; windows compared {cmp.windows}"
        f" ({cmp.counts} counts): equal; I1-I6 hold; audit:"
        f" {', '.join(f'{j} {s.files} files clean' for j, s in audits.items())};"
        f" the command trace of the whole run: {replayed.commands} commands agree with the"
        f" model ({crashed['ReplaceTm']} ReplaceTm, {crashed['CrashTm']} CrashTm,"
        f" {crashed['AttemptStopped']} AttemptStopped, {len(restores)} Restore)"
    )
