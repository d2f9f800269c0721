"""The fault seam of the store's storage calls: every failure a caller sees is a
:class:`StorageFault` naming the operation and the path.

A fault comes from one of two places. ``FailNextCall`` arms one (:class:`FaultSeam`): the
next call of that kind fails before it reaches the file system, which is how the model and
the lockstep tests inject the failures the rules speak of (R17: a write that failed
declines its checkpoint; R45: a delete that failed is kept and reported). Or the file
system itself fails (an ``OSError`` from a disk, a wrapper, a network): such a fault is
counted too, so that a command trace says where one happened, since the model can replay
only armed ones.
"""

from __future__ import annotations

from spec.commands import StorageOp
from spec.errors import CkptError


class StorageFault(CkptError):
    """A storage call failed (an armed fault, or an error of the file system)."""

    def __init__(self, op: StorageOp, path: str, cause: BaseException | None = None) -> None:
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{op.value} {path} failed{detail}")
        self.op = op
        self.path = path
        self.cause = cause


class ReadFault(StorageFault, ValueError):
    """Reading bytes back failed: the file is missing or unreadable, or shorter than a
    handle says (a ``ValueError`` too, as a short read was before)."""

    def __init__(self, path: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(StorageOp.APPEND, path, cause)
        self.args = (message,)


class FaultSeam:
    """The faults armed for a store's next calls, and the count of the real ones."""

    __slots__ = ("armed", "real_faults")

    def __init__(self) -> None:
        self.armed: list[StorageOp] = []
        """Faults armed by ``FailNextCall``: the next call of each kind fails."""
        self.real_faults = 0
        """Write-path calls (create, append, close, metadata, read back) the file system
        itself failed; background deletes report theirs in ``failed_deletes``."""

    def arm(self, op: StorageOp) -> None:
        self.armed.append(op)

    def fire(self, op: StorageOp, path: str) -> None:
        """Fail this call if a fault of its kind is armed (the fault is then used up)."""
        if op in self.armed:
            self.armed.remove(op)
            raise StorageFault(op, path)

    def failed(self, fault: StorageFault) -> StorageFault:
        """Count an error of the file system itself (not an armed fault): a command trace
        says where one happened, since the model can replay only armed faults."""
        self.real_faults += 1
        return fault
