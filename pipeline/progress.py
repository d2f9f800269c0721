"""Progress of a long audit: the phase, and the tasks of the Spark stages running.

On a terminal a rich progress bar follows the active stages (polled from Spark's status
tracker twice a second); elsewhere (CI logs, pipes) each phase is one line with the time
since the start.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class AuditProgress:
    def __init__(self, console: Console, spark: Any | None = None, *, enabled: bool = True):
        self.console = console
        self.spark = spark
        self.enabled = enabled
        self.start = time.monotonic()
        self.live = enabled and console.is_terminal
        self._phase = "starting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> AuditProgress:
        if self.live:
            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self.console, transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self._phase, total=None)
            if self.spark is not None:
                self._thread = threading.Thread(target=self._poll, daemon=True)
                self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, phase: str) -> None:
        self._phase = phase
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, description=phase, total=None, completed=0)
        else:
            self.console.print(f"[dim]{time.monotonic() - self.start:7.1f} s[/] {phase}")

    def _poll(self) -> None:
        if self.spark is None:
            return
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(0.5):
            try:
                done = total = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
            except Exception:  # the JVM may be shutting down; progress is best effort
                return
            if self._bar is not None and total:
                self._bar.update(self._task, total=total, completed=done)
