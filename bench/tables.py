"""Figures 3 and 4: the TM's segment table (``fastimpl.manager.Manager``) as it grows.

Figure 3, subsume cost: nanoseconds per discarded segment when a subsume discards a fixed
number of segments while 1e3 .. 1e6 others stay live; flat is the goal. Measured on the
``Manager`` directly (what the cluster does for a TM on a completed checkpoint's notice,
less the storage calls), and through the whole ``InProcessEngine`` on ``memory://`` up to 1e5.

Figure 4, memory per tracked segment: bytes that ``tracemalloc`` sees allocated for N
segments in a ``Manager``, built the way the cluster builds them.
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import (
    SUBTASK,
    Case,
    Figure,
    checkpoint_cycles,
    median,
    memory_fs,
    new_cluster,
    settle,
)
from fastimpl import CounterIds, IdSource, RandomIds
from fastimpl.manager import Manager
from fastimpl.records import PFile, Seg
from spec.config import Scope, StateKind
from spec.layout import shared_dir

PER_SUBSUME = 1000
"""Segments per checkpoint, so segments discarded per subsume."""
SEGMENT = 1024
TM = "tm-1"
DIRECTORY = shared_dir("job-0", SUBTASK)


def add_checkpoint(
    m: Manager, cp: int, segments: int, ids: IdSource, lengths: Callable[[int], int] | None = None
) -> None:
    """What fastimpl's TM tables hold for ``segments`` segments written for checkpoint
    ``cp`` into one physical file and acknowledged (WITHIN_CHECKPOINT: the file is closed
    and out of its pool), as ``TaskManager._append_segment`` and ``_write_stream`` build them."""
    path = f"{DIRECTORY}/{ids.file_name(DIRECTORY)}"
    key = (TM, Scope.SHARED.value, str(SUBTASK), str(cp))
    pf = PFile(path, Scope.SHARED, key, cp, False, 0)
    m.pfiles[path] = pf
    offset = 0
    for i in range(segments):
        length = SEGMENT if lengths is None else lengths(i)
        m.add(Seg(ids.logical_id(), path, offset, length, cp, cp, True))
        pf.ref_count += 1
        pf.live_bytes += length
        offset += length
    pf.size = offset


def subsume(m: Manager, watermark: int) -> int:
    """What ``TaskManager._tm_complete`` does with the segment table for a new watermark
    (R31, R33, R15) without the storage calls: discard every segment used up to the
    watermark and drop a closed physical file once its last segment is gone."""
    n = 0
    for lid in m.used_up_to(watermark):
        seg = m.remove(lid)
        if seg is None:
            continue
        pf = m.pfiles[seg.path]
        pf.ref_count -= 1
        pf.live_bytes -= seg.length
        if pf.ref_count == 0 and not pf.open:
            del m.pfiles[seg.path]
        n += 1
    return n


# --------------------------------------------------------------------------- figure 3

FULL_LIVE = (1_000, 10_000, 100_000, 1_000_000)
QUICK_LIVE = (1_000, 10_000, 100_000)
FULL_CLUSTER_LIVE = (1_000, 10_000, 100_000)
QUICK_CLUSTER_LIVE = (1_000, 10_000)


class ManagerBench:
    """A Manager holding ``live`` segments in ``live / 1000`` checkpoint buckets."""

    def __init__(self, live: int) -> None:
        self.checkpoints = max(1, live // PER_SUBSUME)
        self.ids = CounterIds()
        self.m = Manager()
        self.cp = 0
        for _ in range(self.checkpoints):
            self.cp += 1
            add_checkpoint(self.m, self.cp, PER_SUBSUME, self.ids)

    def round(self) -> float:
        """Add a checkpoint's segments (not timed), subsume the oldest checkpoint's
        (timed); ns per discarded segment."""
        self.cp += 1
        add_checkpoint(self.m, self.cp, PER_SUBSUME, self.ids)
        gc.collect()
        t0 = time.perf_counter_ns()
        n = subsume(self.m, self.cp - self.checkpoints)
        dt = time.perf_counter_ns() - t0
        if n != PER_SUBSUME or len(self.m.segs) != self.checkpoints * PER_SUBSUME:
            raise AssertionError(f"subsume discarded {n}, {len(self.m.segs)} left")
        return dt / n


class ClusterBench:
    """An InProcessEngine on ``memory://`` with num_retained = live / 1000 checkpoints of 1000
    segments: the TM tracks ``live`` segments."""

    def __init__(self, live: int) -> None:
        self.retained = max(1, live // PER_SUBSUME)
        self.fs = memory_fs()
        self.root = f"/subsume-{uuid.uuid4().hex}"
        self.cluster = new_cluster(self.fs, self.root, CounterIds(), num_retained=self.retained)
        self.cp = checkpoint_cycles(
            self.cluster, first=1, checkpoints=self.retained, segments=PER_SUBSUME, size=SEGMENT
        )

    def round(self) -> tuple[float, float]:
        """Write and acknowledge a checkpoint (not timed); complete it, which subsumes the
        oldest retained one (R52, R54), and deliver the notification, on which the TM
        discards that checkpoint's segments and deletes their file (R31, R33): timed.
        Returns ns per discarded segment: (complete + notification, notification)."""
        cluster, cp = self.cluster, self.cp
        cluster.trigger()
        for i in range(PER_SUBSUME):
            cluster.write(cp, SUBTASK, StateKind.KEYED_SHARED, f"{cp}-{i}", bytes(SEGMENT))
        cluster.acknowledge(cp, SUBTASK)
        settle(cluster)
        gc.collect()
        t0 = time.perf_counter_ns()
        cluster.complete(cp)
        t1 = time.perf_counter_ns()
        while cluster.channel:
            cluster.deliver(0)
        settle(cluster)
        t2 = time.perf_counter_ns()
        live = sum(len(t.m.segs) for t in cluster.parties.values())
        if live != self.retained * PER_SUBSUME:
            raise AssertionError(f"{live} live segments, expected {self.retained * PER_SUBSUME}")
        self.cp += 1
        return (t2 - t0) / PER_SUBSUME, (t2 - t1) / PER_SUBSUME

    def close(self) -> None:
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


def interleaved(rounds: int, benches: dict[int, Callable[[], Any]]) -> dict[int, list[Any]]:
    """``rounds`` samples of each bench, taken in turn (one of each size per round), so
    that load from elsewhere on a shared machine falls on every size alike. One warm-up
    round first, not kept. The long-lived tables are frozen out of the garbage collector
    (``gc.freeze``): a full collection of the whole heap is not one subsume's cost."""
    gc.collect()
    gc.freeze()
    out: dict[int, list[Any]] = {k: [] for k in benches}
    try:
        for r in range(rounds + 1):
            for k, bench in benches.items():
                sample = bench()
                if r > 0:
                    out[k].append(sample)
    finally:
        gc.unfreeze()
    return out


def subsume_cost(repeats: int, quick: bool = False, log: Callable[[str], None] = print) -> Figure:
    rounds = max(repeats, 3) * 3  # one subsume is ~1 ms: more samples than runs
    managers = {live: ManagerBench(live) for live in (QUICK_LIVE if quick else FULL_LIVE)}
    manager_samples = interleaved(rounds, {k: b.round for k, b in managers.items()})
    del managers
    medians = {live: median(v) for live, v in manager_samples.items()}
    first = medians[min(medians)]
    cases: list[Case] = []
    for live, ns in medians.items():
        log(f"  Manager, {live:,} live: {ns:.0f} ns per discarded segment")
        cases.append(
            Case(
                f"Manager, {live:.0e} live",
                ns,
                first,
                ns / first,
                "vs the 1e3 figure",
                {"ns": manager_samples[live]},
            )
        )
    clusters = {
        live: ClusterBench(live) for live in (QUICK_CLUSTER_LIVE if quick else FULL_CLUSTER_LIVE)
    }
    try:
        cluster_samples = interleaved(2 * repeats + 1, {k: b.round for k, b in clusters.items()})
    finally:
        for bench in clusters.values():
            bench.close()
    cluster_medians = {
        live: (median([x[0] for x in v]), median([x[1] for x in v]))
        for live, v in cluster_samples.items()
    }
    cfirst = cluster_medians[min(cluster_medians)]
    for live, (both, notify) in cluster_medians.items():
        log(
            f"  Cluster, {live:,} live: {both:.0f} ns per discarded segment "
            f"(the notification alone {notify:.0f})"
        )
        cases.append(
            Case(
                f"Cluster, {live:.0e} live",
                both,
                cfirst[0],
                both / cfirst[0],
                f"complete + notify; notify alone {notify:.0f} ns ({notify / cfirst[1]:.2f}x)",
                {
                    "complete_and_notify": [x[0] for x in cluster_samples[live]],
                    "notify": [x[1] for x in cluster_samples[live]],
                },
            )
        )
    worst, best = max(medians.values()), min(medians.values())
    cworst = max(b for b, _ in cluster_medians.values())
    cbest = min(b for b, _ in cluster_medians.values())
    return Figure(
        key="subsume_cost",
        title="3. subsume, ns per discarded segment",
        unit="ns",
        value=worst,
        baseline=best,
        baseline_what="the lowest of the Manager figures (the 1e3 one if flat)",
        ratio=worst / best,
        ratio_what=(
            f"max / min of the Manager medians over {min(medians):,}..{max(medians):,} live "
            "segments"
        ),
        goal="max/min <= 2 (flat)",
        met=worst / best <= 2.0,
        cases=cases,
        details={
            "discarded_per_subsume": PER_SUBSUME,
            "manager_samples_per_size": rounds,
            "cluster_max_over_min": cworst / cbest,
            "cluster_flat_within_2x": cworst / cbest <= 2.0,
            "method": (
                "Manager: live segments in live/1000 checkpoint buckets; a round adds a "
                "checkpoint's 1000 segments (untimed) and subsumes the oldest checkpoint's "
                "1000 (timed: used_up_to, remove, file ref counts). The long-lived table is "
                "frozen out of the garbage collector (gc.freeze) so that a full collection "
                "of the whole heap is not charged to one subsume. Cluster: memory://, "
                "num_retained = live/1000, timed Complete + DeliverNotification, which "
                "also writes the new checkpoint's _metadata (a cost per checkpoint, the "
                "same at every size)"
            ),
        },
    )


# --------------------------------------------------------------------------- figure 4

FULL_MEMORY_SIZES = (100_000, 1_000_000)
QUICK_MEMORY_SIZES = (10_000, 100_000)
GOAL_BYTES = 300


class Pregenerated:
    """An id source that hands out logical ids made beforehand by another id source, so
    that the (slow, allocation-heavy) id generation stays outside ``tracemalloc``; the
    bytes of the id strings are added to the figure separately."""

    __slots__ = ("_ids", "_next_file")

    def __init__(self, ids: list[str]) -> None:
        self._ids = iter(ids)
        self._next_file = 1

    def file_name(self, directory: str) -> str:
        name = f"f{self._next_file:06d}"
        self._next_file += 1
        return name

    def logical_id(self) -> str:
        return next(self._ids)


def _distinct_lengths(i: int) -> int:
    """Segment lengths as a real job has them: each an int object of its own."""
    return SEGMENT + (i & 7)


def traced_bytes(build: Callable[[], object]) -> int:
    """Bytes allocated by ``build()`` and still live once it returns."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return after - before


def manager_structure_bytes(n: int, lids: list[str]) -> int:
    """Bytes of a Manager holding ``n`` segments, less their id strings."""

    def build() -> Manager:
        m = Manager()
        ids = Pregenerated(lids)
        for cp in range(1, n // PER_SUBSUME + 1):
            add_checkpoint(m, cp, PER_SUBSUME, ids, _distinct_lengths)
        return m

    return traced_bytes(build)


def plain_structure_bytes(n: int, lids: list[str]) -> int:
    """The same facts in the plainest structure: a dict from the same id strings to a
    tuple (path, offset, length, subtask, scope, created_for, last_used, confirmed);
    less the id strings."""

    def build() -> dict[str, tuple[object, ...]]:
        out: dict[str, tuple[object, ...]] = {}
        ids = Pregenerated(lids)
        for cp in range(1, n // PER_SUBSUME + 1):
            path = f"{DIRECTORY}/{ids.file_name(DIRECTORY)}"
            offset = 0
            for i in range(PER_SUBSUME):
                length = _distinct_lengths(i)
                out[ids.logical_id()] = (path, offset, length, SUBTASK, Scope.SHARED, cp, cp, True)
                offset += length
        return out

    return traced_bytes(build)


def memory_per_segment(
    repeats: int, quick: bool = False, log: Callable[[str], None] = print
) -> Figure:
    cases: list[Case] = []
    sources: dict[str, Callable[[], IdSource]] = {
        "RandomIds": RandomIds,
        "CounterIds": CounterIds,
    }
    structure: dict[int, tuple[list[int], list[int]]] = {}
    for n in QUICK_MEMORY_SIZES if quick else FULL_MEMORY_SIZES:
        lids = _ids(CounterIds(), n)
        runs = 1  # bytes, not time: a second run gives the same count
        fast = [manager_structure_bytes(n, lids) for _ in range(runs)]
        plain = [plain_structure_bytes(n, lids) for _ in range(runs)]
        structure[n] = (fast, plain)
        for name, make in sources.items():
            id_bytes = sum(sys.getsizeof(x) for x in _ids(make(), n))
            value = (median([float(x) for x in fast]) + id_bytes) / n
            base = (median([float(x) for x in plain]) + id_bytes) / n
            case = Case(
                f"{n:.0e} segments, {name}",
                value,
                base,
                value / base,
                f"{value / GOAL_BYTES:.2f} of the 300 B goal; ids {id_bytes / n:.0f} B",
                {
                    "manager_bytes_without_ids": [float(x) for x in fast],
                    "plain_bytes_without_ids": [float(x) for x in plain],
                    "id_string_bytes": [float(id_bytes)],
                },
            )
            cases.append(case)
            log(
                f"  {n:,} segments, {name}: {case.value:.1f} B per segment "
                f"(plain dict of tuples {case.baseline:.1f} B)"
            )
    worst = max(cases, key=lambda c: c.value)
    m = Manager()
    add_checkpoint(m, 1, 1, RandomIds())
    seg = next(iter(m.segs.values()))
    parts = {
        "Seg object": sys.getsizeof(seg),
        "logical id string, RandomIds": sys.getsizeof(seg.logical_id),
        "logical id string, CounterIds": sys.getsizeof(CounterIds(10**6).logical_id()),
        "offset and length ints": 2 * sys.getsizeof(10**6),
    }
    return Figure(
        key="memory_per_segment",
        title="4. memory per tracked segment",
        unit="B",
        value=worst.value,
        baseline=worst.baseline,
        baseline_what="the same facts as a dict of plain tuples keyed by the same id strings",
        ratio=worst.ratio,
        ratio_what=f"Manager bytes / plain bytes; headline the worst case ({worst.label})",
        goal="< 300 B per segment",
        met=worst.value < GOAL_BYTES,
        cases=cases,
        details={
            "of_goal": worst.value / GOAL_BYTES,
            "method": (
                "tracemalloc: bytes allocated and still live after building N segments in "
                "a Manager as the cluster builds them (1000 per checkpoint bucket and "
                "physical file, PFile with its pool key, Seg, offset and length ints of "
                "their own), divided by N; plus the bytes of N logical id strings as each "
                "id source makes them (made outside tracemalloc, which slows their making "
                "down). Deterministic: it counts bytes, not time"
            ),
            "getsizeof_parts": parts,
        },
    )


def _ids(source: IdSource, n: int) -> list[str]:
    return [source.logical_id() for _ in range(n)]
