"""Figures 1 and 2: how fast fastimpl stores checkpoint state.

Figure 1, write throughput on local disk: whole checkpoint cycles through
``Cluster.apply`` against a plain ``open``/``write``/``fsync`` loop that does the same
physical I/O (same files created, same bytes, same fsyncs of files and of directories,
same deletes).

Figure 2, small segments on ``memory://``: 1 KiB segments per second through whole
checkpoint cycles, against a plain loop writing the same chunks into fsspec memory files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench.common import (
    Case,
    Figure,
    Phases,
    checkpoint_cycles,
    local_fs,
    median,
    memory_fs,
    new_cluster,
    settle,
    timed,
)
from fastimpl import CounterIds, IdSource, RandomIds
from spec.layout import METADATA

KIB = 1024
MIB = 1024 * KIB
MB = 1e6


# --------------------------------------------------------------------------- figure 1


@dataclass(frozen=True)
class WritePlan:
    size: int
    segments: int
    """Segments per checkpoint (one physical file per checkpoint)."""
    checkpoints: int

    @property
    def label(self) -> str:
        return f"{self.size // MIB} MiB" if self.size >= MIB else f"{self.size // KIB} KiB"

    @property
    def payload(self) -> int:
        return self.size * self.segments * self.checkpoints


FULL_WRITE_PLANS = (
    WritePlan(KIB, 256, 4),
    WritePlan(64 * KIB, 64, 4),
    WritePlan(MIB, 16, 4),
    WritePlan(4 * MIB, 4, 4),
)
QUICK_WRITE_PLANS = tuple(WritePlan(p.size, max(1, p.segments // 4), 2) for p in FULL_WRITE_PLANS)


@contextlib.contextmanager
def counting_fsyncs() -> Iterator[list[int]]:
    """Count ``os.fsync`` calls made inside the block (by fastimpl or by the loop)."""
    real = os.fsync
    count = [0]

    def counted(fd: Any) -> None:
        count[0] += 1
        real(fd)

    setattr(os, "fsync", counted)  # noqa: B010 (mypy would refuse a plain assignment)
    try:
        yield count
    finally:
        setattr(os, "fsync", real)  # noqa: B010


@dataclass
class LocalRun:
    seconds: float
    data_files: int
    metadata_size: int


def fastimpl_local(base: str, plan: WritePlan) -> LocalRun:
    """One run of ``plan.checkpoints`` checkpoint cycles on a fresh local root."""
    root = tempfile.mkdtemp(prefix="fastimpl-", dir=base)
    ids = CounterIds()
    cluster = new_cluster(local_fs(), root, ids)

    def run() -> None:
        checkpoint_cycles(
            cluster, first=1, checkpoints=plan.checkpoints, segments=plan.segments, size=plan.size
        )
        settle(cluster)

    secs = timed(run)
    meta = [n for p, n in cluster.storage.list_files().items() if p.endswith("/" + METADATA)]
    shutil.rmtree(root)
    return LocalRun(secs, ids.next_file - 1, max(meta, default=0))


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_synced(path: str) -> None:
    """``os.makedirs``, then a sync of the parent of each directory it made."""
    made: list[str] = []
    d = path
    while not os.path.isdir(d):
        made.append(d)
        d = os.path.dirname(d)
    os.makedirs(path, exist_ok=True)
    for d in made:
        _sync_dir(os.path.dirname(d))


def plain_local(base: str, plan: WritePlan, metadata_size: int) -> LocalRun:
    """The same physical I/O as ``fastimpl_local`` in a plain loop.

    Per checkpoint: create the checkpoint's data file and sync its directory; per segment
    write the segment's bytes in one call, flush and fsync (fastimpl makes every append
    durable before its handle exists, R12); close; write a metadata file of the size
    fastimpl's has to a temporary name, fsync it, rename it into place and sync its
    directory; delete the previous checkpoint's data file and metadata file (what
    subsuming it deletes, num_retained = 1). A directory made is synced in its parent, as
    fastimpl does (the names survive a power loss)."""
    root = tempfile.mkdtemp(prefix="plain-", dir=base)
    data = bytes(plan.size)
    meta_bytes = bytes(metadata_size)
    created = [0]

    def run() -> None:
        shared = f"{root}/job-0/shared/v-0-1"
        previous: list[str] = []
        for cp in range(1, plan.checkpoints + 1):
            _makedirs_synced(shared)
            path = f"{shared}/f{cp:06d}"
            with open(path, "wb") as f:
                _sync_dir(shared)
                for _ in range(plan.segments):
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            created[0] += 1
            chk = f"{root}/job-0/chk-{cp}"
            _makedirs_synced(chk)
            meta = f"{chk}/{METADATA}"
            with open(meta + ".inprogress", "wb") as f:
                f.write(meta_bytes)
                f.flush()
                os.fsync(f.fileno())
            os.replace(meta + ".inprogress", meta)
            _sync_dir(chk)
            for p in previous:
                os.remove(p)
            previous = [path, meta]

    secs = timed(run)
    shutil.rmtree(root)
    return LocalRun(secs, created[0], metadata_size)


def write_throughput(
    repeats: int, quick: bool = False, base: str | None = None, log: Callable[[str], None] = print
) -> Figure:
    plans = QUICK_WRITE_PLANS if quick else FULL_WRITE_PLANS
    cases: list[Case] = []
    fairness: dict[str, Any] = {}
    workdir = tempfile.mkdtemp(prefix="ckpt-bench-", dir=base)
    try:
        for plan in plans:
            # A warm-up pair, not timed for the figure: it tells the metadata size and
            # checks that both sides create the same files and fsync as often.
            with counting_fsyncs() as fast_syncs:
                warm = fastimpl_local(workdir, plan)
            with counting_fsyncs() as plain_syncs:
                plain_warm = plain_local(workdir, plan, warm.metadata_size)
            fair = warm.data_files == plain_warm.data_files and fast_syncs == plain_syncs
            fairness[plan.label] = {
                "data_files": [warm.data_files, plain_warm.data_files],
                "fsyncs": [fast_syncs[0], plain_syncs[0]],
                "metadata_bytes": warm.metadata_size,
                "same_io": fair,
            }
            if not fair:
                log(f"  warning: {plan.label}: the baseline's I/O differs: {fairness[plan.label]}")
            fast: list[float] = []
            plain: list[float] = []
            ratios: list[float] = []
            for r in range(repeats):
                # alternate which side goes first, so drift on a shared machine is not
                # always charged to the same side
                if r % 2 == 0:
                    a = fastimpl_local(workdir, plan)
                    b = plain_local(workdir, plan, warm.metadata_size)
                else:
                    b = plain_local(workdir, plan, warm.metadata_size)
                    a = fastimpl_local(workdir, plan)
                fast.append(plan.payload / a.seconds / MB)
                plain.append(plan.payload / b.seconds / MB)
                ratios.append(fast[-1] / plain[-1])
            goal_applies = plan.size >= MIB
            case = Case(
                label=f"{plan.label} segments",
                value=median(fast),
                baseline=median(plain),
                ratio=median(ratios),
                note=">= 0.9 of plain loop" if goal_applies else "(no goal)",
                samples={"fastimpl_MBps": fast, "plain_MBps": plain, "ratio": ratios},
            )
            cases.append(case)
            log(
                f"  {plan.label}: fastimpl {case.value:.1f} MB/s, plain loop "
                f"{case.baseline:.1f} MB/s, ratio {case.ratio:.3f}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    judged = [c for c, p in zip(cases, plans, strict=True) if p.size >= MIB]
    worst = min(judged, key=lambda c: c.ratio)
    return Figure(
        key="write_throughput_local",
        title="1. write throughput, local disk",
        unit="MB/s",
        value=worst.value,
        baseline=worst.baseline,
        baseline_what=(
            "plain open/write/fsync loop doing the same I/O: same files, bytes, fsyncs "
            "(files and directories), metadata write and deletes"
        ),
        ratio=worst.ratio,
        ratio_what=(
            "median over runs of fastimpl MB/s / plain-loop MB/s of the same pair; "
            f"headline: the worst of the sizes the goal covers ({worst.label})"
        ),
        goal=">= 0.9 at 1 MiB and up",
        met=all(c.ratio >= 0.9 for c in judged),
        cases=cases,
        details={
            "workload": (
                "one subtask, WITHIN_CHECKPOINT merging, num_retained 1; per checkpoint: "
                "trigger, N WriteState of fresh keyed shared state, acknowledge, complete, "
                "deliver notifications (which subsume the previous checkpoint). MB = 1e6 "
                "bytes of segment payload per second of the whole cycle"
            ),
            "plans": [
                {
                    "size": p.size,
                    "segments_per_checkpoint": p.segments,
                    "checkpoints": p.checkpoints,
                }
                for p in plans
            ],
            "repeats": repeats,
            "fairness_check": fairness,
            "temp_dir": os.path.dirname(workdir),
        },
    )


# --------------------------------------------------------------------------- figure 2

SMALL = KIB


@dataclass(frozen=True)
class MemoryPlan:
    segments: int
    checkpoints: int

    @property
    def total(self) -> int:
        return self.segments * self.checkpoints


FULL_MEMORY_PLAN = MemoryPlan(1000, 10)
QUICK_MEMORY_PLAN = MemoryPlan(250, 4)


def fastimpl_memory(plan: MemoryPlan, ids: IdSource) -> tuple[float, Phases, int]:
    fs = memory_fs()
    root = f"/bench-{uuid.uuid4().hex}"
    cluster = new_cluster(fs, root, ids)
    phases = Phases()

    def run() -> None:
        checkpoint_cycles(
            cluster,
            first=1,
            checkpoints=plan.checkpoints,
            segments=plan.segments,
            size=SMALL,
            phases=phases,
        )
        settle(cluster)

    secs = timed(run)
    meta = [n for p, n in cluster.storage.list_files().items() if p.endswith("/" + METADATA)]
    if fs.exists(root):
        fs.rm(root, recursive=True)
    return secs, phases, max(meta, default=0)


def plain_memory(plan: MemoryPlan, metadata_size: int) -> float:
    """The same chunks into fsspec memory files: per checkpoint one data file (write and
    flush per segment, as fastimpl's append does), a metadata file of fastimpl's size,
    and the previous checkpoint's two files deleted."""
    fs = memory_fs()
    root = f"/plain-{uuid.uuid4().hex}"
    chunk = bytes(SMALL)
    meta_bytes = bytes(metadata_size)

    def run() -> None:
        shared = f"{root}/job-0/shared/v-0-1"
        previous: list[str] = []
        for cp in range(1, plan.checkpoints + 1):
            fs.makedirs(shared, exist_ok=True)
            path = f"{shared}/f{cp:06d}"
            f = fs.open(path, "wb")
            for _ in range(plan.segments):
                f.write(chunk)
                f.flush()
            f.close()
            meta = f"{root}/job-0/chk-{cp}/{METADATA}"
            fs.makedirs(meta.rsplit("/", 1)[0], exist_ok=True)
            with fs.open(meta, "wb") as g:
                g.write(meta_bytes)
            for p in previous:
                fs.rm_file(p)
            previous = [path, meta]

    secs = timed(run)
    if fs.exists(root):
        fs.rm(root, recursive=True)
    return secs


def small_segments(repeats: int, quick: bool = False, log: Callable[[str], None] = print) -> Figure:
    plan = QUICK_MEMORY_PLAN if quick else FULL_MEMORY_PLAN
    _, _, meta_size = fastimpl_memory(plan, CounterIds())  # warm-up; tells the metadata size
    plain_memory(plan, meta_size)
    series: dict[str, list[float]] = {
        k: [] for k in ("random_ids", "counter_ids", "write_path_only", "plain", "ratio_random")
    }
    per_phase: dict[str, list[float]] = {k: [] for k in ("write", "ack", "complete", "notify")}
    for r in range(repeats):
        order = [0, 1, 2] if r % 2 == 0 else [2, 1, 0]
        rates: dict[int, float] = {}
        for which in order:
            if which == 2:
                rates[2] = plan.total / plain_memory(plan, meta_size)
                continue
            ids: IdSource = RandomIds() if which == 0 else CounterIds()
            secs, phases, _ = fastimpl_memory(plan, ids)
            rates[which] = plan.total / secs
            if which == 0:
                series["write_path_only"].append(plan.total / phases.write)
                us = 1e6 / plan.total
                per_phase["write"].append(phases.write * us)
                per_phase["ack"].append(phases.acknowledge * us)
                per_phase["complete"].append(phases.complete * us)
                per_phase["notify"].append(phases.notify * us)
        series["random_ids"].append(rates[0])
        series["counter_ids"].append(rates[1])
        series["plain"].append(rates[2])
        series["ratio_random"].append(rates[0] / rates[2])
    plain = median(series["plain"])
    cases = [
        Case(
            "whole cycle, RandomIds (the default ids)",
            median(series["random_ids"]),
            plain,
            median(series["ratio_random"]),
            ">= 50,000/s",
            {"fastimpl": series["random_ids"], "plain": series["plain"]},
        ),
        Case(
            "whole cycle, CounterIds",
            median(series["counter_ids"]),
            plain,
            median(series["counter_ids"]) / plain,
            "(information)",
            {"fastimpl": series["counter_ids"]},
        ),
        Case(
            "WriteState calls only, RandomIds",
            median(series["write_path_only"]),
            plain,
            median(series["write_path_only"]) / plain,
            "(information)",
            {"fastimpl": series["write_path_only"]},
        ),
    ]
    head = cases[0]
    phase_us = {k: round(median(v), 2) for k, v in per_phase.items()}
    log(
        f"  fastimpl {head.value:,.0f} segments/s (CounterIds {cases[1].value:,.0f}, write path "
        f"alone {cases[2].value:,.0f}); plain loop {plain:,.0f}/s; us per segment by phase: "
        f"{phase_us}"
    )
    worst = min(cases[:2], key=lambda c: c.value)
    return Figure(
        key="small_segments_memory",
        title="2. 1 KiB segments, memory://",
        unit="segments/s",
        value=worst.value,
        baseline=plain,
        baseline_what=(
            "plain loop writing the same 1 KiB chunks into fsspec memory files: one file "
            "per checkpoint, flush per chunk, same metadata-sized file, same deletes"
        ),
        ratio=worst.value / plain,
        ratio_what="fastimpl segments/s / plain-loop chunks/s (the goal is absolute)",
        goal=">= 50,000 segments/s",
        met=worst.value >= 50_000,
        cases=cases,
        details={
            "workload": (
                f"one subtask, WITHIN_CHECKPOINT, num_retained 1; {plan.checkpoints} "
                f"checkpoints of {plan.segments} segments of 1 KiB; each: trigger, writes, "
                "acknowledge, complete, deliver notifications; segments/s over the whole cycle"
            ),
            "microseconds_per_segment_by_phase_random_ids": phase_us,
            "repeats": repeats,
        },
    )
