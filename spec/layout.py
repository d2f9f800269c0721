"""Where things live under a base (R1, BRIEF §2). Paths are relative to the storage root,
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


WORKING = "working"


def taskowned_dir(job: str, tm: TmId) -> str:
    """A TM's exclusive directory. A TM named ``working`` is escaped further so that it
    never shares ``taskowned/working/`` with the disaggregated working files."""
    name = escape_name(tm)
    if name == WORKING:
        name = "_77" + name[1:]
    return f"{job_base(job)}/taskowned/{name}"


def working_dir(job: str, subtask: SubtaskId) -> str:
    """Disaggregated (ForSt-style) working files of one subtask (FLIP-427)."""
    return f"{job_base(job)}/taskowned/{WORKING}/{subtask.dir_name()}/db"


def savepoint_dir(checkpoint: int) -> str:
    return f"{SAVEPOINTS}/savepoint-{checkpoint}"


def is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""
