"""A large checkpoint base made quickly, for the audit benchmark (``bench/audit.py``).

``generate(root, n)`` writes about ``n`` files under ``root/job-1``: merged shared files
in many subtask directories (``shared/s<k>/``), exclusive files in TM directories
(``taskowned/tm<k>/``), and ``CHECKPOINTS`` retained checkpoints whose ``_metadata`` (real
ones, written with ``fastimpl.parties.encode_metadata``) reference most of them: each checkpoint
uploads its own block of files and the newest also reuses a tenth of the older blocks
(incremental state). A fiftieth of the files are old and unreferenced (orphans) and a
two-hundredth young and unreferenced (pending). Files are sparse (``ftruncate``): their
sizes are real, their bytes cost nothing to write.

Every referenced file holds one live segment of 2 KiB in 4 KiB (space amplification
2.0). The counts the audit must find come back as :class:`Planted`.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from attrs import frozen

from fastimpl.parties import encode_metadata
from spec.config import Scope, StateKind
from spec.handles import SegmentHandle, StateEntry
from spec.ids import SubtaskId

JOB = "job-1"
FILE_SIZE = 4096
SEGMENT = 1024
CHECKPOINTS = 4
FILES_PER_DIR = 2500
DAY = 86400.0


@frozen
class Planted:
    files: int
    """Every file, ``_metadata`` included."""
    orphans: int
    pending: int
    references: int
    checkpoints: int
    live_bytes: int


def generate(root: Path, n: int, *, seed: int = 7) -> Planted:
    """Write the tree under ``root/job-1`` (``root`` must not hold a ``job-1`` yet)."""
    rnd = random.Random(seed)
    base = root / JOB
    if base.exists():
        raise FileExistsError(f"{base} exists")
    data = n - CHECKPOINTS
    n_orphans = data // 50
    n_pending = data // 200
    n_referenced = data - n_orphans - n_pending
    paths: list[str] = []
    dirs = max(2, data // FILES_PER_DIR)
    for i in range(data):
        d = i % dirs
        # one file in twenty is exclusive state in a TM's directory
        rel = (f"{JOB}/taskowned/tm{d % 8}/x{i:x}" if i % 20 == 0
               else f"{JOB}/shared/s{d}/f{i:x}")
        paths.append(rel)
    made: set[str] = set()
    top = str(root)  # plain strings: a Path per file costs as much as the file itself
    for rel in paths:
        parent = rel.rsplit("/", 1)[0]
        if parent not in made:
            (root / parent).mkdir(parents=True, exist_ok=True)
            made.add(parent)
        fd = os.open(f"{top}/{rel}", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.ftruncate(fd, FILE_SIZE)
        finally:
            os.close(fd)
    order = list(range(data))
    rnd.shuffle(order)
    referenced = sorted(order[:n_referenced])
    orphans = order[n_referenced : n_referenced + n_orphans]
    old = time.time() - 3 * DAY
    for i in orphans:
        os.utime(f"{top}/{paths[i]}", (old, old))
    # Checkpoint k uploads block k of the referenced files; the newest also reuses every
    # tenth file of the older blocks.
    block = -(-len(referenced) // CHECKPOINTS)
    references = 0
    for k in range(CHECKPOINTS):
        own = referenced[k * block : (k + 1) * block]
        reused = referenced[: k * block : 10] if k == CHECKPOINTS - 1 else []
        entries = []
        for i in [*reused, *own]:
            rel = paths[i]
            shared = "/shared/" in rel
            sub = SubtaskId("v", i % 64, 64)
            scope = Scope.SHARED if shared else Scope.EXCLUSIVE
            kind = StateKind.KEYED_SHARED if shared else StateKind.KEYED_FULL
            entries.append(StateEntry(sub, kind, f"s{i:x}",
                                      SegmentHandle(rel, SEGMENT, 2 * SEGMENT, f"u{i:x}", scope),
                                      1, (0, 127)))
        references += len(entries)
        cp = 100 + k
        (base / f"chk-{cp}").mkdir(parents=True, exist_ok=True)
        (base / f"chk-{cp}" / "_metadata").write_bytes(
            encode_metadata(cp, JOB, False, tuple(entries), ())
        )
    return Planted(
        files=data + CHECKPOINTS,
        orphans=n_orphans,
        pending=n_pending,
        references=references,
        checkpoints=CHECKPOINTS,
        live_bytes=n_referenced * 2 * SEGMENT,
    )
