"""Who owns a restored checkpoint (FLIP-193): a field of ``spec.config.Config`` that
``spec.flink_options`` also reads and prints (``execution.state-recovery.claim-mode``),
so it lives below both."""

from __future__ import annotations

import enum


class RestoreMode(enum.Enum):
    """Who owns a restored checkpoint (FLIP-193)."""

    CLAIM = "claim"
    NO_CLAIM = "no_claim"
