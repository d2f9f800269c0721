"""The in-process engine's network: the coordinator's notices to TMs, as encoded bytes.

Notices travel as ``spec.messages`` bytes, as they would between processes, so what a TM
applies is only ever what survives ``decode_message``. The queue keeps the order notices
were sent in, across TMs: the spec's commands name a notice by its place in that order
(``DeliverNotification(index)``), and a test adapter drops, duplicates or reorders
notices through it (``drop``, ``duplicate``, ``take`` of any index); the product only
sends and takes.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.errors import CommandError, Reason
from spec.ids import TmId
from spec.messages import Message, decode_message, encode_message


class InMemoryTransport:
    """Encoded messages for TMs, in the order they were sent."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: list[tuple[TmId, bytes]] = []

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[tuple[TmId, Message]]:
        """What is in flight, decoded (for tests and observation)."""
        return ((tm, decode_message(data)) for tm, data in list(self._queue))

    def send(self, tm: TmId, msg: Message) -> None:
        self._queue.append((tm, encode_message(msg)))

    def put(self, tm: TmId, data: bytes) -> Message:
        """Queue bytes that came from elsewhere (another process's pipe) for ``tm``, once
        they decode: ``MessageError`` naming the field otherwise, and nothing queued."""
        msg = decode_message(data)
        self._queue.append((tm, bytes(data)))
        return msg

    def first_for(self, tm: TmId) -> int | None:
        """The index of the oldest message for ``tm`` in flight, if any."""
        return next((i for i, (t, _) in enumerate(self._queue) if t == tm), None)

    def _check(self, index: int) -> None:
        if not 0 <= index < len(self._queue):
            raise CommandError(
                Reason.NO_SUCH_NOTIFICATION, f"no notification {index} of {len(self._queue)}"
            )

    def take(self, index: int) -> tuple[TmId, Message]:
        """Remove the message at ``index`` and return it decoded, with its recipient."""
        self._check(index)
        tm, data = self._queue[index]
        msg = decode_message(data)  # before it leaves the queue: a refusal changes nothing
        del self._queue[index]
        return tm, msg

    def drop(self, index: int) -> None:
        """Lose the message at ``index`` (a test adapter's fault)."""
        self._check(index)
        del self._queue[index]

    def duplicate(self, index: int) -> None:
        """Send the message at ``index`` again, last (a test adapter's fault)."""
        self._check(index)
        self._queue.append(self._queue[index])

    def forget(self, tm: TmId) -> None:
        """A TM that is gone receives nothing more: its messages in flight go."""
        self._queue = [(t, d) for t, d in self._queue if t != tm]
