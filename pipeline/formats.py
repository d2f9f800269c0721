"""Which checkpoint format a directory holds (issue 32 finding 10, issue 33).

ckpt-ownership's own job base holds ``chk-N/_metadata`` in our format. Flink's and
Spark's checkpoint directories are recognised by what those engines write
(``/work/shared/FORMATS.md``): a Flink ``_metadata`` starts with the magic int
``0x4960672D``, and a Flink job folder is named by its 32-hex-digit job id; a Spark
checkpoint location holds a ``metadata`` file beside ``offsets/``, ``commits/`` or
``state/``. Looked for in the directory given and one level down (Flink's
``execution.checkpointing.dir`` holds one ``<job-id>/`` folder per job).
"""

from __future__ import annotations

import re
import struct

from pipeline import scan
from pipeline.location import Location
from pipeline.names import shown
from pipeline.safe_read import Refused, read_head

FLINK_MAGIC = 0x4960672D
SPARK_DIRS = frozenset({"offsets", "commits", "state"})
NOT_YET = "audit it with --format {fmt} (or --format auto, the default)"
JOB_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_LOOK = 200
"""Folders looked into one level down: enough to name the format, bounded on a huge tree."""


def recognise(loc: Location) -> str | None:
    """A sentence naming the foreign checkpoint format found under the job base, or
    ``None`` when it is neither Flink's nor Spark's."""
    found = detect(loc)
    return None if found is None else f"{found[1]}: {NOT_YET.format(fmt=found[0])}"


def detect(loc: Location) -> tuple[str, str] | None:
    """(``flink`` or ``spark``, a sentence saying what was recognised where), or ``None``."""
    top = loc.job_dir
    spark = _spark(loc, top)
    if spark is not None:
        return "spark", spark
    below = sorted(f"{top}/{n}" for n, is_dir, _r in scan.entries(loc, top) if is_dir)
    for place in [top, *below[:MAX_LOOK]]:
        found = _flink(loc, place)
        if found is not None:
            return "flink", found
    for place in [top, *below[:MAX_LOOK]]:
        if JOB_ID.match(place.rsplit("/", 1)[-1]) and _flink_layout(loc, place):
            return "flink", (f"{shown(loc.uri())} is a Flink checkpoint directory "
                             f"({shown(loc.uri(place))} is a Flink job folder, named by its "
                             f"job id, with no completed checkpoint)")
    return None


def _flink_layout(loc: Location, place: str) -> bool:
    names = {n for n, is_dir, _r in scan.entries(loc, place) if is_dir}
    return bool(names & {"shared", "taskowned"}) or any(
        scan.CHECKPOINT_DIR.match(n) for n in names)


def _flink(loc: Location, place: str) -> str | None:
    for name, is_dir, _row in scan.entries(loc, place):
        if not (is_dir and scan.CHECKPOINT_DIR.match(name)):
            continue
        rel = f"{place}/{name}/_metadata"
        if _starts_with_flink_magic(loc, rel):
            return (f"{shown(loc.uri())} is a Flink checkpoint directory "
                    f"({shown(loc.uri(rel))} is in Flink's binary format, magic "
                    f"0x{FLINK_MAGIC:08X})")
    return None


def _starts_with_flink_magic(loc: Location, rel: str) -> bool:
    try:
        head = read_head(loc, rel, 4)
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
                f"holds {held})")
    return None


def nothing_read(loc: Location, files: int, corrupt: int) -> str:
    """What a run that read no checkpoint and recognised no format found and expected."""
    unreadable = f", {corrupt} _metadata that do not read" if corrupt else ""
    return (f"no checkpoint recognised in {shown(loc.uri())}: {files} file(s){unreadable}, "
            "no chk-N/_metadata this audit reads; expected a job base written by "
            "ckpt-ownership (chk-N/_metadata beside shared/ and taskowned/)")
