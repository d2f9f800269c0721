"""The driver's side of every micro-batch, without Spark: one checkpoint per batch, the
orders its tasks carry, and what their results complete.

Per batch ``b``: trigger checkpoint ``c``; give every subtask its restore assignment
(the latest completed checkpoint) and the notices of the previous complete; the tasks
return acknowledgements and closed windows; the caller writes the closed windows to the
sink; then the acknowledgements are received and ``c`` completed, before Spark commits
``b``. The sink is written first because the snapshot of ``c`` has already forgotten the
windows it closed: were the driver to die between the complete and the sink write, the
re-run of ``b`` would restore ``c`` and have nothing left to emit. Written first, a
re-run replaces the same output (its directory is named by ``b``). A checkpoint that
does not complete fails the batch (``CheckpointNotCompleted``): the tasks' DBs moved on
to ``c``, and only a re-run of ``b`` from ``c - 1`` keeps every record counted once.

The watermark is the largest event time of the previous batches less the delay (Spark's
rule: a batch's own records move the watermark of the next one); each subtask keeps it
in its operator state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from attrs import define, field, frozen

from pipeline.stream.batch_order import BatchOrder, SubtaskResult
from pipeline.stream.checkpointing import VERTEX, CoordinatorSide, decode_assignment
from pipeline.stream.kills import Failures
from pipeline.stream.rocks import BLOOM_BITS
from pipeline.stream.snapshot import OPERATOR_STATE
from pipeline.stream.windows import NO_WATERMARK, Windowing
from spec.errors import UsageError
from spec.ids import SubtaskId


@frozen
class BatchReport:
    batch_id: int
    checkpoint: int
    watermark: int
    records: int
    late: int
    closed_windows: int
    uploaded: int
    uploaded_bytes: int
    reused: int
    exclusive: int
    restored: int
    retried: int
    """Subtasks whose accepted result came from a retry (an earlier attempt failed)."""
    created: int = 0
    """State files the subtasks' TMs created on storage (counted on the workers)."""
    new_tms: int = 0
    """Subtasks whose TM was a new attempt (a new job, a kill, a dropped local DB)."""
    exclusive_bytes: int = 0
    """Bytes of EXCLUSIVE state written (RocksDB's MANIFEST/OPTIONS/CURRENT and the
    operator state; ``working``: the manifests' copies and the operator state)."""
    in_place: int = 0
    """``working``: files the checkpoint refers to in place (no upload)."""
    in_place_bytes: int = 0
    db_written_bytes: int = 0
    """``working``: bytes of SSTs the databases wrote to the checkpoint storage."""
    stage: int = -1
    """The Spark stage of the batch's snapshot tasks (-1 outside Spark)."""
    restore_seconds: float = 0.0
    """The longest time a subtask that restored its state took until the state was open
    (its ``ready_seconds``: the download, and after a rescale the key-group copy); 0.0
    when no subtask restored."""


@define
class BatchDriver:
    coordinator: CoordinatorSide
    windowing: Windowing
    parallelism: int
    work_dir: str
    write_buffer_size: int = 64 * 1024
    auto_compactions: bool = True
    l0_compaction_trigger: int = 4
    bloom_bits: int = BLOOM_BITS
    compact_every: int = 0
    failures: Failures = field(factory=Failures)
    snapshot: bool = True
    """Checkpoint every batch (off: the baseline without state checkpointing)."""
    sweep_local: bool = True
    """See ``BatchOrder.sweep_local`` (off under speculation)."""
    backend: str = "rocksdb"
    """See ``BatchOrder.backend``."""
    no_claim: bool = False
    """The job was restored with NO_CLAIM (see ``BatchOrder.no_claim``)."""
    watermark: int = NO_WATERMARK
    reports: list[BatchReport] = field(factory=list)
    last_batch: int = -1
    """The last batch the state holds (the latest completed checkpoint's)."""
    ran_watermark: int = NO_WATERMARK
    """The watermark that batch ran with: every window closed at it is in the sink."""
    _baseline_checkpoint: int = 0

    def recover_progress(self) -> None:
        """Take the watermark and the last batch from the operator state of the latest
        completed checkpoint (after the driver restarted, or a rescale): what every
        subtask wrote in its snapshot, never what this process remembers."""
        batches: set[int] = set()
        watermarks: list[int] = []
        events: list[int] = []
        c = self.coordinator
        for s in self.subtasks():
            for e in decode_assignment(c.restore_assignment(s, 1)).entries:
                if e.name != OPERATOR_STATE:
                    continue
                try:
                    p = json.loads(c.read(e))
                    batches.add(int(p["batch"]))
                    watermarks.append(int(p["watermark"]))
                    if p.get("max_event") is not None:
                        events.append(int(p["max_event"]))
                except (ValueError, KeyError, TypeError, AttributeError) as err:
                    raise UsageError(
                        f"the operator state {e.name!r} of {s} is not a progress record: {err!r}"
                    ) from None
        if not batches:
            return
        if len(batches) != 1:
            raise UsageError(f"the subtasks' operator state names batches {sorted(batches)}")
        self.last_batch = batches.pop()
        self.ran_watermark = max(watermarks)
        self.watermark = self.windowing.advance(self.ran_watermark, max(events, default=None))

    def subtasks(self) -> list[SubtaskId]:
        return [SubtaskId(VERTEX, i, self.parallelism) for i in range(self.parallelism)]

    def order(self, batch_id: int) -> BatchOrder:
        """Trigger the batch's checkpoint; the order every task of the batch carries."""
        if self.snapshot:
            c = self.coordinator.trigger()
        else:
            self._baseline_checkpoint += 1
            c = self._baseline_checkpoint
        return BatchOrder(
            batch_id=batch_id,
            checkpoint=c,
            watermark=self.watermark,
            windowing=self.windowing,
            parallelism=self.parallelism,
            work_dir=self.work_dir,
            recipe=self.coordinator.task_manager_recipe(),
            assignments={
                s.index: self.coordinator.restore_assignment(s, c) for s in self.subtasks()
            },
            mail=self.coordinator.mail() if self.snapshot else (),
            write_buffer_size=self.write_buffer_size,
            auto_compactions=self.auto_compactions,
            l0_compaction_trigger=self.l0_compaction_trigger,
            bloom_bits=self.bloom_bits,
            compact_every=self.compact_every,
            failures=self.failures,
            sweep_local=self.sweep_local,
            restoring=self.snapshot and self.coordinator.restoring(),
            snapshot=self.snapshot,
            backend=self.backend,
            no_claim=self.no_claim,
            in_place=self.coordinator.in_place_of_latest()[0] if self.backend == "working" else {},
        )

    def delivery(self) -> BatchOrder:
        """The order of a delivery of the mail without a batch (``subtask.deliver``)."""
        return BatchOrder(
            batch_id=self.last_batch,
            checkpoint=0,
            watermark=self.watermark,
            windowing=self.windowing,
            parallelism=self.parallelism,
            work_dir=self.work_dir,
            recipe=self.coordinator.task_manager_recipe(),
            # which local DB is the latest completed checkpoint's (its TM gets the mail)
            assignments={
                s.index: self.coordinator.restore_assignment(s, 1) for s in self.subtasks()
            },
            mail=self.coordinator.mail(),
            backend=self.backend,
        )

    def finish(self, order: BatchOrder, results: Sequence[SubtaskResult]) -> BatchReport:
        """Receive the acknowledgements and complete the batch's checkpoint (after the
        sink holds the closed windows). Raises ``CheckpointNotCompleted``."""
        got = sorted(r.index for r in results)
        if got != list(range(self.parallelism)):
            self.coordinator.abort(order.checkpoint)
            raise UsageError(f"batch {order.batch_id}: results of subtasks {got}")
        if self.snapshot:
            try:
                for r in results:
                    self.coordinator.receive(r.ack, r.report)
                self.coordinator.complete(order.checkpoint)
            except BaseException:
                self.coordinator.abort(order.checkpoint)
                raise
        self.last_batch = order.batch_id
        self.ran_watermark = order.watermark
        events = [r.max_event for r in results if r.max_event is not None]
        self.watermark = self.windowing.advance(self.watermark, max(events, default=None))
        report = BatchReport(
            batch_id=order.batch_id,
            checkpoint=order.checkpoint,
            watermark=order.watermark,
            records=sum(r.records for r in results),
            late=sum(r.late for r in results),
            closed_windows=sum(len(r.closed) for r in results),
            uploaded=sum(r.stats.uploaded for r in results),
            uploaded_bytes=sum(r.stats.uploaded_bytes for r in results),
            reused=sum(r.stats.reused for r in results),
            exclusive=sum(r.stats.exclusive for r in results),
            restored=sum(r.restored for r in results),
            retried=sum(r.attempt_number > 0 for r in results),
            created=sum(r.created for r in results),
            new_tms=sum(bool(r.report) and json.loads(r.report).get("new", False) for r in results),
            exclusive_bytes=sum(r.stats.exclusive_bytes for r in results),
            in_place=sum(r.stats.in_place for r in results),
            in_place_bytes=sum(r.stats.in_place_bytes for r in results),
            db_written_bytes=sum(r.stats.db_written_bytes for r in results),
            stage=max((r.stage for r in results), default=-1),
            restore_seconds=max((r.ready_seconds for r in results if r.restored), default=0.0),
        )
        self.reports.append(report)
        return report
