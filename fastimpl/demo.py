"""A scripted job on real local files, in each merging mode (``make demo``, issue 3).

Run it as ``python -m fastimpl.demo`` (``--help`` for the options). For each merging mode
(NONE, WITHIN_CHECKPOINT, ACROSS_CHECKPOINT) a ``fastimpl.InProcessEngine`` on a local directory
runs one job on two TMs:

* ``source`` (parallelism 2): operator list state (offsets) and union list state
  (watermarks);
* ``window`` (parallelism 4): incremental keyed state, modelled on RocksDB: every
  checkpoint flushes one or two new SST files of 4-24 KiB, compaction merges the oldest
  files into one, and a snapshot uploads the new files and reuses (``ReuseShared``) the
  ones it uploaded before; every third checkpoint also writes a full keyed snapshot
  (timers, exclusive scope);
* ``sink`` (parallelism 2): operator list state (pending transactions).

All sizes come from a seeded ``random.Random``. The script: a few dozen checkpoints with
every notification delivered, except for one checkpoint that a subtask declines, one
completion notification that is lost, a TM crash in the middle of a checkpoint (the lost
TM keeps writing as a zombie) followed by a failover and, one checkpoint later, the news
that the lost attempt stopped; then a rescaling restore of the latest checkpoint in CLAIM
mode (``window`` 4 -> 3) and more checkpoints in the new job. At the end the job is
brought to quiet (every notification delivered, failed deletes retried, ``num_retained +
1`` checkpoints without faults).

After every command the demo lists the real files (``InProcessEngine.observe``) and checks the
safety invariants I1-I5 (``spec.invariants.check_safety``); at the end it checks all of
them, I6 (no leak) included. It counts the files created and deleted on storage per
checkpoint, from one listing to the next, and prints a table per mode and a summary.
A violation is printed with the command sequence that led to it, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import fsspec  # type: ignore[import-untyped]

from fastimpl.engine import InProcessEngine
from fastimpl.ids import CounterIds, IdSource, RandomIds
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.errors import CommandError, Reason
from spec.handles import SegmentHandle, stream_of
from spec.ids import SubtaskId, TmId
from spec.invariants import Violation, check_all, check_safety
from spec.layout import METADATA
from spec.observation import Observation

KIB = 1024
DEFAULT_CHECKPOINTS = 30
MIN_CHECKPOINTS = 8
DEFAULT_SEED = 306
MODES = (MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT)
JOB = JobSpec((VertexSpec("source", 2), VertexSpec("window", 4), VertexSpec("sink", 2)), num_tms=2)
RESCALED_WINDOW = 3
_METADATA_SUFFIX = "/" + METADATA

BRIEF_LINE = (
    "BRIEF section 7, real Flink 2.3 (RocksDB incremental, word count, parallelism 4, "
    "1.1 MB state): state files created per checkpoint / space amplification: no merging "
    "13.2 / 1.0x, within 13.0 / 1.7x, across with 32 MB files 0.07 / 109x."
)


class DemoFailure(Exception):
    """An invariant broke, or the store refused a command the script expected it to take."""


# ---------------------------------------------------------------------- the job's state


class LocalDb:
    """A subtask's local RocksDB, as far as checkpoints see it: named SST files with sizes.

    Each checkpoint interval flushes one or two new files; once more than five exist,
    compaction merges the four oldest into one new file (60% of their bytes survive)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.files: dict[str, int] = {}
        self.next_file = 1

    def new_file(self, size: int) -> None:
        self.files[f"{self.next_file:06d}.sst"] = size
        self.next_file += 1

    def advance(self) -> None:
        for _ in range(self.rng.randint(1, 2)):
            self.new_file(self.rng.randint(4, 24) * KIB)
        if len(self.files) > 5:
            oldest = list(self.files)[:4]
            merged = sum(self.files.pop(name) for name in oldest)
            self.new_file(int(merged * 0.6))

    def total(self) -> int:
        return sum(self.files.values())


@dataclass
class Row:
    """What happened on storage between the end of one checkpoint and the end of the next."""

    checkpoint: int = 0
    status: str = ""
    notes: list[str] = field(default_factory=list)
    created: int = 0
    deleted: int = 0
    meta_created: int = 0
    meta_deleted: int = 0
    files: int = 0
    stored: int = 0
    live: int = 0

    @property
    def amplification(self) -> float:
        return self.stored / self.live if self.live else float("inf")


@dataclass
class ModeResult:
    mode: MergingMode
    root: str
    rows: list[Row] = field(default_factory=list)
    commands: int = 0
    violations: list[str] = field(default_factory=list)
    error: str | None = None
    files_at_end: int = 0
    metadata_at_end: int = 0
    stored_at_end: int = 0
    live_at_end: int = 0
    empty_dirs_at_end: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None

    @property
    def completed(self) -> int:
        return sum(1 for r in self.rows if r.status.startswith("completed"))

    @property
    def aborted(self) -> int:
        return sum(1 for r in self.rows if r.status.startswith("aborted"))

    @property
    def created(self) -> int:
        return sum(r.created for r in self.rows)

    @property
    def deleted(self) -> int:
        return sum(r.deleted for r in self.rows)

    @property
    def meta_created(self) -> int:
        return sum(r.meta_created for r in self.rows)

    @property
    def meta_deleted(self) -> int:
        return sum(r.meta_deleted for r in self.rows)

    @property
    def amplification(self) -> float:
        return self.stored_at_end / self.live_at_end if self.live_at_end else float("inf")

    @property
    def peak_amplification(self) -> float:
        return max((r.amplification for r in self.rows if r.live), default=0.0)

    @property
    def mean_amplification(self) -> float:
        amps = [r.amplification for r in self.rows if r.live]
        return sum(amps) / len(amps) if amps else 0.0


@dataclass
class DemoResult:
    modes: list[ModeResult]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.modes)


def state_bytes(obs: Observation) -> tuple[int, int]:
    """(bytes of the state files on storage, distinct state bytes that retained checkpoints
    and the state being restored refer to). ``_metadata`` files count in neither."""
    stored = sum(n for p, n in obs.files.items() if not p.endswith(_METADATA_SUFFIX))
    live: set[tuple[str, int, int]] = set()
    entries = [e for r in obs.retained for e in r.entries] + list(obs.restoring)
    for e in entries:
        s = stream_of(e.handle)
        if s is not None:
            offset = s.offset if isinstance(s, SegmentHandle) else 0
            live.add((s.path, offset, s.length))
    return stored, sum(length for _p, _o, length in live)


def empty_directories(root: str, obs: Observation) -> int:
    """Empty directories on disk that are not managed directories of the store (a
    subsumed checkpoint's ``chk-N/``, an ended job's ``shared/<subtask>/`` without merging).
    SPEC.md counts such directories as implicit, gone with their last file; a local file
    system keeps them."""
    managed = {os.path.normpath(os.path.join(root, d)) for d in obs.directories}
    holds: set[str] = set()  # directories with a file or a managed directory under them
    count = 0
    for here, _dirs, files in os.walk(root, topdown=False):
        here = os.path.normpath(here)
        if files or here in managed or here in holds:
            holds.add(os.path.dirname(here))
        elif here != os.path.normpath(root):
            count += 1
    return count


# ---------------------------------------------------------------------- the driver


def _call(engine: InProcessEngine, cmd: c.Command) -> None:
    """The script's steps as the engine's calls; a snapshot's bytes are zeros of the
    size the script gives (a re-upload too: the demo counts files, not contents)."""
    match cmd:
        case c.Trigger():
            engine.trigger(cmd.savepoint)
        case c.WriteState():
            engine.write(
                cmd.checkpoint,
                cmd.subtask,
                cmd.kind,
                cmd.name,
                bytes(cmd.size),
                cmd.entries,
                cmd.attempt,
            )
        case c.ReuseShared():
            engine.reuse_shared(
                cmd.checkpoint, cmd.subtask, cmd.name, cmd.attempt, lambda h: bytes(h.length)
            )
        case c.Acknowledge():
            engine.acknowledge(cmd.checkpoint, cmd.subtask, cmd.attempt)
        case c.Decline():
            engine.decline(cmd.checkpoint, cmd.subtask)
        case c.Complete():
            engine.complete(cmd.checkpoint)
        case c.DeliverNotification():
            engine.deliver(cmd.index)
        case c.DropNotification():
            engine.channel.drop(cmd.index)  # the network loses it
        case c.CrashTm():
            engine.crash_tm(cmd.tm)
        case c.AttemptStopped():
            engine.attempt_stopped(cmd.tm)
        case c.Failover():
            engine.failover()
        case c.Restore():
            engine.restore(cmd.checkpoint, cmd.parallelism, cmd.mode, cmd.max_parallelism)
        case c.RetryDeletes():
            engine.retry_deletes()
        case _:
            raise ValueError(f"the demo's script has no step {cmd!r}")


class ScriptedJob:
    """Drives one InProcessEngine through the script; checks I1-I5 after every command."""

    def __init__(
        self, mode: MergingMode, root: str, ids: IdSource, seed: int, result: ModeResult
    ) -> None:
        self.mode = mode
        self.config = Config.for_mode(mode)
        self.cluster = InProcessEngine(self.config, JOB, fsspec.filesystem("file"), root, ids)
        self.rng = random.Random(f"{seed}-{mode.value}")
        self.result = result
        self.history: list[c.Command] = []
        self.files: dict[str, int] = {}
        self.row = Row()
        self.next_checkpoint = 1
        self.latest_completed = 0
        self.vertices = {v.name: v.parallelism for v in JOB.vertices}
        self.dbs: dict[SubtaskId, LocalDb] = {}
        self.uploaded: dict[SubtaskId, set[str]] = {}
        """The SST names each subtask uploaded or reused in its last snapshot."""
        self.completed_dbs: dict[SubtaskId, dict[str, int]] = {}
        """Each subtask's SST files as of the latest completed checkpoint."""
        for s in self.subtasks():
            if s.vertex == "window":
                self.dbs[s] = LocalDb(self.rng)
        self.root = root

    # ------------------------------------------------------------------ commands

    def subtasks(self) -> list[SubtaskId]:
        return [SubtaskId(v, i, p) for v, p in self.vertices.items() for i in range(p)]

    def run(self, cmd: c.Command) -> None:
        """Apply a command, count the files it created and deleted, check I1-I5."""
        self.history.append(cmd)
        try:
            _call(self.cluster, cmd)
        except CommandError:
            self.history.pop()
            raise
        self.result.commands += 1
        obs = self.cluster.observe()
        self._count(obs)
        self.check(check_safety(obs) + self.missing_directories(obs))

    def missing_directories(self, obs: Observation) -> list[Violation]:
        """Managed directories the store reports must exist on the disk."""
        return [
            Violation("storage", f"managed directory {d} reported but not on disk")
            for d in obs.directories
            if not os.path.isdir(os.path.join(self.root, d))
        ]

    def try_run(self, cmd: c.Command, *refusals: Reason) -> bool:
        """Apply a command the store may refuse for one of ``refusals`` (nothing changes)."""
        try:
            self.run(cmd)
        except CommandError as err:
            if err.reason not in refusals:
                raise
            return False
        return True

    def _count(self, obs: Observation) -> None:
        now = dict(obs.files)
        for p in now.keys() - self.files.keys():
            if p.endswith(_METADATA_SUFFIX):
                self.row.meta_created += 1
            else:
                self.row.created += 1
        for p in self.files.keys() - now.keys():
            if p.endswith(_METADATA_SUFFIX):
                self.row.meta_deleted += 1
            else:
                self.row.deleted += 1
        self.files = now

    def check(self, broken: list[Violation]) -> None:
        if broken:
            self.result.violations += [str(v) for v in broken]
            raise DemoFailure(
                "\n".join(
                    [
                        f"invariant violated in mode {self.mode.name}:",
                        *(f"  {v}" for v in broken),
                        "after commands:",
                        *(f"    {cmd!r}," for cmd in self.history),
                    ]
                )
            )

    def close_row(self, checkpoint: int, status: str) -> None:
        obs = self.cluster.observe()
        self.row.checkpoint = checkpoint
        self.row.status = status
        self.row.files = len(obs.files)
        self.row.stored, self.row.live = state_bytes(obs)
        self.result.rows.append(self.row)
        self.row = Row()

    def note(self, text: str) -> None:
        self.row.notes.append(text)

    def deliver_all(self) -> None:
        while self.try_run(c.DeliverNotification(0), Reason.NO_SUCH_NOTIFICATION):
            pass

    def live_tms(self) -> list[TmId]:
        return sorted(p[3:] for p in self.cluster.observe().live_parties if p.startswith("tm:"))

    # ------------------------------------------------------------------ snapshots

    def trigger(self) -> int:
        self.run(c.Trigger())
        cp = self.next_checkpoint
        self.next_checkpoint += 1
        for db in self.dbs.values():
            db.advance()
        return cp

    def snapshot(self, cp: int, s: SubtaskId) -> None:
        """Everything subtask ``s`` writes for checkpoint ``cp``."""
        rng = self.rng
        if s.vertex == "source":
            partitions = 4
            self.write(cp, s, StateKind.OPERATOR_LIST, "offsets", 64 * partitions, partitions)
            self.write(cp, s, StateKind.OPERATOR_UNION, "watermarks", 96, 1)
        elif s.vertex == "sink":
            self.write(cp, s, StateKind.OPERATOR_LIST, "pending-txn", rng.randint(1, 2) * KIB, 2)
        else:
            db = self.dbs[s]
            before = self.uploaded.get(s, set())
            for name, size in db.files.items():
                if name in before and self.try_run(
                    c.ReuseShared(cp, s, name), Reason.NO_SUCH_STATE
                ):
                    continue  # reused, or uploaded again where the store could not reuse
                self.write(cp, s, StateKind.KEYED_SHARED, name, size)
            self.uploaded[s] = set(db.files)
            if cp % 3 == 0:
                self.write(cp, s, StateKind.KEYED_FULL, "timers", rng.randint(1, 3) * KIB)

    def write(
        self,
        cp: int,
        s: SubtaskId,
        kind: StateKind,
        name: str,
        size: int,
        entries: int = 1,
    ) -> None:
        self.run(c.WriteState(cp, s, kind, name, size, entries))

    def complete(self, cp: int, *, drop: bool = False) -> None:
        self.run(c.Complete(cp))
        self.latest_completed = cp
        self.completed_dbs = {s: dict(db.files) for s, db in self.dbs.items()}
        if drop:
            self.run(c.DropNotification(0))
            self.note("one TM's completion notice lost")
        self.deliver_all()
        self.close_row(cp, "completed")

    # ------------------------------------------------------------------ the script's steps

    def checkpoint(self, *, drop: bool = False) -> None:
        cp = self.trigger()
        for s in self.subtasks():
            self.snapshot(cp, s)
            self.run(c.Acknowledge(cp, s))
        self.complete(cp, drop=drop)

    def declined_checkpoint(self) -> None:
        cp = self.trigger()
        victim = SubtaskId("window", 2, self.vertices["window"])
        for s in self.subtasks():
            self.snapshot(cp, s)
            if s == victim:
                self.run(c.Decline(cp, s))
                break
            self.run(c.Acknowledge(cp, s))
        self.deliver_all()
        self.note(f"{victim} declined")
        self.close_row(cp, "aborted")

    def crashed_checkpoint(self) -> TmId:
        """Half the subtasks snapshot, then the last TM is lost; it keeps running as a
        zombie and writes one more SST for the checkpoint it does not know aborted."""
        cp = self.trigger()
        subtasks = self.subtasks()
        for s in subtasks[: len(subtasks) // 2]:
            self.snapshot(cp, s)
            self.run(c.Acknowledge(cp, s))
        lost = self.live_tms()[-1]
        self.run(c.CrashTm(lost))
        self.note(f"{lost} lost mid-checkpoint")
        for s in subtasks:
            if s.vertex == "window" and self.try_run(
                c.WriteState(cp, s, StateKind.KEYED_SHARED, "zombie.sst", 8 * KIB, 1, lost),
                Reason.NOT_HOSTED,
                Reason.ALREADY_ACKNOWLEDGED,
            ):
                self.note(f"zombie {lost} wrote for {s}")
                break
        self.deliver_all()
        self.close_row(cp, "aborted")
        return lost

    def failover(self) -> None:
        self.run(c.Failover())
        # every subtask's database restarts from the latest completed checkpoint
        for s, files in self.completed_dbs.items():
            self.dbs[s].files = dict(files)
            self.uploaded[s] = set(files)
        self.note("failover")

    def attempt_stopped(self, tm: TmId) -> None:
        pending = len(self.cluster.observe().pending_deletes)
        self.run(c.AttemptStopped(tm))
        self.note(f"{tm} stopped ({pending} delete{'' if pending == 1 else 's'} waited for it)")

    def rescale(self) -> None:
        """Restore the latest checkpoint in CLAIM mode with ``window`` rescaled."""
        old = self.vertices["window"]
        total = sum(db.total() for db in self.dbs.values())
        self.run(
            c.Restore(self.latest_completed, (("window", RESCALED_WINDOW),), mode=RestoreMode.CLAIM)
        )
        self.vertices["window"] = RESCALED_WINDOW
        self.dbs = {}
        self.uploaded = {}
        for s in self.subtasks():
            if s.vertex == "window":
                db = LocalDb(self.rng)
                share = total // RESCALED_WINDOW
                for part in (share // 2, share // 3, share - share // 2 - share // 3):
                    db.new_file(part)  # the restored key groups, ingested into a new DB
                self.dbs[s] = db
        self.note(f"restore chk-{self.latest_completed} CLAIM, window {old}->{RESCALED_WINDOW}")

    def quiesce(self) -> list[Violation]:
        """R60: deliver everything, retry failed deletes, then ``num_retained + 1``
        checkpoints without faults; then every invariant, I6 included."""
        self.deliver_all()
        if self.cluster.observe().pending_deletes:
            self.run(c.RetryDeletes())
        for _ in range(self.config.num_retained + 1):
            self.checkpoint()
            self.result.rows[-1].status = "completed (quiesce)"
        obs = self.cluster.observe()
        return check_all(obs, quiet=True) + self.missing_directories(obs)


def plan(checkpoints: int) -> dict[str, int]:
    """At which count of completed checkpoints each scripted fault happens."""
    n = checkpoints
    decline = max(2, n // 5)
    drop = max(decline + 1, n // 3)
    crash = max(drop + 1, n // 2)
    rescale = max(crash + 2, 2 * n // 3)
    return {"decline": decline, "drop": drop, "crash": crash, "rescale": rescale}


def run_mode(
    mode: MergingMode, root: str, ids: IdSource, seed: int, checkpoints: int
) -> ModeResult:
    result = ModeResult(mode, root)
    start = time.perf_counter()
    job = ScriptedJob(mode, root, ids, seed, result)
    at = plan(checkpoints)
    done: set[str] = set()
    lost: TmId | None = None
    stop_after: int | None = None
    try:
        while result.completed < checkpoints:
            k = result.completed
            if stop_after is not None and k >= stop_after and lost is not None:
                job.attempt_stopped(lost)
                lost = stop_after = None
            if k == at["decline"] and "decline" not in done:
                done.add("decline")
                job.declined_checkpoint()
            elif k == at["crash"] and "crash" not in done:
                done.add("crash")
                lost = job.crashed_checkpoint()
                job.failover()
                stop_after = k + 1
            else:
                if k == at["rescale"] and "rescale" not in done:
                    done.add("rescale")
                    job.rescale()
                drop = k == at["drop"] and "drop" not in done
                if drop:
                    done.add("drop")
                job.checkpoint(drop=drop)
        if lost is not None:
            job.attempt_stopped(lost)
        quiet = job.quiesce()
        job.check(quiet)
        obs = job.cluster.observe()
        result.files_at_end = len(obs.files)
        result.metadata_at_end = len(obs.metadata_files)
        result.stored_at_end, result.live_at_end = state_bytes(obs)
        result.empty_dirs_at_end = empty_directories(root, obs)
    except DemoFailure as err:
        result.error = str(err)
    except CommandError as err:
        result.error = "\n".join(
            [
                f"the store refused a scripted command in mode {mode.name}: {err}",
                "after commands:",
                *(f"    {cmd!r}," for cmd in job.history),
            ]
        )
    except Exception as err:  # a crash of the store is a bug to report with its commands
        result.error = "\n".join(
            [
                f"the store raised in mode {mode.name}: {err!r}",
                traceback.format_exc(),
                "after commands (the last one raised):",
                *(f"    {cmd!r}," for cmd in job.history),
            ]
        )
    result.seconds = time.perf_counter() - start
    return result


# ---------------------------------------------------------------------- output


def _kib(n: int) -> str:
    return f"{n / KIB:,.0f}"


def _amp(x: float) -> str:
    return "-" if x == float("inf") else f"{x:.2f}x"


def _say(out: TextIO, text: str) -> None:
    """Print prose wrapped to 100 columns."""
    print(textwrap.fill(text, width=100, break_on_hyphens=False), file=out)


def print_mode(r: ModeResult, out: TextIO, *, per_checkpoint: bool) -> None:
    print(f"\n== merging mode {r.mode.name}: {r.root}", file=out)
    if per_checkpoint:
        print(
            f"{'chk':>4} {'status':<19} {'+files':>6} {'-files':>6} {'+/-meta':>7} "
            f"{'files':>5} {'stored KiB':>10} {'live KiB':>8} {'amp':>6}  events",
            file=out,
        )
        for row in r.rows:
            print(
                f"{row.checkpoint:>4} {row.status:<19} {row.created:>6} {row.deleted:>6} "
                f"{f'{row.meta_created}/{row.meta_deleted}':>7} {row.files:>5} "
                f"{_kib(row.stored):>10} {_kib(row.live):>8} {_amp(row.amplification):>6}  "
                f"{'; '.join(row.notes)}".rstrip(),
                file=out,
            )
    if r.error is not None:
        print(f"FAILED: {r.error}", file=out)
        return
    n = max(r.completed, 1)
    _say(
        out,
        f"{r.completed} checkpoints completed, {r.aborted} aborted. State files created: "
        f"{r.created} ({r.created / n:.2f} per completed checkpoint), deleted: {r.deleted} "
        f"({r.deleted / n:.2f}); _metadata created {r.meta_created}, deleted {r.meta_deleted}.",
    )
    _say(
        out,
        f"At the end: {r.files_at_end} files ({r.metadata_at_end} _metadata), "
        f"{_kib(r.stored_at_end)} KiB of state files for {_kib(r.live_at_end)} KiB live: "
        f"space amplification {_amp(r.amplification)} (mean over the rows "
        f"{_amp(r.mean_amplification)}, peak {_amp(r.peak_amplification)}); "
        f"{r.empty_dirs_at_end} empty directories left on disk.",
    )
    _say(
        out,
        f"Invariants I1-I5 checked on the real files after each of {r.commands} commands, "
        f"I1-I6 once quiet: no violation. {r.seconds:.1f} s.",
    )


def print_summary(result: DemoResult, out: TextIO) -> None:
    print("\n== summary", file=out)
    print(
        f"{'mode':<18} {'done':>4} {'abort':>5} {'created/chk':>11} {'deleted/chk':>11} "
        f"{'files at end':>12} {'stored KiB':>10} {'live KiB':>8} {'amp':>6} {'mean':>6} "
        f"{'peak':>6} {'result':>6}",
        file=out,
    )
    for r in result.modes:
        n = max(r.completed, 1)
        print(
            f"{r.mode.name:<18} {r.completed:>4} {r.aborted:>5} {r.created / n:>11.2f} "
            f"{r.deleted / n:>11.2f} {r.files_at_end:>12} {_kib(r.stored_at_end):>10} "
            f"{_kib(r.live_at_end):>8} {_amp(r.amplification):>6} "
            f"{_amp(r.mean_amplification):>6} {_amp(r.peak_amplification):>6} "
            f"{'ok' if r.ok else 'FAILED':>6}",
            file=out,
        )
    for line in (
        "created/chk, deleted/chk: state files (not _metadata) per completed checkpoint.",
        "amp: space amplification = bytes of every state file on storage (every file but "
        "_metadata) / bytes of the distinct segments and files that the retained checkpoints "
        "(and a restore in progress) refer to, at the end; mean and peak over the rows. "
        "1.00x: no dead bytes.",
        "max_space_amplification is 2.0 (Flink's default) per file: a file above it is "
        "closed and no longer reused (R80, R81) and goes once the next checkpoint has "
        "uploaded its live segments again, so the total can stay above 2.0 for a checkpoint.",
        BRIEF_LINE,
    ):
        _say(out, line)
    verdict = (
        "Every invariant held on the real files."
        if result.ok
        else "FAILED: an invariant was violated or the store refused the script (see above)."
    )
    _say(out, f"{verdict} Total {result.seconds:.1f} s.")


# ---------------------------------------------------------------------- entry points


class UsageError(Exception):
    pass


def run_demo(
    base: Path,
    *,
    checkpoints: int = DEFAULT_CHECKPOINTS,
    seed: int = DEFAULT_SEED,
    deterministic: bool = False,
    modes: Iterable[MergingMode] = MODES,
    per_checkpoint: bool = True,
    out: TextIO = sys.stdout,
) -> DemoResult:
    """Run the script in each mode under ``base/<mode>`` (each must be new or empty)."""
    if checkpoints < MIN_CHECKPOINTS:
        raise UsageError(f"the script needs at least {MIN_CHECKPOINTS} checkpoints")
    start = time.perf_counter()
    _say(
        out,
        f"ckpt-ownership demo: source(2) -> window(4, RocksDB-like incremental state) -> "
        f"sink(2) on 2 TMs, local files under {base}; {checkpoints} checkpoints per merging "
        f"mode with a declined checkpoint, a lost notification, a TM crash with a zombie "
        f"and a failover, a CLAIM restore rescaling window 4->{RESCALED_WINDOW}; then "
        f"quiesce (deliver, retry deletes, 2 more checkpoints). "
        f"{'CounterIds' if deterministic else 'RandomIds'}, seed {seed}.",
    )
    if per_checkpoint:
        _say(
            out,
            "Per checkpoint: state files created (+files) and deleted (-files) on storage "
            "since the previous row, _metadata files created/deleted; then, once the "
            "checkpoint is over, files on storage, KiB of state files, live KiB (referenced "
            "by retained checkpoints) and their ratio (amp).",
        )
    results = []
    for mode in modes:
        root = base / mode.value
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise UsageError(f"{root} is not empty")
        ids: IdSource = CounterIds() if deterministic else RandomIds()
        r = run_mode(mode, str(root), ids, seed, checkpoints)
        print_mode(r, out, per_checkpoint=per_checkpoint)
        out.flush()
        results.append(r)
    result = DemoResult(results, time.perf_counter() - start)
    print_summary(result, out)
    return result


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    """The command line; returns the exit status (0: every invariant held)."""
    parser = argparse.ArgumentParser(
        prog="python -m fastimpl.demo",
        description="A scripted job on local files in each merging mode, every invariant "
        "checked against the real files.",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="keep the files under BASE/<mode> (default: a temporary directory, removed)",
    )
    parser.add_argument(
        "--checkpoints",
        type=int,
        default=DEFAULT_CHECKPOINTS,
        help=f"checkpoints to complete per mode before quiescing (at least {MIN_CHECKPOINTS}; "
        f"default {DEFAULT_CHECKPOINTS})",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the state sizes")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="name files with CounterIds (the reference model's names) instead of uuids",
    )
    parser.add_argument("--summary", action="store_true", help="no per-checkpoint tables")
    args = parser.parse_args(argv)
    try:
        if args.base is not None:
            result = run_demo(
                args.base,
                checkpoints=args.checkpoints,
                seed=args.seed,
                deterministic=args.deterministic,
                per_checkpoint=not args.summary,
                out=out,
            )
        else:
            with tempfile.TemporaryDirectory(prefix="ckpt-demo-") as tmp:
                result = run_demo(
                    Path(tmp),
                    checkpoints=args.checkpoints,
                    seed=args.seed,
                    deterministic=args.deterministic,
                    per_checkpoint=not args.summary,
                    out=out,
                )
    except UsageError as err:
        parser.error(str(err))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
