"""One TM's file-merging tables: segments, physical files, pools (FLIP-306 §4).

Segments are bucketed by ``last_used`` so that a subsume with watermark k visits only
the buckets <= k: discarding costs in proportion to what is discarded, not to
everything tracked. The storage calls that follow (closing, deleting) are the
cluster's; this class holds the bookkeeping only.

There is no second index by ``created_for``: ``created_for <= last_used`` always holds
(a segment starts with both equal, reuse only advances ``last_used``, a restored one
takes the first and the last retained checkpoint that use it), so the segments created
for checkpoint c and not used later are exactly those of bucket c created for c. One
index instead of two saves a set slot (about 33 bytes) per tracked segment.
"""

from __future__ import annotations

from fastimpl.records import PFile, PoolKey, Seg


class Manager:
    __slots__ = ("by_last_used", "pfiles", "pools", "segs")

    def __init__(self) -> None:
        self.segs: dict[str, Seg] = {}
        self.pfiles: dict[str, PFile] = {}
        self.pools: dict[PoolKey, str] = {}
        self.by_last_used: dict[int, set[str]] = {}

    def add(self, seg: Seg) -> None:
        self.segs[seg.logical_id] = seg
        self.by_last_used.setdefault(seg.last_used, set()).add(seg.logical_id)

    def touch(self, seg: Seg, last_used: int) -> None:
        """R21: reuse advances ``last_used``; the segment moves to its new bucket."""
        if last_used == seg.last_used:
            return
        self._unbucket(self.by_last_used, seg.last_used, seg.logical_id)
        seg.last_used = last_used
        self.by_last_used.setdefault(last_used, set()).add(seg.logical_id)

    def remove(self, lid: str) -> Seg | None:
        seg = self.segs.pop(lid, None)
        if seg is not None:
            self._unbucket(self.by_last_used, seg.last_used, lid)
        return seg

    @staticmethod
    def _unbucket(buckets: dict[int, set[str]], key: int, lid: str) -> None:
        b = buckets.get(key)
        if b is not None:
            b.discard(lid)
            if not b:
                del buckets[key]

    def used_up_to(self, watermark: int) -> list[str]:
        """Logical ids of the segments with ``last_used <= watermark``, sorted."""
        out: list[str] = []
        for k in [k for k in self.by_last_used if k <= watermark]:
            out.extend(self.by_last_used[k])
        out.sort()
        return out

    def created_for(self, checkpoint: int) -> list[str]:
        """Logical ids of the segments created for ``checkpoint`` not used later, sorted:
        those of bucket ``checkpoint`` (``created_for <= last_used``, see above)."""
        segs = self.segs
        return sorted(
            lid
            for lid in self.by_last_used.get(checkpoint, ())
            if segs[lid].created_for == checkpoint
        )
