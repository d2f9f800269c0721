"""What a directory holds when the audit read no checkpoint in it (issue 32, finding 10).

The audit reads the ``chk-N/_metadata`` files ckpt-ownership writes. Pointed at a
directory it reads none in, it has checked nothing: every file would look unreferenced
(an orphan at ``--grace 0s``) and "clean" would be said of nothing. Such a run says what
it found instead. Flink's and Spark's own checkpoint directories are named as such
(``/work/shared/FORMATS.md``): a Flink ``_metadata`` starts with the magic int
``0x4960672D``; a Spark checkpoint location holds a ``metadata`` file beside ``offsets/``,
``commits/`` or ``state/``. Looked for in the directory given and one level down (Flink's
``execution.checkpointing.dir`` holds one ``<job-id>/`` folder per job; a folder of Spark
queries holds one location per query). Reading them is the next issue's work (33).
"""

from __future__ import annotations

import struct

from pipeline import scan
from pipeline.location import Location
from pipeline.names import shown
from pipeline.safe_read import Refused, read_regular

FLINK_MAGIC = 0x4960672D
SPARK_DIRS = frozenset({"offsets", "commits", "state"})
NOT_YET = "this audit does not read that format yet (issue 33 adds it)"
MAX_LOOK = 200
"""Folders looked into one level down: enough to name the format, bounded on a huge tree."""


def recognise(loc: Location) -> str | None:
    """A sentence naming the foreign checkpoint format found under the job base, or
    ``None`` when it is neither Flink's nor Spark's."""
    top = loc.job_dir
    below = sorted(f"{top}/{n}" for n, is_dir, _r in scan.entries(loc, top) if is_dir)
    for place in [top, *below[:MAX_LOOK]]:
        found = _flink(loc, place) or _spark(loc, place)
        if found is not None:
            return found
    return None


def _flink(loc: Location, place: str) -> str | None:
    for name, is_dir, _row in scan.entries(loc, place):
        if not (is_dir and scan.CHECKPOINT_DIR.match(name)):
            continue
        rel = f"{place}/{name}/_metadata"
        if _starts_with_flink_magic(loc, rel):
            return (f"{shown(loc.uri())} is a Flink checkpoint directory "
                    f"({shown(loc.uri(rel))} is in Flink's binary format, magic "
                    f"0x{FLINK_MAGIC:08X}): {NOT_YET}")
    return None


def _starts_with_flink_magic(loc: Location, rel: str) -> bool:
    try:
        head = read_regular(loc, rel)[:4]
    except (OSError, Refused):
        return False
    return len(head) == 4 and struct.unpack(">I", head)[0] == FLINK_MAGIC


def _spark(loc: Location, place: str) -> str | None:
    dirs: set[str] = set()
    has_metadata = False
    for name, is_dir, row in scan.entries(loc, place):
        if is_dir:
            dirs.add(name)
        elif name == "metadata" and not row[3]:
            has_metadata = True
    if has_metadata and dirs & SPARK_DIRS:
        held = ", ".join(["metadata", *(f"{d}/" for d in sorted(dirs & SPARK_DIRS))])
        return (f"{shown(loc.uri())} is a Spark checkpoint location ({shown(loc.uri(place))} "
                f"holds {held}): {NOT_YET}")
    return None


def nothing_read(loc: Location, files: int, corrupt: int) -> str:
    """What a run that read no checkpoint and recognised no format found and expected."""
    unreadable = f", {corrupt} _metadata that do not read" if corrupt else ""
    return (f"no checkpoint recognised in {shown(loc.uri())}: {files} file(s){unreadable}, "
            "no chk-N/_metadata this audit reads; expected a job base written by "
            "ckpt-ownership (chk-N/_metadata beside shared/ and taskowned/)")
