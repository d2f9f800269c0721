"""``make bench-rescale``: a rescale's restore of the streaming job's RocksDB state
(``snapshot.restore_key_groups``) against the key-by-key copy it replaced.

    python -m bench.rescale_restore [--keys 8e6] [--rounds 3]
        [--write-buffer-mb 64] [--work DIR] [--out FILE] [--no-verify]

The state: ``--keys`` keys ``rocks.encode_key(group, window start, word)`` in tumbling
windows of ``PER_WINDOW`` keys (as ``bench.stream_large``'s: each window holds a uniform
draw of distinct words from a vocabulary of 1e6, the word's key group its CRC-32 over
the 128 key groups, the value an 8-byte count), written window by window, one
WriteBatch per window and subtask as the job's ``WindowCounts.add``, into the RocksDBs
of two jobs at once: one at parallelism 4 and one at parallelism 2, each subtask's DB
holding the keys of its key groups (the job's options: ``rocks.options``, a memtable of
``--write-buffer-mb``, auto compactions, bloom filters). Each job's DBs are checkpointed
as the job does it (``snapshot.take_snapshot`` through a worker's TM to a coordinator
on a local directory, ACROSS merging as ``bench.stream_large``), and the coordinator
rescales (NO_CLAIM): 4 -> 2 and 2 -> 4. A restore is each new subtask's DB built from its
restore assignment (``restore_assignment``, read through ``recipe.reader()`` as a worker
reads it), one subtask after another; its time is the sum over the new subtasks (and
the slowest subtask's, which is what the job waits for when they run side by side).

Each round times, in this order, 4 -> 2 by the key-by-key copy (``restore_key_by_key``,
the baseline, kept here and not in the product), 4 -> 2 by ``restore_key_groups``, then
2 -> 4 the same way: interleaved A B A B, so that a change of load or of the page cache
falls on both. The claim is the ratio of the medians (baseline over new), with the load
average at every sample. After the first round (``--verify``, on by default), every new
subtask's DB built both ways is compared key by key: the same keys and values.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rocksdict

from bench.common import machine_info
from bench.stream_scale import ckpt_config
from pipeline.stream.checkpointing import VERTEX, StateSource, decode_assignment
from pipeline.stream.coordination import SparkCoordinator, open_coordinator
from pipeline.stream.rocks import LAYOUT, WindowCounts, encode_key, group_ranges, options
from pipeline.stream.snapshot import (
    file_of,
    restore,
    restore_key_groups,
    take_snapshot,
)
from pipeline.stream.words import MAX_PARALLELISM, word_name
from spec.config import RestoreMode, StateKind
from spec.handles import StateEntry
from spec.ids import SubtaskId
from spec.keygroups import key_group_range, operator_for_key_group

VOCABULARY = 1_000_000
PER_WINDOW = 500_000
"""Keys a window holds: about what ``bench.stream_large``'s 1e6 uniform draws from 1e6
words give (632,000 distinct)."""
WINDOW_MS = 1000
_COUNT = (1).to_bytes(8, "big")

Restorer = Callable[
    [StateSource, Sequence[StateEntry], Path, tuple[int, int], rocksdict.Options], int
]


def restore_key_by_key(
    party: StateSource,
    entries: Sequence[StateEntry],
    target: Path,
    groups: tuple[int, int],
    opt: rocksdict.Options,
) -> int:
    """The baseline: a rescale's restore as the job did it before ``restore_key_groups``
    took a base DB. Every old DB is downloaded and opened, and its keys of ``groups`` (its
    key ranges, ``snapshot.group_ranges``) are copied out one by one in Python (key, value,
    put, next per key) into one WriteBatch per old DB, written into a new DB. The number
    of keys copied (every key of the new DB). ``tests/test_stream_snapshot.py`` holds
    ``restore_key_groups`` to its result."""
    by_lineage: dict[str, list[StateEntry]] = {}
    for e in entries:
        if e.kind in (StateKind.KEYED_SHARED, StateKind.KEYED_FULL):
            file_of(e)
            by_lineage.setdefault(e.name.split("/")[1], []).append(e)
    part = target.with_name(target.name + ".part")
    copied = 0
    try:
        new = rocksdict.Rdict(str(part), opt)
        try:
            for lineage, old_entries in sorted(by_lineage.items()):
                old_dir = target.with_name(f"{target.name}.old-{lineage}")
                restore(party, old_entries, old_dir)
                try:
                    old = rocksdict.Rdict(str(old_dir), opt)
                    try:
                        batch = rocksdict.WriteBatch(raw_mode=True)
                        for lo, hi in group_ranges(old, groups):
                            it = old.iter()
                            it.seek(lo)
                            while it.valid() and it.key() < hi:
                                batch.put(it.key(), it.value())
                                copied += 1
                                it.next()
                        new.write(batch)
                    finally:
                        old.close()
                finally:
                    shutil.rmtree(old_dir, ignore_errors=True)
            new.flush(True)
        finally:
            new.close()
        os.rename(part, target)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    return copied


ALGORITHMS: dict[str, Restorer] = {
    "key-by-key": restore_key_by_key,
    "restore_key_groups": restore_key_groups,
}


@dataclass
class OldJob:
    """One job's checkpointed state and its coordinator, rescaled to ``to``."""

    parallelism: int
    to: int
    coordinator: SparkCoordinator
    dbs: list[WindowCounts]
    assignments: list[tuple[StateEntry, ...]] = field(default_factory=list)
    state_bytes: int = 0
    """Bytes of the old DBs' SSTs (what the checkpoint holds of them)."""

    @property
    def owners(self) -> list[int]:
        """The old subtask of each key group."""
        return [
            operator_for_key_group(MAX_PARALLELISM, self.parallelism, g)
            for g in range(MAX_PARALLELISM)
        ]


@dataclass
class Sample:
    direction: str
    algorithm: str
    round: int
    seconds: float
    slowest_subtask: float
    subtask_seconds: list[float]
    copied: list[int]
    new_db_bytes: int
    load: float


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(work: Path, jobs: list[OldJob], keys: int, write_buffer: int) -> int:
    """The two jobs' DBs (appended to ``jobs``) filled with the same keys, window by
    window; the number of keys written."""
    rng = np.random.default_rng(35)
    words = [word_name(r) for r in range(VOCABULARY)]
    groups = [zlib.crc32(w.encode()) % MAX_PARALLELISM for w in words]
    opt = options(write_buffer_size=write_buffer)
    for parallelism, to in ((4, 2), (2, 4)):
        co = open_coordinator(str(work / f"base-{parallelism}"), ckpt_config(), parallelism)
        dbs = [WindowCounts(work / f"db-{parallelism}-{i}", opt) for i in range(parallelism)]
        jobs.append(OldJob(parallelism, to, co, dbs))
    windows = -(-keys // PER_WINDOW)
    written = 0
    for w in range(windows):
        # A window's distinct words in arrival order: a uniform draw, as stream_large's.
        drawn = rng.permutation(np.unique(rng.integers(0, VOCABULARY, size=2 * PER_WINDOW)))
        ranks: list[int] = drawn[: min(PER_WINDOW, keys - written)].tolist()
        start = w * WINDOW_MS
        encoded = [(groups[r], encode_key(groups[r], start, words[r])) for r in ranks]
        written += len(encoded)
        for job in jobs:
            batches = [rocksdict.WriteBatch(raw_mode=True) for _ in job.dbs]
            of_group = [batches[owner] for owner in job.owners]
            for g, key in encoded:
                of_group[g].put(key, _COUNT)
            for db, batch in zip(job.dbs, batches, strict=True):
                db.db.write(batch)
        print(f"  window {w + 1}/{windows}: {written:,} keys", flush=True)
    return written


def checkpoint_and_rescale(job: OldJob, scratch: Path) -> None:
    """Checkpoint every old DB as a subtask's batch does, complete, rescale (NO_CLAIM)."""
    co = job.coordinator
    c = co.trigger()
    recipe = co.task_manager_recipe()
    for i, db in enumerate(job.dbs):
        s = SubtaskId(VERTEX, i, job.parallelism)
        party = recipe.open(None, s, c)
        party.apply_mail(co.mail())
        take_snapshot(db, party, c, s, lineage=f"{LAYOUT}-p{job.parallelism}s{i}", base={},
                      scratch=scratch, operator_state=b"{}")  # fmt: skip
        co.receive(party.acknowledge(c, s), party.report())
        party.close()
        job.state_bytes += sum(int(f["size"]) for f in db.db.live_files())
        db.close()
    co.complete(c)
    co.settle()
    co.rescale(job.to, RestoreMode.NO_CLAIM)
    job.assignments = [
        decode_assignment(co.restore_assignment(SubtaskId(VERTEX, i, job.to), c + 1)).entries
        for i in range(job.to)
    ]


def run_restore(job: OldJob, algorithm: str, out: Path) -> tuple[list[float], list[int], int]:
    """Every new subtask's DB by ``algorithm`` under ``out``: seconds and keys per subtask,
    and the new DBs' bytes."""
    fn = ALGORITHMS[algorithm]
    reader = job.coordinator.task_manager_recipe().reader()
    opt = options()
    out.mkdir(parents=True)
    seconds: list[float] = []
    copied: list[int] = []
    for i, entries in enumerate(job.assignments):
        groups = key_group_range(MAX_PARALLELISM, job.to, i)
        t0 = time.perf_counter()
        copied.append(fn(reader, entries, out / f"db-{i}", groups, opt))
        seconds.append(time.perf_counter() - t0)
    return seconds, copied, _dir_bytes(out)


def same_content(a: Path, b: Path) -> tuple[bool, int]:
    """Whether two DBs hold the same keys and values; the number of keys of ``a``."""
    opt = options()
    ro = rocksdict.AccessType.read_only(False)  # a closed DB keeps an (empty) WAL
    da, db = (
        rocksdict.Rdict(str(a), opt, access_type=ro),
        rocksdict.Rdict(str(b), opt, access_type=ro),
    )
    try:
        n = sum(1 for _ in da.keys())  # noqa: SIM118 (Rdict has no __iter__)
        same = n == sum(1 for _ in db.keys()) and all(  # noqa: SIM118
            x == y for x, y in zip(da.items(), db.items(), strict=True)
        )
    finally:
        da.close()
        db.close()
    return same, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.rescale_restore", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ap.add_argument("--keys", type=float, default=8e6, help="keys of the state (8e6)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A B A B (3)")
    ap.add_argument("--write-buffer-mb", type=int, default=64, help="memtable size (64)")
    ap.add_argument("--work", default=None, help="where the DBs and checkpoints go (a temp dir)")
    ap.add_argument("--out", default=None, help="write every sample as JSON here")
    ap.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                    help="compare the DBs built both ways after the first round")  # fmt: skip
    args = ap.parse_args(argv)
    machine = machine_info()
    root = Path(tempfile.mkdtemp(prefix="bench-rescale-", dir=args.work))
    t_start = time.perf_counter()
    jobs: list[OldJob] = []
    try:
        print(f"building {int(args.keys):,} keys into 4 + 2 DBs under {root}", flush=True)
        keys = build(root, jobs, int(args.keys), args.write_buffer_mb << 20)
        build_s = time.perf_counter() - t_start
        for job in jobs:
            checkpoint_and_rescale(job, root)
            print(f"  {job.parallelism} -> {job.to}: {job.state_bytes / 2**20:,.1f} MiB of SSTs"
                  " checkpointed, rescaled", flush=True)  # fmt: skip
        samples: list[Sample] = []
        verified: dict[str, Any] = {}
        for r in range(args.rounds):
            for job in jobs:
                direction = f"{job.parallelism}->{job.to}"
                for algorithm in ALGORITHMS:
                    out = root / f"new-{direction.replace('->', 'to')}-{algorithm}"
                    shutil.rmtree(out, ignore_errors=True)
                    secs, copied, size = run_restore(job, algorithm, out)
                    s = Sample(direction, algorithm, r, sum(secs), max(secs), secs, copied,
                               size, os.getloadavg()[0])  # fmt: skip
                    samples.append(s)
                    print(f"  round {r} {direction} {algorithm:>18}: {s.seconds:7.2f} s"
                          f" (slowest subtask {s.slowest_subtask:.2f} s, keys copied"
                          f" {sum(copied):,}, new DBs {size / 2**20:,.1f} MiB)"
                          f"  load {s.load:.2f}", flush=True)  # fmt: skip
                if r == 0 and args.verify:
                    base = root / f"new-{direction.replace('->', 'to')}"
                    checks = [
                        same_content(Path(f"{base}-key-by-key/db-{i}"),
                                     Path(f"{base}-restore_key_groups/db-{i}"))
                        for i in range(job.to)
                    ]  # fmt: skip
                    verified[direction] = {
                        "identical": all(ok for ok, _ in checks),
                        "keys_per_subtask": [n for _, n in checks],
                    }
                    print(f"  {direction}: identical {verified[direction]}", flush=True)
        summary = summarize(samples)
        for direction, m in summary.items():
            print(f"{direction}: key-by-key median {m['baseline_median_s']:.2f} s,"
                  f" restore_key_groups median {m['new_median_s']:.2f} s:"
                  f" {m['ratio']:.1f}x faster (slowest subtask"
                  f" {m['baseline_slowest_median_s']:.2f} s against"
                  f" {m['new_slowest_median_s']:.2f} s)")  # fmt: skip
        load_end = os.getloadavg()
        took = time.perf_counter() - t_start
        print(f"{keys:,} keys; load average at the start {machine['load_average_at_start']},"
              f" at the end {[round(x, 2) for x in load_end]};"
              f" {took:.0f} s in all ({build_s:.0f} s building)")  # fmt: skip
        if args.out:
            doc = {
                "parameters": vars(args), "keys": keys,
                "state_bytes": {f"{j.parallelism}->{j.to}": j.state_bytes for j in jobs},
                "summary": summary, "verified": verified,
                "samples": [asdict(s) for s in samples],
                "machine": machine, "load_end": list(load_end),
            }  # fmt: skip
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        ok = all(v["identical"] for v in verified.values())
        return 0 if ok else 1
    finally:
        for job in jobs:
            job.coordinator.close()
        shutil.rmtree(root, ignore_errors=True)


def summarize(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """Per direction: the medians of the baseline and of the new restore, their ratio."""
    out: dict[str, dict[str, float]] = {}
    for direction in dict.fromkeys(s.direction for s in samples):

        def of(algorithm: str, what: str, d: str = direction) -> float:
            return float(
                statistics.median(
                    getattr(s, what)
                    for s in samples
                    if (s.direction, s.algorithm) == (d, algorithm)
                )
            )

        base, new = of("key-by-key", "seconds"), of("restore_key_groups", "seconds")
        out[direction] = {
            "baseline_median_s": base,
            "new_median_s": new,
            "ratio": base / new,
            "baseline_slowest_median_s": of("key-by-key", "slowest_subtask"),
            "new_slowest_median_s": of("restore_key_groups", "slowest_subtask"),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
