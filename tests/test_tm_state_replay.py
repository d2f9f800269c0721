"""A TM rebuilt from its saved state after every step acts as the TM never rebuilt.

The soak's sequences (``tests.process_soak``: checkpoints, savepoints, notices late,
dropped and repeated, failovers, rescales, kills during a write, between calls and while
deleting, zombies, storage faults, coordinator restarts) are run twice on two roots, with
the same seed, their TMs served in this process (``InProcessTms``) with ids drawn from
counters, so that both runs draw the same names:

* in the first, after every request it answers, each TM's records are exported
  (``fastimpl.tm_state.export_state``), encoded, decoded, and a new TM is rebuilt from
  them with a fresh storage (``fastimpl.tm_state.rebuild``; its open files abandoned
  and reopened, as a Spark worker does between tasks); the rebuilt TM must export the
  very state it was built from;
* the second, the twin, never rebuilds a TM.

Each request's reply, and after it every live TM's report (``worker_tm.report_of``, the
Spark driver's view of a TM), must be the same in both, and so must the files on storage
at the end, byte for byte.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import attrs
import pytest

from fastimpl.storage import WRITER_LEASE
from fastimpl.storage_hooks import StorageHooks
from fastimpl.taskmanager import TaskManager
from fastimpl.tm_state import export_state, rebuild
from pipeline.stream.worker_tm import report_of
from spec.commands import StorageOp
from spec.config import Config, MergingMode, StateKind
from spec.handles import InPlaceFile
from spec.ids import SubtaskId, TmId
from spec.layout import working_dir
from spec.messages import (
    CheckpointAborted,
    CheckpointComplete,
    DatabasesOpened,
    EndJob,
    OpenDatabase,
)
from spec.tm_state import (
    TaskManagerState,
    TmState,
    WorkingRecords,
    decode_tm_state,
    encode_tm_state,
)
from tests.process_soak import STEPS, Soak, make_setting
from tests.tm_cluster import ProcessEngine, TmDied
from tests.tm_process import TmServer


class Killed(BaseException):
    """An in-process TM reached its kill point: it is dead from here (a BaseException, so
    that no handler of the TM's catches it)."""


def _die() -> NoReturn:
    raise Killed


class CountedIds:
    """Names drawn from counters, with a prefix per source: two runs of one seed draw the
    same names, and no two sources draw the same one."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.files = itertools.count(1)
        self.segments = itertools.count(1)

    def file_name(self, directory: str) -> str:
        return f"f{self.prefix}{next(self.files):06d}"

    def logical_id(self) -> str:
        return f"s{self.prefix}{next(self.segments):06d}"


def _seen(tm: TaskManager) -> tuple[bytes, TaskManagerState]:
    """What can be seen of ``tm``: its report (``worker_tm.report_of``) and its records."""
    return report_of(tm, 0), export_state(tm)


Step = tuple[TmId, str, tuple[Any, ...], dict[TmId, tuple[bytes, TaskManagerState]]]
"""A request's TM, its kind, the reply, then what is seen of every live TM."""


def rebuilt(tm: TaskManager, target: Any, hooks: StorageHooks | None = None) -> TaskManager:
    """``tm`` exported, encoded, decoded and rebuilt on ``target`` (the same ids, the
    same hooks), as a worker saves a TM and takes it up again between two tasks: its
    open files abandoned, then reopened. The rebuilt TM exports the very state."""
    storage = tm.catalog.storage
    storage.drain()
    state = TmState(export_state(tm), 0, None)
    back = decode_tm_state(encode_tm_state(state))
    assert back == state
    for f in state.records.files:
        if f.open:
            storage.abandon(f.path)
    new = rebuild(back.records, target, "", ids=tm.ids, hooks=hooks)
    new.catalog.storage.armed = list(storage.armed)  # the test's fault seam, not the TM's
    assert export_state(new) == back.records
    return new


class InProcessTms(ProcessEngine):
    """``ProcessEngine`` with each TM a ``tests.tm_process.TmServer`` in this process; a
    kill point raises ``Killed`` and the TM is dead, as a killed process is."""

    def __init__(self, target: Any, config: Config, *, rebuild_each_step: bool) -> None:
        super().__init__(target, "", config, immediate=False)
        self.servers: dict[TmId, TmServer] = {}
        self.rebuild_each_step = rebuild_each_step
        self.steps: list[Step] = []
        self.rebuilds = 0
        self.open_reopened = 0

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        tm = f"tm-{self.next_tm}"
        ids = CountedIds(f"t{self.next_tm}x")
        self.next_tm += 1
        self.servers[tm] = TmServer(
            self.target, "", self.config, job, tm, first_checkpoint, finished_mark,
            die=_die, ids=ids,
        )  # fmt: skip
        return tm

    def live(self) -> list[TmId]:
        return sorted(t for t in self.servers if t not in self.dead)

    def deliver(self, index: int) -> None:
        tm, data = self.outbox.pop(index)
        if tm in self.servers and tm not in self.dead:
            try:
                assert self.call(tm, ("notice", data)) == ("ok",)
            except TmDied:
                pass

    def call(self, tm: TmId, req: tuple[Any, ...]) -> tuple[Any, ...]:
        if tm in self.dead:
            raise TmDied(tm)
        server = self.servers[tm]
        try:
            reply = server.handle(req)
        except Killed:
            server.tm.catalog.storage.drain()  # what it queued before: done in both runs
            self.dead.add(tm)
            raise TmDied(tm) from None
        assert reply[0] != "error", reply
        if self.rebuild_each_step and req[0] != "stop":
            server.tm = self._rebuilt(server)
        reports = {t: _seen(self.servers[t].tm) for t in self.live()}
        self.steps.append((tm, req[0], reply, reports))
        return reply

    def _rebuilt(self, server: TmServer) -> TaskManager:
        self.rebuilds += 1
        self.open_reopened += sum(f.open for f in server.tm.catalog.files.values())
        return rebuilt(server.tm, self.target, server.kill)

    def kill(self, tm: TmId) -> None:
        if tm not in self.dead:
            self.servers[tm].tm.catalog.storage.drain()
        self.dead.add(tm)

    def stop_all(self) -> list[int | None]:
        for tm in self.live():
            self.servers[tm].tm.catalog.storage.drain()
        return []

    def forget_tm(self, tm: TmId) -> None:
        self.outbox = [(t, d) for t, d in self.outbox if t != tm]
        if tm in self.servers and tm not in self.dead:
            self.servers[tm].tm.catalog.storage.drain()
            self.dead.add(tm)


def _coordinator_ids() -> Callable[[], CountedIds]:
    n = itertools.count(1)
    return lambda: CountedIds(f"c{next(n)}x")


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != WRITER_LEASE
    }


def _run(
    seed: str, mode: MergingMode, tmp_path: Path, request: pytest.FixtureRequest, rebuilt: bool
) -> tuple[InProcessTms, Soak, Path]:
    config, fs, root, target = make_setting(mode, "local", tmp_path, request)
    engine = InProcessTms(target, config, rebuild_each_step=rebuilt)
    soak = Soak(seed, config, fs, root, target, engine=engine, ids=_coordinator_ids())
    soak.check(quiet=True)
    for _ in range(STEPS):
        soak.step()
        soak.check()
    while soak.zombies:
        soak.zombie_stops()
    soak.quiesce()
    soak.check(quiet=True)
    engine.stop_all()
    return engine, soak, Path(root)


MODES = [MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT]


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("n", range(4))
def test_a_tm_rebuilt_after_every_step_acts_as_its_twin(
    mode: MergingMode, n: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = f"tm-state-{n}-{mode.value}"
    subject, soak, root = _run(seed, mode, tmp_path, request, rebuilt=True)
    twin, twin_soak, twin_root = _run(seed, mode, tmp_path, request, rebuilt=False)
    assert soak.steps == twin_soak.steps
    assert subject.rebuilds > 0 and twin.rebuilds == 0
    assert len(subject.steps) == len(twin.steps)
    for i, (a, b) in enumerate(zip(subject.steps, twin.steps, strict=True)):
        assert a == b, f"seed {seed!r}: request {i} ({a[1]} to {a[0]}) differs"
    assert _files(root) == _files(twin_root)
    if mode is MergingMode.ACROSS_CHECKPOINT:
        assert subject.open_reopened > 0  # open pooled files crossed a rebuild


# ---------------------------------------------------------------------------- working state

JOB1, TM3 = "job-1", "tm-3"
SUB = SubtaskId("v", 0, 1)
USERS = f"{working_dir('job-0', SUB)}/fuser.tm-0"
"""A NO_CLAIM source's working file: the user's (R105)."""
LINEAGE = f"{working_dir(JOB1, SUB)}/0123456789ab"


def _shared(tm: TaskManager, cp: int) -> Callable[[str, bytes], object]:
    def write(name: str, data: bytes) -> object:
        return tm.write(SUB, cp, StateKind.KEYED_SHARED, name, len(data), 1, data)

    return write


def _private(tm: TaskManager) -> str:
    return sorted(p for p in tm.working.written if p in tm.catalog.files)[0]


STEPS_OF_A_DATABASE: list[tuple[str, Callable[[TaskManager, Path], object]]] = [
    ("host", lambda tm, root: tm.host([SUB])),
    ("open on the user's file", lambda tm, root: tm.on_duty(OpenDatabase(
        JOB1, TM3, 1, SUB, (InPlaceFile(USERS, 120, (0, 127)),), (), True))),
    ("write a small file", lambda tm, root: tm.working.write(SUB, b"p" * 10)),
    ("write a large one", lambda tm, root: tm.working.write(SUB, b"q" * 300)),
    ("snapshot 1", lambda tm, root: tm.working.snapshot(SUB, 1, 20, False, _shared(tm, 1))),
    ("write more for 1", lambda tm, root: tm.write(
        SUB, 1, StateKind.OPERATOR_LIST, "ops", 40, 1, b"o" * 40)),
    ("acknowledge 1", lambda tm, root: tm.acknowledge(SUB, 1)),
    ("databases opened", lambda tm, root: tm.on_duty(DatabasesOpened(JOB1, TM3, 1))),
    ("snapshot 2", lambda tm, root: tm.working.snapshot(SUB, 2, 20, False, _shared(tm, 2))),
    ("a delete fails", lambda tm, root: tm.catalog.storage.arm(StorageOp.DELETE)),
    ("drop a private file", lambda tm, root: tm.working.drop(SUB, _private(tm))),
    ("complete 1", lambda tm, root: tm.on_notice(CheckpointComplete(JOB1, 1, 0, False))),
    ("abort 2", lambda tm, root: tm.on_notice(CheckpointAborted(JOB1, 2, 1, False))),
    ("the database's own files", lambda tm, root: tm.working.track(
        SUB, {f"{LINEAGE}/a.sst": 50, f"{LINEAGE}/b.sst": 70}, LINEAGE)),
    ("compacted", lambda tm, root: tm.working.track(SUB, {f"{LINEAGE}/b.sst": 70}, LINEAGE)),
    ("retry the deletes", lambda tm, root: tm.catalog.retry_deletes()),
    ("snapshot 3", lambda tm, root: tm.working.snapshot(SUB, 3, 20, False, _shared(tm, 3))),
    ("acknowledge 3", lambda tm, root: tm.acknowledge(SUB, 3)),
    ("complete 3", lambda tm, root: tm.on_notice(CheckpointComplete(JOB1, 3, 1, False))),
    ("the job ends", lambda tm, root: tm.on_duty(EndJob(JOB1, TM3, frozenset()))),
]  # fmt: skip
"""A TM's database through R101-R105, a failed delete that waits for a retry (R45) and
the end of the job (R90)."""


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_a_tm_with_a_database_rebuilt_after_every_step_acts_as_its_twin(
    mode: MergingMode, tmp_path: Path
) -> None:
    config = Config.for_mode(mode, max_file_size=4096)
    worlds: list[tuple[Path, list[object]]] = []
    covered: set[str] = set()
    for rebuilding in (True, False):
        root = tmp_path / ("rebuilt" if rebuilding else "twin")
        for path in (USERS, f"{LINEAGE}/a.sst", f"{LINEAGE}/b.sst"):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(b"u" * 120 if path == USERS else b"s" * 60)
        target = f"file://{root}"
        tm = TaskManager.alone(target, "", config, JOB1, TM3, ids=CountedIds("w"))
        seen: list[object] = []
        for name, step in STEPS_OF_A_DATABASE:
            try:
                out: object = step(tm, root)
            except Exception as err:  # the same in both, or the comparison fails
                out = repr(err)
            if rebuilding:
                tm = rebuilt(tm, target)
                state = export_state(tm)
                covered |= {f for f in attrs.fields_dict(TaskManagerState) if getattr(state, f)}
                covered |= {
                    f"working.{f}" for f in attrs.fields_dict(WorkingRecords)
                    if getattr(state.working, f)
                }  # fmt: skip
            seen.append((name, out, *_seen(tm)))
        tm.catalog.storage.drain()
        worlds.append((root, seen))
    (root, seen), (twin_root, twin_seen) = worlds
    for a, b in zip(seen, twin_seen, strict=True):
        assert a == b
    assert _files(root) == _files(twin_root)
    must = {"pools", "deferred_deletes", "ended", "acked", "backend", "directories",
            "working.uses", "working.pins", "working.known", "working.written",
            "working.opened", "working.users"}  # fmt: skip
    if mode is MergingMode.NONE:
        must -= {"pools", "directories"}
    assert must <= covered, must - covered
