"""Figures 1 and 2: how fast a TM stores checkpoint state.

Both run whole checkpoint cycles through the API a real engine uses
(``bench/tm_cycle.py``): a ``TaskManager.alone`` in the bench process writes and
acknowledges, its ``Acknowledgement`` goes encoded over a pipe to the coordinator in a
spawned process, which completes the checkpoint, and the encoded notices come back and
are applied by the TM.

Figure 1, write throughput on local disk: the whole cycle, timed in the TM's process
(its wait for the coordinator included: the coordinator's ``_metadata`` and deletes are
on the same disk), against a plain ``open``/``write``/``fsync`` loop that does the same
physical I/O (same files created, same bytes, same fsyncs of files and of directories,
same deletes).

Figure 2, small segments on ``memory://``: 1 KiB segments per second of the TM's own
work (writes, acknowledgement, notices), against a plain loop writing the same chunks
into fsspec memory files; the whole cycle, the coordinator's round trip included, is a
case of its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common import (
    Case,
    Figure,
    counting_fsyncs,
    local_fs,
    median,
    memory_fs,
    timed,
    within_config,
)
from bench.tm_cycle import RemoteCoordinator, TmJob, TmPhases
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


@dataclass
class LocalRun:
    seconds: float
    data_files: int
    metadata_size: int


def fastimpl_local(base: str, plan: WritePlan, coordinator: RemoteCoordinator) -> LocalRun:
    """One run of ``plan.checkpoints`` checkpoint cycles on a fresh local root: the TM
    here, the coordinator in its process, both on the same directory."""
    root = tempfile.mkdtemp(prefix="fastimpl-", dir=base)
    ids = CounterIds()
    job = TmJob(coordinator, local_fs(), root, f"file://{root}", within_config(), ids)
    secs = timed(lambda: job.cycles(plan.checkpoints, plan.segments, plan.size))
    meta = coordinator.metadata_size()
    shutil.rmtree(root)
    return LocalRun(secs, ids.next_file - 1, meta)


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
    coordinator = RemoteCoordinator()
    try:
        for plan in plans:
            # A warm-up pair, not timed for the figure: it tells the metadata size and
            # checks that both sides create the same files and fsync as often.
            coordinator.fsyncs()  # from zero
            with counting_fsyncs() as fast_syncs:
                warm = fastimpl_local(workdir, plan, coordinator)
            fast_syncs[0] += coordinator.fsyncs()  # the coordinator's process's
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
                    a = fastimpl_local(workdir, plan, coordinator)
                    b = plain_local(workdir, plan, warm.metadata_size)
                else:
                    b = plain_local(workdir, plan, warm.metadata_size)
                    a = fastimpl_local(workdir, plan, coordinator)
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
        coordinator.close()
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
                "N TaskManager.write of fresh keyed shared state, TaskManager.acknowledge, "
                "the encoded Acknowledgement to the coordinator's process (spawned), which "
                "completes the checkpoint (subsuming the previous one) and triggers the "
                "next; the encoded notices back, applied by TaskManager.on_notice. MB = "
                "1e6 bytes of segment payload per second of the whole cycle, timed in the "
                "TM's process"
            ),
            "processes": "TM: the bench process; coordinator: a spawned process, same disk",
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


def fastimpl_memory(
    plan: MemoryPlan, ids: IdSource, coordinator: RemoteCoordinator
) -> tuple[float, TmPhases, int]:
    """One run on a fresh ``memory://`` root: wall seconds of the whole cycles in the
    TM's process, their phases, and the size of the coordinator's ``_metadata``."""
    fs = memory_fs()
    root = f"/bench-{uuid.uuid4().hex}"
    job = TmJob(coordinator, fs, root, f"memory://{root}", within_config(), ids)
    phases = TmPhases()
    secs = timed(lambda: job.cycles(plan.checkpoints, plan.segments, SMALL, phases))
    meta = coordinator.metadata_size()
    if fs.exists(root):
        fs.rm(root, recursive=True)
    return secs, phases, meta


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
    with RemoteCoordinator() as coordinator:
        return _small_segments(plan, repeats, coordinator, log)


def _small_segments(
    plan: MemoryPlan, repeats: int, coordinator: RemoteCoordinator, log: Callable[[str], None]
) -> Figure:
    _, _, meta_size = fastimpl_memory(plan, CounterIds(), coordinator)  # warm-up, metadata size
    plain_memory(plan, meta_size)
    keys = ("random_ids", "counter_ids", "whole_cycle", "write_path_only", "plain", "ratio")
    series: dict[str, list[float]] = {k: [] for k in keys}
    phase_keys = ("write", "acknowledge", "notices", "round_trip", "coordinator")
    per_phase: dict[str, list[float]] = {k: [] for k in phase_keys}
    for r in range(repeats):
        order = [0, 1, 2] if r % 2 == 0 else [2, 1, 0]
        rates: dict[int, float] = {}
        for which in order:
            if which == 2:
                rates[2] = plan.total / plain_memory(plan, meta_size)
                continue
            ids: IdSource = RandomIds() if which == 0 else CounterIds()
            _, phases, _ = fastimpl_memory(plan, ids, coordinator)
            rates[which] = plan.total / phases.tm
            if which == 0:
                series["whole_cycle"].append(plan.total / phases.wall)
                series["write_path_only"].append(plan.total / phases.write)
                us = 1e6 / plan.total
                for k in phase_keys:
                    per_phase[k].append(getattr(phases, k) * us)
        series["random_ids"].append(rates[0])
        series["counter_ids"].append(rates[1])
        series["plain"].append(rates[2])
        series["ratio"].append(min(rates[0], rates[1]) / rates[2])
    plain = median(series["plain"])
    cases = [
        Case(
            "TM's work, RandomIds (the default ids)",
            median(series["random_ids"]),
            plain,
            median(series["random_ids"]) / plain,
            ">= 50,000/s",
            {"fastimpl": series["random_ids"], "plain": series["plain"]},
        ),
        Case(
            "TM's work, CounterIds",
            median(series["counter_ids"]),
            plain,
            median(series["counter_ids"]) / plain,
            ">= 50,000/s",
            {"fastimpl": series["counter_ids"]},
        ),
        Case(
            "whole cycle with the coordinator's round trip, RandomIds",
            median(series["whole_cycle"]),
            plain,
            median(series["whole_cycle"]) / plain,
            "(information)",
            {"fastimpl": series["whole_cycle"]},
        ),
        Case(
            "TaskManager.write calls only, RandomIds",
            median(series["write_path_only"]),
            plain,
            median(series["write_path_only"]) / plain,
            "(information)",
            {"fastimpl": series["write_path_only"]},
        ),
    ]
    phase_us = {k: round(median(v), 2) for k, v in per_phase.items()}
    log(
        f"  TM {cases[0].value:,.0f} segments/s (CounterIds {cases[1].value:,.0f}, whole "
        f"cycle {cases[2].value:,.0f}, writes alone {cases[3].value:,.0f}); plain loop "
        f"{plain:,.0f}/s; us per segment by phase: {phase_us}"
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
            "per checkpoint, flush per chunk, a metadata-sized file, the same deletes"
        ),
        ratio=median(series["ratio"]),
        ratio_what=(
            "median over runs of the slower id source's TM segments/s / plain-loop "
            "chunks/s of the same round (the goal is absolute)"
        ),
        goal=">= 50,000 segments/s",
        met=worst.value >= 50_000,
        cases=cases,
        details={
            "workload": (
                f"one subtask, WITHIN_CHECKPOINT, num_retained 1; {plan.checkpoints} "
                f"checkpoints of {plan.segments} segments of 1 KiB; each: TaskManager.write "
                "per segment, TaskManager.acknowledge and the Acknowledgement encoded, the "
                "coordinator's process decodes it, completes and triggers the next, the "
                "encoded notices are decoded and applied (TaskManager.on_notice) and the "
                "TM's deletes finish"
            ),
            "processes": (
                "TM: the bench process (the clock runs there); coordinator: a spawned "
                "process with a memory:// of its own, where it writes _metadata"
            ),
            "value_is": (
                "segments / seconds of the TM's own work (write + acknowledge + notices); "
                "round_trip is the TM waiting for the coordinator (pipe + its work)"
            ),
            "microseconds_per_segment_by_phase_random_ids": phase_us,
            "repeats": repeats,
        },
    )
