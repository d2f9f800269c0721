"""What the scripted job measures: files created and deleted on storage per checkpoint,
and space amplification, all read from ``fastimpl.testing.observe`` (the real files)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from spec.config import MergingMode
from spec.handles import SegmentHandle, stream_of
from spec.layout import METADATA
from spec.observation import Observation

_METADATA_SUFFIX = "/" + METADATA


@dataclass
class Row:
    """What happened on storage between the end of one checkpoint and the end of the next."""

    checkpoint: int = 0
    status: str = ""
    notes: list[str] = field(default_factory=list)
    created: int = 0
    deleted: int = 0
    meta_created: int = 0
    meta_deleted: int = 0
    files: int = 0
    stored: int = 0
    live: int = 0

    @property
    def amplification(self) -> float:
        return self.stored / self.live if self.live else float("inf")


@dataclass
class ModeResult:
    """One merging mode's run: a row per checkpoint, and the state at the end."""

    mode: MergingMode
    root: str
    rows: list[Row] = field(default_factory=list)
    steps: int = 0
    """API calls made, each followed by a check of I1-I5 on the real files."""
    violations: list[str] = field(default_factory=list)
    error: str | None = None
    files_at_end: int = 0
    metadata_at_end: int = 0
    stored_at_end: int = 0
    live_at_end: int = 0
    empty_dirs_at_end: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None

    @property
    def completed(self) -> int:
        return sum(1 for r in self.rows if r.status.startswith("completed"))

    @property
    def aborted(self) -> int:
        return sum(1 for r in self.rows if r.status.startswith("aborted"))

    @property
    def created(self) -> int:
        return sum(r.created for r in self.rows)

    @property
    def deleted(self) -> int:
        return sum(r.deleted for r in self.rows)

    @property
    def meta_created(self) -> int:
        return sum(r.meta_created for r in self.rows)

    @property
    def meta_deleted(self) -> int:
        return sum(r.meta_deleted for r in self.rows)

    @property
    def amplification(self) -> float:
        return self.stored_at_end / self.live_at_end if self.live_at_end else float("inf")

    @property
    def peak_amplification(self) -> float:
        return max((r.amplification for r in self.rows if r.live), default=0.0)

    @property
    def mean_amplification(self) -> float:
        amps = [r.amplification for r in self.rows if r.live]
        return sum(amps) / len(amps) if amps else 0.0


@dataclass
class DemoResult:
    modes: list[ModeResult]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.modes)


class FileCounter:
    """Counts the files that appear and disappear on storage from one listing to the next,
    into the row of the checkpoint in progress."""

    def __init__(self, result: ModeResult) -> None:
        self.result = result
        self.files: dict[str, int] = {}
        self.row = Row()

    def count(self, obs: Observation) -> None:
        now = dict(obs.files)
        for p in now.keys() - self.files.keys():
            if p.endswith(_METADATA_SUFFIX):
                self.row.meta_created += 1
            else:
                self.row.created += 1
        for p in self.files.keys() - now.keys():
            if p.endswith(_METADATA_SUFFIX):
                self.row.meta_deleted += 1
            else:
                self.row.deleted += 1
        self.files = now

    def note(self, text: str) -> None:
        self.row.notes.append(text)

    def close_row(self, checkpoint: int, status: str, obs: Observation) -> None:
        self.row.checkpoint = checkpoint
        self.row.status = status
        self.row.files = len(obs.files)
        self.row.stored, self.row.live = state_bytes(obs)
        self.result.rows.append(self.row)
        self.row = Row()


def state_bytes(obs: Observation) -> tuple[int, int]:
    """(bytes of the state files on storage, distinct state bytes that retained checkpoints
    and the state being restored refer to). ``_metadata`` files count in neither."""
    stored = sum(n for p, n in obs.files.items() if not p.endswith(_METADATA_SUFFIX))
    live: set[tuple[str, int, int]] = set()
    entries = [e for r in obs.retained for e in r.entries] + list(obs.restoring)
    for e in entries:
        s = stream_of(e.handle)
        if s is not None:
            offset = s.offset if isinstance(s, SegmentHandle) else 0
            live.add((s.path, offset, s.length))
    return stored, sum(length for _p, _o, length in live)


def missing_directories(root: str, obs: Observation) -> list[str]:
    """Managed directories the store reports that are not on the disk."""
    return [d for d in obs.directories if not os.path.isdir(os.path.join(root, d))]


def empty_directories(root: str, obs: Observation) -> int:
    """Empty directories on disk that are not managed directories of the store (a
    subsumed checkpoint's ``chk-N/``, an ended job's ``shared/<subtask>/`` without merging).
    SPEC.md counts such directories as implicit, gone with their last file; a local file
    system keeps them."""
    managed = {os.path.normpath(os.path.join(root, d)) for d in obs.directories}
    holds: set[str] = set()  # directories with a file or a managed directory under them
    count = 0
    for here, _dirs, files in os.walk(root, topdown=False):
        here = os.path.normpath(here)
        if files or here in managed or here in holds:
            holds.add(os.path.dirname(here))
        elif here != os.path.normpath(root):
            count += 1
    return count
