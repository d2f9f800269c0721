"""The coordinator of a benchmark job in an OS process of its own (issue 16).

The figures about a TM's write path (``bench/tm_cycle.py``) time the TM in the bench
process, through the API an engine's task manager uses, and keep the coordinator here,
in a process started with multiprocessing's "spawn" (a fresh interpreter: nothing of
the bench process is inherited), as a JobManager or a Spark driver would be. The two
meet only through a pipe: the TM's acknowledgements arrive as encoded
``spec.messages`` bytes and are decoded here; the coordinator's notices leave as
encoded bytes. The coordinator's work (decoding, the registry, writing ``_metadata``,
subsuming, its deletes) is therefore not on the TM's clock, as in a real engine, and is
reported separately (``Coordinator.seconds``).

Requests (pickled tuples; every reply is a tuple, ``("error", text)`` on a failure):

* ``("start", url, config, vertices, placement, job)``: a fresh coordinator over the
  storage at ``url`` (``memory://`` is this process's own memory), the subtasks placed
  as ``placement`` says (``[((vertex, index, parallelism), tm), ...]``); answers
  ``("started", first_checkpoint_id)`` with the first checkpoint triggered.
* ``("acks", [bytes, ...], complete)``: decode and receive each acknowledgement; with
  ``complete`` complete their checkpoint (or abort it when ``complete`` is ``"abort"``),
  then trigger the next. Answers ``("notices", [(tm, bytes), ...], next_id, seconds)``,
  ``seconds`` the time this process spent on the request.
* ``("metadata_size",)``: bytes of the largest ``_metadata`` on its storage.
* ``("fsyncs",)``: ``os.fsync`` calls made here since the last ask (the fairness check
  of figure 1 counts both processes' syncs); ``("stop",)``.
"""

from __future__ import annotations

import time
import traceback
from multiprocessing.connection import Connection

import fsspec  # type: ignore[import-untyped]

from bench.common import counting_fsyncs
from fastimpl.parties import CheckpointCoordinator, RandomIds, Storage
from spec.config import Config, VertexSpec
from spec.ids import SubtaskId, TmId
from spec.layout import METADATA
from spec.messages import (
    Acknowledgement,
    Answer,
    Duty,
    decode_message,
    encode_message,
)

_META = "/" + METADATA


class SteadyEngine:
    """The engine around the coordinator in this process. A steady job starts no TM and
    hands no duty: those calls fail loudly. What a batch of acknowledgements and its
    completion produced is the coordinator's ``ready()``: its deletes are performed here,
    its notices encoded into the reply that carries them to the TM's process."""

    def placed(self, placement: dict[SubtaskId, TmId]) -> None:
        """The TM's process learns its subtasks from the bench (``TaskManager.host``)."""

    def place(self, subtasks: list[SubtaskId], tms: list[TmId]) -> dict[SubtaskId, TmId]:
        return {s: tms[i % len(tms)] for i, s in enumerate(subtasks)}

    def _not_here(self, what: str) -> AssertionError:
        return AssertionError(f"the coordinator asked the engine to {what} in a steady job")

    def start_tm(self, job: str, first_checkpoint: int, finished_mark: int | None) -> TmId:
        raise self._not_here("start a TM")

    def duty(self, tm: TmId, msg: Duty) -> Answer | None:
        raise self._not_here(f"hand {type(msg).__name__} to a TM")

    def forget_tm(self, tm: TmId) -> None:
        raise self._not_here("forget a TM")


def serve(conn: Connection) -> None:
    """Answer requests until ``stop`` (see the module docstring)."""
    with counting_fsyncs() as fsyncs:
        _serve(conn, fsyncs)


def _serve(conn: Connection, fsyncs: list[int]) -> None:
    coord: CheckpointCoordinator | None = None
    while True:
        req = conn.recv()
        op = req[0]
        try:
            if op == "stop":
                if coord is not None:
                    coord.storage.drain()
                conn.send(("ok",))
                return
            if op == "start":
                if coord is not None:
                    coord.storage.drain()
                _, url, config, vertices, placement, job = req
                coord = _start(url, config, vertices, placement, job)
                conn.send(("started", coord.trigger()))
            elif op == "acks":
                assert coord is not None, "no coordinator started"
                t0 = time.perf_counter()
                cid = _receive(coord, req[1], req[2])
                ready = coord.ready()  # the host's part: the deletes, then the notices
                coord.storage.perform(ready.deletes)
                coord.storage.drain()  # its deletes are part of its work
                out = [(tm, encode_message(n)) for tm, n in ready.notices]
                conn.send(("notices", out, cid, time.perf_counter() - t0))
            elif op == "metadata_size":
                assert coord is not None, "no coordinator started"
                sizes = coord.storage.list_files()
                conn.send(
                    ("size", max((n for f, n in sizes.items() if f.endswith(_META)), default=0))
                )
            elif op == "fsyncs":
                conn.send(("fsyncs", fsyncs[0]))
                fsyncs[0] = 0
            else:
                conn.send(("error", f"unknown request {op!r}"))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _start(
    url: str,
    config: Config,
    vertices: tuple[VertexSpec, ...],
    placement: list[tuple[tuple[str, int, int], TmId]],
    job: str,
) -> CheckpointCoordinator:
    fs, root = fsspec.core.url_to_fs(url)
    tms = sorted({tm for _, tm in placement})
    coord = CheckpointCoordinator(
        config, vertices, len(tms), Storage(fs, root), RandomIds(), SteadyEngine(), job
    )
    coord.deploy({SubtaskId(v, i, p): tm for (v, i, p), tm in placement})
    return coord


def _receive(coord: CheckpointCoordinator, acks: list[bytes], complete: bool | str) -> int:
    cid = 0
    for data in acks:
        msg = decode_message(data)
        if not isinstance(msg, Acknowledgement):
            raise TypeError(f"expected an acknowledgement, got {type(msg).__name__}")
        coord.receive_ack(msg)
        cid = msg.checkpoint
    if complete == "abort":
        coord.abort(cid)
    elif complete:
        coord.complete(cid)  # CompletionFailed if its _metadata write failed (R51)
    return coord.trigger()
