"""What the streaming job's modules share about checkpointing: the worker's and the
driver's halves as protocols, and the messages between them.

Two parties, as Flink has them. On a worker, a subtask's snapshot code talks to a
``TaskManagerSide`` (``pipeline.stream.worker_tm``: a real ``fastimpl`` TaskManager in the
Python worker): it writes state, reuses shared state uploaded before, acknowledges (an
encoded message, handed to the driver through Spark's ``collect``) and applies the
coordinator's notices and duties, which travel with the next batch's tasks. On the
driver, the job talks to a ``CoordinatorSide`` (``pipeline.stream.coordination``: a
``fastimpl`` CheckpointCoordinator): it triggers a checkpoint per micro-batch, receives
the acknowledgements, completes, and says what each subtask restores from (an encoded
``RestoreAssignment``). Everything that crosses Spark is bytes. ``worker_tm`` and
``coordination`` are the only modules of ``pipeline.stream`` that import ``fastimpl``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from spec.config import RestoreMode, StateKind
from spec.errors import CkptError, UsageError
from spec.handles import StateEntry
from spec.ids import SubtaskId
from spec.messages import RestoreAssignment, decode_message

if TYPE_CHECKING:
    from pipeline.stream.worker_tm import MailItem, TaskManagerRecipe

VERTEX = "count"
"""The keyed stage's name: the vertex of the job's checkpoints."""


class CheckpointNotCompleted(CkptError, RuntimeError):
    """The coordinator could not complete a checkpoint (a subtask declined or did not
    acknowledge, or writing ``_metadata`` failed): it is aborted, and the micro-batch
    must be run again from the previous one."""


class StateSource(Protocol):
    def read(self, entry: StateEntry) -> bytes:
        """The bytes of a state entry (from a restore assignment), read from storage."""


class TaskManagerSide(StateSource, Protocol):
    """The worker's half: one subtask's TM for one task."""

    def write(
        self, checkpoint: int, subtask: SubtaskId, kind: StateKind, name: str, data: bytes
    ) -> StateEntry | None:
        """Write one piece of state (SHARED for ``KEYED_SHARED``, EXCLUSIVE otherwise);
        the entry, or ``None`` once a write of the checkpoint failed (it is declined)."""

    def reuse(self, checkpoint: int, subtask: SubtaskId, entry: StateEntry) -> StateEntry | None:
        """Reuse shared state a completed checkpoint holds (``entry``, from the restore
        assignment): the entry acknowledged for it, or ``None`` when it may not be
        reused here (the caller uploads the bytes again)."""

    def acknowledge(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        """The encoded acknowledgement of everything written (a decline if a write failed)."""

    def decline(self, checkpoint: int, subtask: SubtaskId) -> bytes:
        """The encoded refusal of ``checkpoint``: nothing written for it is acknowledged."""


class CoordinatorSide(Protocol):
    """The driver's half: one checkpoint per micro-batch."""

    def trigger(self) -> int:
        """Start a checkpoint; its id."""

    def receive(self, message: bytes, report: bytes = b"") -> None:
        """An acknowledgement or a decline from a task, with its TM's report."""

    def complete(self, checkpoint: int) -> None:
        """Complete ``checkpoint`` (its notices wait in ``mail``). Raises
        ``CheckpointNotCompleted`` (the checkpoint is then aborted)."""

    def abort(self, checkpoint: int) -> None:
        """Give ``checkpoint`` up (its batch failed)."""

    def mail(self) -> tuple[MailItem, ...]:
        """The notices and duties the TMs have not applied yet (with the next tasks)."""

    def heard(self, reports: Iterable[bytes]) -> None:
        """TMs' reports from a delivery of the mail without a batch."""

    def restore_assignment(self, subtask: SubtaskId, checkpoint: int) -> bytes:
        """An encoded ``RestoreAssignment``: what ``subtask`` holds in the latest completed
        checkpoint, for a task that writes ``checkpoint`` next."""

    def task_manager_recipe(self) -> TaskManagerRecipe:
        """What a worker needs to build or take up its subtask's TM (picklable)."""

    @property
    def job_id(self) -> str:
        """The running job (a restore or a recovery starts a new one, R70)."""

    def restoring(self) -> bool:
        """Whether the job still starts from a restored checkpoint (no checkpoint of its
        own completed yet): nothing restored is reused then (R71)."""

    def rescale(self, parallelism: int, mode: RestoreMode | None = None) -> None:
        """Restore the latest completed checkpoint into a new job whose keyed stage has
        ``parallelism`` subtasks (``mode``: the configured one by default)."""

    def read(self, entry: StateEntry) -> bytes:
        """The bytes of a state entry of a restore assignment, read on the driver."""

    def finish_attempts(self, wait_s: float = 60.0, poll_s: float = 0.2) -> bool:
        """Once no task attempt may still run: give up the TMs that were replaced and
        sweep what no party records (the end of a run); whether it could."""

    def settle(self) -> None:
        """Wait until the deletes the coordinator decided are carried out."""

    def in_place_of_latest(self) -> tuple[dict[str, int], tuple[str, ...]]:
        """The working files the latest completed checkpoint refers to in place (path ->
        size, R103), and the job bases other than the running one whose state the
        coordinator holds (``--state-backend working``; empty otherwise)."""

    def violations(self, *, quiet: bool = False) -> list[str]:
        """The store's invariants (I1-I5, and I6 when ``quiet``) on the real files."""

    def close(self) -> None:
        """Finish queued deletes; checkpoints stay on storage."""


def decode_assignment(data: bytes) -> RestoreAssignment:
    """A ``RestoreAssignment`` from ``CoordinatorSide.restore_assignment``."""
    msg = decode_message(data)
    if not isinstance(msg, RestoreAssignment):
        raise UsageError(f"expected a RestoreAssignment, got a {type(msg).__name__}")
    return msg
