"""The implementations the proof tools drive with spec commands, behind one small
interface: the lockstep machine (test_lockstep.py), the refusal checks
(test_refusals.py) and the trace and zombie-directory tests all reach fastimpl through
``FastimplTarget`` and nothing else, so the product's internals can change behind it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from conformance.fastimpl_commands import apply
from fastimpl import CounterIds
from fastimpl.engine import InProcessEngine
from fastimpl.party_observation import observe_working
from spec import commands as c
from spec.config import Config, JobSpec
from spec.observation import Observation, WorkingObservation
from spec.refusals import Checks


class Target(Protocol):
    """An implementation under test, running one job on one storage root."""

    def apply(self, cmd: c.Command) -> None:
        """Run a command of ``spec.commands``; raise ``CommandError`` if it is refused
        (a refused command changes nothing)."""

    def observe(self) -> Observation:
        """What the implementation shows of itself: its real files and bookkeeping."""

    def exists_dir(self, path: str) -> bool:
        """Whether a directory (relative to the root) exists on the storage."""

    def settle(self) -> None:
        """Wait for work in the background (e.g. queued deletes) to finish."""

    def close(self) -> None:
        """Release what the implementation holds open (files, threads)."""


StartTarget = Callable[[Config, JobSpec, Any, str], Target]
"""``start(config, job, fs, root)``: a fresh implementation on an empty root. Names must
be the model's deterministic ones (R2: ``f000001``..., ``s000001``...)."""


class FastimplTarget:
    """fastimpl's ``InProcessEngine`` with the model's names (``CounterIds``)."""

    def __init__(self, config: Config, job: JobSpec, fs: Any, root: str) -> None:
        self.engine = InProcessEngine(config, job, fs, root, CounterIds(), deletion_log=True)

    def apply(self, cmd: c.Command) -> None:
        apply(self.engine, cmd)

    def observe(self) -> Observation:
        return self.engine.observe()

    def guard_checks(self, cmd: c.Command) -> Checks:
        """The product's predicate for each guard of ``cmd`` (``spec.refusals``), by
        name: what it checks the command with before anything changes."""
        return self.engine.checks(cmd)

    def observe_working(self, seen: Observation | None = None) -> WorkingObservation:
        engine = self.engine
        obs = engine.observe() if seen is None else seen
        return observe_working(engine.coord, engine.parties, obs)

    def exists_dir(self, path: str) -> bool:
        return bool(self.engine.storage.exists_dir(path))

    def settle(self) -> None:
        self.engine.storage.drain()

    def close(self) -> None:
        self.engine.storage.close_all()
