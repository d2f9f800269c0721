"""The model's observation: what it shows of itself, in spec vocabulary."""

from __future__ import annotations

from refimpl.state import ModelState, TmStatus
from spec.effects import COORDINATOR, tm_actor
from spec.handles import FileHandle
from spec.observation import (
    Observation,
    RegistryView,
    RetainedView,
    WorkingFileView,
    WorkingObservation,
)

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


def _db_name(tm: str, subtask: object) -> str:
    return f"{subtask}@{tm_actor(tm)}"


def observe_working(s: ModelState) -> WorkingObservation:
    """The model's working files (§11): owner, state, the live databases that use each and
    the checkpoints that refer to it in place."""
    live = {
        (t, sub): uses
        for (t, sub), uses in s.dbs.items()
        if s.running and s.placement.get(sub) == t and s.tms[t].status is TmStatus.ALIVE
    }
    refs: dict[str, set[int]] = {}
    for r in s.retained:
        for _, path in r.working:
            refs.setdefault(path, set()).add(r.id)
    for p in s.pending.values():
        for paths in p.working.values():
            for path in paths:
                refs.setdefault(path, set()).add(p.id)
    pinned = {path for paths in s.wout.values() for path in paths}
    files = {}
    for path, wf in s.wfiles.items():
        if path not in s.files:
            continue
        state = "shared" if wf.shared else "pinned" if path in pinned else "private"
        files[path] = WorkingFileView(
            owner=s.files[path].owner,
            state=state,
            users=frozenset(_db_name(t, sub) for (t, sub), uses in live.items() if path in uses),
            refs=frozenset(refs.get(path, ())),
        )
    return WorkingObservation(
        files=files,
        uses={_db_name(t, sub): uses for (t, sub), uses in live.items()},
        retained={r.id: frozenset(p for _, p in r.working) for r in s.retained},
        operators={_db_name(t, sub): sub.vertex for (t, sub) in live},
    )
