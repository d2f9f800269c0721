"""The verdict on each kind of divergence (``judge.signature``), after reading the minimal
sequence, Flink 2.3's code and our rules. A signature not listed here is reported as
unclassified: it needs a look before it counts as anything."""

from __future__ import annotations

from attrs import frozen

FLINK_BUG = "Flink bug"
DELIBERATE = "deliberate difference (We)"
ADAPTER = "limit of the adapter"
UNCLASSIFIED = "unclassified"


@frozen
class Verdict:
    kind: str
    rules: str
    """The rules (and invariants) the divergence is about."""
    title: str
    text: str
    """What happens, what is lost or leaked, and why this verdict."""


VERDICTS: dict[tuple[str, str, str], Verdict] = {}
"""(merging mode or ``*``, command, kinds) -> verdict."""


def verdict(signature: tuple[str, str, str]) -> Verdict:
    mode, command, kinds = signature
    for key in (signature, ("*", command, kinds)):
        if key in VERDICTS:
            return VERDICTS[key]
    return Verdict(UNCLASSIFIED, "", f"{command}: {kinds} ({mode})", "Not looked at yet.")
