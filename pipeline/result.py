"""The audit's answer: a summary, and the detail tables by name (the same columns whether
Spark or the single-process scan computed them)."""

from __future__ import annotations

from typing import Any

from attrs import asdict, frozen

# Every table the audit produces, with its columns in order. The Spark job writes each as
# Parquet; the single-process scan returns each as a list of dicts with these keys.
TABLES: dict[str, tuple[str, ...]] = {
    "files": (
        "path", "owner", "size", "mtime", "symlink", "status", "refs", "checkpoints",
        "live_bytes", "dead_bytes",
    ),
    "references": (
        "checkpoint", "job", "checkpoint_id", "savepoint", "subtask", "kind", "name",
        "handle", "path", "offset", "length", "logical_id", "scope",
    ),
    "dangling": (
        "checkpoint", "subtask", "name", "handle", "path", "offset", "length",
        "logical_id", "file_size", "reason",
    ),
    "orphans": ("path", "owner", "size", "mtime"),
    "owners": (
        "owner", "files", "bytes", "live_bytes", "dead_bytes", "orphans", "orphan_bytes",
        "amplification",
    ),
    "checkpoints": (
        "checkpoint", "job", "checkpoint_id", "savepoint", "in_base", "references", "files",
        "state_bytes", "physical_bytes", "amplification", "shared_bytes",
        "reused_shared_bytes", "dangling",
    ),
    "corrupt": ("metadata", "field", "problem"),
    "unreadable": ("path", "problem"),
}

# A file's status in the ``files`` table.
REFERENCED = "referenced"
ORPHAN = "orphan"
PENDING = "pending"
"""Unreferenced but younger than the grace period: a live writer may still be writing it."""
WORKING = "working"
"""Unreferenced working file of a live database (FLIP-427): the database owns it."""
METADATA = "metadata"
CORRUPT = "corrupt_metadata"
IN_FLIGHT = "in_flight"
"""Unreferenced, written by a Flink checkpoint still in flight (a ``chk-N`` above the job's
latest completed one, active within the grace period, and every file of the job since it
started): the checkpoint that completes will reference it."""
STALE = "stale"
"""Unreferenced by what a restart needs, but the engine's own cleanup deletes it (Spark:
a version below the retained window): not a leak, and not the audit's to delete."""
HELD = (IN_FLIGHT, STALE)
"""Statuses a format's reader decides for a file the references do not name."""

MISSING = "missing file"
BEYOND = "range beyond the file's size"
OTHER_SIZE = "file of another size than recorded"
NO_PATH = "placeholder without a path"


@frozen
class Summary:
    base: str
    engine: str
    grace_seconds: float
    now: float
    files: int
    bytes: int
    data_files: int
    data_bytes: int
    referenced_files: int
    live_bytes: int
    dead_bytes: int
    """Bytes of referenced files that no reference covers."""
    orphans: int
    orphan_bytes: int
    pending: int
    pending_bytes: int
    working: int
    working_bytes: int
    metadata_files: int
    corrupt_metadata: int
    checkpoints: int
    """Completed checkpoints of the audited job whose ``_metadata`` reads."""
    other_metadata: int
    """Checkpoints of other jobs and savepoints read because they may reference this job."""
    references: int
    dangling: int
    dangling_missing: int
    dangling_beyond: int
    space_amplification: float | None
    """Bytes of referenced files over the live bytes in them (1.0: no dead byte)."""
    total_amplification: float | None
    """Every data byte under the base (orphans and pending too) over the live bytes."""
    shared_bytes: int
    reused_shared_bytes: int
    reused_share: float | None
    """Of the shared state the retained checkpoints reference, the share an earlier
    retained checkpoint referenced already (incremental reuse)."""
    restore_source_of: tuple[str, ...]
    """Checkpoints of other jobs that list this base among their shared bases."""
    unreadable: int = 0
    """Paths that could not be listed or examined, or whose name is not UTF-8 (reported,
    skipped, never deleted; a deletion is refused while a directory where a ``_metadata``
    may lie cannot be listed: ``pipeline.deletion``)."""
    format: str = "ckpt"
    """Whose checkpoint format was read: ``ckpt`` (ours), ``flink`` or ``spark``."""
    in_flight: int = 0
    in_flight_bytes: int = 0
    stale: int = 0
    stale_bytes: int = 0
    notes: tuple[str, ...] = ()
    """What the reader of the format says of what it could not know (printed with the
    report): e.g. that Flink publishes no writer state."""

    @property
    def at_risk(self) -> bool:
        """A retained checkpoint cannot be fully restored: a dangling reference or an
        unreadable ``_metadata``."""
        return self.dangling > 0 or self.corrupt_metadata > 0

    @property
    def read_nothing(self) -> bool:
        """No checkpoint of the job was read and none read beside it references the
        base: no file was checked against anything, so the base is never called clean
        and no file an orphan for it (issue 32, finding 10)."""
        return self.checkpoints == 0 and self.references == 0

    @property
    def verdict(self) -> str:
        problems = []
        if self.read_nothing:
            problems.append("no checkpoint read: nothing here was checked")
        if self.dangling:
            problems.append(f"{self.dangling} dangling reference(s): DATA LOSS")
        if self.corrupt_metadata:
            problems.append(f"{self.corrupt_metadata} unreadable _metadata file(s)")
        if self.unreadable:
            problems.append(f"{self.unreadable} path(s) could not be listed or examined")
        if self.orphans:
            problems.append(f"{self.orphans} orphan file(s), {self.orphan_bytes} bytes leaked")
        if not problems:
            return "clean: no dangling reference, no orphan, every _metadata reads"
        return "; ".join(problems)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["restore_source_of"] = list(self.restore_source_of)
        doc["notes"] = list(self.notes)
        doc["at_risk"] = self.at_risk
        doc["verdict"] = self.verdict
        return doc


def ratio(num: int, den: int) -> float | None:
    return None if den <= 0 else num / den


Row = dict[str, Any]


@frozen
class Tables:
    """The detail tables as rows (what the single-process scan returns, and what a Spark
    result collects to)."""

    summary: Summary
    tables: dict[str, list[Row]]

    def __getitem__(self, name: str) -> list[Row]:
        return self.tables[name]
