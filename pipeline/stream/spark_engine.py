"""The coordinator's ``CoordinatorEngine`` in a Spark driver (``SparkEngine``): what only
Spark can do for the coordinator (``pipeline.stream.coordination``).

- The coordinator's notices (its ``ready()``, ``post``) and the duties ``ResetTm``,
  ``TmAssignment`` and ``ReusableFiles`` are queued per TM and travel with the next
  batch's tasks (``mail``); a TM reports the last item it applied, and the applied ones
  leave the queue.
- ``Holdings`` (the TMs' answer is needed now, R64) and ``EndJob`` (R90, at a rescale)
  are answered from each TM's last report. Between two batches that report is exact: a
  TM changes its records only while a task of its subtask runs, and none runs while the
  driver sweeps or ends the job. A Spark job could not do better: it cannot choose the
  worker, and the TM it would reach is the same saved state.
- ``start_tm`` (the first deployment, a restore, a failover replacing a lost TM) names a
  placeholder: the TM that first acknowledges for the subtask takes its place.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from fastimpl.parties import Ready, TmReport
from pipeline.stream.trace import StreamTrace
from pipeline.stream.worker_tm import MailItem
from spec.effects import tm_actor
from spec.ids import SubtaskId, TmId
from spec.layout import is_under
from spec.messages import (
    Answer,
    CheckpointAborted,
    CheckpointComplete,
    DatabaseFiles,
    Duty,
    EndJob,
    Held,
    Holdings,
    InUse,
    KeptFile,
    ResetTm,
    TmAssignment,
    TmEnded,
    decode_message,
    encode_message,
)


class SparkEngine:
    """``CoordinatorEngine`` of a Spark driver (see the module docstring)."""

    def __init__(self) -> None:
        self.outbox: dict[TmId, list[tuple[int, bytes]]] = {}
        self.seq = 0
        self.reports: dict[TmId, dict[str, Any]] = {}
        """Each TM's last report (``worker_tm.report_of``)."""
        self.hosted: dict[TmId, set[SubtaskId]] = {}
        """The subtasks each TM acknowledged for: where a stopped one's files lie."""
        self.runs_on: dict[SubtaskId, TmId] = {}
        """Where the coordinator placed each subtask (``placed``)."""
        self.placeholders: set[TmId] = set()
        """The TMs ``start_tm`` named: none of them ever runs (a Spark task starts its
        TM itself), each only holds a subtask's place until its first TM acknowledges."""
        self._placeholders = 0
        self._nonce = uuid.uuid4().hex[:6]
        self.trace: StreamTrace | None = None

    def post(self, ready: Ready) -> None:
        """The coordinator's notices since the last call, into the mail, in order (its
        ``Ready``'s; the host carried out its deletes before)."""
        for tm, msg in ready.notices:
            self._queue(tm, encode_message(msg))
            if self.trace is not None:
                self.trace.sent(tm, self.seq, msg)

    def _queue(self, tm: TmId, data: bytes) -> None:
        self.seq += 1
        self.outbox.setdefault(tm, []).append((self.seq, data))

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        self._placeholders += 1
        tm = f"tm-{self._nonce}-{self._placeholders}"
        self.placeholders.add(tm)
        return tm

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        self.runs_on = dict(placement)

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        if isinstance(msg, Holdings):
            held = self.reports.get(tm, {}).get("held", [])
            dirs = msg.directories
            paths = tuple(p for p in held if any(is_under(p, d) for d in dirs))
            return Held(msg.job, tm, paths)
        if isinstance(msg, EndJob):
            r = self.reports.get(tm, {})
            actor = tm_actor(tm)
            files = tuple(KeptFile(p, size, creator) for p, size, creator in r.get("owned", []))
            dirs = tuple(sorted(d for d, o in r.get("dirs", {}).items() if o == actor))
            return TmEnded(msg.job, tm, files, dirs)
        if isinstance(msg, DatabaseFiles):
            # R104: the RocksDB backend keeps its live database on the worker's local disk,
            # so no TM of this job uses a working file on the checkpoint storage
            return InUse(msg.job, tm, tuple(self.reports.get(tm, {}).get("working", ())))
        if isinstance(msg, ResetTm):  # the old attempt's notices go with the redeploy
            self.outbox[tm] = [(s, d) for s, d in self.outbox.get(tm, []) if is_duty(d)]
        self._queue(tm, encode_message(msg))
        return None

    def forget_tm(self, tm: TmId) -> None:
        self.outbox.pop(tm, None)

    def mail(self) -> tuple[MailItem, ...]:
        return tuple((tm, s, d) for tm, items in sorted(self.outbox.items()) for s, d in items)

    def in_transit(self) -> list[tuple[TmId, str]]:
        """Files the coordinator handed to a TM (``TmAssignment``) that the TM has not
        applied yet: its from the hand-over on, though only the mail says so."""
        out = []
        for tm, items in self.outbox.items():
            for _seq, data in items:
                msg = decode_message(data)
                if isinstance(msg, TmAssignment):
                    out += [(tm, k.path) for k in msg.files]
        return out

    def heard(self, report: Mapping[str, Any]) -> list[int]:
        """A TM's report: its records now, and the last mail item it applied; the items
        it applied since its last report, in order."""
        tm = report["tm"]
        before = int(self.reports.get(tm, {}).get("applied", 0))
        self.reports[tm] = dict(report)
        applied = int(report["applied"])
        done = [s for s, _d in self.outbox.get(tm, []) if before < s <= applied]
        if tm in self.outbox:
            self.outbox[tm] = [(s, d) for s, d in self.outbox[tm] if s > applied]
        return done


def tm_report(r: Mapping[str, Any]) -> TmReport:
    """A worker TM's report (``worker_tm.report_of``) as the ``TmReport`` the observation
    merges. Its deletion log stays with the attempt's saved state: the observation's
    deletions are the coordinator's."""
    actor = tm_actor(r["tm"])
    return TmReport(
        tm=r["tm"],
        owners=dict(r["owners"]),
        open=tuple(r["open"]),
        dirs=dict(r["dirs"]),
        unrecorded_dirs=tuple(r.get("unrecorded_dirs", ())),
        claims={p: actor for p in r["claims"]},
        ref_counts=dict(r["ref_counts"]),
        live={p: tuple((int(o), int(n)) for o, n in v) for p, v in r["live"].items()},
        pool_files=tuple(r["pool_files"]),
        deletions=(),
        pending=tuple(r["pending"]),
        refused=tuple(r["refused"]),
    )


def is_duty(data: bytes) -> bool:
    return not isinstance(decode_message(data), CheckpointComplete | CheckpointAborted)
