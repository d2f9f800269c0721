"""The divergences of a Flink run, grouped for the report (``report`` builds them,
``report_text`` renders them)."""

from __future__ import annotations

from attrs import frozen

from conformance.flink import judge
from conformance.flink.verdicts import Verdict
from spec.commands import Command
from spec.config import Config, JobSpec


@frozen
class Group:
    signature: tuple[str, str, str]
    cases: tuple[str, ...]
    config: Config
    job: JobSpec
    minimal: tuple[Command, ...]
    outcome: judge.Outcome
    live_only: bool
    verdict: Verdict
    repro: str | None
    quiet: tuple[int, int, int] = (0, 0, 0)
    """Of the sequences run to the end and then quiesced: how many, how many leave a file
    no retained checkpoint uses (I6), how many leave a dangling handle (I1)."""


@frozen
class QuietGroup:
    """Sequences after which Flink is not quiet (``judge.quiet``): a leak (I6) or a
    dangling handle (I1) of one likely cause (``verdicts.quiet_class``)."""

    mode: str
    kind: str
    """``leak`` or ``dangling``."""
    cls: str
    cases: tuple[str, ...]
    config: Config
    job: JobSpec
    minimal: tuple[Command, ...]
    """The shortest sequence found that still leaves it, before the quiescing."""
    quiet: judge.Quiet
    verdict: Verdict
    repro: str | None
