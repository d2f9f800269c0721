"""One observation of a job built from what its parties report (``spec.observation``).

Each party keeps its own records and never reads another's: the coordinator its catalog
and registry, each TM attempt its catalog and file-merging tables. What a TM reports of
them is a plain value (``TmReport``, with a JSON codec, so a TM in another process can
send it over a pipe); ``observe`` merges the coordinator's records with the reports of
the TMs into the ``Observation`` that the invariants (I1-I6) judge and the model's is
compared with. The in-process engine, the process harness and the Spark job all build
their observation here.

A path two parties record with different owners is a disagreement: returned beside the
observation, never hidden by it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from fastimpl.records import Status
from spec.effects import COORDINATOR, USER, tm_actor
from spec.errors import UsageError
from spec.handles import FileHandle
from spec.ids import TmId
from spec.layout import METADATA
from spec.observation import DeletionRecord, Observation, RetainedView

if TYPE_CHECKING:
    from fastimpl.catalog import Catalog
    from fastimpl.coordinator import CheckpointCoordinator
    from fastimpl.taskmanager import TaskManager

REPORT_VERSION = 1


@attrs.frozen
class TmReport:
    """What one TM attempt's records say (its own; nobody else's)."""

    tm: TmId
    owners: Mapping[str, str]
    """Every file it records, with its owner."""
    open: tuple[str, ...]
    dirs: Mapping[str, str]
    """Every managed directory it records, with its owner."""
    unrecorded_dirs: tuple[str, ...]
    """Directories it owns with no record of them (never expected)."""
    claims: Mapping[str, str]
    """Files its tables claim (pool files and unacknowledged whole files)."""
    ref_counts: Mapping[str, int]
    live: Mapping[str, tuple[tuple[int, int], ...]]
    """Live segments by file: (offset, length)."""
    pool_files: tuple[str, ...]
    deletions: tuple[DeletionRecord, ...]
    pending: tuple[str, ...]
    refused: tuple[str, ...]

    def to_json(self) -> str:
        doc = attrs.asdict(self, recurse=True)
        doc["deletions"] = [attrs.asdict(d) for d in self.deletions]
        return json.dumps({"version": REPORT_VERSION, "report": doc}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TmReport:
        """The report ``to_json`` wrote; ``ValueError`` naming what is wrong otherwise."""
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != REPORT_VERSION:
            raise UsageError(f"not a TM report of version {REPORT_VERSION}")
        r: dict[str, Any] = doc["report"]
        return cls(
            tm=str(r["tm"]),
            owners=dict(r["owners"]),
            open=tuple(r["open"]),
            dirs=dict(r["dirs"]),
            unrecorded_dirs=tuple(r["unrecorded_dirs"]),
            claims=dict(r["claims"]),
            ref_counts={str(k): int(v) for k, v in r["ref_counts"].items()},
            live={p: tuple((int(o), int(n)) for o, n in v) for p, v in r["live"].items()},
            pool_files=tuple(r["pool_files"]),
            deletions=tuple(DeletionRecord(**d) for d in r["deletions"]),
            pending=tuple(r["pending"]),
            refused=tuple(r["refused"]),
        )


def unrecorded_dirs(cat: Catalog) -> list[str]:
    """The directories a party owns with no ``ManagedDir`` for them. Every writer of such
    an owner records the directory too (its creator, which R64 reads when it is deleted,
    and whether it was handed over): ``Catalog.delete_dir`` reads the record of every
    owned directory it deletes. None is ever expected. The user's directories are left
    out: ``resume.rebuild`` marks one outside the lineage as the user's with no record,
    and the guard refuses to delete it (I5) before a record is read."""
    return sorted(d for d, o in cat.dir_owner.items() if o != USER and d not in cat.dirs)


def report_of(tm: TaskManager) -> TmReport:
    """What ``tm``'s own records say, after its queued deletes ran."""
    cat = tm.catalog
    cat.storage.drain()
    actor = tm_actor(tm.tm)
    claims: dict[str, str] = {p: actor for p in tm.m.pfiles}
    for entries in tm.outputs.values():
        for e in entries:
            if isinstance(e.handle, FileHandle):
                claims[e.handle.path] = actor
    live: dict[str, list[tuple[int, int]]] = {}
    for seg in tm.m.segs.values():
        live.setdefault(seg.path, []).append((seg.offset, seg.length))
    return TmReport(
        tm=tm.tm,
        owners=cat.owners(),
        open=tuple(sorted(p for p, f in cat.files.items() if f.open)),
        dirs=dict(cat.dir_owner),
        unrecorded_dirs=tuple(unrecorded_dirs(cat)),
        claims=claims,
        ref_counts={p: pf.ref_count for p, pf in tm.m.pfiles.items()},
        live={p: tuple(v) for p, v in live.items()},
        pool_files=tuple(sorted(tm.m.pools.values())),
        deletions=tuple(cat.deletions or ()),
        pending=(*(d.path for d in cat.deferred), *sorted(cat.storage.failed_deletes)),
        refused=tuple(r.path for r in cat.refused_deletes),
    )


def _on_storage(path: str, on_storage: Mapping[str, int]) -> bool:
    """Whether ``path`` is a file on storage, or a directory with one in it."""
    if path in on_storage:
        return True
    below = path.rstrip("/") + "/"
    return any(p.startswith(below) for p in on_storage)


def _attempt_order(tm: TmId) -> tuple[int, str]:
    """Attempts in the order an engine started them (``tm-<n>``), others by name."""
    head, _, n = tm.rpartition("-")
    return (int(n), head) if n.isdigit() else (0, tm)


def observe(
    coord: CheckpointCoordinator,
    reports: Mapping[TmId, TmReport],
    on_storage: Mapping[str, int],
    *,
    orphans: Mapping[str, str] | None = None,
    deletions: Iterable[DeletionRecord] | None = None,
) -> tuple[Observation, list[str]]:
    """The job's observation: ``on_storage`` (what a listing found), the coordinator's
    records and the TMs' ``reports``, merged; and the disagreements between them.

    A lost attempt's records of what a failover handed to a newer attempt are stale (R61,
    R64): the live parties' records come first, then the lost ones' from the newest
    attempt back (a failover hands files from older attempts to newer ones, never back).
    Only live parties' tables claim files, as the model observes. ``orphans``: files the
    host knows a killed attempt left with no record of any live party, and whose they are
    (R65). ``deletions``: the job's deletion log in the order the deletes happened, if
    the host keeps one across parties; else each party's log, the coordinator's first."""
    cat = coord.catalog
    disagree = [f"dir {d}: the coordinator owns it with no record" for d in unrecorded_dirs(cat)]
    owners: dict[str, str] = dict(cat.owners())
    directories: dict[str, str] = dict(cat.dir_owner)
    claims: dict[str, set[str]] = {}
    ref_counts: dict[str, int] = {}
    live: dict[str, list[tuple[int, int]]] = {}
    pool_files: set[str] = set()
    open_files = {p for p, f in cat.files.items() if f.open}
    log = list(cat.deletions or ()) if deletions is None else list(deletions)
    pending = [d.path for d in cat.deferred] + sorted(cat.storage.failed_deletes)
    refused = [r.path for r in cat.refused_deletes]
    placed = set(coord.placement.values()) if coord.running else set()
    lost = {
        t
        for t in reports
        if t not in placed or t not in coord.tms or coord.tms[t].status is not Status.ALIVE
    }
    order = sorted(reports, key=lambda t: (t in lost, -_attempt_order(t)[0]))
    for tm in order:
        r = reports[tm]
        for path, owner in r.owners.items():
            if tm in lost and path not in on_storage and path not in r.open:
                continue  # R61, R64: taken over and deleted since; its record is stale
            if owners.setdefault(path, owner) != owner and tm not in lost:
                disagree.append(f"{path}: coordinator says {owners[path]}, {tm} says {owner}")
        for path, owner in r.dirs.items():
            if tm in lost and path not in directories and not cat.storage.exists_dir(path):
                continue  # a lost attempt's record of a directory a failover handed over
                # and its new owner deleted since (R61, R63): stale, as its file records are
            theirs = directories.setdefault(path, owner)
            if theirs == COORDINATOR and owner == tm_actor(tm):
                continue  # R42: handed over at the complete; the TM learns it from the notice
            if owner != theirs and tm not in lost:
                disagree.append(f"dir {path}: coordinator says {theirs}, {tm} says {owner}")
        disagree += [f"dir {d}: {tm} owns it with no record" for d in r.unrecorded_dirs]
        open_files |= set(r.open)
        if deletions is None:
            log += r.deletions
        if tm in lost:
            # R64: a lost attempt still waits on deletes of files it made that the
            # coordinator took over meanwhile and deleted (R61): a wait on nothing
            pending += [p for p in r.pending if _on_storage(p, on_storage)]
        else:
            pending += r.pending
        refused += r.refused
        if tm in lost:
            continue
        for path, actor in r.claims.items():
            claims.setdefault(path, set()).add(actor)
        ref_counts.update(r.ref_counts)
        for path, extents in r.live.items():
            live.setdefault(path, []).extend(extents)
        pool_files |= set(r.pool_files)
    for path, owner in list(directories.items()):
        # R41: a live TM deleted a directory of its own; the coordinator's copy of the
        # record goes at the TM's next acknowledgement, which no longer reports it (R40)
        holder = owner[3:] if owner.startswith("tm:") else None
        if holder is not None and holder in reports and path not in reports[holder].dirs:
            del directories[path]
    for path, owner in (orphans or {}).items():
        if path in on_storage:
            owners.setdefault(path, owner)
    for path in coord.claimed():
        claims.setdefault(path, set()).add(COORDINATOR)
    alive = {t for t in reports if t not in lost}
    obs = Observation(
        files=on_storage,
        open_files=frozenset(open_files),
        directories=directories,
        owners=owners,
        claims={p: frozenset(v) for p, v in claims.items()},
        retained=tuple(
            RetainedView(r.id, r.job, r.metadata, r.entries, r.directories) for r in coord.retained
        ),
        restoring=coord.restoring,
        ref_counts=ref_counts,
        live_segments={p: tuple(sorted(v)) for p, v in live.items()},
        registry=coord.registry.view(coord.retained),
        deletions=tuple(log),
        pending_deletes=tuple(dict.fromkeys(pending)),  # R45: each waiting path once
        pool_files=frozenset(pool_files),
        metadata_files=frozenset(p for p in on_storage if p.endswith("/" + METADATA)),
        live_parties=frozenset({COORDINATOR} | {tm_actor(t) for t in alive}),
    )
    return obs, disagree + [f"refused delete of {p}" for p in refused]
