"""The ``_metadata`` file of a completed checkpoint or savepoint (R51, R55).

JSON, written atomically by ``Storage.write_metadata``. Its byte size differs from the
reference model's (which counts entries); the lockstep test compares metadata files by
existence only, and every data file by exact size.
"""

from __future__ import annotations

import json

from spec.handles import FileHandle, SegmentHandle, StateEntry


def metadata_bytes(
    checkpoint: int,
    job: str,
    savepoint: bool,
    entries: tuple[StateEntry, ...],
    directories: tuple[str, ...],
) -> bytes:
    """A completed checkpoint's metadata: what a restart or restore needs to know."""
    doc = {
        "checkpoint": checkpoint,
        "job": job,
        "savepoint": savepoint,
        "directories": list(directories),
        "entries": [
            {
                "subtask": [e.subtask.vertex, e.subtask.index, e.subtask.parallelism],
                "kind": e.kind.value,
                "name": e.name,
                "handle": _handle_doc(e.handle),
                "entries": e.entries,
                "key_groups": e.key_groups,
                "entry_range": e.entry_range,
            }
            for e in entries
        ],
    }
    return json.dumps(doc, sort_keys=True).encode()


def _handle_doc(h: object) -> dict[str, object]:
    if isinstance(h, SegmentHandle):
        return {
            "type": "segment",
            "path": h.path,
            "offset": h.offset,
            "length": h.length,
            "id": h.logical_id,
            "scope": h.scope.value,
        }
    if isinstance(h, FileHandle):
        return {
            "type": "file",
            "path": h.path,
            "length": h.length,
            "id": h.logical_id,
            "scope": h.scope.value,
        }
    return {"type": type(h).__name__}
