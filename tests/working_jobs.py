"""A job whose databases (§11) are checkpointed on the in-process engine: shared by the
tests of recovery and of TMs of their own that start from such a checkpoint."""

from __future__ import annotations

from conformance.fastimpl_commands import apply
from fastimpl import CounterIds
from fastimpl.engine import InProcessEngine
from spec.commands import Acknowledge, Complete, SnapshotWorking, Trigger, WriteWorking
from spec.config import Config, JobSpec, MergingMode, VertexSpec
from spec.ids import SubtaskId
from tests.faultyfs import Place

WORKING_JOB = JobSpec((VertexSpec("v", 2),), num_tms=2)


def working_engine(place: Place, config: Config | None = None) -> InProcessEngine:
    """The working job on ``place`` (by default: merging within a checkpoint, one
    retained), nothing written yet."""
    if config is None:
        config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=1)
    return InProcessEngine(config, WORKING_JOB, place.inner, place.root, CounterIds())


def working_checkpoint(engine: InProcessEngine, subtasks: tuple[SubtaskId, ...]) -> int:
    """A checkpoint for which each of ``subtasks`` snapshots its database (every file in
    place, R103) and acknowledges; completed. Its id."""
    apply(engine, Trigger())
    cp = engine.coord.next_checkpoint - 1
    for s in subtasks:
        apply(engine, SnapshotWorking(cp, s, 0))
        apply(engine, Acknowledge(cp, s))
    apply(engine, Complete(cp))
    return cp


def working_store(place: Place, config: Config) -> tuple[InProcessEngine, int, str, list[str]]:
    """A job whose databases wrote one working file each, a completed checkpoint that
    refers to both in place (R103), and a private working file written after it: the
    engine, the checkpoint, the private file and the in-place files."""
    engine = working_engine(place, config)
    subtasks = (SubtaskId("v", 0, 2), SubtaskId("v", 1, 2))
    for s, size in zip(subtasks, (500, 400), strict=True):
        apply(engine, WriteWorking(s, size))
    cp = working_checkpoint(engine, subtasks)
    private = engine.working.write(subtasks[0], b"p" * 30)  # after the checkpoint
    assert private is not None
    engine.storage.drain()
    in_place = sorted(w.path for r in engine.coord.retained for _, w in r.working)
    assert len(in_place) == 2
    return engine, cp, private, in_place
