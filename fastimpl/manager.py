"""One TM's file-merging tables: segments, physical files, pools (FLIP-306 §4).

Segments are bucketed by ``last_used`` so that a subsume with watermark k visits only
the buckets <= k: discarding costs in proportion to what is discarded, not to
everything tracked. The storage calls that follow (closing, deleting) are the
cluster's; this class holds the bookkeeping only.
"""

from __future__ import annotations

from fastimpl.records import PFile, PoolKey, Seg


class Manager:
    __slots__ = ("by_created", "by_last_used", "pfiles", "pools", "segs")

    def __init__(self) -> None:
        self.segs: dict[str, Seg] = {}
        self.pfiles: dict[str, PFile] = {}
        self.pools: dict[PoolKey, str] = {}
        self.by_last_used: dict[int, set[str]] = {}
        self.by_created: dict[int, set[str]] = {}

    def add(self, seg: Seg) -> None:
        self.segs[seg.logical_id] = seg
        self.by_last_used.setdefault(seg.last_used, set()).add(seg.logical_id)
        self.by_created.setdefault(seg.created_for, set()).add(seg.logical_id)

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
            self._unbucket(self.by_created, seg.created_for, lid)
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
        """Logical ids of the segments created for ``checkpoint`` not used later, sorted."""
        return sorted(
            lid
            for lid in self.by_created.get(checkpoint, ())
            if self.segs[lid].last_used <= checkpoint
        )
