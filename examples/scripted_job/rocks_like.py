"""A subtask's local RocksDB, as far as checkpoints see it: named SST files with sizes.

Incremental keyed state is what makes shared files: each checkpoint uploads only the SST
files created since the last one and reuses the handles of the others
(``FileMergingManager.reuse_shared``), so one uploaded file is referenced by many
checkpoints until compaction drops it.
"""

from __future__ import annotations

import random

KIB = 1024


class LocalDb:
    """Each checkpoint interval flushes one or two new SST files of 4-24 KiB; once more
    than five exist, compaction merges the four oldest into one new file (60% of their
    bytes survive). All sizes come from the job's seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.files: dict[str, int] = {}
        self.next_file = 1

    def new_file(self, size: int) -> None:
        self.files[f"{self.next_file:06d}.sst"] = size
        self.next_file += 1

    def advance(self) -> None:
        """One checkpoint interval of writes: flushes, then maybe a compaction."""
        for _ in range(self.rng.randint(1, 2)):
            self.new_file(self.rng.randint(4, 24) * KIB)
        if len(self.files) > 5:
            oldest = list(self.files)[:4]
            merged = sum(self.files.pop(name) for name in oldest)
            self.new_file(int(merged * 0.6))

    def total(self) -> int:
        return sum(self.files.values())

    def ingest(self, size: int) -> None:
        """A new DB built from restored key groups (after a rescale): three files."""
        for part in (size // 2, size // 3, size - size // 2 - size // 3):
            self.new_file(part)


def payload(name: str, size: int) -> bytes:
    """The bytes the job writes for a state handle: its name, repeated to ``size``. A
    restore can then check that what it reads back is what was written under that name."""
    unit = name.encode() + b"\n"
    return (unit * (size // len(unit) + 1))[:size]
