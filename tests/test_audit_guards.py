"""Issue 15: the guards that stop a whole collection (nothing deleted) when what the
audit knows about the references is incomplete:

* the reference set read just before deleting is smaller than the audit's (fewer
  readable checkpoints of the job: Paimon #7710, a shrunken list of used files is never
  "these are unused");
* the writer's published state (``_writer_state.json``) exists and cannot be read: a
  broken file, a wrong field, a FIFO, a link, a directory, over the size limit (an
  unreadable state never means "no writer");
* a checkpoint that a pending one may reuse from (its ``retained_at_trigger``) is gone:
  the pending one may name that checkpoint's files, which no ``_metadata`` names now;
* (issue 32) the writer state disagrees with the base: another job's, or its retained or
  latest completed checkpoints are not those on storage.

And the guard on the audit's own outputs (issue 32, findings 3 and 9): ``--log``,
``--json`` and ``--out`` never inside a checkpoint tree, and an output that cannot be
written is a usage error naming it, before anything is read.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fastimpl import CheckpointStore
from fastimpl.api import publish_state
from fastimpl.writer_state import FORMAT, WRITER_STATE
from pipeline import deletion, fence
from pipeline.deletion import DeletionRefused, plan_deletion
from pipeline.location import Location
from pipeline.single import audit_single
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from tests.audit_fixtures import DAY, Built, base_with_strays, old, run, snapshot

KS = StateKind.KEYED_SHARED


def test_a_shrunken_reference_set_refuses_the_deletion(tmp_path: Path) -> None:
    """The audit read three checkpoints; before the deletion one of them is no longer
    there (an unmounted volume, a partial listing, a mistaken move) while the others
    still read: the collection stops rather than judge by the smaller set."""
    b, strays = base_with_strays(tmp_path)
    t = audit_single(b.loc, grace=DAY)
    assert t.summary.checkpoints >= 2
    base = Path(b.loc.full(b.job_dir))
    newest = max(
        (p for p in base.iterdir() if p.name.startswith("chk-") and (p / "_metadata").exists()),
        key=lambda p: int(p.name[4:]),
    )
    shutil.move(newest, tmp_path / "elsewhere")
    before = snapshot(b)
    with pytest.raises(DeletionRefused, match="shrank"):
        plan_deletion(b.loc, t.summary, t["orphans"], grace=DAY)
    assert snapshot(b) == before
    assert all(Path(b.loc.full(s)).exists() for s in strays)


def _state(**over: object) -> bytes:
    doc: dict[str, object] = {
        "format": FORMAT,
        "version": 1,
        "seq": 1,
        "published_at": time.time(),
        "running": True,
        "pending": [],
        "open_files": [],
    }
    doc.update(over)
    return json.dumps(doc).encode()


def _plant_state(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "not-json":
        path.write_bytes(b'{"format": "ckpt-writer-st')
    elif kind == "wrong-type":
        path.write_bytes(_state(published_at="yesterday"))
    elif kind == "open-file-outside":
        path.write_bytes(_state(open_files=["other-job/shared/x"]))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        target = tmp_path / "elsewhere" / WRITER_STATE
        target.parent.mkdir()
        target.write_bytes(_state())  # a good state, but what a link says is not trusted
        path.symlink_to(target)
    elif kind == "directory":
        path.mkdir()
    elif kind == "oversized":
        with open(path, "wb") as f:
            f.truncate(fence.LIMIT + 1)  # sparse
    else:
        raise AssertionError(kind)


STATE_KINDS = [
    "not-json",
    "wrong-type",
    "open-file-outside",
    "fifo",
    "link",
    "directory",
    "oversized",
]


@pytest.mark.parametrize("kind", STATE_KINDS)
def test_an_unreadable_writer_state_refuses_the_deletion(tmp_path: Path, kind: str) -> None:
    """Read before listing (the CLI) and again before deleting (``plan_deletion``):
    either read refuses, at any grace, with every flag; nothing hangs on a FIFO."""
    b, strays = base_with_strays(tmp_path)
    _plant_state(kind, Path(b.loc.full(fence.state_path(b.loc))), tmp_path)
    t = audit_single(b.loc, grace=DAY)
    assert strays <= {o["path"] for o in t["orphans"]}
    before = snapshot(b)
    with pytest.raises(DeletionRefused, match="writer state is unreadable"):
        plan_deletion(b.loc, t.summary, t["orphans"], grace=DAY)
    for flags in ([], ["--grace", "0s", "--allow-short-grace", "--no-live-writer"]):
        r = run(
            b.loc.full(b.job_dir),
            "--engine",
            "single",
            "-q",
            "--delete-orphans",
            "--log",
            str(tmp_path / "log"),
            *flags,
        )
        assert r.exit_code == 3, r.output
        assert "refused" in r.output and WRITER_STATE in r.output, r.output
    assert snapshot(b) == before
    assert not (tmp_path / "log").exists()


def test_a_lost_pin_of_a_pending_checkpoint_stops_the_collection(tmp_path: Path) -> None:
    """chk-3 is triggered while chk-1 is retained and reuses chk-1's file; chk-2
    completes and subsumes chk-1 while chk-3 is pending. chk-1's file is now named by
    no ``_metadata``, and is older than the writer's fence: only the lost pin tells the
    audit it is not garbage. The collection stops (every orphan deferred); chk-3 then
    completes and restores."""
    job = JobSpec((VertexSpec("w", 1),), num_tms=1)
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    store = CheckpointStore(str(tmp_path / "root"), config, job)
    publish_state(store)
    co = store.coordinator
    ((sub, tm),) = store.placement().items()
    mgr = store.task_manager(tm)

    def done(cid: int) -> None:
        mgr.acknowledge(cid, sub)
        assert co.complete(cid) is not None
        store.deliver_notifications()

    c1 = co.trigger()
    mgr.write(c1, sub, KS, "sst-1", os.urandom(100))
    done(c1)
    c2 = co.trigger()
    mgr.write(c2, sub, KS, "sst-2", os.urandom(100))
    base = tmp_path / "root" / store.job_id
    long_ago = time.time() - 3 * DAY  # everything so far was written long before chk-3
    for p in base.rglob("*"):
        if p.is_file() and p.name != WRITER_STATE:
            os.utime(p, (long_ago, long_ago))
    stray = old(base / "shared" / "stray.sst")
    c3 = co.trigger()
    reused = mgr.reuse_shared(c3, sub, "sst-1")
    assert reused is not None
    mgr.write(c3, sub, KS, "sst-3", os.urandom(100))
    done(c2)  # subsumes chk-1: chk-3 is pending and pinned it
    store.flush()  # chk-1's _metadata is deleted in the background: gone before the audit
    assert [r.checkpoint for r in co.retained()] == [c2]
    loc = Location.parse(str(base))
    state = fence.read_state(loc)
    assert state is not None and c1 in state.pins
    kept = reused.handle.path  # type: ignore[union-attr]
    t = audit_single(loc, grace=DAY)
    assert kept in {o["path"] for o in t["orphans"]}
    plan = plan_deletion(loc, t.summary, t["orphans"], grace=DAY, state_before=state)
    outcomes = {p: (o, w) for p, o, w in plan.outcomes}
    assert plan.delete == ()
    stray_rel = f"{loc.job_dir}/shared/stray.sst"
    for rel in (kept, stray_rel):
        assert outcomes[rel][0] == deletion.DEFER and "are gone" in outcomes[rel][1], outcomes
    deletion.execute(loc, plan, str(tmp_path / "log"), rate=0)
    assert stray.exists()
    done(c3)
    after = audit_single(loc, grace=DAY)
    assert after.summary.dangling == 0, after["dangling"]
    assert mgr.restore(sub)
    store.close()


# --------------------------------------------------------------------------- outputs


def _tree_bytes(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _inside(b: Built, tmp_path: Path, where: str) -> str:
    """A path inside a checkpoint tree beside or in ``b``'s base."""
    root = tmp_path / "root"
    meta = sorted((root / b.job_dir).glob("chk-*/_metadata"))[0]
    link = tmp_path / "link-to-base"
    link.symlink_to(root / b.job_dir, target_is_directory=True)
    return {
        "retained-metadata": str(meta),
        "an-orphan": str(root / b.job_dir / "shared" / "stray.sst"),
        "new-file-in-base": str(root / b.job_dir / "report.json"),
        "sibling-base": str(old(root / "job-sibling" / "chk-1" / "_metadata").parent / "x"),
        "savepoints": str(root / "savepoints" / "savepoint-1" / "out"),
        "through-a-link": str(link / meta.parent.name / "_metadata"),
    }[where]


@pytest.mark.parametrize("option", ["--log", "--json", "--out"])
@pytest.mark.parametrize("where", ["retained-metadata", "an-orphan", "new-file-in-base",
                                   "sibling-base", "savepoints", "through-a-link"])
def test_an_output_inside_a_checkpoint_tree_is_refused_before_anything_is_read(
    tmp_path: Path, option: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, _strays = base_with_strays(tmp_path)
    target = _inside(b, tmp_path, where)
    before = _tree_bytes(tmp_path / "root")

    def no_listing(*_a: object, **_k: object) -> None:
        raise AssertionError("the base was read before the outputs were checked")

    monkeypatch.setattr("pipeline.scan.top_level", no_listing)
    r = run(str(tmp_path / "root" / b.job_dir), "--engine", "single", "-q",
            "--delete-orphans", "--grace", "1h", option, target)
    out = " ".join(r.output.split())
    assert r.exit_code == 2, out
    assert f"{option} " in out and "inside" in out, out
    assert _tree_bytes(tmp_path / "root") == before


def test_an_output_beside_the_bases_or_elsewhere_is_written(tmp_path: Path) -> None:
    """The guard is not a blanket refusal: a summary beside the job bases (a regular
    file, in no tree) and outputs outside the container are written."""
    b, strays = base_with_strays(tmp_path)
    beside = tmp_path / "root" / "summary.json"
    log = tmp_path / "logs" / "deletions.jsonl"
    log.parent.mkdir()
    r = run(str(tmp_path / "root" / b.job_dir), "--engine", "single", "-q",
            "--delete-orphans", "--json", str(beside), "--log", str(log),
            "--out", str(tmp_path / "details"))
    assert r.exit_code == 0, r.output
    assert json.loads(beside.read_text())["orphans"] == len(strays)
    assert (tmp_path / "details" / "files.jsonl").exists()
    assert any(json.loads(x)["event"] == "deleted" for x in log.read_text().splitlines())


@pytest.mark.parametrize("option", ["--log", "--json", "--out"])
@pytest.mark.parametrize("how", ["under-a-regular-file", "a-directory", "missing-folder"])
def test_an_unwritable_output_is_a_usage_error_naming_it(
    tmp_path: Path, option: str, how: str
) -> None:
    """Run as root, whom permissions do not stop: the outputs here fail for every user
    (a path below a regular file, a directory where a file is written, a folder that
    does not exist for the log). One line naming the option and path, exit 2, no
    traceback (``run`` lets exceptions through), nothing deleted."""
    if option == "--out" and how == "a-directory":
        pytest.skip("--out names a directory: a directory there is what it wants")
    if option != "--log" and how == "missing-folder":
        pytest.skip("--json and --out make their folder")
    b, _strays = base_with_strays(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    target = {
        "under-a-regular-file": blocker / "out",
        "a-directory": tmp_path,
        "missing-folder": tmp_path / "no-such-folder" / "log.jsonl",
    }[how]
    before = snapshot(b)
    r = run(str(tmp_path / "root" / b.job_dir), "--engine", "single", "-q",
            "--delete-orphans", option, str(target))
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert f"{option} {target} cannot be written" in line, line
    assert "Traceback" not in r.output
    assert snapshot(b) == before


# Issue 32, finding 5: the writer state is checked against the base, not only parsed: a
# state copied from another job, or a stale copy with a fresh ``published_at`` and nothing
# pending, would otherwise fence nothing, and the deletion would go ahead.


def _own_checkpoints(b: Built) -> list[int]:
    base = Path(b.loc.full(b.job_dir))
    return sorted(int(p.name[4:]) for p in base.glob("chk-*") if (p / "_metadata").exists())


Fields = Callable[[str, list[int]], dict[str, object]]
"""The state's job, retained and latest completed, from the base's job and its ids."""

DISAGREE: dict[str, tuple[str, Fields]] = {
    "foreign job": ("job", lambda job, ids: {"job": "job-77", "retained": [],
                                             "latest_completed": 0}),
    "stale": ("latest_completed", lambda job, ids: {"job": job, "retained": ids[:-1],
                                                    "latest_completed": ids[-2]}),
    "retained not on storage": ("retained", lambda job, ids: {
        "job": job, "retained": [*ids, 999_999], "latest_completed": ids[-1]}),
    "latest not on storage": ("latest_completed", lambda job, ids: {
        "job": job, "retained": ids, "latest_completed": 999_999}),
}


@pytest.mark.parametrize("case", list(DISAGREE))
def test_a_writer_state_that_disagrees_with_the_base_refuses_the_deletion(
    tmp_path: Path, case: str
) -> None:
    """A state saying nothing is pending, published just now, whose job, retained list or
    latest completed checkpoint disagrees with the ``_metadata`` on storage: refused
    (exit 3) naming the field, nothing deleted. The same state with the base's own
    values (a forgery this check cannot see) lets the deletion go ahead."""
    b, strays = base_with_strays(tmp_path)
    job = b.obs.retained[-1].job
    ids = _own_checkpoints(b)
    assert len(ids) >= 2
    field, fields = DISAGREE[case]
    state = Path(b.loc.full(fence.state_path(b.loc)))
    state.write_bytes(_state(**fields(job, ids)))
    before = snapshot(b)
    flags = ["--grace", "0s", "--allow-short-grace", "--log", str(tmp_path / "log")]
    r = run(b.loc.full(b.job_dir), "--engine", "single", "-q", "--delete-orphans", *flags)
    assert r.exit_code == 3, r.output
    assert "disagrees with the base" in r.output and repr(field) in r.output, r.output
    assert snapshot(b) == before
    state.write_bytes(_state(job=job, retained=ids, latest_completed=ids[-1]))
    r = run(b.loc.full(b.job_dir), "--engine", "single", "-q", "--delete-orphans", *flags)
    assert r.exit_code == 0, r.output
    assert not any(Path(b.loc.full(s)).exists() for s in strays)
