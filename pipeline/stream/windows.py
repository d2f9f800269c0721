"""Tumbling event-time windows and the watermark that closes them."""

from __future__ import annotations

from attrs import frozen

from spec.errors import UsageError


@frozen
class Windowing:
    """Windows of ``size_ms`` aligned to the epoch; the watermark trails the largest
    event time seen by ``delay_ms``."""

    size_ms: int
    delay_ms: int = 0

    def __attrs_post_init__(self) -> None:
        if self.size_ms < 1 or self.delay_ms < 0:
            raise UsageError(f"bad windowing: size {self.size_ms} ms, delay {self.delay_ms} ms")

    def start_of(self, event_ms: int) -> int:
        """The start of the window that holds ``event_ms``."""
        return event_ms - event_ms % self.size_ms

    def closed(self, start: int, watermark: int) -> bool:
        """A window is closed (emitted, then forgotten) once the watermark reaches its end."""
        return start + self.size_ms <= watermark

    def first_open_start(self, watermark: int) -> int:
        """The smallest window start that is not closed at ``watermark``: every window
        starting below it is closed."""
        return (watermark // self.size_ms) * self.size_ms

    def advance(self, watermark: int, max_event_ms: int | None) -> int:
        """The watermark after a batch whose largest event time is ``max_event_ms``; it
        never goes back."""
        if max_event_ms is None:
            return watermark
        return max(watermark, max_event_ms - self.delay_ms)


NO_WATERMARK = -1
"""The watermark before any record: no window is closed."""
