"""Issue 16: what the store remembers does not grow with the number of checkpoints.
The deletion history is an opt-in log; without it the store keeps only the deletes that
broke an invariant, and who deleted a file whose delete still fails. (The memory figure
over 10,000 checkpoints is ``bench/memory.py``, not a timed test.)"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from fastimpl import CheckpointStore, CounterIds
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


def table_sizes(root: object) -> dict[str, int]:
    """The length of every container the store's objects hold, summed by where it is held
    (``CheckpointCoordinator.registry``, ``Manager.segs[]``...): every object of
    ``fastimpl`` reachable from ``root`` through attributes and container values, each
    visited once. A table added later is covered without naming it here."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def fields(obj: object) -> list[tuple[str, object]]:
        names = list(getattr(obj, "__dict__", {}))
        for klass in type(obj).__mro__:
            names += [n for n in getattr(klass, "__slots__", ()) if n != "__weakref__"]
        return [(n, getattr(obj, n)) for n in dict.fromkeys(names) if hasattr(obj, n)]

    def visit(obj: object, where: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, dict | list | set | frozenset | tuple | deque):
            if not isinstance(obj, tuple):
                sizes[where] = sizes.get(where, 0) + len(obj)
            for item in obj.values() if isinstance(obj, dict) else obj:
                visit(item, where + "[]")
        elif type(obj).__module__.startswith("fastimpl."):
            for name, value in fields(obj):
                visit(value, f"{type(obj).__name__}.{name}")

    visit(root, "")
    return sizes


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_no_table_grows_with_the_number_of_checkpoints(mode: MergingMode, tmp_path: Path) -> None:
    """Issue 16: a steady job (every subtask writes fresh shared state and an operator
    list, one checkpoint in five aborts) holds tables of the same sizes after 40 and after
    80 checkpoints, in the coordinator, the TMs, the catalog and the storage; only the
    opt-in deletion log (off here) would grow. The figure over 10,000 checkpoints is
    ``bench/memory.py``."""
    store = CheckpointStore(
        f"file://{tmp_path}", Config.for_mode(mode, num_retained=2), JOB, ids=CounterIds()
    )
    _checkpoints(store, 40, abort_every=5)
    first = table_sizes(store)
    _checkpoints(store, 40, abort_every=5)
    second = table_sizes(store)
    grew = {k: (first.get(k, 0), v) for k, v in second.items() if v > first.get(k, 0)}
    assert grew == {}, f"tables that grew from 40 to 80 checkpoints: {grew}"
    assert first["CheckpointCoordinator.registry"] > 0  # the walk reached the tables
    assert store.check_invariants() == []
    store.close()
