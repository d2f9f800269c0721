"""``ckpt audit --delete-orphans``: every guard of issue 6 has a test here.

Bases are written by fastimpl from a corpus case, then given old stray files (the orphans
to delete). Most tests use the single-process engine (the guards do not depend on the
engine); one runs the whole command on Spark, one deletes on S3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fastimpl.metadata import encode
from pipeline import deletion
from pipeline.deletion import DeletionRefused, execute, plan_deletion
from pipeline.location import Location
from pipeline.result import ORPHAN, REFERENCED
from pipeline.single import audit_single
from spec.config import Scope, StateKind
from spec.handles import SegmentHandle, StateEntry
from spec.ids import SubtaskId
from tests.audit_fixtures import (
    CASE,
    DAY,
    HOUR,
    Built,
    base_with_strays,
    build,
    old,
    run,
    snapshot,
)
from tests.lockstep import S3_BUCKET, s3


def referenced(b: Built) -> set[str]:
    return {f["path"] for f in audit_single(b.loc, grace=HOUR)["files"]
            if f["status"] == REFERENCED}


def test_nothing_is_deleted_unless_asked(tmp_path: Path) -> None:
    b, _strays = base_with_strays(tmp_path)
    before = snapshot(b)
    r = run(str(tmp_path / "root" / b.job_dir), "--engine", "single", "-q")
    assert r.exit_code == 0, r.output
    assert "3 orphan file(s)" in r.output
    assert snapshot(b) == before


def test_dry_run_prints_exactly_what_a_real_run_then_deletes(tmp_path: Path) -> None:
    b, strays = base_with_strays(tmp_path)
    base = str(tmp_path / "root" / b.job_dir)
    before = snapshot(b)
    dry = run(base, "--engine", "single", "-q", "--delete-orphans", "--dry-run")
    assert dry.exit_code == 0, dry.output
    would = {line.split()[2] for line in dry.output.splitlines()
             if line.startswith("would delete ")}
    assert would == {b.loc.full(s) for s in strays}
    assert snapshot(b) == before, "a dry run deleted something"
    log = tmp_path / "deletions.jsonl"
    real = run(base, "--engine", "single", "-q", "--delete-orphans", "--log", str(log))
    assert real.exit_code == 0, real.output
    gone = set(before) - set(snapshot(b))
    assert {b.loc.full(p) for p in gone} == would
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[0]["event"] == "plan" and events[0]["files"] == 3
    planned = [e["path"] for e in events if e["event"] == "will-delete"]
    done = [e["path"] for e in events if e["event"] == "deleted"]
    assert set(planned) == set(done) == strays
    # the log names everything before the first delete is recorded
    assert max(i for i, e in enumerate(events) if e["event"] == "will-delete") < min(
        i for i, e in enumerate(events) if e["event"] == "deleted")
    after = audit_single(b.loc, grace=HOUR).summary
    assert after.orphans == 0 and after.dangling == 0


def test_the_log_is_complete_before_the_first_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, strays = base_with_strays(tmp_path)
    before = snapshot(b)
    log = tmp_path / "deletions.jsonl"

    def crash(loc: Location, plan: Any, wal: Any, rate: float = 0) -> Any:
        text = log.read_text()
        assert all(p in text for p in strays), "deleting before the log names every file"
        raise KeyboardInterrupt  # the process dies at the first delete

    monkeypatch.setattr(deletion, "_delete", crash)
    summary = audit_single(b.loc, grace=DAY)
    plan = plan_deletion(b.loc, summary.summary, summary["orphans"], grace=DAY)
    with pytest.raises(KeyboardInterrupt):
        execute(b.loc, plan, str(log))
    assert snapshot(b) == before
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert {e["path"] for e in events if e["event"] == "will-delete"} == strays


def test_young_files_and_referenced_files_are_never_deleted(tmp_path: Path) -> None:
    b, _strays = base_with_strays(tmp_path)
    young = tmp_path / "root" / b.job_dir / "shared" / "half-written.part"
    young.write_bytes(b"h")
    keep = referenced(b)
    r = run(str(tmp_path / "root" / b.job_dir), "--engine", "single", "-q",
            "--delete-orphans", "--log", str(tmp_path / "log"))
    assert r.exit_code == 0, r.output
    assert young.exists()
    assert referenced(b) == keep
    assert all(Path(b.loc.full(p)).exists() for p in keep)


def test_a_grace_period_under_an_hour_needs_its_own_flags(tmp_path: Path) -> None:
    """One flag per danger: --allow-short-grace for the grace; on a base whose writer
    publishes no state, --no-live-writer too (only age would protect a live writer);
    there is no catch-all: --force is a usage error (exit 2) and deletes nothing."""
    b, strays = base_with_strays(tmp_path)
    before = snapshot(b)
    base = str(tmp_path / "root" / b.job_dir)
    r = run(base, "--engine", "single", "-q", "--delete-orphans", "--grace", "30m")
    assert r.exit_code == 3
    assert "under one hour" in r.output and "--allow-short-grace" in r.output
    assert snapshot(b) == before
    r = run(base, "--engine", "single", "-q", "--delete-orphans", "--grace", "30m",
            "--allow-short-grace")
    assert r.exit_code == 3 and "--no-live-writer" in r.output, r.output
    assert snapshot(b) == before
    assert run(base, "--engine", "single", "-q", "--delete-orphans", "--grace", "30m",
               "--force").exit_code == 2
    assert snapshot(b) == before
    r = run(base, "--engine", "single", "-q", "--delete-orphans", "--grace", "30m",
            "--allow-short-grace", "--no-live-writer", "--log", str(tmp_path / "log"))
    assert r.exit_code == 0, r.output
    assert not any(Path(b.loc.full(s)).exists() for s in strays)


def test_unreadable_metadata_refuses_the_deletion(tmp_path: Path) -> None:
    b, _strays = base_with_strays(tmp_path)
    old(tmp_path / "root" / b.job_dir / "chk-9997" / "_metadata", b'{"format": "ckpt-ow')
    before = snapshot(b)
    r = run(str(tmp_path / "root" / b.job_dir), "--engine", "single", "-q", "--delete-orphans")
    assert r.exit_code == 3
    assert "cannot be read" in r.output
    assert snapshot(b) == before


def _foreign_reference(root: Path, job: str, target: str, *, savepoint: bool) -> Path:
    """Another job's checkpoint (or a savepoint) that references ``target`` in our base."""
    sub = SubtaskId("v", 0, 1)
    size = (root / target).stat().st_size
    entry = StateEntry(sub, StateKind.KEYED_SHARED, "s",
                       SegmentHandle(target, 0, size, "u", Scope.SHARED), 1, (0, 127))
    where = root / ("savepoints/savepoint-7" if savepoint else "job-next/chk-1")
    where.mkdir(parents=True)
    cp = 7 if savepoint else 1
    (where / "_metadata").write_bytes(encode(cp, "job-next", savepoint, (entry,), ()))
    return where / "_metadata"


@pytest.mark.parametrize("savepoint", [False, True], ids=["restored-job", "savepoint"])
def test_a_restore_source_or_savepoint_reference_refuses_the_deletion(
    tmp_path: Path, savepoint: bool
) -> None:
    """Another job restored from this base (NO_CLAIM: the files are the user's), or a
    savepoint refers into it: nothing here is deleted, and the file it names is not
    even an orphan."""
    b, strays = base_with_strays(tmp_path)
    root = tmp_path / "root"
    target = sorted(strays)[0]
    _foreign_reference(root, b.job_dir, target, savepoint=savepoint)
    t = audit_single(b.loc, grace=HOUR)
    assert target not in {o["path"] for o in t["orphans"]}
    assert t.summary.restore_source_of
    before = snapshot(b)
    r = run(str(root / b.job_dir), "--engine", "single", "-q", "--delete-orphans")
    assert r.exit_code == 3
    assert "restore source" in r.output
    assert snapshot(b) == before


def test_the_savepoint_directory_itself_is_refused(tmp_path: Path) -> None:
    sp = old(tmp_path / "root" / "savepoints" / "savepoint-3" / "data")
    r = run(str(tmp_path / "root" / "savepoints"), "--engine", "single", "-q",
            "--delete-orphans")
    assert r.exit_code == 3
    assert "savepoint" in r.output
    assert sp.exists()


def test_nothing_outside_the_base_is_deleted(tmp_path: Path) -> None:
    b, strays = base_with_strays(tmp_path)
    outside = tmp_path / "elsewhere"
    victims = [old(outside / "precious"), old(outside / "dir" / "more")]
    link_dir = tmp_path / "root" / b.job_dir / "shared" / "linked-dir"
    link_dir.symlink_to(outside / "dir", target_is_directory=True)
    link_file = tmp_path / "root" / b.job_dir / "shared" / "linked-file"
    link_file.symlink_to(outside / "precious")
    os.utime(link_file, (time.time() - 3 * DAY,) * 2, follow_symlinks=False)
    summary = audit_single(b.loc, grace=HOUR)
    rows = [*summary["orphans"], {"path": "job-other/shared/x", "size": 1, "mtime": 0.0},
            {"path": f"{b.job_dir}/../elsewhere/precious", "size": 1, "mtime": 0.0}]
    plan = plan_deletion(b.loc, summary.summary, rows, grace=HOUR)
    kept = dict(plan.kept)
    assert kept["job-other/shared/x"] == "outside the job base"
    assert kept[f"{b.job_dir}/../elsewhere/precious"] == "not a normalised relative path"
    assert kept[f"{b.job_dir}/shared/linked-file"] == "a symbolic link"
    assert {c.path for c in plan.delete} == strays
    execute(b.loc, plan, str(tmp_path / "log"))
    assert all(v.exists() for v in victims)
    assert link_file.is_symlink() and link_dir.is_symlink()


def test_a_file_referenced_or_touched_since_the_audit_is_kept(tmp_path: Path) -> None:
    b, strays = base_with_strays(tmp_path)
    root = tmp_path / "root"
    t = audit_single(b.loc, grace=HOUR)
    first, second, third = sorted(strays)
    # After the audit, a checkpoint completes that references the first stray ...
    sub = SubtaskId("v", 0, 1)
    entry = StateEntry(sub, StateKind.KEYED_SHARED, "s",
                       SegmentHandle(first, 0, 64, "u", Scope.SHARED), 1, (0, 127))
    meta = root / b.job_dir / "chk-9000" / "_metadata"
    meta.parent.mkdir()
    meta.write_bytes(encode(9000, b.job_dir, False, (entry,), ()))
    # ... and a writer appends to the second.
    with open(root / second, "ab") as f:
        f.write(b"more")
    plan = plan_deletion(b.loc, t.summary, t["orphans"], grace=HOUR)
    kept = dict(plan.kept)
    assert kept[first] == "referenced by a _metadata read just now"
    outcomes = {p: o for p, o, _w in plan.outcomes}
    assert outcomes == {first: deletion.KEEP_ACTIVE, second: deletion.DEFER,
                        third: deletion.DELETE}
    assert "floor" in kept[second] or "grace" in kept[second]
    assert [c.path for c in plan.delete] == [third]


def test_no_flag_deletes_in_a_base_without_checkpoints_or_layout(tmp_path: Path) -> None:
    """An empty reference set (no readable checkpoint) never means "nothing is
    referenced", and a directory without the layout is not a base: refused, and no
    flag lifts either."""
    job = tmp_path / "root" / "job-x"
    stray = old(job / "shared" / "v-0-1" / "f")
    for flags in ([], ["--grace", "0s", "--allow-short-grace", "--no-live-writer"]):
        r = run(str(job), "--engine", "single", "-q", "--delete-orphans", *flags)
        assert r.exit_code == 3 and "empty" in r.output, r.output
    assert stray.exists()
    home = tmp_path / "root" / "not-a-base"
    precious = old(home / "notes.txt")
    for flags in ([], ["--grace", "0s", "--allow-short-grace", "--no-live-writer"]):
        r = run(str(home), "--engine", "single", "-q", "--delete-orphans", *flags)
        assert r.exit_code == 3 and "not a checkpoint base" in r.output, r.output
    with pytest.raises(DeletionRefused, match="not a checkpoint base"):
        loc = Location.parse(str(home))
        t = audit_single(loc, grace=HOUR)
        plan_deletion(loc, t.summary, t["orphans"], grace=HOUR)
    assert precious.exists()


def test_a_dangling_reference_refuses_the_deletion(tmp_path: Path) -> None:
    """Issue 32, finding 7: a referenced file renamed to ``.bak`` is a dangling reference
    and an old orphan; the ``.bak`` holds the very bytes a repair needs. The audit pages
    and deletes nothing (exit 3), naming the reference. On Spark:
    ``test_spark_command_end_to_end_with_parquet_and_deletion``."""
    b, strays = base_with_strays(tmp_path)
    moved = sorted(referenced(b))[0]
    bak = Path(b.loc.full(moved + ".bak"))
    os.rename(b.loc.full(moved), bak)
    os.utime(bak, (time.time() - 3 * DAY,) * 2)
    before = snapshot(b)
    assert moved + ".bak" in {o["path"] for o in audit_single(b.loc, grace=HOUR)["orphans"]}
    r = run(b.loc.full(b.job_dir), "--engine", "single", "-q", "--delete-orphans",
            "--log", str(tmp_path / "log"))
    assert r.exit_code == 3, r.output
    assert "dangling reference(s)" in r.output and moved in r.output, r.output
    assert snapshot(b) == before
    assert bak.exists() and all(Path(b.loc.full(s)).exists() for s in strays)


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    assert run("memory://x/job", "--engine", "single").exit_code == 2
    assert run(str(tmp_path / "missing" / "job"), "--engine", "single").exit_code == 2
    assert run("/", "--engine", "single").exit_code == 2
    assert run(str(tmp_path), "--grace", "soon").exit_code == 2


@pytest.mark.spark  # starts Spark itself (tests/conftest.py: spark)
def test_spark_command_end_to_end_with_parquet_and_deletion(
    tmp_path: Path,
) -> None:
    from pipeline.session import spark_session

    spark = spark_session("local[2]")
    b, strays = base_with_strays(tmp_path)
    gone = sorted(referenced(b))[0]
    os.remove(b.loc.full(gone))
    out = tmp_path / "report"
    r = run(str(tmp_path / "root" / b.job_dir), "--master", "local[2]", "-q",
            "--out", str(out), "--delete-orphans", "--log", str(tmp_path / "log"))
    # The dangling reference pages, and refuses the deletion (issue 32, finding 7): the
    # orphans may be what a repair needs.
    assert r.exit_code == 3, r.output
    assert "DATA LOSS" in r.output
    assert "1 dangling reference(s)" in r.output and gone in r.output, r.output
    assert all(Path(b.loc.full(s)).exists() for s in strays)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["orphans"] == 3 and summary["dangling"] >= 1 and summary["at_risk"]
    dangling = spark.read.parquet(str(out / "dangling.parquet")).collect()
    assert {d.path for d in dangling} == {gone}
    files = spark.read.parquet(str(out / "files.parquet"))
    assert {f.path for f in files.where(files.status == ORPHAN).collect()} == strays


def test_orphans_are_deleted_on_s3_in_bulk(
    s3_endpoint: str, tmp_path: Path
) -> None:
    fs = s3(s3_endpoint)
    opts = {"key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": s3_endpoint}}
    b = build(CASE, fs, f"{S3_BUCKET}/delete", "s3://", opts)
    j = b.job_dir
    strays = {f"{j}/shared/stray.sst", f"{j}/chk-9999/incomplete"}
    for s in strays:
        fs.pipe_file(b.loc.full(s), b"x" * 10)
    later = time.time() + 10 * DAY  # S3 cannot backdate: move the clock instead
    t = audit_single(b.loc, grace=HOUR, now=later)
    keep = {f["path"] for f in t["files"] if f["status"] == REFERENCED}
    assert strays <= {o["path"] for o in t["orphans"]}
    # A checkpoint that completes after the audit and references a stray saves it: the
    # guard lists S3 again (no stale listing cache) and reads the new _metadata.
    saved = f"{j}/chk-9999/incomplete"
    entry = StateEntry(SubtaskId("v", 0, 1), StateKind.KEYED_SHARED, "s",
                       SegmentHandle(saved, 0, 10, "u", Scope.SHARED), 1, (0, 127))
    fs.pipe_file(b.loc.full(f"{j}/chk-9000/_metadata"),
                 encode(9000, j, False, (entry,), ()))
    plan = plan_deletion(b.loc, t.summary, t["orphans"], grace=HOUR, now=later)
    assert dict(plan.kept) == {saved: "referenced by a _metadata read just now"}
    outcome = deletion.execute(b.loc, plan, str(tmp_path / "log"))
    assert not outcome.failed
    after = audit_single(b.loc, grace=HOUR, now=later)
    assert after.summary.orphans == 0 and after.summary.dangling == 0
    assert {f["path"] for f in after["files"] if f["status"] == REFERENCED} == keep | {saved}


def test_a_path_inside_a_base_is_refused_whatever_the_flags(tmp_path: Path) -> None:
    """Issue 15, defect 1: a base given one level too deep (``BASE/shared``,
    ``BASE/chk-N``, ``BASE/shared/<subtask>``, ``BASE/taskowned/<tm>``) makes every live
    file look orphaned; it is refused, with every flag there is, even for a report."""
    b, _strays = base_with_strays(tmp_path)
    base = tmp_path / "root" / b.job_dir
    before = snapshot(b)
    chk = sorted(p.name for p in base.iterdir() if p.name.startswith("chk-"))[0]
    subtask = sorted(p.name for p in (base / "shared").iterdir() if p.is_dir())[0]
    inside = ["shared", chk, f"shared/{subtask}", "taskowned/tm-gone"]
    flags = ["--grace", "0s", "--allow-short-grace", "--no-live-writer",
             "--log", str(tmp_path / "log")]
    for sub in inside:
        for extra in ([], ["--delete-orphans", *flags]):
            r = run(str(base / sub), "--engine", "single", "-q", *extra)
            assert r.exit_code == 3, (sub, r.output)
            assert "inside the checkpoint base" in r.output
    assert snapshot(b) == before
    assert not (tmp_path / "log").exists()


def test_deletes_are_paced_one_file_at_a_time(tmp_path: Path) -> None:
    b, strays = base_with_strays(tmp_path)
    t = audit_single(b.loc, grace=DAY)
    plan = plan_deletion(b.loc, t.summary, t["orphans"], grace=DAY)
    assert {c.path for c in plan.delete} == strays
    start = time.monotonic()
    out = execute(b.loc, plan, str(tmp_path / "log"), rate=5)
    assert time.monotonic() - start >= (len(strays) - 1) / 5
    assert set(out.deleted) == strays and not out.failed
    events = [json.loads(x) for x in (tmp_path / "log").read_text().splitlines()]
    assert events[0]["outcomes"] == {"delete": 3, "keep-active": 0, "defer": 0,
                                     "skip-unknown": 0}


def test_a_path_inside_a_base_is_refused_on_s3(s3_endpoint: str) -> None:
    fs = s3(s3_endpoint)
    opts = {"key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": s3_endpoint}}
    b = build(CASE, fs, f"{S3_BUCKET}/inside", "s3://", opts)
    deletion.check_base(b.loc)  # the base itself is one
    for sub in ("shared", "taskowned"):
        loc = Location.parse(b.loc.uri(f"{b.job_dir}/{sub}"), opts)
        with pytest.raises(deletion.NotABase, match="inside the checkpoint base"):
            deletion.check_base(loc, layout=False)


# --------------------------------------------------------------------------- the log
# Issue 32, finding 4: a write-ahead log. Each run has an id; each delete's intent is
# synced before it and its result appended after it; every outcome is logged, even when
# nothing is deleted; one deletion run per base at a time.


def _many_strays(b: Built, n: int) -> set[str]:
    root = Path(b.loc.container)
    out = {f"{b.job_dir}/shared/src-9-9/o-{i:03d}" for i in range(n)}
    for rel in out:
        old(root / rel, b"o" * 10)
    return out


def _cli(base: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``ckpt audit --delete-orphans`` in a process of its own (to be killed)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen(
        [sys.executable, "-m", "ckpt", "audit", base, "--engine", "single", "-q",
         "--delete-orphans", "--log", str(log), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _wait_for(cond: Any, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 120
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}: {proc.stdout.read()!r}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"no {what} in 120 s"
        time.sleep(0.02)


def test_a_killed_run_leaves_the_exact_set_it_deleted(tmp_path: Path) -> None:
    """SIGKILL mid-deletion: every ``deleted`` result was deleted, at most one intent has
    no result, and the files gone are exactly those plus, perhaps, that one; the next
    run says whether it exists, and the log then gives the killed run's set exactly."""
    b, strays = base_with_strays(tmp_path)
    many = _many_strays(b, 40) | strays
    base = b.loc.full(b.job_dir)
    log = tmp_path / "deletions.jsonl"
    proc = _cli(base, log, "--max-deletes-per-second", "20")
    _wait_for(lambda: sum(e["event"] == "plan" for e in _events(log)) == 1, proc, "plan")
    time.sleep(0.7)  # about 14 deletes in
    proc.kill()
    proc.wait()
    gone = {p for p in many if not Path(b.loc.full(p)).exists()}
    assert 0 < len(gone) < len(many)
    events = _events(log)
    runs = {e.get("run") for e in events}
    assert len(runs) == 1, runs
    done = {e["path"] for e in events
            if e["event"] in ("deleted", "gone", "failed", "skip-unknown")}
    recorded = {e["path"] for e in events if e["event"] == "deleted"}
    open_intents = {e["path"] for e in events if e["event"] == "intent"} - done
    assert len(open_intents) <= 1
    assert recorded <= gone <= recorded | open_intents
    # The next run resolves the open intent and deletes the rest.
    from pipeline import deletion_log

    r = run(base, "--engine", "single", "-q", "--delete-orphans", "--log", str(log),
            "--max-deletes-per-second", "0")
    assert r.exit_code == 0, r.output
    (killed,) = runs
    assert deletion_log.deleted_by(str(log))[str(killed)] == gone
    assert deletion_log.unfinished(str(log), b.loc.uri()) == []
    for p in open_intents:
        assert f"was stopped while deleting {b.loc.uri(p)}" in r.output
    assert not any(Path(b.loc.full(p)).exists() for p in many)


def test_every_outcome_is_logged_even_when_nothing_is_deleted(tmp_path: Path) -> None:
    """A run whose orphans are all kept (within the hard floor, a link) still writes its
    plan and every outcome, under its run id."""
    b, strays = base_with_strays(tmp_path)
    for s in strays:
        os.utime(b.loc.full(s))  # orphans at grace 0, deferred by the 60 s floor
    link = Path(b.loc.full(f"{b.job_dir}/shared/a-link"))
    link.symlink_to(tmp_path / "nowhere")
    os.utime(link, (time.time() - 3 * DAY,) * 2, follow_symlinks=False)
    log = tmp_path / "deletions.jsonl"
    r = run(b.loc.full(b.job_dir), "--engine", "single", "-q", "--delete-orphans",
            "--log", str(log), "--grace", "0s", "--allow-short-grace", "--no-live-writer")
    assert r.exit_code == 0, r.output
    events = _events(log)
    assert events and events[0]["event"] == "plan" and events[0]["files"] == 0
    assert len({e["run"] for e in events}) == 1
    logged = {e["path"]: e["outcome"] for e in events if e["event"] == "outcome"}
    assert logged == {**{s: deletion.DEFER for s in strays},
                      f"{b.job_dir}/shared/a-link": deletion.SKIP_UNKNOWN}
    assert all(Path(b.loc.full(s)).exists() for s in strays)


def test_one_deletion_run_per_base_at_a_time(tmp_path: Path) -> None:
    """A second ``--delete-orphans`` on a base while one runs (another log, even) is
    refused with exit 3, naming the holder; the first deletes every file once."""
    b, strays = base_with_strays(tmp_path)
    many = _many_strays(b, 30) | strays
    base = b.loc.full(b.job_dir)
    first_log = tmp_path / "first.jsonl"
    proc = _cli(base, first_log, "--max-deletes-per-second", "10")
    _wait_for(lambda: any(e["event"] == "plan" for e in _events(first_log)), proc, "plan")
    before = snapshot(b)
    second_log = tmp_path / "second.jsonl"
    r = run(base, "--engine", "single", "-q", "--delete-orphans", "--log", str(second_log),
            "--max-deletes-per-second", "0")
    assert r.exit_code == 3, r.output
    flat = "".join(r.output.split())  # the terminal's width wraps the line anywhere
    assert "anotherdeletionrunholds" in flat and f"pid{proc.pid}," in flat, r.output
    assert not second_log.exists()
    assert set(before) - set(snapshot(b)) <= many  # only the first run deleted
    assert proc.wait(timeout=120) == 0
    events = _events(first_log)
    deleted = [e["path"] for e in events if e["event"] == "deleted"]
    assert sorted(deleted) == sorted(many)
    assert len({e["run"] for e in events}) == 1
