"""``make bench-peers``: the FLIP-306 table, files and bytes per checkpoint of one logical job
on Flink 2.3, on ``ckpt stream`` and on Spark's own state store, counted the same way.

    python -m bench.peers [--rows 1e4] [--checkpoints 8] [--vocabulary 1000000]
        [--systems flink,ckpt,spark] [--flink-python .venv-flink/bin/python]
        [--timeout 300] [--flink-conf KEY=VALUE ...] [--out bench/peers_results.json]

The job: words from a Zipf vocabulary (exponent 1.1), counted per word in 5 s tumbling
event-time windows, parallelism 4, RocksDB state with incremental checkpoints, one checkpoint
retained, ``--rows`` rows per checkpoint, ``--checkpoints`` checkpoints. The rows:

- ``flink``: Flink 2.3.0's SQL of the job on pyflink's local MiniCluster (``bench/peers_flink.py``
  in ``.venv-flink``, one child process a row, killed at ``--timeout``; its docstring says how
  its words differ from ours), ``--rows`` rows per second and a checkpoint a second, file
  merging (FLIP-306) none, within and across checkpoints, each at a max file size of 32 MB
  and of 1 MB; Flink's default inline threshold (20 KB: smaller state goes into
  ``_metadata``, which no row counts);
- ``ckpt``: ``ckpt stream`` (``bench.stream_scale.run_ckpt``) in each merging mode at the
  default max file size (32 MiB), on Spark ``local[2]``, one checkpoint a micro-batch;
- ``spark``: ``groupBy(window, word).count()`` on Spark's RocksDB state store provider, its
  changelog off (``native``) and on (``native-changelog``) (``bench.stream_scale.run_native``).

Every figure comes from listing storage. Files per checkpoint: the state files each checkpoint
created, from the second checkpoint on (Flink: its directory listed as each checkpoint
completes; ``ckpt``: listed by the job after each), except Spark's, which is every file
under ``state/`` at the end over the batches, ``.crc`` sidecars apart (it deletes none within
100 batches, so that is what each batch created, the first included). Bytes per checkpoint:
the state bytes held at the end over the checkpoints taken. Amplification at the end: the
state bytes held over the bytes the latest checkpoint refers to, where the latest checkpoint's
own metadata says what it refers to: Flink's ``_metadata`` read by Flink's classes
(``FlinkTruthDump``; each segment or file once), ``ckpt``'s own; Spark's store metadata is not
read here, so its cells say n/a. Flink's "end" is the moment the next checkpoint is triggered
(``bench.peers_count.held_at_end``), ``ckpt``'s once its TMs heard of the last subsume. A row
that could not run says why in its note, with no figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import REPO, cell, machine_info
from bench.peers_count import Counted, count_flink
from bench.stream_scale import Sample, run_ckpt, run_native

SYSTEMS = ("flink", "ckpt", "spark")
FLINK_SCRIPT = REPO / "bench" / "peers_flink.py"
FLINK_ROWS: tuple[tuple[str, str | None], ...] = (
    ("none", None), ("within", "32MB"), ("within", "1MB"), ("across", "32MB"), ("across", "1MB"),
)  # fmt: skip
"""Flink's merging mode and max file size of each row (the size is moot without merging)."""


@dataclass
class Row:
    system: str
    mode: str
    checkpoints: int | None
    files_per_checkpoint: float | None
    bytes_per_checkpoint: float | None
    amplification_end: float | None
    seconds: float
    note: str = ""
    seconds_per_checkpoint: float | None = None
    """Flink's: between the first and the last completion seen (its interval is 1 s)."""


def failed(system: str, mode: str, seconds: float, why: str) -> Row:
    return Row(system, mode, None, None, None, None, seconds, why)


def flink_conf(merging: str, max_file_size: str | None) -> dict[str, str]:
    """The Flink 2.3 configuration of a row (keys as CheckpointingOptions names them)."""
    conf = {
        "parallelism.default": "4",
        "execution.runtime-mode": "streaming",
        "restart-strategy.type": "none",
        "execution.checkpointing.interval": "1 s",
        "execution.checkpointing.num-retained": "1",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.file-merging.enabled": str(merging != "none").lower(),
        "execution.checkpointing.file-merging.across-checkpoint-boundary": str(
            merging == "across"
        ).lower(),
        "taskmanager.memory.managed.size": "256m",
    }
    if max_file_size is not None:
        conf["execution.checkpointing.file-merging.max-file-size"] = max_file_size
    return conf


def flink_mode(merging: str, max_file_size: str | None) -> str:
    return merging if max_file_size is None else f"{merging} {max_file_size}"


def last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no output"


def row_of(system: str, mode: str, counted: Counted, seconds: float) -> Row:
    return Row(
        system, mode, counted.checkpoints, counted.files_per_checkpoint,
        counted.bytes_per_checkpoint, counted.amplification_end, seconds, counted.note,
    )  # fmt: skip


def run_flink(
    python: Path, merging: str, max_file_size: str | None, args: argparse.Namespace, root: Path
) -> Row:
    """One Flink row in a child process of its own session, so that a timeout kills its JVM
    too (pyflink's gateway JVM is the child's child)."""
    mode = flink_mode(merging, max_file_size)
    started = time.monotonic()
    if not python.is_file():
        return failed("flink", mode, 0.0, f"{python} is missing (make .venv-flink/.installed)")
    work = Path(tempfile.mkdtemp(prefix=f"flink-{merging}-", dir=root))
    log = work / "job.log"
    conf = {**flink_conf(merging, max_file_size), **dict(args.flink_conf)}
    cmd = [
        str(python), str(FLINK_SCRIPT), "--conf", json.dumps(conf),
        "--rows", str(args.rows), "--vocabulary", str(args.vocabulary),
        "--checkpoints", str(args.checkpoints), "--timeout", str(args.timeout),
        "--work", str(work), "--classes", str(root / "classes"),
    ]  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            out, timed_out = b"", True
        finally:
            # The child's session: its JVM too, should one outlive it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if timed_out:
        return failed("flink", mode, time.monotonic() - started,
                      f"timed out after {args.timeout + 60:.0f} s")  # fmt: skip
    seconds = time.monotonic() - started
    if proc.returncode != 0 or not out.strip():
        return failed("flink", mode, seconds,
                      f"exit {proc.returncode}: {last_line(log.read_text(errors='replace'))}")
    # The result is the child's last line (pyflink may print before it).
    got = json.loads(out.decode().strip().splitlines()[-1])
    counted = count_flink(
        got["listings"], got["ids"], got["before_next"], got["ids"][-1], got["handles"],
        got["job_dir"],
    )  # fmt: skip
    if got["load_error"]:
        counted = Counted(
            counted.checkpoints, counted.files_per_checkpoint, counted.bytes_per_checkpoint,
            None, f"{counted.note}; _metadata not loaded: {got['load_error'][:200]}".lstrip("; "),
        )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    row = row_of("flink", mode, counted, seconds)
    row.seconds_per_checkpoint = between = got["seconds_per_checkpoint"]
    if between is not None and between > 1.25:
        slow = (f"checkpoints {between:.1f} s apart (interval 1 s): up to {between:.1f}x"
                " --rows rows a checkpoint")
        row.note = f"{row.note}; {slow}" if row.note else slow
    return row


def run_spark_side(args: argparse.Namespace, root: Path, systems: Sequence[str]) -> list[Row]:
    """``ckpt``'s rows and Spark's, in one SparkSession (``local[2]``, as bench-stream)."""
    from pipeline.session import spark_session
    from spec.config import MergingMode

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[2]", app="bench-peers")
    # run_native stops its query with a batch in flight, which Spark logs as an error with a
    # stack trace; a run that fails raises, and its row says why.
    spark.sparkContext.setLogLevel("OFF")
    jobs: list[tuple[str, str, Callable[[Path], Sample]]] = []

    def ours(m: MergingMode) -> Callable[[Path], Sample]:
        return lambda tmp: run_ckpt(spark, args.rows, args.checkpoints, args.vocabulary, tmp,
                                    snapshot=True, merging=m)  # fmt: skip

    def native(changelog: bool) -> Callable[[Path], Sample]:
        return lambda tmp: run_native(spark, args.rows, args.checkpoints, args.vocabulary, tmp,
                                      changelog=changelog)  # fmt: skip

    if "ckpt" in systems:
        for m in MergingMode:
            mode = "none" if m is MergingMode.NONE else f"{m.value} 32MB"
            jobs.append(("ckpt", mode, ours(m)))
    if "spark" in systems:
        for changelog in (False, True):
            jobs.append(("spark", "native-changelog" if changelog else "native", native(changelog)))
    rows: list[Row] = []
    try:
        for system, mode, job in jobs:
            tmp = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=root))
            started = time.monotonic()
            try:
                s = job(tmp)
            except Exception as e:  # the row says why, the others still run
                rows.append(failed(system, mode, time.monotonic() - started,
                                   f"{type(e).__name__}: {str(e)[:300]}"))  # fmt: skip
                continue
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            note = "" if system == "ckpt" else (
                "files: all under state/ over the batches; amplification n/a: the store's "
                "metadata is not read")  # fmt: skip
            rows.append(Row(system, mode, args.checkpoints, s.files_per_batch,
                            s.bytes_per_batch, s.amplification_end,
                            time.monotonic() - started, note))  # fmt: skip
            print(f"  {system} {mode}: {rows[-1].seconds:.0f} s", flush=True)
    finally:
        spark.stop()
    return rows


def render(rows: Sequence[Row]) -> str:
    """The table: one line a row, n/a where a figure could not be told."""
    head = ("system", "mode", "ckpts", "files/ckpt", "bytes/ckpt", "amp end", "note")
    body = [
        (r.system, r.mode, cell(r.checkpoints, "d"), cell(r.files_per_checkpoint, ".1f"),
         cell(r.bytes_per_checkpoint, ",.0f"), cell(r.amplification_end, ".2f"), r.note)
        for r in rows
    ]  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)]
    right = {2, 3, 4, 5}

    def line(cols: Sequence[str]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(cols, widths, strict=False))]  # fmt: skip
        return ("  ".join(cells) + "  " + cols[-1]).rstrip()

    return "\n".join([line(head), *(line(b) for b in body)])


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=lambda x: int(float(x)), default=10_000,
                    help="rows per checkpoint (Flink: per second, a checkpoint a second)")
    ap.add_argument("--checkpoints", type=int, default=8)
    ap.add_argument("--vocabulary", type=lambda x: int(float(x)), default=1_000_000)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--flink-python", type=Path, default=REPO / ".venv-flink" / "bin" / "python")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for a Flink row")
    ap.add_argument("--flink-conf", action="append", default=[], type=key_value,
                    metavar="KEY=VALUE", help="a Flink option set in every Flink row, e.g."
                    " execution.checkpointing.file-merging.pool-blocking=true")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "peers_results.json")
    args = ap.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if set(systems) - set(SYSTEMS) or args.checkpoints < 3 or args.rows < 1:
        ap.error(f"systems among {SYSTEMS}, --checkpoints >= 3, --rows >= 1")
    started = time.time()
    machine = machine_info()
    load = os.getloadavg()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        root = Path(tmp)
        (root / "classes").mkdir()
        if "flink" in systems:
            for merging, size in FLINK_ROWS:
                rows.append(run_flink(args.flink_python, merging, size, args, root))
                print(f"  flink {rows[-1].mode}: {rows[-1].seconds:.0f} s", flush=True)
        if {"ckpt", "spark"} & set(systems):
            rows.extend(run_spark_side(args, root, systems))
    load_end = os.getloadavg()
    print()
    print(f"The FLIP-306 table: {args.rows:,} rows per checkpoint, {args.checkpoints}"
          f" checkpoints, vocabulary {args.vocabulary:,}, parallelism 4"
          + "".join(f", Flink {k}={v}" for k, v in args.flink_conf))
    print(render(rows))
    print(f"\nload average at the start {load[0]:.2f}, at the end {load_end[0]:.2f};"
          f" {time.time() - started:.0f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(
            {"machine": machine, "rows_per_checkpoint": args.rows,
             "flink_conf": dict(args.flink_conf),
             "checkpoints": args.checkpoints, "vocabulary": args.vocabulary,
             "load_start": list(load), "load_end": list(load_end),
             "seconds": time.time() - started, "rows": [asdict(r) for r in rows]},
            indent=1) + "\n")  # fmt: skip
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
