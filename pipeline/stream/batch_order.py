"""What the driver sends with every task of a micro-batch (``BatchOrder``) and what the
task sends back (``SubtaskResult``): the same for the RocksDB task (``subtask``) and the
working-state task (``working_task``), which dispatches on ``BatchOrder.backend``, so
both import it from here."""

from __future__ import annotations

from collections.abc import Mapping

from attrs import field, frozen

from pipeline.stream.kills import Failures
from pipeline.stream.rocks import BLOOM_BITS
from pipeline.stream.snapshot import SnapshotStats
from pipeline.stream.windows import Windowing
from pipeline.stream.worker_tm import MailItem, TaskManagerRecipe


@frozen
class BatchOrder:
    """What the driver sends with every task of one micro-batch (in the task's closure)."""

    batch_id: int
    checkpoint: int
    watermark: int
    windowing: Windowing
    parallelism: int
    work_dir: str
    recipe: TaskManagerRecipe
    assignments: Mapping[int, bytes]
    """Subtask index -> encoded ``RestoreAssignment`` (the latest completed checkpoint)."""
    mail: tuple[MailItem, ...] = ()
    """The coordinator's notices and duties the TMs have not applied yet."""
    write_buffer_size: int = 64 * 1024
    auto_compactions: bool = True
    l0_compaction_trigger: int = 4
    bloom_bits: int = BLOOM_BITS
    compact_every: int = 0
    """Also run a full manual compaction every so many checkpoints (0: never)."""
    failures: Failures = field(factory=Failures)
    restoring: bool = False
    """The job starts from a restored checkpoint (a rescale, a recovered driver): nothing
    restored is reused, every SST of the snapshot is uploaded (R71); after a rescale the
    subtask builds its DB from the key-group ranges it now owns."""
    snapshot: bool = True
    """Checkpoint the state (off: the baseline of the records-per-second ratio)."""
    sweep_local: bool = True
    """Remove what earlier attempts of the subtask left on the local disk (a killed
    attempt's DB, checkpoint or download directory) when a task starts. Safe only when no
    other attempt of the subtask can still run: off under speculation."""
    backend: str = "rocksdb"
    """``rocksdb`` (a local RocksDB, its files uploaded) or ``working`` (a SlateDB on the
    checkpoint storage, its files referred to in place: ``working_task``)."""
    no_claim: bool = False
    """The job was restored with NO_CLAIM (``working``: a restore copies the user's rows)."""
    in_place: Mapping[str, int] = field(factory=dict)
    """``working``: the files the latest completed checkpoint refers to in place, with
    their sizes (its ``_metadata``'s): a restore's clone refers to some of them, and needs
    no listing to know how large they are."""


@frozen
class SubtaskResult:
    index: int
    attempt: str
    attempt_number: int
    ack: bytes
    records: int
    late: int
    max_event: int | None
    restored: bool
    stats: SnapshotStats
    closed: tuple[tuple[int, str, int], ...] = field(factory=tuple)
    """The windows the watermark closed: ``(window start, word, count)``."""
    report: bytes = b""
    """The subtask's TM's records after the task (``worker_tm.report_of``)."""
    created: int = 0
    """Files the TM created on storage in this task."""
    ready_seconds: float = 0.0
    """From the task's start until its state was open (a restore included)."""
    snapshot_seconds: float = 0.0
    """The snapshot and the acknowledgement (the task's part of the checkpoint)."""
    stage: int = -1
    """The Spark stage the task ran in (-1 outside Spark): which speculative attempts
    the listener saw were copies of snapshot tasks."""
