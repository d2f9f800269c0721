"""The coordinator in this process, each TaskManager in a fresh OS process (issue 16).

A TM process is started by the engine (``tests.tm_cluster.ProcessEngine``) with
multiprocessing's "spawn" and builds its TM from only the storage URL, the config, the
job id and its TM id (``tests.tm_process``). The two sides meet only through the pipe:
notices and duties (a reset, a restart assignment, the claimed files a backend may reuse,
the end of the job) go out as encoded ``spec.messages``, acknowledgements, declines and
the answer to the end of the job come back as encoded messages and are decoded here
before the coordinator sees them. Each party keeps its own records over its own
``Storage``; after every step the invariants I1-I5 are checked on the real files, with
the owners, claims and deletions of both parties merged, and once quiet nothing leaks
(I6). On a local directory in every merging mode, and on S3 (moto's server, which the TM
processes reach over HTTP) in the modes an object store allows (R16).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.coordinator import CheckpointCoordinator, subtasks_of
from fastimpl.ids import RandomIds
from fastimpl.reports import TmReport
from fastimpl.resume import ha_state, resume
from fastimpl.storage import Storage
from spec import commands as c
from spec.config import Config, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.handles import DirectoryHandle, StateEntry, stream_of
from spec.ids import SubtaskId
from spec.layout import METADATA, is_under, job_base, savepoint_dir
from spec.messages import (
    Acknowledgement,
    AttemptStopped,
    Decline,
    decode_message,
    encode_message,
)
from tests.lockstep import S3_BUCKET, s3
from tests.tm_cluster import ProcessEngine, observe, violations

JOB = "job-0"
VERTICES = (VertexSpec("map", 2), VertexSpec("sink", 1))
Parties = tuple[CheckpointCoordinator, ProcessEngine, Storage]


@pytest.fixture
def parties(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Parties]:
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
        engine = ProcessEngine(fs, root, config)
    else:
        (tmp_path / "root").mkdir()
        target = f"file://{tmp_path / 'root'}"
        fs, root = fsspec.core.url_to_fs(target)
        engine = ProcessEngine(target, "", config)
    try:
        storage = Storage(fs, root)
        engine.host_storage = storage
        assert (storage.protocol == "s3") is (where == "s3")
        coord = CheckpointCoordinator(
            config, VERTICES, 2, storage, RandomIds(), engine, JOB, deletion_log=True
        )
        tms = [engine.start_tm(JOB, 1, None) for _ in range(2)]
        coord.deploy(engine.place(subtasks_of(VERTICES), tms))
        yield coord, engine, storage
    finally:
        codes = engine.stop_all()
    assert all(code == 0 for code in codes), codes


def assert_sound(
    coord: CheckpointCoordinator,
    engine: ProcessEngine,
    *,
    quiet: bool,
    orphans: dict[str, str] | None = None,
) -> None:
    found = violations(coord, engine, quiet=quiet, orphans=orphans)
    assert found == [], found


def write(engine: ProcessEngine, coord: CheckpointCoordinator, cid: int, s: SubtaskId) -> None:
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
    engine: ProcessEngine, coord: CheckpointCoordinator, cid: int, s: SubtaskId
) -> Acknowledgement:
    tm = coord.placement[s]
    reply = engine.call(
        tm, ("ack", (s.vertex, s.index, s.parallelism), cid, cid in coord.savepoint_ids)
    )
    msg = decode_message(reply[1])
    if isinstance(msg, Decline):
        coord.receive_decline(msg)
        engine.hand_out(coord)
        raise AssertionError(f"unexpected decline {msg}")
    assert isinstance(msg, Acknowledgement) and msg.attempt == tm
    coord.receive_ack(msg)
    engine.hand_out(coord)
    return msg


def checkpoint(
    engine: ProcessEngine, coord: CheckpointCoordinator
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
    engine.hand_out(coord)
    assert done is not None
    assert_sound(coord, engine, quiet=True)
    assert set(done.entries) == named(acks1)
    # 2: every subtask acknowledges, then the checkpoint is aborted: what the
    # coordinator received (R43) and the TMs' segments for it (R33) go
    c2, _ = checkpoint(engine, coord)
    coord.abort(c2)
    engine.hand_out(coord)
    assert_sound(coord, engine, quiet=True)
    # 3: one subtask acknowledges late, after the abort (R43: the late whole files are
    # handed over and deleted; segments stay the TM's until it hears of the abort)
    c3 = coord.trigger()
    subtasks = sorted(coord.placement, key=str)
    for s in subtasks:
        write(engine, coord, c3, s)
    ack(engine, coord, c3, subtasks[0])
    engine.immediate = False  # the abort notices are still on their way
    coord.abort(c3)
    engine.hand_out(coord)
    ack(engine, coord, c3, subtasks[1])
    while engine.outbox:
        engine.deliver(0)
    engine.immediate = True
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
    engine.hand_out(coord)
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
        engine.hand_out(coord)
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
    engine.hand_out(coord)
    coord.lose("tm-2")
    engine.hand_out(coord)
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
    engine.forget_tm("tm-2")  # the engine stops the attempt's process, then says so
    stopped = decode_message(encode_message(AttemptStopped(JOB, "tm-2")))
    assert isinstance(stopped, AttemptStopped)
    coord.receive_stopped(stopped)
    engine.hand_out(coord)
    assert not late & set(storage.list_files())
    coord.abort(c2)
    engine.hand_out(coord)
    assert_sound(coord, engine, quiet=True)
    back = coord.load_completed(coord.retained[-1].metadata, JOB)
    assert paths(back.entries) <= set(storage.list_files())


def orphans_of(engine: ProcessEngine, tm: str) -> dict[str, str]:
    """What ``tm``'s own records say it owns, taken before the test kills it: after the
    kill no live party records those files, yet they are that attempt's (R65) until the
    coordinator takes them (R64)."""
    snap = TmReport.from_json(engine.call(tm, ("records",))[1])
    return {p: o for p, o in snap.owners.items() if o == f"tm:{tm}"}


def quiesce(engine: ProcessEngine, coord: CheckpointCoordinator) -> list[int]:
    """num_retained + 1 checkpoints complete (the quiet state of SPEC.md section 11)."""
    done = []
    for _ in range(coord.cfg.num_retained + 1):
        cid, _ = checkpoint(engine, coord)
        assert coord.complete(cid) is not None
        engine.hand_out(coord)
        done.append(cid)
    return done


@pytest.mark.parametrize(
    "parties",
    [
        (MergingMode.NONE, "local"),
        (MergingMode.WITHIN_CHECKPOINT, "local"),
        (MergingMode.ACROSS_CHECKPOINT, "local"),
        (MergingMode.WITHIN_CHECKPOINT, "s3"),
    ],
    indirect=True,
    ids=["none-local", "within-local", "across-local", "within-s3"],
)
def test_a_failover_replaces_a_killed_tm_process_and_resets_the_survivor(parties: Any) -> None:
    """R60-R64 across processes: tm-1 is killed (SIGKILL) between two calls; the engine
    tells the coordinator it is lost, then that it stopped; the failover starts tm-3 (a
    new process) and sends the survivor ``ResetTm`` and each TM a ``TmAssignment``, as
    bytes. tm-3 takes over the retained checkpoint's segments in its directories from
    the assignment alone (R61); the killed TM's exclusive directory is abandoned to the
    coordinator (R63) and goes once unreferenced (R42). Once quiet nothing leaks."""
    coord, engine, storage = parties
    c1, _ = checkpoint(engine, coord)
    assert coord.complete(c1) is not None
    engine.hand_out(coord)
    c2 = coord.trigger()
    for s in sorted(coord.placement, key=str):
        write(engine, coord, c2, s)  # written, never acknowledged: the survivor drops it
    orphans = orphans_of(engine, "tm-1")
    engine.kill("tm-1")
    engine.orphans.update(orphans)
    coord.lose("tm-1")  # the engine's notice of a lost TM: c2 aborts (R57)
    engine.hand_out(coord)
    assert_sound(coord, engine, quiet=False)
    coord.receive_stopped(decode_stopped(AttemptStopped(JOB, "tm-1")))
    engine.hand_out(coord)
    assert_sound(coord, engine, quiet=False)
    coord.failover()
    engine.hand_out(coord)
    assert sorted(engine.live()) == ["tm-2", "tm-3"]
    assert set(coord.placement.values()) == {"tm-2", "tm-3"}
    assert_sound(coord, engine, quiet=False)
    if coord.mode is not MergingMode.NONE:
        # tm-3 owns the retained segments in the directories it took over (R61)
        obs, _ = observe(coord, engine)
        retained = paths(coord.retained[-1].entries)
        mine = {p for p in retained if obs.owners.get(p) == "tm:tm-3"}
        assert mine, obs.owners
    quiesce(engine, coord)
    assert_sound(coord, engine, quiet=True)
    left = {p for p in orphans if p in storage.list_files()}
    assert not left, f"the killed TM's files outlived its checkpoints: {sorted(left)}"
    assert not any(is_under(p, f"{job_base(JOB)}/taskowned/tm-1") for p in storage.list_files())


def decode_stopped(msg: AttemptStopped) -> AttemptStopped:
    back = decode_message(encode_message(msg))
    assert isinstance(back, AttemptStopped)
    return back


@pytest.mark.parametrize(
    ("parties", "restore_mode"),
    [
        ((MergingMode.NONE, "local"), RestoreMode.CLAIM),
        ((MergingMode.WITHIN_CHECKPOINT, "local"), RestoreMode.CLAIM),
        ((MergingMode.ACROSS_CHECKPOINT, "local"), RestoreMode.NO_CLAIM),
        ((MergingMode.WITHIN_CHECKPOINT, "s3"), RestoreMode.CLAIM),
    ],
    indirect=["parties"],
    ids=["none-claim", "within-claim", "across-no-claim", "within-s3-claim"],
)
def test_a_rescale_ends_the_tm_processes_and_starts_new_ones(
    parties: Any, restore_mode: RestoreMode
) -> None:
    """R70-R75, R90 across processes: a restore with another parallelism ends the job
    for every TM (``EndJob``, answered by ``TmEnded``: what each still owned, now the
    coordinator's), stops their processes and starts new ones for the new job; the new
    job checkpoints from the restored state, and once quiet nothing leaks."""
    coord, engine, storage = parties
    c1, _ = checkpoint(engine, coord)
    assert coord.complete(c1) is not None
    engine.hand_out(coord)
    c2, _ = checkpoint(engine, coord)
    assert coord.complete(c2) is not None
    engine.hand_out(coord)
    assert_sound(coord, engine, quiet=True)
    coord.restore(c.Restore(c2, (("map", 3),), restore_mode))
    engine.hand_out(coord)
    assert coord.job == "job-1"
    assert sorted(engine.live()) == ["tm-3", "tm-4"]
    assert {s.parallelism for s in coord.placement if s.vertex == "map"} == {3}
    assert_sound(coord, engine, quiet=False)
    obs, _ = observe(coord, engine)
    # nothing of job-0 is a TM's any more: handed over at the end (R90)
    assert not {
        p for p, o in obs.owners.items() if is_under(p, job_base(JOB)) and o.startswith("tm:")
    }
    quiesce(engine, coord)
    assert_sound(coord, engine, quiet=True)
    # the restored checkpoint is gone if claimed (subsumed), kept as the user's if not
    left_of_old = {p for p in storage.list_files() if is_under(p, job_base(JOB))}
    if restore_mode is RestoreMode.CLAIM:
        assert not left_of_old
    else:
        assert left_of_old


@pytest.mark.parametrize(
    "parties",
    [(MergingMode.WITHIN_CHECKPOINT, "local"), (MergingMode.NONE, "local")],
    indirect=True,
    ids=["within", "none"],
)
def test_cancel_and_a_restart_of_the_coordinator_with_tm_processes(parties: Any) -> None:
    """R95 then R90-R91 across processes: the coordinator restarts from the retained
    ``_metadata`` (a failover of every TM: ``ResetTm`` and ``TmAssignment`` to live
    processes), checkpoints go on, then the job is cancelled without keeping anything:
    each TM answers ``EndJob`` with what it still owned, the coordinator deletes it, and
    nothing of the job is left."""
    coord, engine, storage = parties
    c1, _ = checkpoint(engine, coord)
    assert coord.complete(c1) is not None
    engine.hand_out(coord)
    c2 = coord.trigger()
    for s in sorted(coord.placement, key=str):
        write(engine, coord, c2, s)
        ack(engine, coord, c2, s)
    # the coordinator's process dies: a new one from storage and the HA state (c2 was
    # pending: forgotten, what it handed over deleted as the dead one's garbage)
    ha, placement = ha_state(coord), dict(coord.placement)
    coord = resume(
        coord.cfg, VERTICES, storage, RandomIds(), engine, ha, placement, deletion_log=True
    )
    engine.hand_out(coord)
    assert sorted(engine.live()) == ["tm-1", "tm-2"]
    assert_sound(coord, engine, quiet=False)
    quiesce(engine, coord)
    assert_sound(coord, engine, quiet=True)
    coord.end_job(retain=False)
    engine.hand_out(coord)
    assert engine.live() == []
    assert_sound(coord, engine, quiet=True)
    assert storage.list_files() == {}
