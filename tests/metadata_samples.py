"""A valid ``_metadata`` document (two entries: a shared segment and an exclusive file),
the starting point that the metadata tests damage in one place at a time."""

from __future__ import annotations

from fastimpl.metadata import encode
from spec.config import Scope, StateKind
from spec.handles import FileHandle, SegmentHandle, StateEntry
from spec.ids import SubtaskId
from spec.layout import job_base, shared_dir

JOB = "job-1"
SUB = SubtaskId("src", 0, 2)


def sample_entries(job: str = JOB) -> tuple[StateEntry, ...]:
    shared = shared_dir(job, SUB)
    return (
        StateEntry(
            SUB,
            StateKind.KEYED_SHARED,
            "keyed",
            SegmentHandle(f"{shared}/seg-1", 0, 10, "u1", Scope.SHARED),
            1,
            (0, 63),
            None,
        ),
        StateEntry(
            SUB,
            StateKind.OPERATOR_LIST,
            "ops",
            FileHandle(f"{job_base(job)}/chk-3/f-2", 7, "u2", Scope.EXCLUSIVE),
            4,
            None,
            (0, 2),
        ),
    )


def sample(job: str = JOB) -> bytes:
    return encode(3, job, False, sample_entries(job), (f"{job_base(job)}/taskowned/tm1",))
