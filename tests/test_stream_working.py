"""``--state-backend working`` without Spark (issue 18 stage 3): each subtask's keyed state
is a SlateDB on the checkpoint storage, a checkpoint refers to its SSTs in place (R103),
a restore clones from the checkpoint's SlateDB checkpoint (R105), and the coordinator's
collection with SlateDB's GC leaves only what a live database or a retained checkpoint
needs (R104, I6, I7). The same correctness test as the RocksDB backend's: every closed
window's count equals the batch computation, under task kills and a rescale."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pipeline.stream import slate
from pipeline.stream.kills import Failures
from pipeline.stream.working_names import PointerError, is_staged, pointer_name, pointers
from pipeline.stream.working_task import RestoreError
from spec.config import Config, MergingMode, RestoreMode, Scope, StateKind
from spec.handles import FileHandle, StateEntry
from spec.ids import SubtaskId
from tests.lockstep import S3_BUCKET
from tests.stream_harness import LocalJob


def _job(tmp: Path, mode: RestoreMode = RestoreMode.CLAIM, **kw: object) -> LocalJob:
    config = Config.for_mode(
        MergingMode.WITHIN_CHECKPOINT, num_retained=1, restore_mode=mode, open_files_readable=False
    )
    return LocalJob(tmp, config, backend="working", **kw)  # type: ignore[arg-type]


def _quiet_violations(job: LocalJob) -> list[str]:
    job.quiesce()
    assert job.coordinator.finish_attempts()
    return job.coordinator.violations(quiet=True)


@pytest.mark.parametrize("mode", [RestoreMode.CLAIM, RestoreMode.NO_CLAIM], ids=lambda m: m.name)
def test_kills_and_a_rescale_4_to_3_count_every_window_once(
    tmp_path: Path, mode: RestoreMode
) -> None:
    job = _job(tmp_path, mode, parallelism=4, failures=Failures(kill_prob=0.08, seed=3))
    reports = [job.batch() for _ in range(8)]
    assert job.kills, "the seed kills tasks"
    assert sum(r.restored for r in reports) > 0  # a killed attempt's successor clones
    assert all(r.in_place > 0 and r.uploaded == 0 for r in reports)
    assert job.coordinator.violations() == []
    job.rescale(3)
    after = [job.batch() for _ in range(4)]
    assert after[0].restored == 3
    comparison = job.comparison()
    assert comparison.windows >= 3
    assert comparison.equal, comparison.mismatches[:10]
    assert _quiet_violations(job) == []
    done = job.coordinator.slate.done
    assert done.released > 0  # subsumed checkpoints' SlateDB checkpoints went


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(d, f))
            out[os.path.join(d, f)] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_no_claim_restore_copies_and_never_touches_the_users_databases(tmp_path: Path) -> None:
    """R105, R73: the new job's databases are copies (a reader pinned to the checkpoint
    writes nothing in the source), so its checkpoints refer to its own files only."""
    job = _job(tmp_path, RestoreMode.NO_CLAIM, parallelism=4)
    for _ in range(4):
        job.batch()
    job.rescale(3)
    users = tmp_path / "base" / "job-0" / "taskowned" / "working"
    before = _listing(users)
    assert before
    reports = [job.batch() for _ in range(3)]
    assert reports[0].restored == 3
    assert _listing(users) == before
    retained = job.coordinator.co.retained[-1]
    assert retained.working and all(w.path.startswith("job-1/") for _, w in retained.working)
    assert job.comparison().equal
    assert _quiet_violations(job) == []


def test_a_lost_local_home_restores_by_a_clone_that_copies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R105: a subtask whose TM records are gone (a new worker) clones the checkpoint: the
    clone writes no SST, its manifest names the checkpoint's SSTs of the subtask where they
    are, and its first snapshot refers to them in place. The compactor is held back here: a
    compaction between the clone's flush and its snapshot may rewrite the source's SSTs into
    the clone's own (a rewrite, not a copy at restore), which makes the snapshot's references
    depend on timing (a restored database's first task opens without its compactor only
    while its L0 is small, ``slate.QUIET_L0``)."""
    settings = slate.db_settings

    def slow_compactor(l0_max_ssts: int = 32, *, compactor: bool = True) -> Any:
        s = settings(l0_max_ssts, compactor=compactor)
        if compactor:
            s.set("compactor_options.poll_interval", '"1h"')
        return s

    monkeypatch.setattr(slate, "db_settings", slow_compactor)
    job = _job(tmp_path, parallelism=2)
    for _ in range(4):
        job.batch()
    theirs = {w.path for s, w in job.coordinator.co.retained[-1].working if s.index == 1}
    cloned: list[tuple[str, slate.ManifestFiles, list[str]]] = []
    real = slate.clone

    def clone(loop: slate.Loop, place: slate.Place, target: str, *a: Any, **k: Any) -> None:
        real(loop, place, target, *a, **k)
        written = sorted(p.name for p in (tmp_path / "base" / target / "compacted").glob("*"))
        cloned.append((target, slate.Admin(loop, place).files(target), written))

    monkeypatch.setattr(slate, "clone", clone)
    job.lose_local_state(1)
    r = job.batch()
    assert r.restored == 1 and r.uploaded == 0
    ((target, files, written),) = cloned
    assert "/count-1-2/" in target and written == []
    assert files.own == () and set(files.external) == theirs
    dbs = {w.path.split("/compacted/")[0] for _, w in job.coordinator.co.retained[-1].working}
    assert len([d for d in dbs if "count-1-2" in d]) >= 2  # the clone's own and its source's
    assert job.comparison().equal
    assert _quiet_violations(job) == []


def test_on_s3_the_working_backend_restores_and_collects(tmp_path: Path, s3_endpoint: str) -> None:
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": s3_endpoint},
    }
    job = _job(
        tmp_path, parallelism=2, url=f"s3://{S3_BUCKET}/working-{tmp_path.name}",
        storage_options=options,
    )  # fmt: skip
    for _ in range(4):
        job.batch()
    job.lose_local_state(0)
    assert job.batch().restored == 1
    job.batch()
    assert job.comparison().equal
    assert _quiet_violations(job) == []


def _entry(name: str, kind: StateKind = StateKind.KEYED_SHARED) -> StateEntry:
    sub = SubtaskId("count", 0, 2)
    handle = FileHandle("job-0/shared/count-0-2/f", 10, "f", Scope.SHARED)
    return StateEntry(sub, kind, name, handle, 1, (0, 63))


@pytest.mark.parametrize(
    "name",
    [
        "db:../../etc/manifest/00000000000000000001.manifest#" + "0" * 36,
        "db:job-0/taskowned/working/count-0-2/db/zz/manifest/1.manifest#x",
        "db:job-0/shared/count-0-2/db/0123456789ab/manifest/00000000000000000001.manifest#"
        + "a" * 36,
        "db:no-pointer",
    ],
)
def test_a_db_entry_that_names_no_slatedb_checkpoint_is_refused(name: str) -> None:
    with pytest.raises(PointerError, match=r"names no SlateDB checkpoint|not a database"):
        pointers([_entry(name)])


def test_a_pointer_round_trips_and_an_exclusive_one_is_refused() -> None:
    lineage = "job-0/taskowned/working/count-0-2/db/0123456789ab"
    name = pointer_name(lineage, 7, "6e0a095c-1a45-423b-92fb-5c9368d8cb4c")
    (p,) = pointers([_entry(name)])
    assert (p.lineage, p.manifest_id, p.key_groups) == (lineage, 7, (0, 63))
    assert p.manifest_path == f"{lineage}/manifest/00000000000000000007.manifest"
    with pytest.raises(PointerError):
        pointers([_entry(name, StateKind.KEYED_FULL)])


def test_a_pointer_to_another_operators_database_is_refused() -> None:
    """R105: a subtask of ``count`` clones only databases of ``count``, whatever a
    checkpoint's entry names."""
    name = pointer_name("job-0/taskowned/working/join-0-2/db/0123456789ab", 7, "c" * 36)
    with pytest.raises(PointerError, match="another operator than 'count'"):
        pointers([_entry(name)])


def test_a_restore_whose_manifest_in_place_changed_is_refused_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    """The checkpoint's copy of its manifest is the restore's check: a database directory
    whose manifest differs is not the one the checkpoint was taken of; nothing is cloned."""
    job = _job(tmp_path, parallelism=2)
    for _ in range(3):
        job.batch()
    (p,) = pointers(e for e in job.coordinator.co.retained[-1].entries if e.subtask.index == 0)
    manifest = tmp_path / "base" / p.manifest_path
    manifest.write_bytes(manifest.read_bytes() + b"x")
    before = _listing(tmp_path / "base")
    job.lose_local_state(0)
    with pytest.raises(RestoreError, match="differs from the checkpoint's copy"):
        job.batch()
    gone = set(before) - set(_listing(tmp_path / "base"))
    assert not gone


@pytest.mark.parametrize("rescale", [False, True], ids=["last-batch", "after-a-rescale"])
def test_a_task_killed_after_it_put_its_state_back_leaves_no_tm_to_go_on_with(
    tmp_path: Path, rescale: bool
) -> None:
    """A task killed after it put its TM's records back (``put-back``): its result never
    reached the driver, and the retry must not go on with that TM, which acknowledged the
    same checkpoint already. Going on, the TM would write the checkpoint twice: in the last
    batch of a run the first copy's segments would stay the live TM's, referred to by
    nothing (I6 once quiet; seed 4 of the kills and rescale test with the Spark test's
    settings reaches it); after a restore the retry's clone would be refused (the TM has
    opened its restored files at that epoch already: "lists files it neither wrote nor was
    opened on", seed 8)."""
    batch = 4  # the last batch, or the first after the rescale (its tasks restore)
    job = _job(
        tmp_path, parallelism=2 if rescale else 3,
        failures=Failures(kill_at=(batch, 0, "put-back")),
    )  # fmt: skip
    for _ in range(4):
        job.batch()
    if rescale:
        job.rescale(3)
    for _ in range(2 if rescale else 1):
        job.batch()
    assert job.next_batch == (6 if rescale else 5)
    assert job.kills == [(batch, 0, 0, "put-back")]
    assert job.comparison().equal
    assert _quiet_violations(job) == []


def _staged_upload(base: Path, lineage: str) -> str:
    """What a SIGKILL in the middle of an upload of SlateDB's object store leaves in the
    database directory ``lineage`` on a local disk: the object's staging file
    (``<object>#<n>``, renamed to ``<object>`` only once whole), here the first bytes of
    an SST named as SlateDB names one made now. Its path relative to ``base``."""
    crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    t, stamp = time.time_ns() // 1_000_000, ""
    for _ in range(10):
        t, r = divmod(t, 32)
        stamp = crockford[r] + stamp
    ulid = stamp + "".join(random.Random(lineage).choice(crockford) for _ in range(16))
    staged = base / lineage / "compacted" / f"{ulid}.sst#1"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(b"\x00" * 512)
    return str(staged.relative_to(base))


@pytest.mark.parametrize("point", ["before-snapshot", "mid-upload"])
def test_an_upload_cut_off_by_a_kill_goes_with_its_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """R104, I6 (issue 39; the Spark test reaches it at seed 5): the first task of a
    subtask after a rescale 4 -> 3 (CLAIM) clones into a new database directory and opens
    it with its compactor, which compacts the L0 the clone united; the worker is
    SIGKILLed (before its snapshot, or after its flush) while the compactor, or the flush,
    uploads an SST.
    On a local disk SlateDB's object store leaves the upload's staging file
    (``working_names.STAGED``), which SlateDB never lists: the retry clones into another
    directory, the coordinator drops the dead one with ``delete_db`` (R104, nothing needs
    it), and step 4 of ``slate_collect`` deletes the staging file with it: left behind, it
    would leak the directory (I6) and the audit would report one orphan. The harness kills
    in-process; the kill here leaves on storage what a SIGKILL mid-upload leaves."""
    from pipeline.stream import working_task
    from tests import stream_harness

    base = tmp_path / "base"
    planted: list[str] = []
    die = stream_harness._die

    def die_mid_upload(at: str) -> NoReturn:
        (db,) = working_task._OPEN  # the killed task's database, its compactor running
        planted.append(_staged_upload(base, db.lineage))
        die(at)

    monkeypatch.setattr(stream_harness, "_die", die_mid_upload)
    job = _job(tmp_path, parallelism=4, failures=Failures(kill_at=(5, 2, point)))
    for _ in range(5):
        job.batch()
    job.rescale(3)
    for _ in range(3):
        job.batch()
    assert job.kills == [(5, 2, 0, point)]
    (staged,) = planted
    assert is_staged(staged) and staged.startswith("job-1/taskowned/working/count-2-3/db/")
    assert job.comparison().equal
    assert _quiet_violations(job) == []
    assert staged in job.coordinator.slate.done.staged
    left = [str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()]
    assert not [p for p in left if "#" in p], left


@pytest.mark.parametrize(
    ("name", "staged"),
    [
        ("compacted/01M8T2SJTAKRHF7E749MWP5MJ1.sst#1", True),
        ("manifest/00000000000000000009.manifest#17", True),
        ("compacted/01M8T2SJTAKRHF7E749MWP5MJ1.sst", False),
        ("compacted/01M8T2SJTAKRHF7E749MWP5MJ1.sst#", False),
        ("compacted/notes.txt#1", False),
        ("compacted/01M8T2SJTAKRHF7E749MWP5MJ1.sst#1#2", False),
    ],
)
def test_only_an_unfinished_upload_of_a_databases_object_counts_as_staged(
    name: str, staged: bool
) -> None:
    """Step 4 of ``slate_collect`` deletes only what SlateDB's object store was writing:
    a staging name of one of a database's objects, nothing else a directory may hold."""
    assert is_staged(f"job-1/taskowned/working/count-2-3/db/0123456789ab/{name}") is staged
    assert not is_staged(f"job-1/taskowned/tm-0123456789ab/{name}")


@pytest.mark.parametrize("codec", [slate.CODEC, None], ids=["snappy", "none"])
def test_the_databases_ssts_are_compressed_as_rocksdbs_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str | None
) -> None:
    """The SSTs of a working database land on the checkpoint storage: compressed as the
    upload backend's RocksDB compresses its own (Snappy), 20,000 counts take under half
    their raw bytes (0.39x when written); without a codec (SlateDB's default) more than
    their raw bytes (1.33x)."""
    if codec is None:
        settings = slate.db_settings

        def uncompressed(*a: Any, **kw: Any) -> Any:
            s = settings(*a, **kw)
            s.set("compression_codec", "null")
            s.set("compactor_options.worker.compression_codec", "null")
            return s

        monkeypatch.setattr(slate, "db_settings", uncompressed)
    loop = slate.Loop()
    try:
        db = slate.SlateCounts(loop, slate.Place(str(tmp_path), {}), "db")
        rnd = random.Random(3)
        counts = {(rnd.randrange(32), 0, f"w{i:06d}"): rnd.randrange(1, 9) for i in range(20_000)}
        db.add(counts)
        db.flush()
        db.close()
    finally:
        loop.close()
    raw = sum(len(slate.encode_key(*k)) + 8 for k in counts)
    stored = sum(p.stat().st_size for p in tmp_path.rglob("*.sst"))
    assert (stored < raw / 2) == (codec is not None), (stored, raw)


@pytest.mark.parametrize("per_write", [1, 7, 1000, 1 << 20])
def test_a_no_claim_copy_writes_every_row_of_its_key_groups_a_bounded_write_at_a_time(
    tmp_path: Path, per_write: int
) -> None:
    """``read_checkpoint`` streams the rows of a checkpoint's key groups and ``put_all``
    writes them ``per_write`` at a time: the copy holds every row of the key groups at
    the checkpoint and nothing else (neither other key groups nor a later write), whatever
    the size of the writes, the last one part full or not."""
    loop = slate.Loop()
    place = slate.Place(str(tmp_path), {})
    try:
        src = slate.SlateCounts(loop, place, "src")
        counts = {(g, 1000, f"w{i:04d}"): i + 1 for i in range(200) for g in (3, 4, 9)}
        src.add(counts)
        src.flush()
        checkpoint_id, _ = src.checkpoint(1)
        src.add({(4, 2000, "later"): 1})  # after the checkpoint: not copied
        src.flush()
        src.close()
        copy = slate.SlateCounts(loop, place, "copy")
        rows = slate.read_checkpoint(loop, place, "src", checkpoint_id, (3, 4))
        assert copy.put_all(rows, per_write=per_write) == 400
        got = dict(copy.items())
        copy.close()
    finally:
        loop.close()
    assert got == {k: n for k, n in counts.items() if k[0] in (3, 4)}



def test_a_task_ends_once_its_compactions_finished(tmp_path: Path) -> None:
    """``settle`` waits until the compactor has no compaction active: four flushes make
    four L0 SSTs, which SlateDB merges into a sorted run; once it is scheduled (the
    scheduler polls: ``settle`` does not wait for what is not) and ``settle`` returned, the
    merge is committed (no L0 SST left, nothing active), so the shutdown that ends the
    task cuts nothing off (SlateDB would not resume it). A database opened without its
    compactor does not wait."""
    loop = slate.Loop()
    place = slate.Place(str(tmp_path), {})
    store = place.store()
    rnd = random.Random(5)
    try:
        db = slate.SlateCounts(loop, place, "db", store=store)
        for window in range(4):
            db.add({(rnd.randrange(32), window, f"w{rnd.randrange(10**6):07d}"): 1
                    for _ in range(5_000)})  # fmt: skip
            db.flush()
        deadline = time.monotonic() + 30
        while not db.compacting() and time.monotonic() < deadline:
            time.sleep(0.01)  # the scheduler polls every 100 ms
        assert db.compacting(), "SlateDB scheduled no merge of the four L0 SSTs"
        assert db.settle() < slate.SETTLE_LIMIT
        assert not db.compacting()
        assert db.files().l0 == 0
        db.close()
        quiet = slate.SlateCounts(loop, place, "db", store=store, compactor=False)
        assert quiet.settle() == 0.0
        quiet.close()
    finally:
        loop.close()
