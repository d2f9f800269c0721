"""The one restart from storage (``fastimpl.resume.rebuild``, issue 16), driven where it is
hardest: a coordinator resumed right after a CLAIM restore, a NO_CLAIM restore, a
savepoint, and with a torn ``_metadata`` of an in-flight checkpoint, with its TMs in
processes of their own (``tests.process_soak``), in every merging mode on a local
directory and on S3 (moto; ACROSS is refused there, R16). The public recovery
(``CheckpointStore.recover``) rebuilds through the same function: its cases follow.

Each scripted story ends as a soak sequence does: invariants on the real files after
every step, quiet with no leak (I6), and the trace replayed through the model.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl import CheckpointStore, testing
from fastimpl.engine import InProcessEngine
from fastimpl.metadata import MetadataError
from fastimpl.party_observation import observe_working
from fastimpl.resume import ha_state, rebuild
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.effects import COORDINATOR, USER
from spec.handles import stream_of
from spec.ids import SubtaskId
from spec.invariants import (
    check_safety,
    no_leak_once_quiet,
    no_working_leak_once_quiet,
    working_files_kept,
)
from spec.layout import SAVEPOINTS, is_under, job_base, metadata_path
from tests.faultyfs import Place
from tests.lockstep import S3_BUCKET, s3
from tests.process_soak import SETTINGS, Soak, SoakFailure, make_setting
from tests.storage_settings import _checkpoint as completed_checkpoint
from tests.tm_cluster import TmDied

IDS = [f"{m.value}-{w}" for m, w in SETTINGS]


def _soak(mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest) -> Soak:
    config, fs, root, target = make_setting(mode, where, tmp_path, request)
    return Soak(f"scripted-{mode.value}-{where}", config, fs, root, target)


def _on_storage(soak: Soak, base: str) -> dict[str, bytes]:
    files = soak.coord.storage.list_files()
    return {p: soak.fs.cat_file(f"{soak.root}/{p}") for p in sorted(files) if is_under(p, base)}


def _story(soak: Soak, body: object) -> None:
    try:
        soak.check(quiet=True)
        assert callable(body)
        body()
        soak.finish()
    except (AssertionError, TmDied) as err:
        if isinstance(err, SoakFailure):
            raise
        raise SoakFailure(soak.failure(f"{type(err).__name__}: {err}")) from err
    finally:
        codes = soak.engine.stop_all()
    assert all(code == 0 for code in codes), soak.failure(f"TM exit codes {codes}")


def _restart(soak: Soak) -> None:
    before = soak.counts["coordinator kills"]
    soak.restart()
    assert soak.counts["coordinator kills"] == before + 1, soak.failure("did not restart")
    soak.check()


@pytest.mark.parametrize(("mode", "where"), SETTINGS, ids=IDS)
def test_resumed_after_a_claim_restore_it_owns_the_claimed_files_until_subsumed(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R72, R95: job-1 claimed job-0's checkpoint and has completed nothing of its own when
    its coordinator dies. The resumed one still owns the claimed files (the HA state's
    checkpoint store and lineage say so), restarts the subtasks from the claimed state,
    and deletes the claimed files once a checkpoint of job-1 subsumes it: nothing of job-0
    is left. (Rebuilt from job-1's base alone, the claimed files would be the user's,
    and stay on storage for ever.)"""
    soak = _soak(mode, where, tmp_path, request)

    def body() -> None:
        soak.full_checkpoint()
        src = soak.full_checkpoint()
        soak.restore(src.id, RestoreMode.CLAIM)
        starts = {s: soak.coord.state_to_restore(s) for s in soak.coord.placement}
        assert any(starts.values())
        _restart(soak)
        co = soak.coord
        assert [r.metadata for r in co.retained] == [src.metadata]
        assert {s: co.state_to_restore(s) for s in co.placement} == starts
        claimed = {src.metadata} | {
            s.path for e in src.entries if (s := stream_of(e.handle)) is not None
        }
        for path in sorted(claimed):
            assert co.catalog.files[path].owner == COORDINATOR, path
        assert _on_storage(soak, job_base(src.job))
        for _ in range(soak.cfg.num_retained + 1):
            soak.full_checkpoint()
        assert _on_storage(soak, job_base(src.job)) == {}

    _story(soak, body)


@pytest.mark.parametrize(("mode", "where"), SETTINGS, ids=IDS)
def test_resumed_after_a_no_claim_restore_it_never_deletes_the_source(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R73, R95: after a NO_CLAIM restore the source is the user's; a coordinator resumed
    before the new job completes anything restarts the subtasks from it and never
    deletes a byte of it, through later checkpoints and the end."""
    soak = _soak(mode, where, tmp_path, request)

    def body() -> None:
        src = soak.full_checkpoint()
        soak.restore(src.id, RestoreMode.NO_CLAIM, par=3)
        source = _on_storage(soak, job_base(src.job))
        starts = {s: soak.coord.state_to_restore(s) for s in soak.coord.placement}
        _restart(soak)
        co = soak.coord
        assert co.retained == []
        assert {s: co.state_to_restore(s) for s in co.placement} == starts
        for path in source:
            assert co.catalog.files[path].owner == USER, path
        for _ in range(soak.cfg.num_retained + 1):
            soak.full_checkpoint()
        _restart(soak)
        assert _on_storage(soak, job_base(src.job)) == source

    _story(soak, body)
    after = {p for p in soak.coord.storage.list_files() if is_under(p, "job-0")}
    assert after, "the NO_CLAIM source is the user's: it stays"


@pytest.mark.parametrize(("mode", "where"), SETTINGS, ids=IDS)
def test_resumed_with_a_kept_checkpoint_outside_its_lineage_it_only_reads_it(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R72, I5: job-1 claimed job-0's checkpoint and has completed nothing of its own when
    its coordinator dies, and the HA state it resumes from names that checkpoint as kept
    but has lost the lineage (job-0's base is not in it). The resumed coordinator restarts
    the subtasks from it, reads it as the user's, and subsumes it without deleting or
    trying to delete anything of it: no delete refused, every file of job-0 unchanged
    (subsuming deletes the ``_metadata`` only when the store owns it, so the user's is
    never tried and I5 refuses nothing). The model knows nothing of lost HA
    state, so the story is checked here, not replayed."""
    soak = _soak(mode, where, tmp_path, request)
    try:
        soak.full_checkpoint()
        src = soak.full_checkpoint()
        soak.restore(src.id, RestoreMode.CLAIM)
        source = _on_storage(soak, job_base(src.job))
        starts = {s: soak.coord.state_to_restore(s) for s in soak.coord.placement}
        before = soak.counts["coordinator kills"]
        soak.restart(edit_ha=lambda ha: attrs.evolve(ha, lineage=()))
        assert soak.counts["coordinator kills"] == before + 1, soak.failure("did not restart")
        co = soak.coord
        assert [r.metadata for r in co.retained] == [src.metadata]
        assert {s: co.state_to_restore(s) for s in co.placement} == starts
        assert {co.catalog.files[p].owner for p in source} == {USER}
        for _ in range(soak.cfg.num_retained + 1):
            soak.full_checkpoint()
        assert src.metadata not in [r.metadata for r in soak.coord.retained]
        assert soak.coord.catalog.refused_deletes == []
        assert _on_storage(soak, job_base(src.job)) == source
        soak.check()
    finally:
        codes = soak.engine.stop_all()
    assert all(code == 0 for code in codes), soak.failure(f"TM exit codes {codes}")


@pytest.mark.parametrize(("mode", "where"), SETTINGS, ids=IDS)
def test_resumed_after_a_savepoint_it_keeps_the_users_savepoint(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R55, R95: a completed savepoint is the user's; the resumed coordinator knows it
    (a job may restore from it) and never deletes it."""
    soak = _soak(mode, where, tmp_path, request)

    def body() -> None:
        soak.full_checkpoint()
        sp = soak.full_checkpoint(savepoint=True)
        saved = _on_storage(soak, SAVEPOINTS)
        assert sp.metadata in saved
        _restart(soak)
        co = soak.coord
        assert co.stored_savepoints() == [sp.id]
        assert all(co.catalog.files[p].owner == USER for p in saved)
        for _ in range(soak.cfg.num_retained + 1):
            soak.full_checkpoint()
        soak.restore(sp.id, RestoreMode.NO_CLAIM)
        soak.full_checkpoint()
        assert _on_storage(soak, SAVEPOINTS) == saved

    _story(soak, body)


@pytest.mark.parametrize(("mode", "where"), SETTINGS, ids=IDS)
def test_a_torn_metadata_of_an_in_flight_checkpoint_is_ignored_and_collected(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R51, R95: the coordinator died while writing an acknowledged checkpoint's
    ``_metadata`` (half of it reached storage; on a local disk the ``.inprogress`` twin
    too) and while a savepoint was in flight with a torn ``_metadata`` of its own. The HA
    state lists neither: the resumed coordinator reads neither, deletes the checkpoint's
    torn files and its other files as garbage of its own base; the HA state lists the
    savepoint as in flight, so its directory is the store's too: its torn ``_metadata``
    goes, and the TMs delete their own unacknowledged files there at the failover
    (R60). (Recovery, without HA state, leaves an interrupted savepoint to the user:
    ``test_recovery``.)"""
    soak = _soak(mode, where, tmp_path, request)

    def body() -> None:
        done = soak.full_checkpoint()
        good = soak.fs.cat_file(f"{soak.root}/{done.metadata}")
        cid = soak.run_trigger()
        for s in sorted(soak.coord.placement, key=str):
            assert soak.write(cid, s) == "ok"
            soak.ack(cid, s)
        torn = [metadata_path(soak.coord.job, cid)]
        if where == "local":
            torn.append(torn[0] + ".inprogress")
        spid = soak.run_trigger(savepoint=True)
        for s in sorted(soak.coord.placement, key=str):
            assert soak.write(spid, s, savepoint=True) == "ok"
        sp_torn = f"{SAVEPOINTS}/savepoint-{spid}/_metadata"
        for path in [*torn, sp_torn]:
            soak.fs.makedirs(f"{soak.root}/{path.rsplit('/', 1)[0]}", exist_ok=True)
            soak.fs.pipe_file(f"{soak.root}/{path}", good[: len(good) // 2])
        sp_files = _on_storage(soak, f"{SAVEPOINTS}/savepoint-{spid}")
        _restart(soak)
        files = soak.coord.storage.list_files()
        assert not set(torn) & set(files)
        assert not any(is_under(p, f"job-0/chk-{cid}") for p in files)
        assert sp_torn in sp_files
        assert _on_storage(soak, f"{SAVEPOINTS}/savepoint-{spid}") == {}

    _story(soak, body)


# ---------------------------------------------------------------- the public recovery

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)


def _checkpoint(store: CheckpointStore, *, savepoint: bool = False) -> int:
    cid = completed_checkpoint(store, savepoint=savepoint)
    assert cid is not None
    return cid


Places = Callable[[], Place]


@pytest.fixture(params=["local", "memory", "s3"])
def places(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Places]:
    """Fresh roots on one storage (S3: moto's server)."""
    made: list[Place] = []

    def new() -> Place:
        if request.param != "s3":
            made.append(Place.make(request.param, tmp_path))
        else:
            fs = s3(request.getfixturevalue("s3_endpoint"))
            root = f"{S3_BUCKET}/{uuid.uuid4().hex}"
            made.append(Place("s3", root, f"s3://{root}", fs))
        return made[-1]

    yield new
    for p in made:
        p.cleanup()


def _options(place: Place) -> dict[str, Any]:
    return {} if place.kind != "s3" else dict(place.inner.storage_options)


def _snapshot(place: Place, base: str | None = None) -> dict[str, bytes]:
    """Every file under the place's root (or under ``base`` there), with its bytes."""
    prefix = place.root.rstrip("/") + "/"
    try:
        found = place.inner.find(place.root)
    except FileNotFoundError:
        return {}
    rel = sorted(p[len(prefix) :] for p in found if p.startswith(prefix))
    return {p: place.inner.cat_file(prefix + p) for p in rel if base is None or is_under(p, base)}


@pytest.mark.parametrize("restore_mode", list(RestoreMode), ids=lambda m: m.name)
def test_recover_after_a_restore_and_a_savepoint_never_deletes_the_users_files(
    places: Places, restore_mode: RestoreMode
) -> None:
    """The public recovery, rebuilt by ``rebuild`` with no TM running: job-0 took a
    savepoint, then job-1 restored job-0's latest checkpoint and completed one of its own
    before the process died. ``recover(crashed_job="job-1")`` continues from that one,
    keeps every byte of the savepoint and of job-0's base (after NO_CLAIM the user's; after
    CLAIM what job-1 had not yet deleted stays too, since nothing on storage proves job-1
    owns job-0's base, I5), and is quiet after more checkpoints. Every merging mode the
    storage allows."""
    for mode in MergingMode:
        place = places()
        if place.kind == "s3" and mode is MergingMode.ACROSS_CHECKPOINT:
            continue  # R16
        config = Config.for_mode(mode, num_retained=1)
        opts = _options(place)
        store = CheckpointStore(place.url, config, JOB, storage_options=opts)
        _checkpoint(store)
        sp = _checkpoint(store, savepoint=True)
        src = _checkpoint(store)
        store.coordinator.restore(src, mode=restore_mode)
        _checkpoint(store)
        store.flush()
        job0 = _snapshot(place, "job-0")
        saved = _snapshot(place, SAVEPOINTS)
        assert saved and (job0 or restore_mode is RestoreMode.CLAIM)
        # the process dies here
        new, report = CheckpointStore.recover(
            place.url, config, JOB, crashed_job="job-1", storage_options=opts
        )
        assert report.checkpoints == (src + 1,)
        assert sp in new.coordinator.savepoints()
        assert testing.check_invariants(new) == []
        for _ in range(config.num_retained + 1):
            _checkpoint(new)
        assert testing.check_invariants(new, quiet=True) == []
        assert _snapshot(place, SAVEPOINTS) == saved
        assert _snapshot(place, "job-0") == job0
        new.close()
        store.close()


def test_recover_refuses_a_torn_metadata_it_cannot_tell_from_a_damaged_one(
    places: Places,
) -> None:
    """Without the HA state's checkpoint store, recovery cannot tell a torn ``_metadata``
    of the newest checkpoint from a completed one damaged since: it refuses, naming the
    file, and deletes nothing (a resumed coordinator, which has the HA state, ignores
    it: see the scripted story above)."""
    place = places()
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    opts = _options(place)
    store = CheckpointStore(place.url, config, JOB, storage_options=opts)
    done = _checkpoint(store)
    good = place.inner.cat_file(f"{place.root}/{metadata_path('job-0', done)}")
    torn = f"{place.root}/{metadata_path('job-0', done + 1)}"
    place.inner.makedirs(torn.rsplit("/", 1)[0], exist_ok=True)
    place.inner.pipe_file(torn, good[:40])
    before = _snapshot(place)
    with pytest.raises(MetadataError, match=f"chk-{done + 1}"):
        CheckpointStore.recover(place.url, config, JOB, storage_options=opts)
    assert _snapshot(place) == before
    store.close()


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.value)
def test_resumed_under_live_databases_it_collects_the_working_files_handed_over_before(
    tmp_path: Path, mode: MergingMode
) -> None:
    """R95, R100, R104: each subtask's database (two operators, two TMs) writes a working
    file and its snapshot hands it over in place; the coordinator's process dies and is
    resumed under the running TMs. Once the databases drop those files and the next
    checkpoint subsumes the one that referred to them, the resumed coordinator's
    collection deletes them, as the coordinator that took them would have: nothing
    leaks (I6, I7), in every merging mode, and never a file a checkpoint still refers
    to or a database uses."""
    (tmp_path / "root").mkdir()
    vertices = (VertexSpec("src", 1), VertexSpec("agg", 2))
    engine = InProcessEngine(
        Config.for_mode(mode, num_retained=1),
        JobSpec(vertices, num_tms=2),
        fsspec.filesystem("file"),
        str(tmp_path / "root"),
        background_deletes=False,
    )
    subtasks = sorted(engine.placement, key=str)

    def checkpoint_of_new_files() -> dict[SubtaskId, str]:
        cid = engine.trigger()
        written = {}
        for s in subtasks:
            path = engine.write_working(s, f"{s}@{cid}".encode())
            assert path is not None
            written[s] = path
            engine.snapshot_working(cid, s)
            engine.acknowledge(cid, s)
        engine.complete(cid)
        while engine.channel:
            engine.deliver(0)
        return written

    first = checkpoint_of_new_files()
    old = engine.coord
    resumed, garbage = rebuild(
        engine.cfg,
        old.vertices,
        old.num_tms,
        engine.storage,
        engine.ids,
        engine,
        ha_state(old),
        dict(old.placement),
        log=engine.log,
    )
    assert garbage == []  # every file is a kept checkpoint's, or a live database's
    engine.host(resumed)
    resumed.failover()  # R60-R62, R105: the databases reopen on the latest checkpoint
    engine.send_ready()
    assert set(first.values()) <= resumed.working_needed()
    for s, path in first.items():
        engine.drop_working(s, path)
    second = checkpoint_of_new_files()  # subsumes the first (num_retained 1)
    engine.collect_working()
    engine.storage.drain()
    on_storage = engine.storage.list_files()
    assert not set(first.values()) & set(on_storage)
    assert set(second.values()) <= set(on_storage)
    obs = engine.observe()
    working = observe_working(resumed, engine.parties, obs)
    # I1-I5 and I7; I6 for the files no checkpoint refers to in place, and I6 of §11
    assert check_safety(obs) + working_files_kept(obs, working) == []
    assert no_leak_once_quiet(obs, frozenset(working.files)) == []
    assert no_working_leak_once_quiet(obs, working) == [] and engine.disagreements == []
