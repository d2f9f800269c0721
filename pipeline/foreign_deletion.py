"""Deleting the orphans of a Flink or Spark checkpoint directory (issue 33): the guards of
``pipeline.deletion`` that do not depend on our writer, and the engine's own re-read.

Neither engine publishes a writer state, so nothing fences a live job's new files but
age: a grace period under one hour needs both ``--allow-short-grace`` and
``--no-live-writer``, and the 60 s hard floor holds whatever the flags. The whole run is
refused on an unreadable ``_metadata`` or commit, a dangling reference, or a path that
could not be listed. Just before deleting, the directory is read again with the same
reader (listing, every ``_metadata`` or the commit log and every snapshot's file list):
a shrunken or empty reference set refuses the run; a file referenced or held now (a Flink
checkpoint newly in flight, a Spark version newly stale) is kept; a Spark query that
committed a batch since the audit is running, and the run is refused. The plan is then
executed by ``pipeline.deletion.execute``: the same lock, write-ahead log and
descriptor-bound deletes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from pipeline import deletion
from pipeline.deletion import (
    DELETE,
    KEEP_ACTIVE,
    MIN_GRACE,
    DeletionRefused,
    Plan,
)
from pipeline.foreign import ForeignRead
from pipeline.location import Location
from pipeline.result import IN_FLIGHT, STALE, Row, Summary

Reread = Callable[[], tuple[ForeignRead, object]]
"""The reader again, and the format's marker of a live writer (Spark: the commit log's
newest entry; Flink: ``None``)."""

_WHY_HELD = {
    IN_FLIGHT: "written by a checkpoint in flight (read just now)",
    STALE: "the engine's own cleanup deletes it (read just now)",
}


def plan_foreign(
    loc: Location,
    summary: Summary,
    orphans: Iterable[Row],
    *,
    grace: float,
    reread: Reread,
    marker: object,
    allow_short_grace: bool = False,
    no_live_writer: bool = False,
    now: float | None = None,
    dangling: Iterable[Row] = (),
) -> Plan:
    now = time.time() if now is None else now
    if grace < MIN_GRACE and not allow_short_grace:
        raise DeletionRefused(
            f"grace period {grace:g} s is under one hour: a file a live job is still "
            "writing could be taken for an orphan; pass --allow-short-grace to allow it"
        )
    if grace < MIN_GRACE and not no_live_writer:
        raise DeletionRefused(
            f"{summary.format.capitalize()} publishes no writer state, so only age protects "
            "a live job's files and the grace period is under one hour; pass "
            "--no-live-writer if no job is running"
        )
    if summary.corrupt_metadata:
        raise DeletionRefused(
            f"{summary.corrupt_metadata} metadata file(s) cannot be read, so what they "
            "reference is unknown; nothing deleted (see the report)"
        )
    deletion.refuse_dangling(summary, dangling)
    if summary.unreadable:
        raise DeletionRefused(
            f"{summary.unreadable} path(s) could not be listed or examined, and may hold "
            "what a checkpoint references; nothing deleted (see the report)"
        )
    candidates = sorted({str(o["path"]) for o in orphans})
    current = {p: deletion.stat_now(loc, p) for p in candidates}  # before the re-read
    again, marker_now = reread()
    if marker_now != marker:
        raise DeletionRefused(
            "the query committed a batch since the audit: it is running; stop it or audit "
            "again (nothing deleted)"
        )
    if again.corrupt or again.problems:
        what = again.corrupt[0][0] if again.corrupt else again.problems[0][0]
        raise DeletionRefused(f"{what} became unreadable since the audit; nothing deleted")
    own = [c for c in again.checkpoints if c[5] == loc.job_dir]
    referenced = {r[8] for r in again.references if r[8] is not None}
    deletion.refuse_shrunk(len(own), bool(referenced), summary.checkpoints)
    held = dict(again.foreign.held)
    keep = referenced | again.foreign.metadata
    root_real = os.path.realpath(loc.full(loc.job_dir)) if loc.local else ""

    def judge(path: str, st: tuple[int, float, bool] | None) -> tuple[str, str]:
        return _judge(loc, path, root_real, st, keep, held, now, grace)

    return deletion.plan_of(loc, candidates, current, judge, grace=grace, now=now)


def _judge(
    loc: Location, path: str, root_real: str, st: tuple[int, float, bool] | None,
    keep: set[str] | frozenset[str], held: dict[str, str], now: float, grace: float,
) -> tuple[str, str]:
    unknown = deletion.not_ours(loc, path, root_real, st)
    if unknown is not None:
        return unknown
    assert st is not None
    if path in keep:
        return KEEP_ACTIVE, "referenced by a checkpoint read just now"
    if path in held:
        return KEEP_ACTIVE, _WHY_HELD.get(held[path], held[path])
    young = deletion.too_young(st[1], now=now, grace=grace)
    if young is not None:
        return young
    return DELETE, "unreferenced, older than the grace period, held by no checkpoint"
