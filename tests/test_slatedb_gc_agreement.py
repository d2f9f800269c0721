"""SlateDB's garbage collector and our collection (R104) never delete what the other still
needs (issue 18 stage 3), on real SlateDB databases without Spark.

What must stay: every retained checkpoint's SlateDB checkpoint reads whole (a restore
clones from it) and every working file it refers to in place exists; every live
database reads whole through its latest manifest (the files it uses, its own and those
of the databases it was cloned from). ``needed`` reads all of it before a collection and
``losses`` again after: the same rows, or the loss is named.

The agreement holds because each side keeps the other's: our retained checkpoints hold
SlateDB checkpoints (so its GC, at any minimum age, keeps their manifests and SSTs), and
our collection runs before its GC and deletes only what no retained checkpoint refers to
and no live database uses, and whole databases only when nothing needs them. Each broken
variant below breaks one side, and the same check must then name a loss: the test can
fail."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.stream import slate
from pipeline.stream.kills import Failures
from pipeline.stream.working_names import CHECKPOINT_PREFIX, db_dir_of, pointers
from spec.config import Config, MergingMode
from tests.stream_harness import LocalJob

Rows = dict[str, list[tuple[bytes, bytes]] | str]
ALL = (0, 127)


def _scenario(tmp: Path) -> LocalJob:
    """Two retained checkpoints; subtask 1's first attempt of batch 4 dies after its
    snapshot, so its successor clones and the dead database stays needed (the clone and
    a retained checkpoint refer to its SSTs in place)."""
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=2)
    job = LocalJob(
        tmp,
        config,
        parallelism=2,
        backend="working",
        failures=Failures(kill_at=(4, 1, "uploaded")),
        gc_min_age_s=0.0,
    )
    for _ in range(6):
        job.batch()
    assert job.kills == [(4, 1, 0, "uploaded")]
    return job


def needed(job: LocalJob) -> Rows:
    """What must stay readable, read now: ``<what>`` -> its rows, or why it is unreadable."""
    co = job.coordinator
    place = slate.Place(job.url, {})
    loop = slate.Loop()
    out: Rows = {}

    def read(what: str, lineage: str, checkpoint_id: str | None) -> None:
        try:
            out[what] = list(slate.read_checkpoint(loop, place, lineage, checkpoint_id, ALL))
        except Exception as err:
            out[what] = f"unreadable: {err}"

    for r in co.co.retained:
        for p in pointers(r.entries):
            read(f"chk {r.id} {p.lineage}@{p.checkpoint_id}", p.lineage, p.checkpoint_id)
        for _, w in r.working:
            out[f"chk {r.id} file {w.path}"] = (
                [] if (Path(job.url) / w.path).is_file() else "missing"
            )
    for d in sorted(co.live_databases()):
        read(f"live {d}", d, None)
    loop.close()
    return out


def losses(before: Rows, after: Rows) -> list[str]:
    return [
        f"{what}: {after.get(what, 'gone')}" if isinstance(after.get(what), str) or what not in
        after else f"{what}: rows changed"
        for what, rows in sorted(before.items())
        if after.get(what) != rows
    ]  # fmt: skip


def _gc_everything(job: LocalJob) -> None:
    """SlateDB's GC at its most eager (minimum age 0) on every database of the job."""
    co = job.coordinator
    admin = slate.Admin(slate.Loop(), slate.Place(job.url, {}))
    dbs = {d for p in co.co.storage.files_under("job-0") if (d := db_dir_of(p)) is not None}
    for d in sorted(dbs):
        admin.gc(d, 0)


def _ours(job: LocalJob) -> None:
    job.coordinator.collect_working()


def _ours_then_eager_slatedb_gc(job: LocalJob) -> None:
    job.coordinator.collect_working()
    _gc_everything(job)


def _broken_collection_ignores_references(job: LocalJob) -> None:
    """Our side broken: fastimpl's collection deletes every shared file (no retained
    checkpoint, no live database counted)."""
    w = job.coordinator.co.working
    w.referred = lambda: set()  # type: ignore[method-assign]
    w.in_use = lambda: set()  # type: ignore[method-assign]
    w.collect()
    job.coordinator.post()  # the host carries out what the collection decided
    job.coordinator.co.storage.drain()


def _broken_pins_released_early(job: LocalJob) -> None:
    """The pins broken: every snapshot's SlateDB checkpoint is deleted at once (as if
    the coordinator released at the snapshot, not at the subsume), then SlateDB's GC."""
    co = job.coordinator
    admin = slate.Admin(slate.Loop(), slate.Place(job.url, {}))
    dbs = {d for p in co.co.storage.files_under("job-0") if (d := db_dir_of(p)) is not None}
    for d in sorted(dbs):
        for cid, name, _ in admin.checkpoints(d):
            if name is not None and name.startswith(CHECKPOINT_PREFIX):
                admin.delete_checkpoint(d, cid)
    _gc_everything(job)


def _broken_drops_needed_databases(job: LocalJob) -> None:
    """Our database collection broken: a directory counts as needed only while a live
    database writes it (a clone's source and a retained checkpoint's are dropped)."""
    co = job.coordinator
    on_storage = co.co.storage.files_under("job-0/taskowned/working")
    co.slate.collect(on_storage, needed=co.live_databases(), wanted=set(), recorded=())


@pytest.mark.parametrize(
    "collect",
    [_ours, _ours_then_eager_slatedb_gc],
    ids=["ours", "ours-then-eager-slatedb-gc"],
)
def test_neither_collector_deletes_what_the_other_needs(
    tmp_path: Path, collect: Callable[[LocalJob], None]
) -> None:
    job = _scenario(tmp_path)
    co = job.coordinator
    live = co.live_databases()
    before = needed(job)
    # the scenario holds what each side must keep: a database no live one writes but a
    # retained checkpoint or a clone needs, and retained files no live database uses
    sources = {d for what in before if what.startswith("chk ") and " file " in what
               if (d := db_dir_of(what.split(" file ", 1)[1])) is not None}  # fmt: skip
    assert sources - live, "a dead database the retained checkpoints still refer to"
    assert all(not isinstance(v, str) for v in before.values()), before
    collect(job)
    assert losses(before, needed(job)) == []
    assert co.violations() == []


@pytest.mark.parametrize(
    "broken",
    [
        _broken_collection_ignores_references,
        _broken_pins_released_early,
        _broken_drops_needed_databases,
    ],
    ids=["collection-ignores-references", "pins-released-early", "drops-needed-databases"],
)
def test_the_check_names_the_loss_when_one_side_is_broken(
    tmp_path: Path, broken: Callable[[LocalJob], None]
) -> None:
    job = _scenario(tmp_path)
    before = needed(job)
    broken(job)
    lost = losses(before, needed(job))
    assert lost, "a broken side lost nothing: the check could not fail"
