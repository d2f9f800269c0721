"""The counting of ``make bench-peers`` (``bench.peers``): files and bytes per checkpoint from
listings of a checkpoint directory, and the space amplification from what the latest
checkpoint's metadata refers to. Pure functions on plain data (a listing is ``{relative path:
size}``), so that the Flink side (``bench/peers_flink.py``, in ``.venv-flink``) only lists and
loads, and the same arithmetic is tested without Flink."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Listing = Mapping[str, int]
"""A checkpoint directory's state files (its ``_metadata`` apart): relative path to bytes."""

FILE_TYPES = ("FileStateHandle", "RelativeFileStateHandle", "SegmentFileStateHandle")
"""Flink's handle types that name a file of their own; inline bytes live in ``_metadata``,
which no listing here counts (as ``ckpt``'s samples leave its own ``_metadata`` out)."""


def created_per_checkpoint(
    listings: Sequence[Listing], ids: Sequence[int] | None = None
) -> float | None:
    """The mean number of files each checkpoint created, from the second on: the files of a
    listing that the listing before it did not hold. The first checkpoint is left out, as it
    creates every subtask's first files (``bench.stream_scale`` leaves out the same one). A file
    created and deleted between two listings is not seen; one that a checkpoint still in
    flight created goes to the next listing that holds it, so the mean over the run stands.
    ``ids``, the checkpoint id of each listing, divide by the checkpoints taken between the
    first and the last listing, where a listing was missed (two completed between polls)."""
    if len(listings) < 2:
        return None
    fresh = [len(b.keys() - a.keys()) for a, b in itertools.pairwise(listings)]
    if ids is None:
        return statistics.fmean(fresh)
    if len(ids) != len(listings) or ids[-1] <= ids[0]:
        raise ValueError(f"checkpoint ids {list(ids)} do not fit {len(listings)} listings")
    return sum(fresh) / (ids[-1] - ids[0])


def held_at_end(at_completion: Listing, before_next: Listing) -> int:
    """The bytes storage holds for the latest checkpoint: the files listed as it completed
    that were still there when the next one was triggered (the subsumed checkpoint's files
    deleted meanwhile are gone), at their size when it completed (a file kept open across
    checkpoints grows with the next one's segments; a file new since is the next one's)."""
    return sum(size for path, size in at_completion.items() if path in before_next)


def relative(path: str, root: str) -> str | None:
    """A handle's path relative to the checkpoint directory ``root`` (a URI or a path, as
    Flink writes it: ``file:/x`` or ``file:///x``), or None if it is elsewhere."""
    for prefix in (root, "file:" + root, "file://" + root):
        if path.startswith(prefix.rstrip("/") + "/"):
            return path[len(prefix.rstrip("/")) + 1 :]
    return None


@dataclass(frozen=True)
class Referenced:
    """What one checkpoint's metadata refers to in files of the checkpoint directory."""

    bytes: int
    """Each referred range once (a segment, or a whole file without merging)."""
    files: frozenset[str]
    elsewhere: int
    """Handles naming a file outside the directory (none expected: no savepoint restored)."""


def referenced(handles: Iterable[Mapping[str, Any]], root: str) -> Referenced:
    """Flink's handles of one ``_metadata`` (``FlinkTruthDump``'s records: type, path,
    offset, length) as the bytes and files they refer to."""
    ranges: set[tuple[str, int, int]] = set()
    elsewhere = 0
    for h in handles:
        if h.get("type") not in FILE_TYPES or h.get("path") is None:
            continue
        rel = relative(str(h["path"]), root)
        if rel is None:
            elsewhere += 1
            continue
        ranges.add((rel, int(h["offset"]), int(h["length"])))
    return Referenced(
        sum(length for _p, _o, length in ranges), frozenset(p for p, _o, _l in ranges), elsewhere
    )


@dataclass(frozen=True)
class Counted:
    """One row's figures, each None where it cannot be told (the note says why)."""

    checkpoints: int
    files_per_checkpoint: float | None
    bytes_per_checkpoint: float | None
    amplification_end: float | None
    note: str = ""


def count_flink(
    listings: Sequence[Listing],
    ids: Sequence[int],
    before_next: Listing | None,
    checkpoints: int,
    handles: Iterable[Mapping[str, Any]] | None,
    root: str,
) -> Counted:
    """A Flink run's row: ``listings`` as each observed checkpoint completed (the last one
    the latest; ``ids`` their checkpoint ids), ``before_next`` as the next one was triggered
    (None if that was not seen: the last listing stands in, and the note says so),
    ``checkpoints`` the latest's id, ``handles`` its metadata's (None if it could not be
    loaded: no amplification)."""
    notes: list[str] = []
    if not listings:
        return Counted(checkpoints, None, None, None, "no checkpoint completed")
    last = listings[-1]
    if before_next is None:
        before_next = last
        notes.append("the next trigger was not seen: bytes held as the latest completed")
    held = held_at_end(last, before_next)
    amp: float | None = None
    if handles is None:
        notes.append("amplification n/a: the latest _metadata was not loaded")
    else:
        ref = referenced(handles, root)
        missing = ref.files - last.keys()
        if ref.elsewhere or missing:
            notes.append(
                f"amplification n/a: {len(missing)} referenced file(s) not listed,"
                f" {ref.elsewhere} outside the directory"
            )
        elif ref.bytes:
            amp = held / ref.bytes
    per = held / checkpoints if checkpoints else None
    return Counted(checkpoints, created_per_checkpoint(listings, ids), per, amp, "; ".join(notes))
