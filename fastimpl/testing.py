"""The test seam of :class:`fastimpl.api.CheckpointStore`: inspect a store and simulate
faults in it.

A job's engine never needs these: they exist so that tests, the scripted demo and the
benchmarks can see the bookkeeping behind the files (``observe``), check the invariants
I1-I6 of spec/SPEC.md on the real files (``check_invariants``), lose a TM whose process
may still run and then learn that it stopped (``crash``, ``stopped``: in one process a TM
is lost only when a test says so), make the next storage call of a kind fail
(``fail_next``), and build a store over an engine a test wired itself
(``store_on_engine``). They read the store's internals on purpose; this module is the one
place outside ``fastimpl.api`` that does.

What an engine does after a failure stays on the store's API: ``Coordinator.failover``
(a task failure), ``Coordinator.restart`` (a job master restart),
``CheckpointStore.recover`` (the whole process died), ``restore`` and ``rescale``.
"""

from __future__ import annotations

from fastimpl.api import CheckpointStore
from fastimpl.engine import InProcessEngine
from fastimpl.party_observation import refused_deletes
from spec.commands import StorageOp
from spec.ids import TmId
from spec.invariants import Violation, check_all
from spec.observation import Observation


def observe(store: CheckpointStore) -> Observation:
    """The files on storage and the bookkeeping that decides who deletes them."""
    with store._lock:
        return store._engine.observe()


def check_invariants(store: CheckpointStore, *, quiet: bool = False) -> list[Violation]:
    """I1-I5 on the real files (and I6 when the job is quiet); empty when all hold.

    A delete the store's guard refused before it happened (a path outside what the store
    can prove it owns, ``Catalog.refused_deletes``) is an I5 violation too: nothing was
    deleted, but something decided to. Records of two parties that disagree on a file's
    owner or a directory's are an I3 violation."""
    with store._lock:
        engine = store._engine
        refused = [
            Violation("I5", f"{r.actor} tried to delete {r.path}: refused, {r.reason}")
            for r in refused_deletes(engine.coord, engine.parties)
        ]
        seen = engine.observe()
        # I3: the parties keep records of their own; two that name different owners
        disagree = [Violation("I3", d) for d in engine.disagreements]
    return refused + disagree + check_all(seen, quiet=quiet)


def crash(store: CheckpointStore, tm: TmId) -> None:
    """TM ``tm`` is lost (R57): its memory goes, its process may still run (a zombie
    whose managers keep writing as that attempt). Pending checkpoints abort."""
    with store._lock:
        store._engine.crash_tm(tm)


def stopped(store: CheckpointStore, tm: TmId) -> None:
    """The lost TM ``tm`` is known to have stopped: what waited for it may be deleted
    (R64)."""
    with store._lock:
        store._engine.attempt_stopped(tm)


def fail_next(store: CheckpointStore, op: StorageOp) -> None:
    """The store's next storage call of kind ``op`` fails with a ``StorageFault``, as the
    model's ``FailNextCall`` says (a write declines the checkpoint, R17; a ``_metadata``
    write aborts it, R51; a delete is retried)."""
    with store._lock:
        store._engine.storage.arm(op)


def keep_deletion_log(store: CheckpointStore) -> None:
    """Keep every delete from now on in ``observe(store).deletions``: off by default,
    since the history grows with every checkpoint; without it ``deletions`` holds only
    the deletes that broke I2 or I5."""
    with store._lock:
        store._engine.catalog.keep_deletion_log()


def store_on_engine(engine: InProcessEngine) -> CheckpointStore:
    """A store over ``engine`` as a test built it (its own file system, ids, a fault
    wrapper): no base is opened, no lease taken, nothing is checked against a URL."""
    return CheckpointStore._on_engine(engine)


__all__ = [
    "check_invariants",
    "crash",
    "fail_next",
    "keep_deletion_log",
    "observe",
    "stopped",
    "store_on_engine",
]
