"""The conformance profile of the Flink adapter: which cases it can judge, and which part
of an observation it judges.

Flink's ``FileMergingSnapshotManager`` is the task-manager side of file merging (R10-R15,
R20-R21, R31-R34, R40-R41, R60-R65): segments, physical files, pools, the subsumed
watermark, the managed directories of one TM. Everything else a case exercises (trigger,
acknowledgement collection, completion, retention, the registry, ``_metadata``) is the
coordinator's, and Flink's coordinator cannot be driven call by call; the adapter plays it
with the reference model (the *coordinator stand-in*). So what Flink is judged on is what a
TM leaves on storage: the files in the job's ``shared/`` and ``taskowned/`` directories
with their sizes, and which of them were deleted. Every other field of the observation is
the stand-in's and is not evidence about Flink.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from spec import commands as c
from spec.config import Config, MergingMode
from spec.observation import DeletionRecord, Observation

NO_COUNTERPART: Mapping[type, str] = {
    c.FailNextCall: "fault injection into storage calls: Flink's FileSystem has no hook for it",
    c.Restore: (
        "a new job from a retained checkpoint: key-group redistribution and ownership by "
        "restore mode are the JobManager's and the state backend's, not the manager's"
    ),
    c.ReplaceTm: "task-level failover of one attempt while checkpoints stay pending (Spark's)",
    c.WriteWorking: "disaggregated working state: Flink cannot combine it with file merging",
    c.DropWorking: "disaggregated working state: Flink cannot combine it with file merging",
    c.SnapshotWorking: "disaggregated working state: Flink cannot combine it with file merging",
}
"""Commands the adapter cannot translate into calls on Flink's manager, with why."""

COORDINATOR_ONLY = (c.CollectWorking, c.RetryDeletes)
"""Commands that act on the coordinator alone in a case without working state or armed
faults: they run on the stand-in, and Flink's TMs see nothing."""

TM_RULES = (
    "R10", "R12", "R13", "R14", "R15", "R20", "R21", "R23", "R31", "R32", "R33", "R34",
    "R40", "R41", "R57", "R60", "R61", "R62", "R63", "R64", "R65", "R90",
)  # fmt: skip
"""The rules whose effect on storage the profile judges (task-manager rules)."""


def out_of_reach(config: Config, commands: Iterable[c.Command]) -> str | None:
    """Why a case with ``config`` and ``commands`` is out of the adapter's reach, or None
    when it is in reach."""
    if config.merging_mode is MergingMode.NONE:
        return "merging mode none: Flink does not use the file-merging manager without merging"
    if not config.open_files_readable:
        return (
            "an object store (open files not readable): the adapter runs Flink on a local "
            "file system, and R12's close-on-acknowledge for object stores is ours"
        )
    if config.inline_threshold > 0:
        return (
            "inline state (R107): Flink keeps small state in the handle in its checkpoint "
            "stream factory, before the file-merging manager the adapter drives"
        )
    for cmd in commands:
        why = NO_COUNTERPART.get(type(cmd))
        if why is not None:
            return f"{type(cmd).__name__}: {why}"
        if isinstance(cmd, c.Trigger) and cmd.savepoint:
            return "Trigger(savepoint=True): Flink writes savepoints without the manager"
    return None


def tm_side(path: str, job: str) -> bool:
    """A path in one of the job's directories that TMs manage (R1): a subtask's
    ``shared/`` directory or a TM's ``taskowned/`` directory."""
    return path.startswith((f"{job}/shared/", f"{job}/taskowned/"))


def judged(obs: Observation, job: str) -> tuple[dict[str, int], list[str]]:
    """The part of an observation the profile judges: the TM-side files with their sizes,
    and the TM-side paths deleted while they existed, in order."""
    files = {p: n for p, n in obs.files.items() if tm_side(p, job)}
    deleted = [d.path for d in obs.deletions if d.existed and tm_side(d.path, job)]
    return files, deleted


def foreign_deletion(path: str) -> DeletionRecord:
    """A deletion Flink made of a file the model keeps or never had: its actor is shown as
    ``flink`` (the adapter cannot see which manager deleted it)."""
    return DeletionRecord(path, "flink", None, True, False)
