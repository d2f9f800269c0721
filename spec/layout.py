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


def working_operator(path: str) -> str | None:
    """The escaped name of the operator (vertex) whose working directory holds ``path``
    (``<base>/taskowned/working/<vertex>-<index>-<parallelism>/db/...``, at any depth
    below ``db``), or None for a path outside every working directory. R105 opens a file
    only for subtasks of that operator, and I7 asks that every database use only files
    of its own operator; compare with ``escape_name(vertex)``."""
    parts = path.split("/")
    for i in range(len(parts) - 4):
        if parts[i : i + 2] == ["taskowned", WORKING] and parts[i + 3] == "db":
            pieces = parts[i + 2].rsplit("-", 2)
            if len(pieces) == 3 and pieces[0] and pieces[1].isdigit() and pieces[2].isdigit():
                return pieces[0]
            return None
    return None


def savepoint_dir(checkpoint: int) -> str:
    return f"{SAVEPOINTS}/savepoint-{checkpoint}"


def is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""
