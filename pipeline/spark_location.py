"""A Spark query's checkpointLocation as the audit's rows (issue 33).

``pipeline.spark_checkpoint`` reads the commit log, every snapshot zip's file list and
the changelog lineage, and judges each file by Spark 4.3's own rules. Here its answer
becomes the rows every format feeds the audit: one checkpoint per retained state version
(the files of every store a restart of that version needs), one reference per needed
file (its recorded size, or the file's own for a zip or changelog, which record none),
what Spark's maintenance deletes held as ``stale``, the query's own log files as
metadata, and the reader's dangling rows (it checks exact sizes, which a range check
cannot). Spark publishes no writer state: a live query is protected by age and by the
commit log read again before any delete (``pipeline.foreign_deletion``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from pipeline import scan
from pipeline.foreign import Foreign, ForeignRead
from pipeline.location import Location
from pipeline.result import MISSING, OTHER_SIZE, STALE, Row
from pipeline.spark_checkpoint import (
    METADATA,
    STORE_SUBDIRS,
    SparkCheckpoint,
    SparkCheckpointError,
    read_spark_checkpoint,
    walk,
)

NOTES = (
    "Spark does not record minBatchesToRetain in the files: the retained window is the "
    "--retain given (Spark's default 100)",
    "Spark publishes no writer state: a live query's files are protected only by age (the "
    "grace period) and by the commit log read again before deleting (a batch committed "
    "since the audit refuses the deletion)",
)


def owner(path: str, root: str) -> str:
    """The store directory of a state file (``state/<op>/<partition>[/<store name>]``),
    else the top-level folder of the location (``commits``, ``offsets``, ...)."""
    rest = path[len(root) + 1:].split("/") if path.startswith(root + "/") else []
    if len(rest) > 3 and rest[0] == "state":
        deep = len(rest) > 4 and rest[3] not in STORE_SUBDIRS
        return "/".join([root, *rest[:4 if deep else 3]])
    if len(rest) > 1:
        return f"{root}/{rest[0]}"
    return root


def read_spark(
    loc: Location, *, retain: int, grace: float, now: float
) -> tuple[ForeignRead, object]:
    """The location read, and its commit marker (what a deleter compares before
    deleting). A malformed commit, zip metadata or changelog header is an unreadable
    metadata row: nothing is read past it and no deletion runs."""
    root = loc.job_dir
    del grace, now  # Spark's rules do not depend on the clock: the audit applies grace

    def owner_of(p: str) -> str:
        return owner(p, root)

    try:
        cp = read_spark_checkpoint(loc, root, retain=retain)
    except SparkCheckpointError as err:
        files, problems = walk(loc, root)
        foreign = Foreign("spark", owner=owner_of, notes=NOTES, dangling=[])
        return ForeignRead(foreign, files, [], [], [(err.path, err.field, err.problem)], [],
                           problems), None
    return _rows(cp, root, owner_of), cp.marker


def _rows(cp: SparkCheckpoint, root: str, owner_of: Callable[[str], str]) -> ForeignRead:
    size = {f[0]: f[1] for f in cp.files}
    job = root.rsplit("/", 1)[-1]
    by_version: dict[int, list[scan.RefRow]] = defaultdict(list)
    for r in cp.refs:
        key = f"{root}/state-version-{r.version}"
        length = r.size if r.size is not None else size.get(r.path, 0)
        scope = "shared" if r.role == "sst" else "exclusive"
        by_version[r.version].append(
            (key, job, r.version, False, r.store, "rocksdb", r.role, "file", r.path, 0,
             length, None, scope))
    present = set(size)
    checkpoints: list[scan.CheckpointRow] = [
        (f"{root}/state-version-{v}", job, v, False, _commit_of(present, root, v), root,
         len(rows), [])
        for v, rows in sorted(by_version.items())
    ]
    references = [r for _v, rows in sorted(by_version.items()) for r in rows]
    dangling: list[Row] = [
        {"checkpoint": f"{root}/state-version-{d.version}", "subtask": d.store,
         "name": d.path.rsplit("/", 1)[-1], "handle": "file", "path": d.path, "offset": 0,
         "length": d.size, "logical_id": None, "file_size": d.actual,
         "reason": MISSING if d.actual is None else OTHER_SIZE}
        for d in cp.dangling
    ]
    held = {p: STALE for p in cp.paths("stale")}
    foreign = Foreign(
        "spark", held=held, metadata=frozenset(cp.paths(METADATA)),
        owner=owner_of, notes=NOTES, dangling=dangling)
    return ForeignRead(foreign, list(cp.files), checkpoints, references, [], [],
                       sorted(set(cp.problems)))


def _commit_of(present: set[str], root: str, version: int) -> str:
    """The commit that made ``version`` the restart point (batch ``version - 1``), as the
    checkpoint's metadata path; an older retained version may have none left."""
    rel = f"{root}/commits/{version - 1}"
    return rel if rel in present else ""
