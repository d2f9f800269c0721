"""Where things live under a base (BRIEF §2). Paths are relative to the storage root,
``/``-separated, and every component that carries an id is escaped (R3)."""

from __future__ import annotations

from spec.ids import SubtaskId, TmId, escape_name

METADATA = "_metadata"
SAVEPOINTS = "savepoints"


def job_base(job: str) -> str:
    return escape_name(job)


def checkpoint_dir(job: str, checkpoint: int) -> str:
    return f"{job_base(job)}/chk-{checkpoint}"


def metadata_path(job: str, checkpoint: int) -> str:
    return f"{checkpoint_dir(job, checkpoint)}/{METADATA}"


def shared_dir(job: str, subtask: SubtaskId) -> str:
    return f"{job_base(job)}/shared/{subtask.dir_name()}"


def taskowned_dir(job: str, tm: TmId) -> str:
    return f"{job_base(job)}/taskowned/{escape_name(tm)}"


def working_dir(job: str, subtask: SubtaskId) -> str:
    """Disaggregated (ForSt-style) working files of one subtask (FLIP-427)."""
    return f"{job_base(job)}/taskowned/working/{subtask.dir_name()}/db"


def savepoint_dir(checkpoint: int) -> str:
    return f"{SAVEPOINTS}/savepoint-{checkpoint}"


def is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""
