"""What the in-process parties record, observed as one job (``spec.observation``): the
coordinator's records and each TM attempt's report merged over a listing of storage
(``fastimpl.reports.observe``, as every host merges them), and the working files
(§11) as the parties record them. The in-process engine, its traces and the tests judge
the invariants on these; the parties never read each other's records.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastimpl.catalog import RefusedDelete
from fastimpl.coordinator import CheckpointCoordinator
from fastimpl.records import Status
from fastimpl.reports import observe as observe_parties
from fastimpl.reports import report_of
from fastimpl.storage import Storage
from fastimpl.taskmanager import TaskManager
from fastimpl.working import is_working_path
from spec.effects import USER, tm_actor
from spec.ids import TmId
from spec.observation import Observation, WorkingFileView, WorkingObservation


def observe_working(
    coord: CheckpointCoordinator, parties: Mapping[TmId, TaskManager], seen: Observation
) -> WorkingObservation:
    """The working files (§11) as the parties record them: each one's owner, state
    (R100), live users and in-place references, every live database's files and
    operator, and every retained checkpoint's in-place files; what I6 and I7 judge
    beside ``observe``. ``seen``: the observation since the last command (``observe``),
    whose files and owners are judged: the caller's own, since a listing costs a request
    per prefix on an object store, and the storage walk most of an observation."""
    live: dict[str, set[str]] = {}
    operators: dict[str, str] = {}
    pinned: set[str] = set()
    if coord.is_running():
        for sub, tm in sorted(coord.placement.items()):
            if coord.tms[tm].status is not Status.ALIVE:
                continue
            dbs = parties[tm].working
            name = f"{sub}@{tm_actor(tm)}"
            live[name] = set(dbs.uses.get(sub, ()))
            operators[name] = sub.vertex
    # Every attempt's unacknowledged snapshots pin (R103), a lost one's too until it
    # stopped: its files stay its own and private only once it drops them (R106)
    for party in parties.values():
        pinned |= {p for paths in party.working.pins.values() for p in paths}
    refs: dict[str, set[int]] = {}
    for r in coord.retained:
        for _, w in r.working:
            refs.setdefault(w.path, set()).add(r.id)
    for pend in coord.pending.values():
        for ws in pend.working.values():
            for w in ws:
                refs.setdefault(w.path, set()).add(pend.id)
    obs = seen
    owners = obs.owners  # every party's records, merged
    shared = coord.working.shared
    files: dict[str, WorkingFileView] = {}
    for path in sorted(obs.files):
        if not is_working_path(path) or path not in owners:
            continue
        if obs.files.get(path) == 0:
            # R100, R101: a working file is written whole, at least one byte, before
            # anything uses it. A file of no bytes here is what a write whose append
            # failed left when its clean-up delete failed too: its attempt's file with
            # a pending delete (R45, in ``observe``), never a working file, whoever
            # owns it by the time the delete is retried.
            continue
        owner = owners[path]
        if path in shared or owner == USER:  # handed over by an acknowledgement (R100)
            state = "shared"
        else:
            state = "pinned" if path in pinned else "private"
        files[path] = WorkingFileView(
            owner=owner,
            state=state,
            users=frozenset(db for db, paths in live.items() if path in paths),
            refs=frozenset(refs.get(path, ())),
        )
    return WorkingObservation(
        files=files,
        uses={db: frozenset(paths) for db, paths in live.items()},
        retained={r.id: frozenset(w.path for _, w in r.working) for r in coord.retained},
        operators=operators,
    )


def observe(
    coord: CheckpointCoordinator, parties: Mapping[TmId, TaskManager], storage: Storage
) -> tuple[Observation, list[str]]:
    """The real files on storage, and the bookkeeping that decides who deletes them:
    the coordinator's records and each TM attempt's report, merged as every host
    merges them (``fastimpl.reports``), over one deletion log in the order the
    deletes ran; and what the parties' records disagree on (an error:
    ``fastimpl.testing.check_invariants`` reports it), a delete a guard refused
    apart (I5 reports that)."""
    catalog = coord.catalog
    reports = {tm: report_of(party) for tm, party in parties.items()}
    obs, found = observe_parties(
        coord,
        reports,
        storage.list_files(),
        deletions=catalog.bad_deletions if catalog.deletions is None else catalog.deletions,
    )
    refused = {f"refused delete of {r.path}" for r in refused_deletes(coord, parties)}
    return obs, [d for d in found if d not in refused]


def refused_deletes(
    coord: CheckpointCoordinator, parties: Mapping[TmId, TaskManager]
) -> list[RefusedDelete]:
    """Every delete a party's guard refused before it happened (I5), the
    coordinator's first."""
    catalogs = [coord.catalog, *(parties[tm].catalog for tm in sorted(parties))]
    return [r for cat in catalogs for r in cat.refused_deletes]
