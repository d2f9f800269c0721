"""Rescaling: which restored state each new subtask gets (R75, R76; FLIP-8).

Keyed state follows key-group ranges; operator list and channel state are split evenly
over the new subtasks in contiguous runs of entries; union list state goes whole to every
subtask. With an unchanged parallelism every subtask gets exactly its own state back.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import evolve

from spec.config import StateKind, VertexSpec
from spec.handles import StateEntry
from spec.ids import SubtaskId
from spec.keygroups import even_split, key_group_range, ranges_overlap


def _slice(e: StateEntry) -> tuple[int, int]:
    return e.entry_range if e.entry_range is not None else (0, e.entries)


def redistribute(
    entries: Sequence[StateEntry], vertices: Sequence[VertexSpec], max_parallelism: int
) -> dict[SubtaskId, list[StateEntry]]:
    out: dict[SubtaskId, list[StateEntry]] = {}
    for v in vertices:
        new = [SubtaskId(v.name, i, v.parallelism) for i in range(v.parallelism)]
        for s in new:
            out[s] = []
        old = [e for e in entries if e.subtask.vertex == v.name]
        if not old:
            continue
        if all(e.subtask.parallelism == v.parallelism for e in old):
            for e in old:  # R76: unchanged parallelism keeps the assignment
                out[SubtaskId(v.name, e.subtask.index, v.parallelism)].append(e)
            continue
        ordered = sorted(old, key=lambda e: e.subtask.index)
        for s in new:
            mine = key_group_range(max_parallelism, v.parallelism, s.index)
            for e in ordered:
                if e.kind.keyed and e.key_groups is not None and ranges_overlap(e.key_groups, mine):
                    out[s].append(evolve(e, subtask=s))  # R75
                elif e.kind is StateKind.OPERATOR_UNION:
                    out[s].append(evolve(e, subtask=s))
        groups: dict[tuple[StateKind, str], list[StateEntry]] = {}
        for e in ordered:
            if e.kind in (StateKind.OPERATOR_LIST, StateKind.CHANNEL):
                groups.setdefault((e.kind, e.name), []).append(e)
        for group in groups.values():
            # flatten the list elements in old-subtask order, then cut in even runs
            pieces = [(e, _slice(e)) for e in group]
            total = sum(b - a for _, (a, b) in pieces)
            for s, (lo, hi) in zip(new, even_split(total, len(new)), strict=True):
                pos = 0
                for e, (a, b) in pieces:
                    n = b - a
                    start, end = max(lo, pos), min(hi, pos + n)
                    if start < end:
                        rng = (a + start - pos, a + end - pos)
                        out[s].append(evolve(e, subtask=s, entry_range=rng))
                    pos += n
    return out
