"""The Flink side of ``make bench-peers``: one Flink 2.3 job on pyflink's local MiniCluster,
its checkpoint directory listed as each checkpoint completes. Run only as a script by
``.venv-flink/bin/python`` (``bench.peers`` starts it in a child process with a timeout, as
``tests/fixtures/regen_flink.py`` runs each job); the main environment never imports it.

    python bench/peers_flink.py --conf JSON --rows N --checkpoints N --vocabulary N
        --work DIR --classes DIR

The job is ``bench.stream_scale``'s word count in Flink SQL: a datagen source at ``--rows``
rows per second (the checkpoint interval is 1 s, so about ``--rows`` rows per checkpoint, as
``ckpt stream`` takes ``--rows`` per micro-batch and one checkpoint a batch), each row's word
of rank ``floor(x)``, ``x`` drawn from the continuous power law of exponent 1.1 on
``[1, vocabulary + 1)`` by inverting its distribution function on a uniform draw
(``pipeline/stream/words.py`` inverts the same law on ``[0.5, vocabulary + 0.5)``, rank
``floor(x - 0.5)``, on a draw from a hash of the row's value: the same skew up to the rounding
of the low ranks, but random here rather than a function of the row, so a replay would draw
other words), counted per 5 s tumbling window of
event time (``LOCALTIMESTAMP``, watermark 0 s; ``ckpt stream`` advances event time 1 s a
batch) by a window table-valued function, on RocksDB with incremental checkpoints.

Prints one JSON object on stdout: the job id, the checkpoint directory, each observed
completed checkpoint's id and listing, the listing as the next checkpoint was triggered (its
``chk-N`` directory appears: the coordinator makes it before the barriers go out) and the
handles of the latest checkpoint's ``_metadata``, read by Flink's own classes
(``FlinkTruthDump``, ``regen_flink.load``).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REGEN = HERE.parent / "tests" / "fixtures" / "regen_flink.py"
EXPONENT = 1.1
POLL_S = 0.02


@functools.cache
def regen_flink() -> ModuleType:
    """The fixture generator's helpers (the truth loader, ``completed_ids``): a script, not a
    package module, so loaded by path."""
    spec = importlib.util.spec_from_file_location("regen_flink", REGEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def word_sql(vocabulary: int) -> str:
    """The word of a uniform draw ``u`` in [0, 1): rank ``floor(x) - 1`` where
    ``x = (1 - u (1 - (V + 1)^(1 - s)))^(1 / (1 - s))`` has density proportional to
    ``x^-s`` on [1, V + 1); named as ``words.word_name`` names it."""
    tail = (vocabulary + 1) ** (1 - EXPONENT)
    rank = (
        f"CAST(FLOOR(POWER(1 - u * {1 - tail!r}, {1 / (1 - EXPONENT)!r})) AS BIGINT) - 1"
    )
    return (
        f"CASE WHEN {rank} < 100000 THEN CONCAT('w', LPAD(CAST({rank} AS STRING), 5, '0'))"
        f" ELSE CONCAT('w', CAST({rank} AS STRING)) END"
    )


def statements(rows: int, vocabulary: int) -> list[str]:
    return [
        "CREATE TABLE src (u DOUBLE, ts AS LOCALTIMESTAMP, WATERMARK FOR ts AS ts) WITH ("
        f"'connector' = 'datagen', 'rows-per-second' = '{rows}', "
        "'fields.u.kind' = 'random', 'fields.u.min' = '0', 'fields.u.max' = '0.999999999')",
        "CREATE TABLE snk (window_start TIMESTAMP(3), word STRING, cnt BIGINT) "
        "WITH ('connector' = 'blackhole')",
        f"CREATE VIEW words AS SELECT {word_sql(vocabulary)} AS word, ts FROM src",
    ]


INSERT = (
    "INSERT INTO snk SELECT window_start, word, COUNT(*) FROM "
    "TABLE(TUMBLE(TABLE words, DESCRIPTOR(ts), INTERVAL '5' SECOND)) "
    "GROUP BY window_start, window_end, word"
)


def listing(job_dir: Path) -> dict[str, int]:
    """The state files (every file but ``_metadata``) under the job's directory. Flink deletes
    subsumed checkpoints while the walk runs: a directory or file gone meanwhile is left out
    (``os.walk`` skips a directory it cannot list)."""
    out: dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(job_dir):
        for n in names:
            if n == "_metadata":
                continue
            p = Path(dirpath) / n
            try:
                out[str(p.relative_to(job_dir))] = p.stat().st_size
            except FileNotFoundError:
                continue
    return out


def watch(client: Any, job_dir: Path, checkpoints: int, timeout_s: float) -> dict[str, Any]:
    """Poll until checkpoint ``checkpoints`` completed, listing the directory at each
    completion seen, then once more when the next checkpoint's directory appears."""
    rf = regen_flink()
    ids: list[int] = []
    listings: list[dict[str, int]] = []
    seen_at: list[float] = []
    deadline = time.monotonic() + timeout_s
    while not ids or ids[-1] < checkpoints:
        done = rf.completed_ids(job_dir)
        if done and (not ids or max(done) > ids[-1]):
            listings.append(listing(job_dir))
            ids.append(max(done))
            seen_at.append(time.monotonic())
            continue
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ids)} checkpoint(s) completed within {timeout_s:.0f} s")
        status = str(client.get_job_status().result())
        if status in ("FAILED", "CANCELED", "FINISHED"):
            raise SystemExit(f"the job is {status} after checkpoints {ids}")
        time.sleep(POLL_S)
    before_next: dict[str, int] | None = None
    nxt = job_dir / f"chk-{ids[-1] + 1}"
    until = time.monotonic() + 10
    while time.monotonic() < until:
        if nxt.is_dir():
            before_next = listing(job_dir)
            break
        time.sleep(POLL_S / 4)
    # The datagen source's rows per second are a ceiling: on a busy machine a checkpoint
    # interval may hold fewer rows, and checkpoints further apart than 1 s show it.
    between = (seen_at[-1] - seen_at[0]) / (ids[-1] - ids[0]) if ids[-1] > ids[0] else None
    return {"ids": ids, "listings": listings, "before_next": before_next,
            "seconds_per_checkpoint": between}


def cancel(client: Any) -> None:
    client.cancel().result()
    # The local executor shuts its MiniCluster down once the job is terminal: a status query
    # that fails with "shut down" means the job ended (as regen_flink's run_job reads it).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if str(client.get_job_status().result()) == "CANCELED":
                return
        except Exception as e:
            if "shut down" in str(e):
                return
            raise
        time.sleep(0.2)
    raise SystemExit("the job did not reach CANCELED within 60 s")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conf", required=True, help="the Flink configuration, a JSON object")
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--vocabulary", type=int, required=True)
    ap.add_argument("--checkpoints", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--work", type=Path, required=True, help="holds ckpt/ and tmp/")
    ap.add_argument("--classes", type=Path, required=True, help="FlinkTruthDump's classes")
    ns = ap.parse_args(argv)
    import pyflink
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    ckpt, tmp = ns.work / "ckpt", ns.work / "tmp"
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    conf = {
        **json.loads(ns.conf),
        "execution.checkpointing.dir": ckpt.as_uri(),
        "io.tmp.dirs": str(tmp),
    }
    c = Configuration()
    for k, v in conf.items():
        c.set_string(k, str(v))
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(c).build()
    t_env = TableEnvironment.create(settings)
    for stmt in statements(ns.rows, ns.vocabulary):
        t_env.execute_sql(stmt)
    client = t_env.execute_sql(INSERT).get_job_client()
    assert client is not None
    job_dir = ckpt / str(client.get_job_id())
    seen = watch(client, job_dir, ns.checkpoints, ns.timeout)
    cancel(client)
    rf = regen_flink()
    lib = Path(pyflink.__file__).resolve().parent / "lib"
    classpath = f"{lib}/*:{ns.classes}"
    if not (ns.classes / "FlinkTruthDump.class").is_file():
        classpath = rf.compile_dumper(lib, ns.classes)
    last = job_dir / f"chk-{seen['ids'][-1]}"
    handles: list[dict[str, Any]] | None = None
    error = ""
    try:
        (got,) = rf.load(classpath, [(last / "_metadata", "file:" + str(last))])
        handles = got["handles"]
    except Exception as e:  # the row says why its amplification is n/a
        error = f"{type(e).__name__}: {e}"
    print(json.dumps({"job_dir": str(job_dir), **seen, "handles": handles,
                      "load_error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
