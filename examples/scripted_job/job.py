"""The scripted job: what a stream processor does with a ``CheckpointStore``.

One job on two TMs, three vertices:

* ``source`` (parallelism 2): operator list state (offsets) and union list state
  (watermarks);
* ``window`` (parallelism 4): incremental keyed state (``rocks_like.LocalDb``): each
  checkpoint uploads the SST files created since the last one and reuses the others with
  ``FileMergingManager.reuse_shared``; every third checkpoint also writes a full keyed
  snapshot (timers, exclusive scope);
* ``sink`` (parallelism 2): operator list state (pending transactions).

The script (``run_mode``): checkpoints with every notice delivered, except for one
checkpoint that a subtask declines, one completion notice that reaches its TM late, and a
TM lost in the middle of a checkpoint: the job fails over while the lost TM keeps running
as a zombie and writes once more; one checkpoint later the engine reports that the zombie
stopped. Then a rescaling restore of the latest checkpoint in CLAIM mode (``window``
4 -> 3) and more checkpoints in the new job; at the end the job is brought to quiet.

Every call below is one of the public API (``fastimpl``'s ``CheckpointStore``, its
``Coordinator``, a TM's ``FileMergingManager`` and its streams), except where the script
simulates what a real job only suffers or inspects what a job never sees, through the
store's test seam ``fastimpl.testing``: losing a TM (``testing.crash``) and learning that
its process stopped (``testing.stopped``), the files and bookkeeping
(``testing.observe``). After each call, ``ScriptedJob.check`` lists the real files and
checks the invariants I1-I5 (``testing.check_invariants``); once quiet, I6 (no leak) too.
"""

from __future__ import annotations

import random
import time
import traceback

from examples.scripted_job.figures import (
    FileCounter,
    ModeResult,
    empty_directories,
    missing_directories,
    state_bytes,
)
from examples.scripted_job.rocks_like import KIB, LocalDb, payload
from fastimpl import CheckpointStore, FileMergingManager, IdSource, testing
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.errors import CommandError, Reason
from spec.ids import SubtaskId, TmId
from spec.invariants import Violation

JOB = JobSpec((VertexSpec("source", 2), VertexSpec("window", 4), VertexSpec("sink", 2)), num_tms=2)
RESCALED_WINDOW = 3
MIN_CHECKPOINTS = 8


class JobFailure(Exception):
    """An invariant failed on the real files, or a subtask restored other bytes than
    those written; the message says which, and lists the steps that led there."""


class ScriptedJob:
    """Drives one ``CheckpointStore`` through the script, checking after every call."""

    def __init__(self, store: CheckpointStore, root: str, seed: int, result: ModeResult) -> None:
        self.store = store
        self.coordinator = store.coordinator
        self.root = root
        self.rng = random.Random(f"{seed}-{store.config.merging_mode.value}")
        self.result = result
        self.counter = FileCounter(result)
        self.steps: list[str] = []
        self.latest_completed = 0
        self.vertices = {v.name: v.parallelism for v in JOB.vertices}
        self.dbs = {s: LocalDb(self.rng) for s in self.subtasks() if s.vertex == "window"}
        self.uploaded: dict[SubtaskId, set[str]] = {}
        """The SST names each subtask uploaded or reused in its last snapshot."""
        self.completed_dbs: dict[SubtaskId, dict[str, int]] = {}
        """Each subtask's SST files as of the latest completed checkpoint."""

    def subtasks(self) -> list[SubtaskId]:
        return [SubtaskId(v, i, p) for v, p in self.vertices.items() for i in range(p)]

    # ------------------------------------------------------------------ checking

    def check(self, step: str) -> None:
        """``step`` just ran: count the files it created and deleted, check I1-I5."""
        self.steps.append(step)
        self.result.steps += 1
        obs = testing.observe(self.store)
        self.counter.count(obs)
        broken = testing.check_invariants(self.store) + [
            Violation("storage", f"managed directory {d} reported but not on disk")
            for d in missing_directories(self.root, obs)
        ]
        self.fail_on(broken)

    def fail_on(self, broken: list[Violation]) -> None:
        if broken:
            self.result.violations += [str(v) for v in broken]
            raise JobFailure(
                "\n".join(
                    [
                        f"invariant violated in mode {self.result.mode.name}:",
                        *(f"  {v}" for v in broken),
                        "after steps:",
                        *(f"    {step}" for step in self.steps),
                    ]
                )
            )

    def close_row(self, checkpoint: int, status: str) -> None:
        self.counter.close_row(checkpoint, status, testing.observe(self.store))

    def note(self, text: str) -> None:
        self.counter.note(text)

    def deliver_all(self) -> None:
        self.store.deliver_notifications()
        self.check("deliver_notifications()")

    # ------------------------------------------------------------------ one subtask's snapshot

    def write(
        self,
        manager: FileMergingManager,
        cp: int,
        s: SubtaskId,
        kind: StateKind,
        name: str,
        size: int,
        entries: int = 1,
    ) -> None:
        """One state handle: open a stream, write its bytes, close it. The handle comes
        back once the bytes are durable; the acknowledgement sends it later."""
        stream = manager.open_stream(cp, s, kind, name, entries=entries)
        stream.write(payload(name, size))
        stream.close_and_get_handle()
        self.check(f"{manager.tm}.write({cp}, {s}, {kind.name}, {name!r}, {size} bytes)")

    def snapshot(self, cp: int, s: SubtaskId) -> None:
        """Everything subtask ``s`` writes for checkpoint ``cp``, on the TM hosting it."""
        manager = self.store.manager_for(s)
        rng = self.rng
        if s.vertex == "source":
            partitions = 4  # one offset of 64 bytes per partition read, as list entries
            size = 64 * partitions
            self.write(manager, cp, s, StateKind.OPERATOR_LIST, "offsets", size, partitions)
            self.write(manager, cp, s, StateKind.OPERATOR_UNION, "watermarks", 96)
        elif s.vertex == "sink":
            size = rng.randint(1, 2) * KIB
            self.write(manager, cp, s, StateKind.OPERATOR_LIST, "pending-txn", size, 2)
        else:
            db = self.dbs[s]
            before = self.uploaded.get(s, set())
            for name, size in db.files.items():
                if name in before:
                    try:
                        # The old handle (or a placeholder) when the store may reuse it,
                        # else a new upload of the same bytes (R20-R23).
                        manager.reuse_shared(cp, s, name)
                        self.check(f"{manager.tm}.reuse_shared({cp}, {s}, {name!r})")
                        continue
                    except CommandError as err:
                        if err.reason is not Reason.NO_SUCH_STATE:
                            raise
                        # The store has no upload of it to reuse: upload it again below.
                self.write(manager, cp, s, StateKind.KEYED_SHARED, name, size)
            self.uploaded[s] = set(db.files)
            if cp % 3 == 0:
                size = rng.randint(1, 3) * KIB
                self.write(manager, cp, s, StateKind.KEYED_FULL, "timers", size)

    def acknowledge(self, cp: int, s: SubtaskId) -> None:
        manager = self.store.manager_for(s)
        manager.acknowledge(cp, s)
        self.check(f"{manager.tm}.acknowledge({cp}, {s})")

    # ------------------------------------------------------------------ the coordinator's side

    def trigger(self) -> int:
        cp = self.coordinator.trigger()
        self.check(f"coordinator.trigger() -> {cp}")
        for db in self.dbs.values():
            db.advance()
        return cp

    def complete(self, cp: int, *, late_notice: bool = False) -> None:
        """Complete ``cp``; with ``late_notice`` the first TM hears of it only after the
        next checkpoint, so it snapshots that one as if ``cp`` had not completed."""
        self.coordinator.complete(cp)  # CompletionFailed if it aborted instead (R51)
        self.check(f"coordinator.complete({cp})")
        self.latest_completed = cp
        self.completed_dbs = {s: dict(db.files) for s, db in self.dbs.items()}
        if late_notice:
            # The in-process store's transport loses no notice; a late one does here what
            # a lost one would: the TM snapshots the next checkpoint without knowing that
            # this one completed (so it may not reuse its uploads yet, R20), and the next
            # completion notice carries the subsumed watermark (R30, R34).
            late, *others = self.store.task_managers()
            for tm in others:
                self.store.task_manager(tm).receive_notifications()
                self.check(f"{tm}.receive_notifications()")
            self.note(f"{late}'s completion notice late")
        else:
            self.deliver_all()
        self.close_row(cp, "completed")

    def verify_restore(self) -> int:
        """Every subtask reads back what it restores from; each handle's bytes must be
        the ones written under its name. Returns how many handles were read."""
        read = 0
        for s in self.subtasks():
            for entry, data in self.store.manager_for(s).restore(s):
                if data != payload(entry.name, len(data)):
                    raise JobFailure(
                        "\n".join(
                            [
                                f"{s} restored {entry.name!r} from {entry.handle!r}: not the"
                                " bytes that were written",
                                "after steps:",
                                *(f"    {step}" for step in self.steps),
                            ]
                        )
                    )
                read += 1
        return read

    # ------------------------------------------------------------------ the script's steps

    def checkpoint(self, *, late_notice: bool = False) -> None:
        cp = self.trigger()
        for s in self.subtasks():
            self.snapshot(cp, s)
            self.acknowledge(cp, s)
        self.complete(cp, late_notice=late_notice)

    def declined_checkpoint(self) -> None:
        cp = self.trigger()
        victim = SubtaskId("window", 2, self.vertices["window"])
        for s in self.subtasks():
            self.snapshot(cp, s)
            if s == victim:
                self.coordinator.decline(cp, s)
                self.check(f"coordinator.decline({cp}, {s})")
                break
            self.acknowledge(cp, s)
        self.deliver_all()
        self.note(f"{victim} declined")
        self.close_row(cp, "aborted")

    def crashed_checkpoint(self) -> TmId:
        """Half the subtasks snapshot, then the last TM is lost and the job fails over.
        The lost TM keeps running as a zombie: it has not heard that the checkpoint
        aborted, and writes one more SST for it."""
        cp = self.trigger()
        subtasks = self.subtasks()
        for s in subtasks[: len(subtasks) // 2]:
            self.snapshot(cp, s)
            self.acknowledge(cp, s)
        lost = self.store.task_managers()[-1]
        zombie = self.store.task_manager(lost)  # its managers keep writing as that attempt
        testing.crash(self.store, lost)
        self.check(f"testing.crash({lost})")
        self.note(f"{lost} lost mid-checkpoint")
        for tm in self.store.task_managers():  # the survivors hear of the abort
            self.store.task_manager(tm).receive_notifications()
            self.check(f"{tm}.receive_notifications()")
        self.failover()
        # The zombie writes after the failover: until then the coordinator still places
        # its subtasks on it, and a write through its manager is the TM's own (refused:
        # not alive). From the failover on, the same call is a write of a replaced
        # attempt, which the store must survive (R64).
        for s in subtasks:
            if s.vertex != "window":
                continue
            try:
                self.write(zombie, cp, s, StateKind.KEYED_SHARED, "zombie.sst", 8 * KIB)
            except CommandError as err:
                # A subtask the zombie never hosted, or one it acknowledged already.
                if err.reason not in (Reason.NOT_HOSTED, Reason.ALREADY_ACKNOWLEDGED):
                    raise
                continue
            self.note(f"zombie {lost} wrote for {s}")
            break
        self.deliver_all()  # the zombie hears of the abort at last
        self.close_row(cp, "aborted")
        return lost

    def failover(self) -> None:
        """Replace the lost TM; every subtask restarts from the latest completed checkpoint."""
        self.coordinator.failover()
        self.check("coordinator.failover()")
        for s, files in self.completed_dbs.items():
            self.dbs[s].files = dict(files)
            self.uploaded[s] = set(files)
        self.note(f"failover ({self.verify_restore()} handles restored)")

    def attempt_stopped(self, tm: TmId) -> None:
        """The engine learns that the lost TM's process stopped (R64)."""
        pending = len(testing.observe(self.store).pending_deletes)
        testing.stopped(self.store, tm)
        self.check(f"testing.stopped({tm})")
        self.note(f"{tm} stopped ({pending} delete{'' if pending == 1 else 's'} waited for it)")

    def rescale(self) -> None:
        """Restore the latest checkpoint in CLAIM mode with ``window`` rescaled; each new
        ``window`` subtask builds its database from the key groups it now owns."""
        old = self.vertices["window"]
        total = sum(db.total() for db in self.dbs.values())
        cp = self.latest_completed
        new_job = self.coordinator.rescale(cp, {"window": RESCALED_WINDOW}, mode=RestoreMode.CLAIM)
        self.check(f"coordinator.rescale({cp}, {{'window': {RESCALED_WINDOW}}}, mode=CLAIM)")
        self.vertices["window"] = RESCALED_WINDOW
        self.dbs = {}
        self.uploaded = {}
        for s in self.subtasks():
            if s.vertex == "window":
                self.dbs[s] = LocalDb(self.rng)
                self.dbs[s].ingest(total // RESCALED_WINDOW)
        restored = self.verify_restore()
        self.note(
            f"{new_job}: restore chk-{cp} CLAIM, window {old}->{RESCALED_WINDOW}"
            f" ({restored} handles restored)"
        )

    def quiesce(self) -> list[Violation]:
        """R60: deliver everything, retry failed deletes, then ``num_retained + 1``
        checkpoints without faults; then every invariant, I6 (no leak) included."""
        self.deliver_all()
        if testing.observe(self.store).pending_deletes:
            self.store.retry_deletes()
            self.check("retry_deletes()")
        for _ in range(self.store.config.num_retained + 1):
            self.checkpoint()
            self.result.rows[-1].status = "completed (quiesce)"
        obs = testing.observe(self.store)
        return testing.check_invariants(self.store, quiet=True) + [
            Violation("storage", f"managed directory {d} reported but not on disk")
            for d in missing_directories(self.root, obs)
        ]


def plan(checkpoints: int) -> dict[str, int]:
    """At which count of completed checkpoints each scripted fault happens."""
    n = checkpoints
    decline = max(2, n // 5)
    late = max(decline + 1, n // 3)
    crash = max(late + 1, n // 2)
    rescale = max(crash + 2, 2 * n // 3)
    return {"decline": decline, "late": late, "crash": crash, "rescale": rescale}


def run_mode(
    mode: MergingMode, root: str, ids: IdSource, seed: int, checkpoints: int
) -> ModeResult:
    """The whole script in one merging mode, on a new store under ``root``."""
    result = ModeResult(mode, root)
    start = time.perf_counter()
    steps: list[str] = []
    try:
        with CheckpointStore(root, Config.for_mode(mode), JOB, ids=ids) as store:
            job = ScriptedJob(store, root, seed, result)
            steps = job.steps
            run_script(job, checkpoints)
            job.fail_on(job.quiesce())
            obs = testing.observe(store)
            result.files_at_end = len(obs.files)
            result.metadata_at_end = len(obs.metadata_files)
            result.stored_at_end, result.live_at_end = state_bytes(obs)
            result.empty_dirs_at_end = empty_directories(root, obs)
    except JobFailure as err:
        result.error = str(err)
    except CommandError as err:
        result.error = "\n".join(
            [
                f"the store refused a step of the script in mode {mode.name}: {err}",
                traceback.format_exc(),
                "after steps:",
                *(f"    {step}" for step in steps),
            ]
        )
    except Exception as err:  # a crash of the store is a bug to report with its steps
        result.error = "\n".join(
            [
                f"the store raised in mode {mode.name}: {err!r}",
                traceback.format_exc(),
                "after steps (the next one raised):",
                *(f"    {step}" for step in steps),
            ]
        )
    result.seconds = time.perf_counter() - start
    return result


def run_script(job: ScriptedJob, checkpoints: int) -> None:
    at = plan(checkpoints)
    done: set[str] = set()
    lost: TmId | None = None
    stop_after: int | None = None
    while job.result.completed < checkpoints:
        k = job.result.completed
        if stop_after is not None and k >= stop_after and lost is not None:
            job.attempt_stopped(lost)
            lost = stop_after = None
        if k == at["decline"] and "decline" not in done:
            done.add("decline")
            job.declined_checkpoint()
        elif k == at["crash"] and "crash" not in done:
            done.add("crash")
            lost = job.crashed_checkpoint()
            stop_after = k + 1
        else:
            if k == at["rescale"] and "rescale" not in done:
                done.add("rescale")
                job.rescale()
            late = k == at["late"] and "late" not in done
            if late:
                done.add("late")
            job.checkpoint(late_notice=late)
    if lost is not None:
        job.attempt_stopped(lost)
