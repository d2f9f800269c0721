"""The coordinator in this process, each TaskManager in a fresh OS process (issue 16).

A TM process is started with multiprocessing's "spawn" and builds its TM from only the
storage URL, the config, the job id and its TM id (``tests.tm_process``). The two sides
meet only through the pipe: notices go out as encoded ``spec.messages``,
acknowledgements and declines come back as encoded messages and are decoded here before
the coordinator sees them. Each party keeps its own records over its own ``Storage``;
after every step the invariants I1-I5 are checked on the real files, with the owners,
claims and deletions of both parties merged, and once quiet nothing leaks (I6). The
``_metadata`` of the retained checkpoint is read back and must name exactly what the
TMs acknowledged. On a local directory in every merging mode, and on S3 (moto's server,
which the TM processes reach over HTTP) in the modes an object store allows (R16).
"""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.coordinator import CheckpointCoordinator, subtasks_of
from fastimpl.ids import RandomIds
from fastimpl.storage import Storage
from spec.config import Config, MergingMode, StateKind, VertexSpec
from spec.effects import COORDINATOR, tm_actor
from spec.handles import DirectoryHandle, StateEntry, stream_of
from spec.ids import SubtaskId, TmId
from spec.invariants import Violation, check_all
from spec.layout import METADATA, is_under, savepoint_dir
from spec.messages import (
    Acknowledgement,
    AttemptStopped,
    CheckpointAborted,
    CheckpointComplete,
    Decline,
    decode_message,
    encode_message,
)
from spec.observation import Observation, RegistryView, RetainedView
from tests import tm_process
from tests.lockstep import S3_BUCKET, s3

JOB = "job-0"
VERTICES = (VertexSpec("map", 2), VertexSpec("sink", 1))


class PipeEngine:
    """The engine around the coordinator when each TM is a process: notices go down the
    TM's pipe as bytes. Deploying, restarting and stopping TMs is the engine's and not
    part of this test: those calls fail loudly if the coordinator makes them."""

    def __init__(self, conns: dict[TmId, Connection]) -> None:
        self.conns = conns
        self.sent: list[tuple[TmId, bytes]] = []

    def call(self, tm: TmId, req: tuple[Any, ...]) -> tuple[Any, ...]:
        self.conns[tm].send(req)
        reply: tuple[Any, ...] = self.conns[tm].recv()
        assert reply[0] != "error", reply
        return reply

    def send(self, tm: TmId, msg: CheckpointComplete | CheckpointAborted) -> None:
        data = encode_message(msg)
        self.sent.append((tm, data))
        assert self.call(tm, ("notice", data)) == ("ok",)

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        for tm in self.conns:
            mine = [(s.vertex, s.index, s.parallelism) for s, t in placement.items() if t == tm]
            assert self.call(tm, ("host", mine)) == ("ok",)

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def _not_here(self, what: str) -> AssertionError:
        return AssertionError(f"the coordinator asked the engine to {what}: not in this test")

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        raise self._not_here("start a TM")

    def pool_files(self, tm: TmId) -> Iterable[str]:
        raise self._not_here("list a TM's pool files")

    def reset_tm(self, tm: TmId) -> None:
        raise self._not_here("reset a TM")

    def restart_tm(self, *args: object) -> None:
        raise self._not_here("restart a TM")

    def seed_backend(self, *args: object) -> None:
        raise self._not_here("seed a backend")

    def end_tm(self, tm: TmId, keep: set[str]) -> None:
        raise self._not_here("end a TM")

    def forget_tm(self, tm: TmId) -> None:
        """The TM process is gone; this engine queues nothing for it."""
        assert tm not in self.conns, f"{tm} is still running"


@pytest.fixture
def parties(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    mode, where = request.param
    config = Config(
        file_merging_enabled=mode is not MergingMode.NONE,
        across_checkpoint_boundary=mode is MergingMode.ACROSS_CHECKPOINT,
        max_file_size=4096,
        num_retained=1,
    )
    assert config.merging_mode is mode
    if where == "s3":  # moto's S3 server: the TM processes reach it over HTTP
        fs = s3(request.getfixturevalue("s3_endpoint"))
        root = f"{S3_BUCKET}/{uuid.uuid4().hex}"
        config = attrs.evolve(config, open_files_readable=False)  # R16: an object store
        target: Any = fs
    else:
        (tmp_path / "root").mkdir()
        target = f"file://{tmp_path / 'root'}"
        fs, root = fsspec.core.url_to_fs(target)
    ctx = multiprocessing.get_context("spawn")
    conns: dict[TmId, Connection] = {}
    procs = []
    for tm in ("tm-1", "tm-2"):
        here, there = ctx.Pipe()
        args = (there, target, root if where == "s3" else "", config, JOB, tm)
        p = ctx.Process(target=tm_process.serve, args=args, daemon=True)
        p.start()
        there.close()
        conns[tm] = here
        procs.append(p)
    try:
        engine = PipeEngine(conns)
        storage = Storage(fs, root)
        assert (storage.protocol == "s3") is (where == "s3")
        coord = CheckpointCoordinator(
            config, VERTICES, 2, storage, RandomIds(), engine, JOB, deletion_log=True
        )
        coord.deploy(engine.place(subtasks_of(VERTICES), sorted(conns)))
        yield coord, engine, storage
    finally:
        for conn in conns.values():
            try:
                conn.send(("stop",))
                conn.recv()
            except (EOFError, OSError):
                pass
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


def observe(coord: CheckpointCoordinator, engine: PipeEngine) -> tuple[Observation, list[str]]:
    """The real files, with both parties' records merged (the test side may merge them;
    neither party reads the other's). A path two parties both record as owned by
    different owners is a disagreement, returned with the observation."""
    coord.storage.drain()
    snaps = {tm: engine.call(tm, ("records",))[1] for tm in sorted(engine.conns)}
    disagree: list[str] = []
    owners: dict[str, str] = dict(coord.catalog.owners())
    directories: dict[str, str] = dict(coord.catalog.dir_owner)
    claims: dict[str, set[str]] = {}
    ref_counts: dict[str, int] = {}
    live: dict[str, list[tuple[int, int]]] = {}
    pool_files: set[str] = set()
    open_files: set[str] = {p for p, f in coord.catalog.files.items() if f.open}
    deletions = list(coord.catalog.deletions or ())
    pending = [d.path for d in coord.catalog.deferred] + sorted(coord.storage.failed_deletes)
    refused = [r.path for r in coord.catalog.refused_deletes]
    for tm, s in snaps.items():
        for path, owner in s["owners"].items():
            if owners.setdefault(path, owner) != owner:
                disagree.append(f"{path}: coordinator says {owners[path]}, {tm} says {owner}")
        for path, owner in s["dirs"].items():
            # Notices are delivered at once here: a TM has heard of every completion
            # that handed a directory over (R42), so both records must agree
            theirs = directories.setdefault(path, owner)
            if owner != theirs:
                disagree.append(f"dir {path}: coordinator says {theirs}, {tm} says {owner}")
        for path, actor in s["claims"].items():
            claims.setdefault(path, set()).add(actor)
        ref_counts.update(s["ref_counts"])
        for path, extents in s["live"].items():
            live.setdefault(path, []).extend(tuple(x) for x in extents)
        pool_files |= set(s["pool_files"])
        open_files |= set(s["open"])
        deletions += s["deletions"]
        pending += s["pending"]
        refused += s["refused"]
    for reg in coord.registry.values():
        if reg.owned and not reg.key.startswith("dir:"):
            claims.setdefault(reg.path, set()).add(COORDINATOR)
    for pend in coord.pending.values():
        for path in pend.received:
            claims.setdefault(path, set()).add(COORDINATOR)
    for r in coord.retained:
        claims.setdefault(r.metadata, set()).add(COORDINATOR)
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
        registry={
            k: RegistryView(r.path, frozenset(r.refs), r.owned) for k, r in coord.registry.items()
        },
        deletions=tuple(deletions),
        pending_deletes=tuple(pending),
        pool_files=frozenset(pool_files),
        metadata_files=frozenset(p for p in on_storage if p.endswith("/" + METADATA)),
        live_parties=frozenset({COORDINATOR} | {tm_actor(t) for t in engine.conns}),
    )
    return obs, disagree + [f"refused delete of {p}" for p in refused]


def assert_sound(coord: CheckpointCoordinator, engine: PipeEngine, *, quiet: bool) -> None:
    obs, disagree = observe(coord, engine)
    violations: list[Violation | str] = [*check_all(obs, quiet=quiet), *disagree]
    assert violations == [], violations
    # every directory either party records exists on storage, and no file is in none
    for d in obs.directories:
        assert coord.storage.exists_dir(d), d


def write(engine: PipeEngine, coord: CheckpointCoordinator, cid: int, s: SubtaskId) -> None:
    tm = coord.placement[s]
    sub = (s.vertex, s.index, s.parallelism)
    sp = cid in coord.savepoint_ids
    for kind, name, n in (
        (StateKind.KEYED_SHARED, f"sst-{cid}", 700),
        (StateKind.OPERATOR_LIST, "ops", 300),
    ):
        reply = engine.call(tm, ("write", sub, cid, kind.value, name, bytes([cid % 251]) * n, sp))
        assert reply == ("ok",), reply


def ack(
    engine: PipeEngine, coord: CheckpointCoordinator, cid: int, s: SubtaskId
) -> Acknowledgement:
    tm = coord.placement[s]
    reply = engine.call(
        tm, ("ack", (s.vertex, s.index, s.parallelism), cid, cid in coord.savepoint_ids)
    )
    msg = decode_message(reply[1])
    if isinstance(msg, Decline):
        coord.receive_decline(msg)
        raise AssertionError(f"unexpected decline {msg}")
    assert isinstance(msg, Acknowledgement) and msg.attempt == tm
    coord.receive_ack(msg)
    return msg


def checkpoint(
    engine: PipeEngine, coord: CheckpointCoordinator
) -> tuple[int, list[Acknowledgement]]:
    cid = coord.trigger()
    acks = []
    for s in sorted(coord.placement, key=str):
        write(engine, coord, cid, s)
        acks.append(ack(engine, coord, cid, s))
        assert_sound(coord, engine, quiet=False)
    return cid, acks


def paths(entries: Iterable[StateEntry]) -> set[str]:
    return {st.path for e in entries if (st := stream_of(e.handle)) is not None}


def named(acks: list[Acknowledgement]) -> set[StateEntry]:
    return {e for a in acks for e in a.entries if not isinstance(e.handle, DirectoryHandle)}


@pytest.mark.parametrize(
    "parties",
    [
        (MergingMode.NONE, "local"),
        (MergingMode.WITHIN_CHECKPOINT, "local"),
        (MergingMode.ACROSS_CHECKPOINT, "local"),
        (MergingMode.NONE, "s3"),
        (MergingMode.WITHIN_CHECKPOINT, "s3"),
    ],
    indirect=True,
    ids=["none-local", "within-local", "across-local", "none-s3", "within-s3"],
)
def test_tm_processes_checkpoint_abort_and_late_ack_with_their_own_records(
    parties: Any,
) -> None:
    coord, engine, storage = parties
    assert_sound(coord, engine, quiet=True)
    # 1: complete
    c1, acks1 = checkpoint(engine, coord)
    done = coord.complete(c1)
    assert done is not None
    assert_sound(coord, engine, quiet=True)
    assert set(done.entries) == named(acks1)
    # 2: every subtask acknowledges, then the checkpoint is aborted: what the
    # coordinator received (R43) and the TMs' segments for it (R33) go
    c2, _ = checkpoint(engine, coord)
    coord.abort(c2)
    assert_sound(coord, engine, quiet=True)
    # 3: one subtask acknowledges late, after the abort (R43: the late whole files are
    # handed over and deleted; segments stay the TM's until it hears of the abort)
    c3 = coord.trigger()
    subtasks = sorted(coord.placement, key=str)
    for s in subtasks:
        write(engine, coord, c3, s)
    ack(engine, coord, c3, subtasks[0])
    coord.abort(c3)
    ack(engine, coord, c3, subtasks[1])
    assert_sound(coord, engine, quiet=False)
    # a savepoint: its whole files are handed over by the acknowledgements (R43) and
    # are the user's once it completes (R55); the TMs keep no record of them
    sp = coord.trigger(savepoint=True)
    sp_acks = []
    for s in subtasks:
        write(engine, coord, sp, s)
        sp_acks.append(ack(engine, coord, sp, s))
        assert_sound(coord, engine, quiet=False)
    saved = coord.complete(sp)
    assert saved is not None and saved.savepoint
    assert_sound(coord, engine, quiet=True)
    obs, _ = observe(coord, engine)
    sp_files = {p for p in obs.files if is_under(p, savepoint_dir(sp))}
    assert sp_files == {saved.metadata} | paths(saved.entries)
    assert saved.metadata in obs.files
    assert {obs.owners[saved.metadata]} | {obs.owners[p] for p in paths(saved.entries)} == {"user"}
    # 4, 5: complete twice: checkpoint 1 is subsumed (num_retained 1)
    for _ in range(2):
        cid, acks = checkpoint(engine, coord)
        done = coord.complete(cid)
        assert done is not None
        assert_sound(coord, engine, quiet=True)
    # the retained checkpoint's _metadata on storage names exactly what was acknowledged
    assert [r.id for r in coord.retained] == [cid]
    back = coord.load_completed(done.metadata, JOB)
    assert set(back.entries) == named(acks)
    metas = sorted(p for p in storage.list_files() if p.endswith("/" + METADATA))
    assert metas == sorted([done.metadata, saved.metadata])
    # nothing of the aborted or subsumed checkpoints is left on storage
    obs, _ = observe(coord, engine)
    live = paths(back.entries)
    kept = paths(saved.entries)
    assert set(obs.files) <= live | kept | {done.metadata, saved.metadata} | obs.pool_files
    # the notices the TMs got were bytes that decode to what was sent
    assert {type(decode_message(b)).__name__ for _, b in engine.sent} == {
        "CheckpointComplete",
        "CheckpointAborted",
    }


@pytest.mark.parametrize("parties", [(MergingMode.NONE, "local")], indirect=True, ids=["none"])
def test_a_lost_tm_process_keeps_what_it_acknowledged_until_it_stopped(parties: Any) -> None:
    """R56, R64 across processes: the coordinator gives up on tm-2 (the engine's notice
    of a lost TM), but its process runs on and acknowledges whole files. It forgot them
    when it acknowledged (R43); the coordinator does not take them (R56) and records
    them as tm-2's, so each has one owner (I3). Once the engine says tm-2 stopped
    (``AttemptStopped``, as bytes) they are the coordinator's and go: nothing leaks."""
    coord, engine, storage = parties
    c1, _ = checkpoint(engine, coord)
    assert coord.complete(c1) is not None
    coord.lose("tm-2")
    c2 = coord.trigger()
    late: set[str] = set()
    for s in sorted(coord.placement, key=str):
        write(engine, coord, c2, s)
        msg = ack(engine, coord, c2, s)
        if coord.placement[s] == "tm-2":
            late |= paths(msg.entries)
    assert late
    obs, _ = observe(coord, engine)
    assert {obs.owners.get(p) for p in late} == {"tm:tm-2"}
    assert_sound(coord, engine, quiet=False)
    engine.call("tm-2", ("stop",))  # the attempt's process ends
    del engine.conns["tm-2"]
    stopped = decode_message(encode_message(AttemptStopped(JOB, "tm-2")))
    assert isinstance(stopped, AttemptStopped)
    coord.receive_stopped(stopped)
    assert not late & set(storage.list_files())
    coord.abort(c2)
    assert_sound(coord, engine, quiet=True)
    back = coord.load_completed(coord.retained[-1].metadata, JOB)
    assert paths(back.entries) <= set(storage.list_files())
