"""The engine around a coordinator whose TMs are OS processes (issue 16), for the
multi-process tests and the soak.

``ProcessEngine`` is what an engine (Flink's scheduler, a Spark driver) does around the
coordinator: it starts each TM attempt as a spawned process (``tests.tm_process``, built
from the storage URL, the config, the job id and its TM id only), places subtasks
round-robin, carries notices and duties to the TM as encoded ``spec.messages`` over the
TM's pipe, and stops TMs. Notices wait in ``outbox`` unless ``immediate``: the soak
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

from fastimpl.coordinator import CheckpointCoordinator
from fastimpl.records import Status
from spec.config import Config
from spec.effects import COORDINATOR, tm_actor
from spec.ids import SubtaskId, TmId
from spec.invariants import Violation, check_all
from spec.layout import METADATA
from spec.messages import (
    Answer,
    CheckpointAborted,
    CheckpointComplete,
    Duty,
    ResetTm,
    decode_message,
    encode_message,
)
from spec.observation import Observation, RetainedView
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

    def send(self, tm: TmId, msg: CheckpointComplete | CheckpointAborted) -> None:
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
    """The real files, with both parties' records merged (the test side may merge them;
    neither party reads the other's). A path two parties record with different owners is
    a disagreement, returned with the observation. ``orphans``: files the test knows a
    killed attempt left with no record of any live party, and whose they are (R65)."""
    coord.storage.drain()
    snaps = {}
    for tm in engine.live():
        try:
            snaps[tm] = engine.call(tm, ("records",))[1]
        except TmDied:
            continue
    disagree: list[str] = []
    owners: dict[str, str] = dict(coord.catalog.owners())
    directories: dict[str, str] = dict(coord.catalog.dir_owner)
    disagree += [
        f"dir {d}: the coordinator owns it with no record"
        for d in tm_process.unrecorded_dirs(coord.catalog)
    ]
    claims: dict[str, set[str]] = {}
    ref_counts: dict[str, int] = {}
    live: dict[str, list[tuple[int, int]]] = {}
    pool_files: set[str] = set()
    open_files: set[str] = {p for p, f in coord.catalog.files.items() if f.open}
    deletions = list(coord.catalog.deletions or ())
    pending = [d.path for d in coord.catalog.deferred] + sorted(coord.storage.failed_deletes)
    refused = [r.path for r in coord.catalog.refused_deletes]
    lost = {t for t in snaps if t in coord.tms and coord.tms[t].status is Status.LOST}
    # A zombie's records of what a failover handed to a newer attempt are stale (R61,
    # R64): the live parties' records come first, then the lost ones' from the newest
    # attempt back (a failover hands files from older attempts to newer ones, never back;
    # the engine numbers attempts in the order it starts them)
    for tm, s in sorted(snaps.items(), key=lambda ts: (ts[0] in lost, -_attempt_number(ts[0]))):
        for path, owner in s["owners"].items():
            if owners.setdefault(path, owner) != owner and tm not in lost:
                disagree.append(f"{path}: coordinator says {owners[path]}, {tm} says {owner}")
        for path, owner in s["dirs"].items():
            if tm in lost and path not in directories and not coord.storage.exists_dir(path):
                continue  # a zombie's record of a directory a failover handed over and its
                # new owner deleted since (R61, R63): stale, as its file records are
            theirs = directories.setdefault(path, owner)
            if theirs == COORDINATOR and owner == tm_actor(tm):
                continue  # R42: handed over at the complete; the TM learns it from the notice
            if owner != theirs and tm not in lost:
                disagree.append(f"dir {path}: coordinator says {theirs}, {tm} says {owner}")
        disagree += [f"dir {d}: {tm} owns it with no record" for d in s["unrecorded_dirs"]]
        open_files |= set(s["open"])
        deletions += s["deletions"]
        pending += s["pending"]
        refused += s["refused"]
        if tm in lost:
            continue  # as the model observes: only live parties' bookkeeping claims
        for path, actor in s["claims"].items():
            claims.setdefault(path, set()).add(actor)
        ref_counts.update(s["ref_counts"])
        for path, extents in s["live"].items():
            live.setdefault(path, []).extend(tuple(x) for x in extents)
        pool_files |= set(s["pool_files"])
    for path, owner in list(directories.items()):
        # R41: a live TM deleted a directory of its own; the coordinator's copy of the
        # record goes at the TM's next acknowledgement, which no longer reports it (R40)
        holder = owner[3:] if owner.startswith("tm:") else None
        if holder in snaps and path not in snaps[holder]["dirs"]:
            del directories[path]
    for path, owner in {**engine.orphans, **(orphans or {})}.items():
        if path in coord.storage.list_files():
            owners.setdefault(path, owner)
    for path in coord.claimed():
        claims.setdefault(path, set()).add(COORDINATOR)
    on_storage = coord.storage.list_files()
    obs = Observation(
        files=on_storage,
        open_files=frozenset(open_files),
        directories=directories,
        owners=owners,
        claims={p: frozenset(v) for p, v in claims.items()},
        retained=tuple(
            RetainedView(r.id, r.job, r.metadata, r.entries, r.directories) for r in coord.retained
        ),
        restoring=coord.restoring,
        ref_counts=ref_counts,
        live_segments={p: tuple(sorted(v)) for p, v in live.items()},
        registry=coord.registry.view(coord.retained),
        deletions=tuple(deletions),
        pending_deletes=tuple(pending),
        pool_files=frozenset(pool_files),
        metadata_files=frozenset(p for p in on_storage if p.endswith("/" + METADATA)),
        live_parties=frozenset({COORDINATOR} | {tm_actor(t) for t in snaps if t not in lost}),
    )
    return obs, disagree + [f"refused delete of {p}" for p in refused]


def _attempt_number(tm: TmId) -> int:
    """The number ``ProcessEngine.start_tm`` gave attempt ``tm-<n>``."""
    return int(tm.rsplit("-", 1)[1])


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
