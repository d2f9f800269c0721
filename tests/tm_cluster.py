"""The engine around a coordinator whose TMs are OS processes (issue 16), for the
multi-process tests and the soak.

``ProcessEngine`` is what an engine (Flink's scheduler, a Spark driver) does around the
coordinator: it starts each TM attempt as a spawned process (``tests.tm_process``, built
from the storage URL, the config, the job id and its TM id only), places subtasks
round-robin, carries notices and duties to the TM as encoded ``spec.messages`` over the
TM's pipe, and stops TMs. The coordinator's notices reach it when the test posts the
coordinator's ``ready()`` (``post``; ``hand_out`` is the host's whole part: the deletes
on ``host_storage``, then the notices), and wait in ``outbox`` unless ``immediate``: the soak
delivers, drops and repeats them. A TM that died (SIGKILL) is noticed when its pipe
breaks: ``dead`` lists it, and nothing more is sent to it.

``observe`` merges both parties' records for the test side (the parties never read each
other's): the coordinator's, and each live TM process's snapshot of its own.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from fastimpl.coordinator import CheckpointCoordinator, Ready
from fastimpl.reports import TmReport
from fastimpl.reports import observe as observe_parties
from fastimpl.storage import Storage
from spec.config import Config
from spec.ids import SubtaskId, TmId
from spec.invariants import Violation, check_all
from spec.messages import (
    Answer,
    Duty,
    ResetTm,
    decode_message,
    encode_message,
)
from spec.observation import Observation
from tests import tm_process


class TmDied(Exception):
    """The TM process is gone (killed): its pipe broke."""

    def __init__(self, tm: TmId) -> None:
        super().__init__(f"{tm} died")
        self.tm = tm


class ProcessEngine:
    """Each TM attempt a process; only bytes of ``spec.messages`` reach it from the
    coordinator."""

    def __init__(self, target: Any, root: str, config: Config, *, immediate: bool = True) -> None:
        self.target = target
        self.root = root
        self.config = config
        self.immediate = immediate
        self.ctx = multiprocessing.get_context("spawn")
        self.conns: dict[TmId, Connection] = {}
        self.procs: dict[TmId, BaseProcess] = {}
        self.dead: set[TmId] = set()
        self.next_tm = 1
        self.outbox: list[tuple[TmId, bytes]] = []
        """Notices sent and not yet delivered (``immediate`` False)."""
        self.sent: list[tuple[TmId, bytes]] = []
        self.placement: dict[SubtaskId, TmId] = {}
        self.host_storage: Storage | None = None
        """The coordinator's storage, on which ``hand_out`` performs its deletes."""
        self.orphans: dict[str, str] = {}
        """Files a killed attempt owned by its last records (the test's knowledge, R65):
        no live party records them, yet each has an owner until the coordinator takes it
        (R64). Merged into ``observe`` below any party's record."""

    # ------------------------------------------------------------------ the process side

    def call(self, tm: TmId, req: tuple[Any, ...]) -> tuple[Any, ...]:
        if tm in self.dead:
            raise TmDied(tm)
        try:
            self.conns[tm].send(req)
            reply: tuple[Any, ...] = self.conns[tm].recv()
        except (EOFError, OSError, BrokenPipeError):
            self._buried(tm)
            raise TmDied(tm) from None
        assert reply[0] != "error", reply
        return reply

    def _buried(self, tm: TmId) -> None:
        self.dead.add(tm)
        proc = self.procs[tm]
        proc.join(timeout=20)
        self.conns[tm].close()

    def kill(self, tm: TmId) -> None:
        """SIGKILL from outside (a kill between two calls of the TM)."""
        proc = self.procs[tm]
        if proc.is_alive():
            proc.kill()
        self._buried(tm)

    def live(self) -> list[TmId]:
        return sorted(t for t in self.conns if t not in self.dead)

    def deliver(self, index: int) -> None:
        """Hand the ``index``-th notice in flight to its TM."""
        tm, data = self.outbox.pop(index)
        if tm in self.dead or tm not in self.conns:
            return
        try:
            assert self.call(tm, ("notice", data)) == ("ok",)
        except TmDied:
            pass

    def drop(self, index: int) -> None:
        """Lose the ``index``-th notice in flight."""
        del self.outbox[index]

    def duplicate(self, index: int) -> None:
        """Send the ``index``-th notice in flight again, last."""
        self.outbox.append(self.outbox[index])

    def stop_all(self) -> list[int | None]:
        for tm in self.live():
            try:
                self.call(tm, ("stop",))
            except TmDied:
                pass
        codes = []
        for tm, proc in sorted(self.procs.items()):
            proc.join(timeout=20)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
            if tm not in self.dead:
                codes.append(proc.exitcode)
        return codes

    # ------------------------------------------------------------------ CoordinatorEngine

    def hand_out(self, coord: CheckpointCoordinator) -> None:
        """What a host does after a coordinator call: its ``Ready`` taken, the deletes
        performed on ``host_storage``, then the notices posted."""
        ready = coord.ready()
        assert self.host_storage is not None, "the test sets the coordinator's storage"
        self.host_storage.perform(ready.deletes)
        self.post(ready)

    def post(self, ready: Ready) -> None:
        """The coordinator's notices since the test last took its ``ready()``, in order:
        delivered now (``immediate``), or left in ``outbox`` for the soak."""
        for tm, msg in ready.notices:
            data = encode_message(msg)
            self.sent.append((tm, data))
            self.outbox.append((tm, data))
            if self.immediate:
                self.deliver(len(self.outbox) - 1)

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        """Deploying a TM is the engine's: a new process, a new attempt id."""
        tm = f"tm-{self.next_tm}"
        self.next_tm += 1
        here, there = self.ctx.Pipe()
        args = (there, self.target, self.root, self.config, job, tm, first_checkpoint)
        proc = self.ctx.Process(
            target=tm_process.serve, args=(*args, finished_mark), daemon=True, name=tm
        )
        proc.start()
        there.close()
        self.conns[tm] = here
        self.procs[tm] = proc
        return tm

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        self.placement = dict(placement)
        for tm in self.live():
            mine = [(s.vertex, s.index, s.parallelism) for s, t in placement.items() if t == tm]
            try:
                assert self.call(tm, ("host", mine)) == ("ok",)
            except TmDied:
                pass

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        if isinstance(msg, ResetTm):  # the old attempt's notices go with the redeploy
            self.outbox = [(t, d) for t, d in self.outbox if t != tm]
        reply = self.call(tm, ("duty", encode_message(msg)))
        if reply[0] == "answer":
            answer = decode_message(reply[1])
            assert isinstance(answer, Answer), answer
            return answer
        assert reply == ("ok",), reply
        return None

    def forget_tm(self, tm: TmId) -> None:
        """The TM is gone: its process stops (if it still runs) and its notices go."""
        self.outbox = [(t, d) for t, d in self.outbox if t != tm]
        if tm in self.conns and tm not in self.dead:
            try:
                self.call(tm, ("stop",))
            except TmDied:
                return
            self.procs[tm].join(timeout=20)
            self.dead.add(tm)


def observe(
    coord: CheckpointCoordinator, engine: ProcessEngine, *, orphans: dict[str, str] | None = None
) -> tuple[Observation, list[str]]:
    """The real files, with both parties' records merged (``fastimpl.reports.observe``:
    the test side may merge them; neither party reads the other's). ``orphans``: files
    the test knows a killed attempt left with no record of any live party, and whose
    they are (R65)."""
    coord.storage.drain()
    reports: dict[TmId, TmReport] = {}
    for tm in engine.live():
        try:
            reports[tm] = TmReport.from_json(engine.call(tm, ("records",))[1])
        except TmDied:
            continue
    return observe_parties(
        coord,
        reports,
        coord.storage.list_files(),
        orphans={**engine.orphans, **(orphans or {})},
    )


def violations(
    coord: CheckpointCoordinator,
    engine: ProcessEngine,
    *,
    quiet: bool,
    orphans: dict[str, str] | None = None,
) -> list[Violation | str]:
    """I1-I5 (and I6 when ``quiet``) on the real files, the parties' disagreements, and
    every directory either party records that is not on storage."""
    return checked(coord, engine, quiet=quiet, orphans=orphans)[0]


def checked(
    coord: CheckpointCoordinator,
    engine: ProcessEngine,
    *,
    quiet: bool,
    orphans: dict[str, str] | None = None,
) -> tuple[list[Violation | str], Observation]:
    """``violations``, and the observation they were found on."""
    obs, disagree = observe(coord, engine, orphans=orphans)
    found: list[Violation | str] = [*check_all(obs, quiet=quiet), *disagree]
    local = coord.storage.protocol in ("file", "local")  # an object store has no directories
    for d in obs.directories if local else ():
        if not coord.storage.exists_dir(d):
            found.append(f"directory {d} is recorded but not on storage")
    return found, obs
