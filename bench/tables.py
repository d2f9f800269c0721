"""Figures 3 and 4: the TM's segment table as it grows.

Figure 3, subsume cost: nanoseconds per discarded segment when a subsume discards a fixed
number of segments while others stay live; flat is the goal. Measured through the public
API, a ``TaskManager.alone`` applying the coordinator's encoded notice in its process
with the coordinator in another (``bench/tm_cycle.py``), at 1e3 .. 1e5 live segments,
and on the TM's segment table (``fastimpl.manager.Manager``) alone up to 1e6.

Figure 4, memory per tracked segment: bytes that ``tracemalloc`` sees the product's lines
hold per live segment in a ``TaskManager.alone`` that wrote them through its public API
(1e5, ``--quick`` 1e4), and bytes of N segments in a ``Manager`` built the way the TM
builds them (1e5, 1e6), against the same facts in a dict of plain tuples.
"""

from __future__ import annotations

import gc
import inspect
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Case, Figure, median, memory_fs, within_config
from bench.tm_cycle import SUBTASK, RemoteCoordinator, TmJob
from fastimpl import CounterIds, IdSource, RandomIds
from fastimpl.manager import Manager
from fastimpl.records import PFile, Seg
from fastimpl.storage import Storage
from spec.config import Scope, StateKind
from spec.layout import shared_dir
from spec.messages import CheckpointAborted, CheckpointComplete, decode_message, encode_message

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
    and out of its pool), as ``TmWriter._append_segment`` and ``_write_stream`` build them."""
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
    """What ``TmNotices._tm_complete`` does with the segment table for a new watermark
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
FULL_TM_LIVE = (1_000, 10_000, 100_000)
QUICK_TM_LIVE = (1_000, 10_000)


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


class TmBench:
    """A ``TaskManager.alone`` on ``memory://`` tracking ``live`` segments: its coordinator
    (in a process of its own, ``bench/tm_cycle.py``) retains live / 1000 checkpoints of
    1000 segments."""

    def __init__(self, live: int) -> None:
        self.retained = max(1, live // PER_SUBSUME)
        self.fs = memory_fs()
        self.root = f"/subsume-{uuid.uuid4().hex}"
        self.coordinator = RemoteCoordinator()
        config = within_config(num_retained=self.retained)
        self.job = TmJob(
            self.coordinator, self.fs, self.root, f"memory://{self.root}", config, CounterIds()
        )
        self.job.cycles(self.retained, PER_SUBSUME, SEGMENT)
        self.data = bytes(SEGMENT)

    def round(self) -> tuple[float, float]:
        """Write and acknowledge a checkpoint; the coordinator completes it, which
        subsumes the oldest retained one (R52, R54): not timed here. The TM applies the
        notice, discarding that checkpoint's segments and deleting their file (R31, R33):
        timed. Returns ns per discarded segment: (the TM's notice, the coordinator's
        request in its process: decoding, completing with _metadata, subsuming)."""
        tm, cp = self.job.tm, self.job.next
        for i in range(PER_SUBSUME):
            tm.write(SUBTASK, cp, StateKind.KEYED_SHARED, f"{cp}-{i}", SEGMENT, 1, self.data)
        ack = encode_message(tm.acknowledge(SUBTASK, cp)[1])
        reply = self.coordinator.call(("acks", [ack], True))
        self.job.settle()
        gc.collect()
        t0 = time.perf_counter_ns()
        for _, raw in reply[1]:
            msg = decode_message(raw)
            assert isinstance(msg, CheckpointComplete | CheckpointAborted)
            tm.on_notice(msg)
        self.job.settle()
        t1 = time.perf_counter_ns()
        self.job.next = int(reply[2])
        if len(tm.m.segs) != self.retained * PER_SUBSUME:
            raise AssertionError(
                f"{len(tm.m.segs)} live segments, expected {self.retained * PER_SUBSUME}"
            )
        return (t1 - t0) / PER_SUBSUME, float(reply[3]) * 1e9 / PER_SUBSUME

    def close(self) -> None:
        self.coordinator.close()
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
    tms = {live: TmBench(live) for live in (QUICK_TM_LIVE if quick else FULL_TM_LIVE)}
    try:
        tm_samples = interleaved(2 * repeats + 1, {k: b.round for k, b in tms.items()})
    finally:
        for bench in tms.values():
            bench.close()
    tm_medians = {
        live: (median([x[0] for x in v]), median([x[1] for x in v]))
        for live, v in tm_samples.items()
    }
    tfirst = tm_medians[min(tm_medians)]
    for live, (notice, coord) in tm_medians.items():
        log(
            f"  TaskManager, {live:,} live: {notice:.0f} ns per discarded segment "
            f"(the coordinator's request, in its process: {coord:.0f})"
        )
        cases.append(
            Case(
                f"TaskManager.on_notice, {live:.0e} live",
                notice,
                tfirst[0],
                notice / tfirst[0],
                f"the notice in the TM's process; the coordinator's request {coord:.0f} ns",
                {
                    "tm_notice": [x[0] for x in tm_samples[live]],
                    "coordinator_request": [x[1] for x in tm_samples[live]],
                },
            )
        )
    worst, best = max(medians.values()), min(medians.values())
    tworst = max(b for b, _ in tm_medians.values())
    tbest = min(b for b, _ in tm_medians.values())
    return Figure(
        key="subsume_cost",
        title="3. subsume, ns per discarded segment",
        unit="ns",
        value=tworst,
        baseline=tbest,
        baseline_what="the lowest of the TaskManager figures (the 1e3 one if flat)",
        ratio=tworst / tbest,
        ratio_what=(
            f"max / min of the TaskManager.on_notice medians over {min(tm_medians):,}.."
            f"{max(tm_medians):,} live segments (the public API; the Manager alone up to "
            f"{max(medians):,}: details.manager_max_over_min)"
        ),
        goal="max/min <= 2 (flat)",
        met=tworst / tbest <= 2.0,
        cases=cases,
        details={
            "discarded_per_subsume": PER_SUBSUME,
            "manager_samples_per_size": rounds,
            "manager_max_over_min": worst / best,
            "manager_flat_within_2x": worst / best <= 2.0,
            "method": (
                "TaskManager: a TaskManager.alone on memory:// with its coordinator in a "
                "spawned process retaining live/1000 checkpoints; a round writes and "
                "acknowledges 1000 segments, the coordinator completes (subsuming the "
                "oldest retained one), and the TM's decoding and applying of the notice "
                "(its discards, the file's delete) is timed in the TM's process; the "
                "coordinator's request is timed in its own. Manager: the TM's segment "
                "table alone, live segments in live/1000 checkpoint buckets; a round adds "
                "a checkpoint's 1000 segments (untimed) and subsumes the oldest "
                "checkpoint's 1000 (timed: used_up_to, remove, file ref counts), up to "
                "1e6 live, which through the TM would take 1000 retained checkpoints. The "
                "long-lived tables are frozen out of the garbage collector (gc.freeze) so "
                "that a full collection of the whole heap is not charged to one subsume"
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


_PRODUCT = tuple(
    tracemalloc.Filter(True, str(Path(__file__).resolve().parent.parent / d) + "/*")
    for d in ("fastimpl", "spec")
)


def _bytes_written_line() -> tracemalloc.Filter:
    """The line of ``Storage.append`` that hands a segment's bytes to the file: on
    ``memory://`` the file's buffer grows there, and those are the storage's bytes."""
    lines, first = inspect.getsourcelines(Storage.append)
    at = [first + i for i, line in enumerate(lines) if "f.write(data)" in line]
    if len(at) != 1:
        raise RuntimeError("Storage.append no longer has one 'f.write(data)' line")
    return tracemalloc.Filter(False, inspect.getfile(Storage), lineno=at[0])


FULL_TM_MEMORY = 100_000
QUICK_TM_MEMORY = 10_000


def tm_bytes_per_segment(n: int) -> tuple[float, int]:
    """Through the public API: bytes the product's own lines allocated and still hold
    after a ``TaskManager.alone`` (``memory://``, ``RandomIds``) wrote ``n`` 1 KiB
    segments, 1000 per checkpoint, each checkpoint acknowledged and completed by its
    coordinator (a spawned process retaining every one, so that every segment stays
    live) and the notices applied; per segment, and the live segments counted. What
    the memory file system holds (the bytes, allocated in fsspec's lines) is not the
    product's; the path and id strings the product made are."""
    checkpoints = n // PER_SUBSUME
    root = f"/tm-memory-{uuid.uuid4().hex}"
    fs = memory_fs()
    with RemoteCoordinator() as coordinator:
        gc.collect()
        tracemalloc.start()
        try:
            config = within_config(num_retained=checkpoints)
            job = TmJob(coordinator, fs, root, f"memory://{root}", config, RandomIds())
            job.cycles(checkpoints, PER_SUBSUME, SEGMENT)
            gc.collect()
            snap = tracemalloc.take_snapshot().filter_traces(_PRODUCT)
            snap = snap.filter_traces([_bytes_written_line()])
            held = sum(st.size for st in snap.statistics("filename"))
            live = len(job.tm.m.segs)
        finally:
            tracemalloc.stop()
    if fs.exists(root):
        fs.rm(root, recursive=True)
    return held / n, live


def memory_per_segment(
    repeats: int, quick: bool = False, log: Callable[[str], None] = print
) -> Figure:
    cases: list[Case] = []
    n_tm = QUICK_TM_MEMORY if quick else FULL_TM_MEMORY
    per_segment, live = tm_bytes_per_segment(n_tm)
    if live != n_tm:
        raise AssertionError(f"{live} live segments, expected {n_tm}")
    log(f"  TaskManager.alone, {n_tm:,} segments: {per_segment:.1f} B per segment")
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
    plain_at = median([float(x) for x in structure[n_tm][1]])
    base = (plain_at + sum(sys.getsizeof(x) for x in _ids(RandomIds(), n_tm))) / n_tm
    cases.insert(
        0,
        Case(
            f"TaskManager.alone, {n_tm:.0e} segments, RandomIds",
            per_segment,
            base,
            per_segment / base,
            f"{per_segment / GOAL_BYTES:.2f} of the 300 B goal; through the public API: "
            "all the TM's own lines hold, ids included",
            {"bytes_per_segment": [per_segment]},
        ),
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
                "TaskManager.alone: tracemalloc, bytes the lines of fastimpl/ and spec/ "
                "hold after the TM (memory://, RandomIds) wrote N 1 KiB segments through "
                "its API, 1000 per checkpoint, each acknowledged (encoded), completed by "
                "its coordinator in a spawned process retaining all of them, and the "
                "notices applied; less the segments' bytes in the memory file system "
                "(Storage.append's write line); divided by N. Manager: tracemalloc, "
                "bytes allocated and still live after building N segments in "
                "a Manager as the TM builds them (1000 per checkpoint bucket and "
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
