"""The job the example runs: the coordinator in this process, each TM a process of its
own (``examples.embedding.engine``), on one local directory.

Two vertices on two TMs (``source`` and ``window``, parallelism 2 each). A few
checkpoints complete, the window subtasks reusing the SST files they uploaded earlier
(R20-R23), every completion notice delivered (R31). Then a TM process is killed with
SIGKILL between writing its state for a checkpoint and acknowledging it: the engine tells
the coordinator the TM is lost (R57: the checkpoint aborts), then that its process has
stopped (R64: what it wrote and no live party records is swept), and fails over (R60-R63:
a new TM process takes the killed one's subtasks, the survivor is reset, both restart
from the latest completed checkpoint). More checkpoints, then the job ends keeping its
retained checkpoints (R90, R91): what is left on storage is exactly what they reference.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import fsspec  # type: ignore[import-untyped]

from examples.embedding.engine import PipeEngine
from fastimpl.parties import (
    Acknowledgement,
    AttemptStopped,
    CheckpointCoordinator,
    CompletionFailed,
    Decline,
    RandomIds,
    StorageFault,
    decode_message,
    encode_message,
    lease_token,
    open_base,
)
from spec.config import Config, MergingMode, VertexSpec
from spec.ids import SubtaskId, TmId

JOB = "job-0"
VERTICES = (VertexSpec("source", 2), VertexSpec("window", 2))
NUM_TMS = 2
RETAINED = 2
BEFORE_KILL = 4
"""Checkpoints completed before a TM is killed."""
AFTER_FAILOVER = 3


def subtasks() -> list[SubtaskId]:
    return [SubtaskId(v.name, i, v.parallelism) for v in VERTICES for i in range(v.parallelism)]


class Job:
    """Drives the coordinator and the engine through the script, printing as it goes."""

    def __init__(self, root: Path, mode: MergingMode, say: Callable[[str], None]) -> None:
        self.root = root
        self.say = say
        url = f"file://{root}"
        fs, path = fsspec.core.url_to_fs(url)
        # The base must hold no other job; the lease fences any later writer of it out.
        self.storage, self.config = open_base(
            fs, path, Config.for_mode(mode, num_retained=RETAINED), lease_token("embedding example")
        )
        self.engine = PipeEngine(url, self.config)
        self.coord = CheckpointCoordinator(
            self.config, VERTICES, NUM_TMS, self.storage, RandomIds(), self.engine, JOB
        )
        self.completed: list[int] = []

    # ------------------------------------------------------------------ the script

    def run(self) -> None:
        engine, coord = self.engine, self.coord
        tms = [engine.start_tm(JOB, 1, None) for _ in range(NUM_TMS)]
        coord.deploy(engine.place(subtasks(), tms))
        self.say(f"job {JOB}: {self.placement_text()}")
        for _ in range(BEFORE_KILL):
            self.checkpoint()
        self.kill_and_fail_over()
        for _ in range(AFTER_FAILOVER):
            self.checkpoint()
        coord.end_job(retain=True)  # R90, R91: every TM answers EndJob, then stops
        self.hand_out()
        self.storage.drain()
        self.say(f"job ended: the retained checkpoints {self.completed[-RETAINED:]} are the user's")
        self.say(self.files_text(full=True))

    def checkpoint(self) -> None:
        """Trigger; every TM's subtasks snapshot, then acknowledge; complete."""
        coord, engine = self.coord, self.engine
        cid = coord.trigger()
        uploaded = reused = 0
        declined = False
        for tm in engine.hosting():
            _, declines, up, again = engine.call(tm, "snapshot", cid)
            uploaded, reused = uploaded + up, reused + again
            declined |= self.receive(declines)
        for tm in engine.hosting():
            declined |= self.receive(engine.call(tm, "acknowledge", cid)[1])
        if declined:  # the coordinator aborted it (R17)
            return
        try:  # the storage effect is the host's: the _metadata first, then the notices (R51)
            write = coord.prepare_completion(cid)
            try:
                self.storage.write_metadata(write.path, write.data)
            except StorageFault as fault:
                raise coord.metadata_write_failed(cid, fault) from fault
            done = coord.metadata_written(cid)
        except CompletionFailed as err:
            self.say(f"checkpoint {cid}: {err.reason}, aborted (R51)")
            return
        finally:
            self.hand_out()  # what it subsumed goes, then each TM learns of it (R31)
        self.completed.append(done.id)
        self.say(
            f"checkpoint {done.id} completed: {done.metadata}, {len(done.entries)} state "
            f"handles ({uploaded} written, {reused} reused from earlier checkpoints)"
        )
        self.say(self.files_text())

    def hand_out(self) -> None:
        """What the coordinator's calls produced (its ``Ready``), carried out in the order
        it asks: its deletes, then its notices (a host that keeps HA state persists it
        before both, so that a restart never names a deleted ``_metadata``)."""
        ready = self.coord.ready()
        self.storage.perform(ready.deletes)
        self.engine.post(ready)

    def receive(self, messages: list[bytes]) -> bool:
        """Hand the TMs' encoded answers to the coordinator; whether one declined."""
        declined = False
        for data in messages:
            msg = decode_message(data)
            if isinstance(msg, Acknowledgement):
                self.coord.receive_ack(msg)
            elif isinstance(msg, Decline):
                self.say(f"{msg.subtask} on {msg.attempt} declined checkpoint {msg.checkpoint}")
                self.coord.receive_decline(msg)
                self.hand_out()  # its abort notices (R17)
                declined = True
            else:
                raise RuntimeError(f"a TM sent {type(msg).__name__}")
        return declined

    def kill_and_fail_over(self) -> None:
        """A TM process killed between writing its state for a checkpoint and
        acknowledging it, then what the engine and the coordinator do about it."""
        engine, coord = self.engine, self.coord
        victim = engine.hosting()[-1]
        cid = coord.trigger()
        left: list[str] = []
        for tm in engine.hosting():
            before = set(self.storage.list_files())
            self.receive(engine.call(tm, "snapshot", cid)[1])
            if tm == victim:
                left = sorted(set(self.storage.list_files()) - before)
        for tm in engine.hosting():
            if tm != victim:
                self.receive(engine.call(tm, "acknowledge", cid)[1])
        code = engine.kill(victim)
        self.say(
            f"checkpoint {cid}: {victim} wrote its state ({len(left)} new files), then "
            f"was killed (SIGKILL, exit code {code}) before acknowledging"
        )
        coord.lose(victim)  # R57: the engine's word; the pending checkpoint aborts
        self.hand_out()
        self.say(f"{victim} lost: checkpoint {cid} aborted")
        # R64: the engine knows the process is gone; the message travels as bytes
        stopped = decode_message(encode_message(AttemptStopped(JOB, victim)))
        assert isinstance(stopped, AttemptStopped)
        coord.receive_stopped(stopped)
        self.hand_out()
        on_storage = self.storage.list_files()
        swept = [p for p in left if p not in on_storage]
        self.say(
            f"{victim} stopped: {len(swept)} of the {len(left)} files it left were swept (R64)"
        )
        coord.failover()  # R60-R63: a new TM process, the survivor reset, both restored
        self.hand_out()
        self.say(f"failover: {self.placement_text()}")
        for tm, restored in sorted(engine.restored.items()):
            if tm in engine.live():
                parts = ", ".join(f"{s} {n} B" for s, n in sorted(restored.items()))
                self.say(f"  {tm} restarts from checkpoint {self.completed[-1]}: {parts}")

    # ------------------------------------------------------------------ the narrative

    def placement_text(self) -> str:
        by_tm: dict[TmId, list[str]] = {}
        for s, tm in sorted(self.engine.placement.items(), key=lambda st: str(st[0])):
            by_tm.setdefault(tm, []).append(str(s))
        return "; ".join(f"{tm} runs {', '.join(subs)}" for tm, subs in sorted(by_tm.items()))

    def files_text(self, *, full: bool = False) -> str:
        """The files on storage, grouped by directory (all of them with ``full``)."""
        files = self.storage.list_files()
        groups: dict[str, list[tuple[str, int]]] = {}
        for path, size in sorted(files.items()):
            folder, name = path.rsplit("/", 1) if "/" in path else ("", path)
            groups.setdefault(folder, []).append((name, size))
        lines = [f"  on storage: {len(files)} files, {sum(files.values())} bytes"]
        for folder, names in groups.items():
            if full:
                lines += [f"    {folder}/{n} ({size} B)" for n, size in names]
            else:
                lines.append(f"    {folder}/: {len(names)} file{'s' * (len(names) != 1)}")
        return "\n".join(lines)


def run_job(root: Path, mode: MergingMode, say: Callable[[str], None] = print) -> list[int]:
    """Run the script on ``root``; the retained checkpoints' ids. Every TM process is
    stopped on the way out, whatever happened."""
    os.makedirs(root, exist_ok=True)
    job = Job(root, mode, say)
    try:
        job.run()
    finally:
        codes = job.engine.stop_all()
        job.storage.drain()
    say(f"TM processes' exit codes: {codes}")
    return job.completed[-RETAINED:]
