"""The model's observation: what it shows of itself, in spec vocabulary."""

from __future__ import annotations

from refimpl.state import ModelState, TmStatus
from spec.effects import COORDINATOR, tm_actor
from spec.handles import FileHandle
from spec.observation import Observation, RegistryView, RetainedView

METADATA_SUFFIX = "/_metadata"


def observe(s: ModelState) -> Observation:
    alive = (
        {t for t in s.placement.values() if s.tms[t].status is TmStatus.ALIVE}
        if s.running
        else set()
    )
    claims: dict[str, set[str]] = {}

    def claim(path: str, party: str) -> None:
        claims.setdefault(path, set()).add(party)

    ref_counts: dict[str, int] = {}
    live: dict[str, list[tuple[int, int]]] = {}
    pool_files: set[str] = set()
    for (tm, path), pf in s.pfiles.items():
        if tm in alive:
            claim(path, tm_actor(tm))
            ref_counts[path] = pf.ref_count
    for (tm, _lid), seg in s.segs.items():
        if tm in alive:
            live.setdefault(seg.path, []).append((seg.offset, seg.length))
    for key, path in s.pools.items():
        if key[0] in alive:
            pool_files.add(path)
    for (tm, _sub, _cp), entries in s.outputs.items():
        if tm in alive:
            for e in entries:
                if isinstance(e.handle, FileHandle):
                    claim(e.handle.path, tm_actor(tm))
    if s.running:
        for reg in s.registry.values():
            if reg.owned and not reg.key.startswith("dir:"):
                claim(reg.path, COORDINATOR)
        for p in s.pending.values():
            for path in p.received:
                claim(path, COORDINATOR)
        for r in s.retained:
            claim(r.metadata, COORDINATOR)
    retained = tuple(
        RetainedView(r.id, r.job, r.metadata, r.entries, r.directories) for r in s.retained
    )
    return Observation(
        files={p: f.size for p, f in s.files.items()},
        open_files=frozenset(p for p, f in s.files.items() if f.open),
        directories=dict(s.dir_owner),
        owners={p: f.owner for p, f in s.files.items()},
        claims={p: frozenset(v) for p, v in claims.items()},
        retained=retained,
        restoring=s.restoring,
        ref_counts=ref_counts,
        live_segments={p: tuple(sorted(v)) for p, v in live.items()},
        registry={k: RegistryView(r.path, r.refs, r.owned) for k, r in s.registry.items()},
        deletions=s.deletions,
        pending_deletes=tuple(d.path for d in s.deferred),
        pool_files=frozenset(pool_files),
        metadata_files=frozenset(p for p in s.files if p.endswith(METADATA_SUFFIX)),
        live_parties=frozenset({COORDINATOR} | {tm_actor(t) for t in alive}),
    )
