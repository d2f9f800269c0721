"""Issue 16: what the store remembers does not grow with the number of checkpoints.
The deletion history is an opt-in log; without it the store keeps only the deletes that
broke an invariant, and who deleted a file whose delete still fails. (The memory figure
over 10,000 checkpoints is ``bench/memory.py``, not a timed test.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from fastimpl import CheckpointStore
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.effects import COORDINATOR
from spec.layout import metadata_path
from tests.faultyfs import Place

JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 1)), num_tms=2)
MODES = list(MergingMode)



def _checkpoints(store: CheckpointStore, n: int, *, abort_every: int = 0) -> None:
    coord = store.coordinator
    for k in range(n):
        cid = coord.trigger()
        for sub, tm in sorted(store.placement().items()):
            mgr = store.task_manager(tm)
            mgr.write(cid, sub, StateKind.KEYED_SHARED, f"sst-{cid}", b"k" * 50)
            mgr.write(cid, sub, StateKind.OPERATOR_LIST, "offsets", b"o" * 20)
            mgr.acknowledge(cid, sub)
        if abort_every and k % abort_every == 0:
            coord.abort(cid)
        else:
            assert coord.complete(cid) is not None
        store.deliver_notifications()
    store.flush()


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_the_deletion_history_is_opt_in(mode: MergingMode, tmp_path: Path) -> None:
    config = Config.for_mode(mode, num_retained=1)
    quiet = CheckpointStore(f"memory://{tmp_path}/quiet", config, JOB)
    logged = CheckpointStore(f"memory://{tmp_path}/logged", config, JOB, deletion_log=True)
    for store in (quiet, logged):
        _checkpoints(store, 12, abort_every=5)
        assert store.check_invariants() == []
    assert quiet.observe().deletions == ()
    history = logged.observe().deletions
    assert len(history) >= 11  # at least every subsumed _metadata
    assert {d.path for d in history} >= {metadata_path("job-0", n) for n in (2, 3, 4)}  # 1 aborted
    assert all(d.existed and not d.protected and d.owner == d.actor for d in history)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_a_failing_delete_keeps_its_owner_after_many_more_deletes(
    mode: MergingMode, tmp_path: Path, places: list[Place]
) -> None:
    """Who deleted what is kept only until the delete is done (R45): a delete that keeps
    failing is not done, so its file stays its deleter's (I3) however many deletes
    follow, and is listed until a retry succeeds."""
    place = Place.make("memory", tmp_path)
    places.append(place)
    store, fs = place.store(Config.for_mode(mode, num_retained=1), JOB, deletion_log=False)
    victim = metadata_path(store.job_id, 1)
    fs.fail("rm_file", times=10**6, path_contains=victim)
    fs.fail("rm", times=10**6, path_contains=victim)
    _checkpoints(store, 150)  # several hundred deletes after the victim's
    assert [f.path for f in store.delete_failures()] == [victim]
    obs = store.observe()
    assert victim in obs.files and obs.owners.get(victim) == COORDINATOR
    assert victim in obs.pending_deletes
    assert obs.deletions == ()
    assert store.check_invariants() == []
    fs.heal()
    assert store.retry_deletes() == []
    assert victim not in store.observe().files
    store.close()
