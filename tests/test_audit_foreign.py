"""``ckpt audit`` on checkpoint directories real Flink and Spark wrote (issue 33).

Each fixture under ``tests/fixtures/{flink,spark}/<scenario>/`` is a directory the engine
left (``ckpt/``) and the ground truth its own code gave when the fixture was made
(``truth.json``: Flink's ``Checkpoints.loadCheckpointMetadata``, Spark's
``RocksDBFileManager``; run by the regeneration scripts, ``make fixtures-flink`` and
``make fixtures-spark``, never by these tests). The audit reads the files with no JVM and
must match that truth exactly: every referenced file, every orphan, every dangling
reference; and ``--delete-orphans --dry-run`` must name exactly the orphans.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpt.cli import app
from pipeline.foreign import PathMap
from pipeline.location import Location
from pipeline.result import IN_FLIGHT, METADATA, ORPHAN, REFERENCED, STALE

FIXTURES = Path(__file__).parent / "fixtures"
DAY = 86400.0
HOUR = 3600.0


def _scenarios(engine: str) -> list[Path]:
    return sorted(p.parent for p in (FIXTURES / engine).glob("*/truth.json"))


@pytest.mark.parametrize("engine", ["flink", "spark"])
def test_the_engines_fixtures_are_there(engine: str) -> None:
    assert _scenarios(engine), f"no {engine} fixture under {FIXTURES / engine}: committed"


def _truth(fixture: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((fixture / "truth.json").read_text())
    return doc


def _copy(fixture: Path, tmp: Path, *, age: float = 3 * DAY) -> Path:
    """The fixture's ``ckpt/`` copied and aged (a checkout gives every file the time of
    the checkout; the grace period and the hard floor would hold them all). Where the
    truth recorded each file's time (Spark's maintenance compares them), the times are
    put back, shifted so the newest is ``age`` old."""
    top = tmp / "root" / "ckpt"
    shutil.copytree(fixture / "ckpt", top, symlinks=True)
    t = time.time() - age
    for p in [top, *top.rglob("*")]:
        os.utime(p, (t, t), follow_symlinks=False)
    recorded = {f["path"]: f["mtime_ms"] / 1000 for f in _truth(fixture)["files"]
                if "mtime_ms" in f}
    if recorded:
        shift = t - max(recorded.values())
        for rel, m in recorded.items():
            os.utime(top / rel, (m + shift, m + shift), follow_symlinks=False)
    return top


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, ["audit", *args], catch_exceptions=False)


def _statuses(summary_files: list[dict[str, Any]], top: Path) -> dict[str, str]:
    cut = len(top.name) + 1
    return {str(f["path"])[cut:]: str(f["status"]) for f in summary_files}


# --------------------------------------------------------------------------- Flink


def _flink_expected(truth: dict[str, Any]) -> tuple[set[str], set[str], set[str], set[str]]:
    """(files, referenced and present, orphans, dangling) by Flink's own loader: every
    file not referenced by any retained checkpoint and not a ``_metadata`` is leaked."""
    files = {f["path"] for f in truth["files"]}
    metadata = {c["metadata"] for c in truth["checkpoints"]}
    referenced = set(truth["referenced"])
    dangling = set(truth["dangling"])
    return files, referenced & files, files - referenced - metadata, dangling


@pytest.mark.parametrize("fixture", _scenarios("flink"), ids=lambda p: p.name)
def test_the_flink_audit_matches_flinks_own_loader(fixture: Path, tmp_path: Path) -> None:
    from pipeline.foreign_cli import ForeignRun, read, tables

    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    loc = Location.parse(str(top))
    run = ForeignRun(fmt="flink", engine="single", master=None, grace=0.0,
                     path_map=[f"{truth['root']}={top}"], savepoints=[], retain=0,
                     delete=False, dry_run=False, log=None, json_out=None, out=None,
                     limit=20, quiet=True, allow_short_grace=False, no_live_writer=False,
                     rate=0.0)
    got, _marker = read(loc, run, time.time())
    result = tables(loc, got, run, time.time())
    status = _statuses(result["files"], top)
    files, referenced, orphans, dangling = _flink_expected(truth)
    assert set(status) == files
    assert {p for p, s in status.items() if s == REFERENCED} == referenced
    assert {p for p, s in status.items() if s == ORPHAN} == orphans
    assert {p for p, s in status.items() if s == METADATA} == files - referenced - orphans
    cut = len(top.name) + 1
    assert {str(d["path"])[cut:] for d in result["dangling"]} == dangling
    assert result.summary.checkpoints == len(truth["checkpoints"])


@pytest.mark.parametrize("fixture", _scenarios("flink"), ids=lambda p: p.name)
def test_a_flink_dry_run_names_exactly_the_leaked_files(fixture: Path, tmp_path: Path) -> None:
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    _files, _referenced, orphans, dangling = _flink_expected(truth)
    before = {p: p.read_bytes() for p in top.rglob("*") if p.is_file()}
    r = _run(str(top), "--engine", "single", "-q", "--path-map", f"{truth['root']}={top}",
             "--grace", "0s", "--delete-orphans", "--dry-run", "--allow-short-grace",
             "--no-live-writer")
    out = r.output
    assert f"recognised: {top} is a Flink checkpoint directory" in " ".join(out.split()) \
        or "Flink" in out
    if dangling:
        assert r.exit_code == 3 and "deletion refused" in out, out
        return
    would = {line.split(" ", 2)[2].rsplit(" (", 1)[0][len(str(top)) + 1:]
             for line in out.splitlines() if line.startswith("would delete ")}
    assert would == orphans, out
    assert r.exit_code == 0, out
    assert {p: p.read_bytes() for p in top.rglob("*") if p.is_file()} == before


def test_a_moved_flink_checkpoint_is_refused_naming_the_path_map(tmp_path: Path) -> None:
    fixture = _scenarios("flink")[0]
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    r = _run(str(top), "--engine", "single", "-q")
    out = " ".join(r.output.split())
    assert r.exit_code == 2, out
    assert f"--path-map {truth['root'].removeprefix('file:')}=" in out \
        or f"--path-map {truth['root']}=" in out, out
    assert "orphan" not in out.lower(), out


def test_a_flink_checkpoint_in_flight_holds_the_jobs_newer_files(tmp_path: Path) -> None:
    """Flink publishes no writer state: a chk-N above the latest completed one, active
    within the grace period, holds its files and every file of its job written since it
    started, even older than the grace period; a file from before it is an orphan."""
    fixture = _scenarios("flink")[0]
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    job = sorted({c["metadata"].split("/")[0] for c in truth["checkpoints"]})[0]
    latest = max(c["checkpoint_id"] for c in truth["checkpoints"]
                 if c["metadata"].startswith(job + "/"))
    now = time.time()
    flight = top / job / f"chk-{latest + 1}"
    flight.mkdir()
    (flight / "private-state").write_bytes(b"p" * 100)
    since = top / job / "shared" / "written-since"
    before = top / job / "shared" / "written-before"
    since.write_bytes(b"s" * 100)
    before.write_bytes(b"b" * 100)
    os.utime(flight / "private-state", (now - 300, now - 300))
    os.utime(since, (now - 1200, now - 1200))
    os.utime(before, (now - 2400, now - 2400))
    os.utime(flight, (now - 1800, now - 1800))
    r = _run(str(top), "--engine", "single", "-q", "--path-map", f"{truth['root']}={top}",
             "--grace", "10m", "--out", str(tmp_path / "out"))
    rows = [json.loads(x) for x in (tmp_path / "out" / "files.jsonl").read_text().splitlines()]
    status = _statuses(rows, top)
    assert status[f"{job}/chk-{latest + 1}/private-state"] == IN_FLIGHT, r.output
    assert status[f"{job}/shared/written-since"] == IN_FLIGHT, r.output
    assert status[f"{job}/shared/written-before"] == ORPHAN, r.output
    assert "in flight" in r.output and "publishes no writer state" in " ".join(r.output.split())


@pytest.mark.spark  # starts Spark itself (tests/conftest.py: spark)
@pytest.mark.parametrize("fmt", ["flink", "spark"])
def test_the_audit_on_spark_equals_the_single_process_one(fmt: str, tmp_path: Path) -> None:
    """The reader's rows through the DataFrame audit and through the one-process audit:
    the same tables, on the largest fixture of each engine."""
    from pipeline.foreign_cli import ForeignRun, read, tables

    fixture = max(_scenarios(fmt), key=lambda p: len(_truth(p)["files"]))
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    loc = Location.parse(str(top))
    now = time.time()
    runs = {}
    for engine in ("single", "spark"):
        run = ForeignRun(fmt=fmt, engine=engine, master="local[2]", grace=HOUR,
                         path_map=[f"{truth['root']}={top}"] if fmt == "flink" else [],
                         savepoints=[], retain=int(truth.get("retain", 1)),
                         delete=False, dry_run=False, log=None, json_out=None, out=None,
                         limit=20, quiet=True, allow_short_grace=False,
                         no_live_writer=False, rate=0.0)
        got, _m = read(loc, run, now)
        runs[engine] = tables(loc, got, run, now)
    for name in ("files", "orphans", "dangling", "owners", "checkpoints"):
        key = sorted(runs["single"][name][0]) if runs["single"][name] else []
        one = sorted(json.dumps({k: r[k] for k in key}, sort_keys=True, default=str)
                     for r in runs["single"][name])
        two = sorted(json.dumps({k: r[k] for k in key}, sort_keys=True, default=str)
                     for r in runs["spark"][name])
        assert one == two, name
    a, b = runs["single"].summary, runs["spark"].summary
    assert (a.orphans, a.referenced_files, a.dangling, a.checkpoints, a.in_flight) == (
        b.orphans, b.referenced_files, b.dangling, b.checkpoints, b.in_flight)


def test_path_map_matches_at_a_path_boundary_longest_first() -> None:
    m = PathMap.parse(["file:/a=/x", "file:/a/b=/y"])
    assert m.apply("file:/a/b/c") == "/y/c"
    assert m.apply("file:/a/bc") == "/x/bc"
    assert m.apply("file:/ab") == "file:/ab"


# --------------------------------------------------------------------------- Spark


@pytest.mark.parametrize("fixture", _scenarios("spark"), ids=lambda p: p.name)
def test_the_spark_audit_matches_sparks_own_file_manager(fixture: Path, tmp_path: Path) -> None:
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    r = _run(str(top), "--engine", "single", "-q", "--grace", "0s",
             "--retain", str(truth["retain"]), "--out", str(tmp_path / "out"))
    rows = [json.loads(x) for x in (tmp_path / "out" / "files.jsonl").read_text().splitlines()]
    status = _statuses(rows, top)
    assert set(status) == {f["path"] for f in truth["files"]}, r.output
    assert {p for p, s in status.items() if s == REFERENCED} == set(truth["needed"]) - set(
        truth["dangling"]), r.output
    assert {p for p, s in status.items() if s == STALE} == set(truth["stale"]), r.output
    assert {p for p, s in status.items() if s == ORPHAN} == set(truth["orphans"]), r.output
    dangling = [json.loads(x) for x in
                (tmp_path / "out" / "dangling.jsonl").read_text().splitlines()]
    cut = len(top.name) + 1
    assert {str(d["path"])[cut:] for d in dangling} == set(truth["dangling"]), r.output
    assert r.exit_code == (1 if truth["dangling"] else 0), r.output


@pytest.mark.parametrize("fixture", _scenarios("spark"), ids=lambda p: p.name)
def test_a_spark_dry_run_names_exactly_the_leaked_files(fixture: Path, tmp_path: Path) -> None:
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    r = _run(str(top), "--engine", "single", "-q", "--grace", "0s", "--retain",
             str(truth["retain"]), "--delete-orphans", "--dry-run", "--allow-short-grace",
             "--no-live-writer")
    out = r.output
    if truth["dangling"]:
        assert r.exit_code == 3 and "deletion refused" in out, out
        return
    would = {line.split(" ", 2)[2].rsplit(" (", 1)[0][len(str(top)) + 1:]
             for line in out.splitlines() if line.startswith("would delete ")}
    assert would == set(truth["orphans"]), out
    assert r.exit_code == 0, out


def test_a_needed_spark_file_removed_is_dangling_and_refuses_deletion(tmp_path: Path) -> None:
    fixture = _scenarios("spark")[0]
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    victim = sorted(p for p in truth["needed"] if p.endswith(".sst"))
    assert victim, "the fixture has no needed SST"
    (top / victim[0]).unlink()
    r = _run(str(top), "--engine", "single", "-q", "--retain", str(truth["retain"]),
             "--delete-orphans", "--dry-run")
    out = " ".join(r.output.split())
    assert r.exit_code == 3, out
    assert "dangling" in out and "deletion refused" in out, out


# --------------------------------------------------------------------------- on S3


def _leakiest(engine: str) -> Path:
    """The fixture with the most leaked files and no dangling reference (a deletion runs)."""
    def key(p: Path) -> tuple[bool, int]:
        t = _truth(p)
        leaked = (_flink_expected(t)[2] if engine == "flink" else set(t["orphans"]))
        return (not t["dangling"], len(leaked))

    return max(_scenarios(engine), key=key)


@pytest.mark.parametrize("engine", ["flink", "spark"])
def test_a_checkpoint_directory_on_s3_is_audited_and_its_leaks_deleted_exactly(
    engine: str, s3_endpoint: str, tmp_path: Path
) -> None:
    """The same directory uploaded to S3 (moto): Flink's paths mapped to it at read time,
    the same statuses as on a disk, and a deletion that removes exactly the leaked files.
    S3 cannot backdate an object: the audit's clock moves ten days ahead instead."""
    from pipeline import deletion
    from pipeline.foreign_cli import ForeignRun, read, tables
    from pipeline.foreign_deletion import plan_foreign
    from tests.lockstep import S3_BUCKET, s3

    fixture = _leakiest(engine)
    truth = _truth(fixture)
    fs = s3(s3_endpoint)
    container = f"{S3_BUCKET}/{engine}-{fixture.name}"
    for p in sorted((fixture / "ckpt").rglob("*")):
        if p.is_file():
            fs.pipe(f"{container}/ckpt/{p.relative_to(fixture / 'ckpt')}", p.read_bytes())
    opts = {"key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": s3_endpoint}}
    loc = Location.parse(f"s3://{container}/ckpt", opts)
    now = time.time() + 10 * DAY
    run = ForeignRun(fmt=engine, engine="single", master=None, grace=HOUR,
                     path_map=[f"{truth['root']}=s3://{container}/ckpt"] if engine == "flink"
                     else [], savepoints=[], retain=int(truth.get("retain", 0)),
                     delete=True, dry_run=False, log=None, json_out=None, out=None,
                     limit=20, quiet=True, allow_short_grace=False, no_live_writer=False,
                     rate=0.0)
    got, marker = read(loc, run, now)
    result = tables(loc, got, run, now)
    status = _statuses(result["files"], Path("ckpt"))
    leaked = _flink_expected(truth)[2] if engine == "flink" else set(truth["orphans"])
    assert leaked, f"{fixture.name} leaks nothing: the deletion would prove nothing"
    assert {p for p, s in status.items() if s == ORPHAN} == leaked
    assert set(status) == {f["path"] for f in truth["files"]}
    plan = plan_foreign(loc, result.summary, result["orphans"], grace=HOUR,
                        reread=lambda: read(loc, run, now), marker=marker, now=now,
                        dangling=result["dangling"])
    assert {c.path[len("ckpt/"):] for c in plan.delete} == leaked
    done = deletion.execute(loc, plan, str(tmp_path / "log.jsonl"), rate=0)
    assert not done.failed and not done.skipped
    left = {k[len(container) + len("/ckpt/"):] for k in fs.find(f"{container}/ckpt")}
    assert left == {f["path"] for f in truth["files"]} - leaked


# --------------------------------------------------------------------------- re-read


def _plan(fmt: str, top: Path, truth: dict[str, Any], change: Any) -> Any:
    """Audit ``top`` (aged), apply ``change`` to the directory, then plan the deletion:
    the plan re-reads the directory with the same reader."""
    from pipeline.foreign_cli import ForeignRun, read, tables
    from pipeline.foreign_deletion import plan_foreign

    loc = Location.parse(str(top))
    run = ForeignRun(fmt=fmt, engine="single", master=None, grace=HOUR,
                     path_map=[f"{truth['root']}={top}"] if fmt == "flink" else [],
                     savepoints=[], retain=int(truth.get("retain", 1)), delete=True,
                     dry_run=False, log=None, json_out=None, out=None, limit=20, quiet=True,
                     allow_short_grace=False, no_live_writer=False, rate=0.0)
    now = time.time()
    got, marker = read(loc, run, now)
    result = tables(loc, got, run, now)
    assert result["orphans"], "the fixture leaks nothing"
    change()
    return plan_foreign(loc, result.summary, result["orphans"], grace=HOUR,
                        reread=lambda: read(loc, run, time.time()), marker=marker, now=now,
                        dangling=result["dangling"])


def test_a_spark_batch_committed_since_the_audit_refuses_the_deletion(tmp_path: Path) -> None:
    """Spark publishes no writer state: the commit log read again before deleting is the
    sign of a running query."""
    from pipeline.deletion import DeletionRefused

    fixture = _leakiest("spark")
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    last = max(int(p.name) for p in (top / "commits").iterdir() if p.name.isdigit())

    def commit() -> None:
        shutil.copy(top / "commits" / str(last), top / "commits" / str(last + 1))

    with pytest.raises(DeletionRefused, match="committed a batch since the audit"):
        _plan("spark", top, truth, commit)


def test_a_flink_checkpoint_gone_since_the_audit_refuses_the_deletion(tmp_path: Path) -> None:
    from pipeline.deletion import DeletionRefused

    fixture = _leakiest("flink")
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)

    def subsume() -> None:
        (top / truth["checkpoints"][0]["metadata"]).unlink()

    with pytest.raises(DeletionRefused, match="shrank"):
        _plan("flink", top, truth, subsume)


def test_one_flink_job_folder_is_audited_alone_and_says_what_it_cannot_see(
    tmp_path: Path,
) -> None:
    fixture = _leakiest("flink")
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    jobs = sorted({f["path"].split("/")[0] for f in truth["files"]})
    assert len(jobs) == 1, jobs
    r = _run(str(top / jobs[0]), "--engine", "single", "--path-map",
             f"{truth['root']}={top}", "--grace", "0s", "--out", str(tmp_path / "out"))
    out = " ".join(r.output.split())
    assert r.exit_code == (1 if truth["dangling"] else 0), out
    assert "recognised:" in out and "one job's folder was audited" in out, out
    rows = [json.loads(x) for x in (tmp_path / "out" / "files.jsonl").read_text().splitlines()]
    orphans = {str(f["path"]) for f in rows if f["status"] == ORPHAN}
    assert orphans == {f"{jobs[0]}/{p.split('/', 1)[1]}" for p in _flink_expected(truth)[2]}


def test_a_savepoint_given_is_read_and_counted_never_audited(tmp_path: Path) -> None:
    """``--savepoints``: the savepoint's references are read (Flink's loader's own, handle by
    handle) and counted; its files are the user's, never in the audited tables. The
    restored job's first checkpoint names the savepoint's SSTs it reuses by a path relative
    to its own directory, where they are not (Flink 2.3.0's loader resolves them there
    too): dangling, as the truth says, never an orphan."""
    fixture = FIXTURES / "flink" / "savepoint-restore-claim"
    truth = _truth(fixture)
    top = _copy(fixture, tmp_path)
    saved = tmp_path / "root" / "savepoints"
    shutil.copytree(fixture / "savepoints", saved)
    sp = truth["savepoint_checkpoints"][0]
    sp_dir = saved / sp["metadata"].split("/", 1)[1].rsplit("/", 1)[0]
    r = _run(str(top), "--engine", "single", "-q", "--grace", "0s",
             "--path-map", f"{truth['root']}={top}",
             "--path-map", f"{truth['savepoint_root']}={saved}",
             "--savepoints", str(sp_dir), "--out", str(tmp_path / "out"))
    out = " ".join(r.output.split())
    assert r.exit_code == 1, out  # the dangling references of chk-4
    rows = {name: [json.loads(x) for x in (tmp_path / "out" / f"{name}.jsonl")
                   .read_text().splitlines()]
            for name in ("files", "references", "checkpoints", "dangling")}
    assert {c["checkpoint_id"] for c in rows["checkpoints"] if c["savepoint"]} == {
        sp["checkpoint_id"]}
    assert not any(str(f["path"]).startswith("savepoints/") for f in rows["files"])
    from pipeline.flink_audit import read_flink

    got = read_flink(Location.parse(str(top)), path_map=PathMap.parse(
        [f"{truth['root']}={top}", f"{truth['savepoint_root']}={saved}"]),
        savepoints=[str(sp_dir)], grace=0.0, now=time.time())
    mine = sorted(str(r_[8]) for r_ in got.references
                  if r_[3] and r_[0].startswith("savepoints/") and r_[7] in ("file", "segment"))
    cut = len(truth["savepoint_root"])
    theirs = sorted("savepoints" + str(h["path"])[cut:] for h in sp["handles"]
                    if h["path"] and h["type"] in ("FileStateHandle", "RelativeFileStateHandle",
                                                   "SegmentFileStateHandle"))
    assert mine == theirs
    cut = len(top.name) + 1
    assert {str(d["path"])[cut:] for d in rows["dangling"]} == set(truth["dangling"])
    status = _statuses(rows["files"], top)
    assert {p for p, s in status.items() if s == ORPHAN} == _flink_expected(truth)[2]
