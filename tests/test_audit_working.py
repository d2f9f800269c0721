"""The audit understands working directories (issue 18, SPEC §11): a working file a live
database uses is ``working``, one a retained checkpoint refers to in place is
``referenced``, one neither refers to is an orphan; the deletion guards never touch a live
database's file, and without the writer's word on its databases no working file is an
orphan.

The job runs through fastimpl's in-process engine on a local directory, its coordinator
publishing its state (``fastimpl.writer_state``), as a live writer beside the audit."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest
from typer.testing import CliRunner

from ckpt.cli import app
from fastimpl import CounterIds
from fastimpl.engine import InProcessEngine
from fastimpl.storage import Storage
from fastimpl.writer_state import WRITER_STATE, WriterStatePublisher
from pipeline import deletion, fence
from pipeline.location import Location
from pipeline.result import ORPHAN, REFERENCED, WORKING
from pipeline.single import audit_single
from spec.commands import StorageOp
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.ids import SubtaskId
from spec.layout import working_dir
from tests.audit_fixtures import comparable
from tests.lockstep import S3_BUCKET, s3
from tests.stream_harness import LocalJob

DAY = 86400.0
HOUR = 3600.0
JOB = JobSpec((VertexSpec("w", 2),), num_tms=1)
W0 = SubtaskId("w", 0, 2)
W1 = SubtaskId("w", 1, 2)


def written(path: str | None) -> str:
    assert path is not None, "no storage fault is armed: the write succeeds"
    return path


class Job:
    """A running job with working state: ``inplace`` referred to in place by retained
    checkpoint 1 and no longer used, ``live`` used by the database and referred to by
    nothing, ``stray`` an old file in the working directory that nobody refers to, and
    ``small`` merged into checkpoint 1 and deleted by its database."""

    def __init__(self, root: Path) -> None:
        self.engine = InProcessEngine(
            Config.for_mode(MergingMode.WITHIN_CHECKPOINT),
            JOB,
            fsspec.filesystem("file"),
            str(root),
            CounterIds(),
        )
        e = self.engine
        self.publisher = WriterStatePublisher(e)
        e.on_applied = self.publisher
        self.inplace = written(e.write_working(W0, os.urandom(200)))
        self.small = written(e.write_working(W0, os.urandom(20)))
        cp = e.trigger()
        e.snapshot_working(cp, W0, inline_below=50)
        for s in (W0, W1):
            e.write(cp, s, StateKind.OPERATOR_LIST, "offsets", os.urandom(30))
            e.acknowledge(cp, s)
        assert e.complete(cp) is not None
        while e.channel:
            e.deliver(0)
        self.live = written(e.write_working(W0, os.urandom(300)))
        e.drop_working(W0, self.inplace)  # compacted away: checkpoint 1 still refers to it
        e.drop_working(W0, self.small)  # private: its database deletes it at once (R102)
        e.storage.drain()  # that delete runs on the deleter thread: the audit must not race it
        self.publisher.publish()
        self.stray = f"{working_dir(e.job, W0)}/f999999"
        full = root / self.stray
        full.write_bytes(b"left by a crashed database")
        old = time.time() - 3 * DAY
        os.utime(full, (old, old))
        os.utime(root / self.live, (old, old))  # age alone never decides (R100)
        self.loc = Location.parse(str(root / e.job))

    def statuses(self) -> dict[str, str]:
        t = audit_single(self.loc, grace=HOUR, now=time.time() + DAY)
        return {f["path"]: f["status"] for f in t["files"] if "/working/" in f["path"]}


def test_audit_tells_live_referenced_and_orphaned_working_files(tmp_path: Path) -> None:
    job = Job(tmp_path)
    assert job.small not in job.engine.catalog.files
    assert job.statuses() == {
        job.inplace: REFERENCED,
        job.live: WORKING,
        job.stray: ORPHAN,
    }
    t = audit_single(job.loc, grace=HOUR)
    refs = [r for r in t["references"] if r["handle"] == "in_place"]
    assert [(r["path"], r["offset"], r["length"]) for r in refs] == [(job.inplace, 0, 200)]
    (chk,) = [c for c in t["checkpoints"] if c["in_base"]]
    assert chk["dangling"] == 0 and chk["files"] >= 2  # the in-place file and a segment file


def test_deletion_takes_the_orphan_and_never_a_live_databases_file(tmp_path: Path) -> None:
    job = Job(tmp_path)
    now = time.time() + DAY
    t = audit_single(job.loc, grace=HOUR, now=now)
    assert {o["path"] for o in t["orphans"]} == {job.stray}
    forged = [*t["orphans"], {"path": job.live}, {"path": job.inplace}]
    plan = deletion.plan_deletion(job.loc, t.summary, forged, grace=HOUR, now=now)
    outcome = {p: (o, why) for p, o, why in plan.outcomes}
    assert outcome[job.stray][0] == deletion.DELETE
    assert outcome[job.live] == (
        deletion.KEEP_ACTIVE,
        "a live database's working file (or the writer did not say)",
    )
    assert outcome[job.inplace][0] == deletion.KEEP_ACTIVE  # referenced in place
    deletion.execute(job.loc, plan, str(tmp_path / "log.jsonl"), rate=0)
    assert not (tmp_path / job.stray).exists()
    assert (tmp_path / job.live).exists() and (tmp_path / job.inplace).exists()


def test_without_the_writers_word_no_working_file_is_an_orphan(tmp_path: Path) -> None:
    """A writer state without ``working_files`` (an older writer) or none at all: any
    working file may be a live database's, so none is an orphan and none is deleted."""
    job = Job(tmp_path)
    state = tmp_path / job.engine.job / WRITER_STATE
    doc = json.loads(state.read_text())
    del doc["working_files"]
    state.write_text(json.dumps(doc))
    assert fence.working_of(job.loc) is None
    assert job.statuses()[job.stray] == WORKING
    state.unlink()
    assert job.statuses()[job.stray] == WORKING
    now = time.time() + DAY
    t = audit_single(job.loc, grace=HOUR, now=now)
    plan = deletion.plan_deletion(job.loc, t.summary, [{"path": job.stray}], grace=HOUR, now=now)
    assert [o for _p, o, _w in plan.outcomes] == [deletion.KEEP_ACTIVE]


def test_a_stopped_jobs_unreferenced_working_files_are_orphans(tmp_path: Path) -> None:
    """Once the job ended with its checkpoints retained, no database is live: what they
    refer to in place is referenced (the user's), anything else in the working
    directories is an orphan; the job's end deleted its databases' private files."""
    job = Job(tmp_path)
    job.engine.cancel(retain=True)
    job.engine.storage.drain()  # the job end's deletes run on the deleter thread
    assert job.live not in job.engine.catalog.files  # closed with its database (R90)
    assert json.loads((tmp_path / job.engine.job / WRITER_STATE).read_text())["working_files"] == []
    assert job.statuses() == {job.inplace: REFERENCED, job.stray: ORPHAN}


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d.update(working_files="x"), "working_files is not a list"),
        (lambda d: d.update(working_files=["elsewhere/f"]), "outside the job base"),
    ],
)
def test_a_bad_working_list_makes_the_state_unreadable(
    tmp_path: Path, edit: object, problem: str
) -> None:
    job = Job(tmp_path)
    state = tmp_path / job.engine.job / WRITER_STATE
    doc = json.loads(state.read_text())
    assert callable(edit)
    edit(doc)
    state.write_text(json.dumps(doc))
    with pytest.raises(fence.StateError, match=problem):
        fence.read_state(job.loc)
    assert job.statuses()[job.stray] == WORKING  # unreadable: nothing is an orphan


@pytest.mark.spark  # starts Spark itself (tests/conftest.py: spark)
def test_spark_and_single_agree_on_working_files(spark: Any, tmp_path: Path) -> None:
    """The Spark job classifies working files as the single-process audit does."""
    from pipeline.spark_audit import audit_spark

    job = Job(tmp_path)
    now = time.time() + DAY
    single = audit_single(job.loc, grace=HOUR, now=now)
    assert comparable(audit_spark(spark, job.loc, grace=HOUR, now=now).collect()) == comparable(
        single
    )
    statuses = {f["path"]: f["status"] for f in single["files"]}
    assert (statuses[job.live], statuses[job.stray]) == (WORKING, ORPHAN)


def _plant_and_collect(job: LocalJob, base: Path, log: Path, n: int) -> tuple[set[str], bool]:
    """Plant leaks in the running job's working directory, backdate every file three days
    (age protects nothing then), check that the audit of every job base calls exactly
    those orphans, and run ``ckpt audit --delete-orphans`` at grace 0 on each. The leaks:
    a database directory nothing needs, an upload's staging file in a live database's
    directory (``object_store`` writes ``<name>#<n>`` and renames it), and an SST no
    manifest names (a fenced zombie's upload) made at time 0, which is an orphan exactly
    when SlateDB's own garbage collector would delete it (it keeps every SST while its
    database never compacted). The mail goes to the TMs first (as at the end of a run), so
    that they have deleted what the last complete released. What the audit deleted, and
    whether the zombie's SST was an orphan."""
    job.quiesce()
    live = sorted(job.coordinator.live_databases())
    assert live
    zombie = f"{live[0]}/compacted/000000000000000000000000{n:02d}.sst"
    planted = {
        f"{live[-1].rsplit('/', 1)[0]}/ffffffffff{n:02d}/manifest/{1:020d}.manifest",
        f"{live[-1]}/compacted/01M8DYPF6ETEJ9NV1RJ09SVQ{n:02d}.sst#{n}",
        zombie,
    }
    for rel in planted:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(b"left behind")
    old = time.time() - 3 * DAY
    for f in base.rglob("*"):
        if f.is_file():
            os.utime(f, (old, old))
    jobs = sorted(p.name for p in base.iterdir() if p.is_dir())
    orphans: set[str] = set()
    seen: set[str] = set()
    listed: dict[str, int] = {}
    for name in jobs:
        files = audit_single(Location.parse(str(base / name)), grace=0.0)["files"]
        listed[name] = len(files)
        orphans |= {f["path"] for f in files if f["status"] == ORPHAN}
        seen |= {f["status"] for f in files if "/taskowned/working/" in f["path"]}
    assert {REFERENCED, WORKING} <= seen
    if zombie not in orphans:  # kept: SlateDB's own collector keeps it too
        job.coordinator.slate.admin.gc(live[0], 0)
        assert (base / zombie).exists()
        planted.remove(zombie)
    assert orphans == planted
    for name in jobs:
        r = CliRunner().invoke(
            app,
            ["audit", str(base / name), "--engine", "single", "-q", "--delete-orphans",
             "--grace", "0s", "--allow-short-grace", "--max-deletes-per-second", "0",
             "--log", str(log)],
            catch_exceptions=False,
        )  # fmt: skip
        # 3: a guard refused: a CLAIM restore's source (its files are the restored job's),
        # or a claimed base every file of which went already (the restored job's clones
        # compacted away from its SSTs): no reference is read there, so nothing is deleted;
        # the CLI refuses before the deleter reads (nothing recognised), or the deleter
        # refuses the empty set it read
        emptied = listed[name] == 0
        said = " ".join(r.output.split())  # the report wraps its lines
        assert r.exit_code == 0 or (
            r.exit_code == 3
            and (
                "restore source of" in said
                or (
                    emptied
                    and (
                        "reference set read just now is empty" in said
                        or "the reference set is empty" in said
                    )
                )
            )
        ), r.output
    deleted = {
        json.loads(x)["path"]
        for x in log.read_text().splitlines()
        if json.loads(x)["event"] == "deleted"
    }
    assert planted <= deleted
    return deleted, zombie in planted


def test_the_audit_of_a_stream_run_takes_only_the_leaks_in_its_databases(
    tmp_path: Path,
) -> None:
    """``ckpt stream --state-backend working`` (the stream harness: the job's driver,
    tasks and coordinator, no Spark) publishes its writer state with what its SlateDB
    databases keep. Between batches, through a lost worker (a clone refers to its
    source's SSTs in place) and a rescale 2 -> 3 under CLAIM (the new job's databases
    are clones of the old job's), and at the end of the run, the audit calls exactly the
    planted leaks orphans, and ``--delete-orphans`` deletes them and nothing else: the
    job runs on from its databases, every window equal to the batch computation."""
    config = Config.for_mode(
        MergingMode.WITHIN_CHECKPOINT, num_retained=1, restore_mode=RestoreMode.CLAIM
    )
    job = LocalJob(tmp_path, config, parallelism=2, backend="working")
    base = tmp_path / "base"
    log = tmp_path / "deletions.jsonl"
    deleted: set[str] = set()
    zombies = 0
    for b in range(9):
        if b == 3:
            job.lose_local_state(1)
        if b == 6:
            job.rescale(3)
        job.batch()
        if b in (2, 4, 6, 8):
            now, zombie = _plant_and_collect(job, base, log, b)
            assert len(now - deleted) == 2 + zombie, now - deleted
            deleted, zombies = now, zombies + zombie
    assert job.coordinator.finish_attempts()
    now, zombie = _plant_and_collect(job, base, log, 9)
    assert len(now - deleted) == 2 + zombie
    assert zombies + zombie > 0, "no database compacted: SlateDB keeps every SST then"
    for _ in range(2):
        job.batch()
    assert job.comparison().equal
    job.quiesce()
    assert job.coordinator.finish_attempts()
    assert job.coordinator.violations(quiet=True) == []
    job.coordinator.close()


def test_a_claimed_base_left_with_nothing_loses_its_writer_state(tmp_path: Path) -> None:
    """A CLAIM restore puts the old job's base in the coordinator's lineage for good, and
    the coordinator publishes its state there while the base holds the claimed checkpoint.
    Once every file of it went (subsumed, ``num_retained`` 1), the state goes too: else it
    alone would keep the base for good, republished at every complete. The audit of the
    running job's base still sees its state; the job runs on, windows equal."""
    config = Config.for_mode(
        MergingMode.WITHIN_CHECKPOINT, num_retained=1, restore_mode=RestoreMode.CLAIM
    )
    job = LocalJob(tmp_path, config, parallelism=2)
    old = tmp_path / "base" / "job-0"
    for _ in range(3):
        job.batch()
    job.rescale(3)
    assert json.loads((old / WRITER_STATE).read_text())["job"] == "job-0"
    for _ in range(2):
        job.batch()
        job.quiesce()
        assert "job-0" in job.coordinator.co.lineage
        assert [p for p in old.rglob("*") if p.is_file()] == []
    state = json.loads((tmp_path / "base" / "job-1" / WRITER_STATE).read_text())
    assert state["running"] and state["job"] == "job-1"
    assert job.comparison().equal
    assert job.coordinator.violations(quiet=True) == []
    job.coordinator.close()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_unpublish_takes_the_state_as_publish_wrote_it(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """``Storage.unpublish`` (the withdrawn state's delete) is no checkpoint delete, as
    ``publish`` is no checkpoint write: an armed fault does not fire; a state already
    gone is no error."""
    if where == "s3":
        fs, root = s3(request.getfixturevalue("s3_endpoint")), f"{S3_BUCKET}/{tmp_path.name}"
    else:
        fs, root = fsspec.filesystem("file"), str(tmp_path)
    st = Storage(fs, root, background_deletes=False)
    path = f"job-0/{WRITER_STATE}"
    st.publish(path, b"{}")
    st.write_metadata("job-0/kept", b"{}")
    assert st.files_under("job-0") == {path, "job-0/kept"}
    st.arm(StorageOp.DELETE)
    for _ in range(2):
        st.unpublish(path)
        assert st.files_under("job-0") == {"job-0/kept"}
    assert st.armed == [StorageOp.DELETE]
