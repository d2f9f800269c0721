"""Which restored state each new subtask gets (R75, R76), from spec.keygroups alone."""

from __future__ import annotations

from collections.abc import Sequence

from spec.config import StateKind, VertexSpec
from spec.handles import StateEntry
from spec.ids import SubtaskId
from spec.keygroups import even_split, key_group_range, ranges_overlap

_SPLIT = (StateKind.OPERATOR_LIST, StateKind.CHANNEL)


def _moved(e: StateEntry, to: SubtaskId, entry_range: tuple[int, int] | None) -> StateEntry:
    return StateEntry(to, e.kind, e.name, e.handle, e.entries, e.key_groups, entry_range)


def assign(
    entries: Sequence[StateEntry], vertices: Sequence[VertexSpec], max_parallelism: int
) -> dict[SubtaskId, list[StateEntry]]:
    by_vertex: dict[str, list[StateEntry]] = {}
    for e in entries:
        by_vertex.setdefault(e.subtask.vertex, []).append(e)
    out: dict[SubtaskId, list[StateEntry]] = {}
    for v in vertices:
        p = v.parallelism
        new = [SubtaskId(v.name, i, p) for i in range(p)]
        for s in new:
            out[s] = []
        old = by_vertex.get(v.name, [])
        if not old:
            continue
        if all(e.subtask.parallelism == p for e in old):
            # R76: with unchanged parallelism every subtask gets exactly its own state
            for e in old:
                out[new[e.subtask.index]].append(e)
            continue
        old.sort(key=lambda e: e.subtask.index)  # stable: keeps order within a subtask
        for s in new:
            mine = key_group_range(max_parallelism, p, s.index)
            for e in old:
                if e.kind.keyed and e.key_groups is not None:
                    if ranges_overlap(e.key_groups, mine):  # R75
                        out[s].append(_moved(e, s, e.entry_range))
                elif e.kind is StateKind.OPERATOR_UNION:
                    out[s].append(_moved(e, s, e.entry_range))  # R76: union goes whole
        groups: dict[tuple[StateKind, str], list[StateEntry]] = {}
        for e in old:
            if e.kind in _SPLIT:
                groups.setdefault((e.kind, e.name), []).append(e)
        for group in groups.values():
            # R76: the elements in old-subtask order, cut in contiguous even runs
            spans = [e.entry_range or (0, e.entries) for e in group]
            total = sum(b - a for a, b in spans)
            for s, (lo, hi) in zip(new, even_split(total, p), strict=True):
                pos = 0
                for e, (a, b) in zip(group, spans, strict=True):
                    start, end = max(lo, pos), min(hi, pos + b - a)
                    if start < end:
                        out[s].append(_moved(e, s, (a + start - pos, a + end - pos)))
                    pos += b - a
    return out
