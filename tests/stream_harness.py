"""The streaming job without Spark: the same driver, subtask and snapshot code, with the
partitions of each micro-batch run one after another in this process."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from pipeline.stream.batch_order import BatchOrder, SubtaskResult
from pipeline.stream.check import Comparison, batch_counts, compare
from pipeline.stream.checkpointing import VERTEX
from pipeline.stream.coordination import open_coordinator, to_recover
from pipeline.stream.driver import BatchDriver, BatchReport
from pipeline.stream.kills import Failures, Killed
from pipeline.stream.partial_counts import partial_counts
from pipeline.stream.source import RateSource
from pipeline.stream.subtask import deliver, run_subtask, subtask_dir
from pipeline.stream.windows import Windowing
from pipeline.stream.words import ranks_of
from spec.config import Config, RestoreMode
from spec.ids import SubtaskId


class DriverKilled(BaseException):
    """The driver died (SIGKILL) in a batch, at ``LocalJob.batch``'s ``die``."""


def _die(point: str) -> NoReturn:
    # A killed worker's databases die with it (``--state-backend working``)
    from pipeline.stream.working_task import halt_all

    halt_all()
    raise Killed(point)


class LocalJob:
    """A job whose micro-batches run in this process; ``emitted`` is the sink's union."""

    def __init__(
        self,
        tmp: Path,
        config: Config,
        *,
        parallelism: int = 2,
        source: RateSource | None = None,
        windowing: Windowing | None = None,
        write_buffer_size: int = 4096,
        auto_compactions: bool = True,
        url: str | None = None,
        storage_options: dict[str, Any] | None = None,
        failures: Failures | None = None,
        backend: str = "rocksdb",
        gc_min_age_s: float = 0.0,
        trace: str | None = None,
    ) -> None:
        self.url = url or str(tmp / "base")
        self.source = source or RateSource(400, vocabulary=300)
        self.windowing = windowing or Windowing(3000)
        self.parallelism = parallelism
        self.config = config
        self.storage_options = storage_options
        self.gc_min_age_s = gc_min_age_s
        self.trace = trace
        self.coordinator = open_coordinator(
            self.url,
            config,
            parallelism,
            storage_options=storage_options,
            backend=backend,
            gc_min_age_s=gc_min_age_s,
            trace=trace,
        )
        self.lineage: list[tuple[str, RestoreMode | None]] = [(self.coordinator.job_id, None)]
        """Every job started, with the mode it restored the one before in (``driver.json``)."""
        self.work = str(tmp / "work")
        self.driver = BatchDriver(
            self.coordinator,
            self.windowing,
            parallelism,
            self.work,
            write_buffer_size=write_buffer_size,
            auto_compactions=auto_compactions,
            failures=failures or Failures(),
            backend=backend,
        )
        self.emitted: dict[int, list[tuple[int, str, int]]] = {}
        self.next_batch = 0
        self._attempts = 0
        self.kills: list[tuple[int, int, int, str]] = []
        """(batch, subtask, attempt number, point) of every injected kill."""

    def partitions(self, batch: int) -> dict[int, list[bytes]]:
        """Each subtask's streams of counts of the batch, by the job's own map side
        (``partial_counts``) over the source's partitions, their words named by
        ``ranks_of`` (what the JVM's ``with_ranks`` computes in the job)."""
        parts: dict[int, list[bytes]] = collections.defaultdict(list)
        values = self.source.values(batch)
        event = self.source.event_ms(batch)
        cut = np.array_split(np.arange(values.start, values.stop, dtype=np.int64),
                             self.source.partitions)
        for chunk in cut:
            ranks = ranks_of(chunk, **self.source.word_args())
            rows = pa.record_batch({"rank": ranks, "ts": np.full(len(chunk), event, np.int64)})
            for out in partial_counts(self.source.vocabulary, self.parallelism, [rows]):
                for s, stream in zip(out.column(0).to_pylist(), out.column(1).to_pylist(),
                                     strict=True):
                    parts[s].append(stream)
        return parts

    def run_tasks(self, order: BatchOrder) -> list[SubtaskResult]:
        """Each partition's task; a task killed by an injected failure is retried, up to
        four attempts, as Spark does with ``spark.task.maxFailures`` 4."""
        parts = self.partitions(order.batch_id)
        out = []
        for i in range(self.parallelism):
            for number in range(4):
                self._attempts += 1
                try:
                    r = run_subtask(
                        order,
                        i,
                        f"a{self._attempts}",
                        parts.get(i, []),
                        attempt_number=number,
                        die=_die,
                    )
                except Killed as k:
                    self.kills.append((order.batch_id, i, number, str(k)))
                    continue
                out.append(r)
                break
            else:
                raise RuntimeError(f"subtask {i} of batch {order.batch_id}: 4 attempts died")
        return out

    def batch(self, die: str | None = None) -> BatchReport:
        """Run the next micro-batch to its completed checkpoint (sink first). ``die``
        kills the driver in it (``ckpt stream --die-at``): ``sunk`` after the sink holds
        its output, before its checkpoint completes; ``completed`` after that, before
        the engine commits the batch (so a restarted engine runs it again)."""
        order = self.driver.order(self.next_batch)
        results = self.run_tasks(order)
        self.emitted[order.batch_id] = [w for r in results for w in r.closed]
        if die == "sunk":
            raise DriverKilled(die)
        report = self.driver.finish(order, results)
        if die == "completed":
            raise DriverKilled(die)
        self.next_batch += 1
        return report

    def restart_driver(self) -> None:
        """The driver died with its workers (``DriverKilled``) and starts again on the
        same storage and work directory (``ckpt stream --resume``): a new coordinator
        recovers the store into a new job that claims the latest completed checkpoint
        (R96), the progress comes from its operator state, and the engine runs again
        from the first batch it had not committed; a batch the state already holds is
        committed without running (SPEC R96), so the next one to run follows it."""
        from pipeline.stream.working_task import halt_all

        halt_all()  # the workers' databases died with the application
        old = self.coordinator
        if old.trace is not None:
            old.trace.close()  # its lines are on disk: the driver died after writing them
        back = to_recover(self.url, self.storage_options, self.lineage)
        self.coordinator = open_coordinator(
            self.url,
            self.config,
            self.parallelism,
            storage_options=self.storage_options,
            crashed_job=back.crashed_job,
            abandoned=back.abandoned,
            restore_mode=back.restore_mode,
            backend=self.driver.backend,
            gc_min_age_s=self.gc_min_age_s,
            trace=self.trace,
        )
        self.lineage.append((self.coordinator.job_id, back.restore_mode))
        old_driver = self.driver
        self.driver = BatchDriver(
            self.coordinator,
            self.windowing,
            self.parallelism,
            self.work,
            write_buffer_size=old_driver.write_buffer_size,
            auto_compactions=old_driver.auto_compactions,
            failures=old_driver.failures,
            backend=old_driver.backend,
            no_claim=back.restore_mode is RestoreMode.NO_CLAIM,
        )
        self.driver.recover_progress()
        self.driver.reports = list(old_driver.reports)
        self.next_batch = self.driver.last_batch + 1

    def quiesce(self) -> None:
        """Deliver the mail no batch carried yet to every subtask's TM (as the end of a
        Spark run does), then wait for the coordinator's deletes: quiet (I6)."""
        order = self.driver.delivery()
        self.coordinator.heard([deliver(order, i) for i in range(self.parallelism)])
        self.coordinator.settle()

    def lose_local_state(self, index: int) -> None:
        """The worker's disk of subtask ``index`` is gone (a new worker)."""
        shutil.rmtree(subtask_dir(self.work, SubtaskId(VERTEX, index, self.parallelism)))

    def rescale(self, parallelism: int) -> None:
        """Restore the latest completed checkpoint with ``parallelism`` subtasks (the
        configured restore mode), as ``--rescale-at`` does between two queries."""
        self.coordinator.rescale(parallelism)
        self.lineage.append((self.coordinator.job_id, self.config.restore_mode))
        old = self.driver
        self.parallelism = parallelism
        self.driver = BatchDriver(
            self.coordinator,
            self.windowing,
            parallelism,
            self.work,
            write_buffer_size=old.write_buffer_size,
            auto_compactions=old.auto_compactions,
            failures=old.failures,
            backend=old.backend,
            no_claim=self.config.restore_mode is RestoreMode.NO_CLAIM,
        )
        self.driver.recover_progress()
        self.driver.reports = list(old.reports)

    def expected(self) -> collections.Counter[tuple[int, str]]:
        return batch_counts(self.source, self.next_batch, self.windowing)

    def closed_watermark(self) -> int:
        return self.driver.reports[-1].watermark

    def comparison(self) -> Comparison:
        """Every window emitted so far against the batch computation of the same input."""
        emitted = [w for ws in self.emitted.values() for w in ws]
        return compare(self.expected(), emitted, self.windowing, self.closed_watermark())
