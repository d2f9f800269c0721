"""How an implementation plugs into the conformance suite in process.

An implementation provides ``start(config, job)``, which begins one job on empty storage
and returns a ``Session``: ``run(command)`` executes a command of ``spec.commands`` and
returns ``None`` when it was accepted or the ``Reason`` it was refused for (a refused
command changes nothing); ``observe()`` returns what the implementation shows of itself
(``spec.observation.Observation``: its real files and bookkeeping); ``close()`` ends it.

Names: the expected observations use the reference model's deterministic names (R2: the
n-th physical file is ``f000001``..., the n-th logical segment ``s000001``...). An
implementation runs the suite with such a deterministic id source (fastimpl's
``CounterIds``); CONFORMANCE.md says why and what else is normalized.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

import fsspec  # type: ignore[import-untyped]

from conformance.fastimpl_commands import apply
from fastimpl import CounterIds
from fastimpl.engine import InProcessEngine
from refimpl import ModelState, initial_state, observe, step
from spec.commands import Command
from spec.config import Config, JobSpec
from spec.errors import CommandError, Reason
from spec.observation import Observation


class Session(Protocol):
    def run(self, command: Command) -> Reason | None: ...

    def observe(self) -> Observation: ...

    def close(self) -> None: ...


class Implementation(Protocol):
    name: str

    def start(self, config: Config, job: JobSpec) -> Session: ...


class ModelSession:
    """The reference model itself: the judge, and the source of every expectation."""

    def __init__(self, config: Config, job: JobSpec) -> None:
        self.state: ModelState = initial_state(config, job)

    def run(self, command: Command) -> Reason | None:
        try:
            self.state = step(self.state, command).state
        except CommandError as err:
            return err.reason
        return None

    def observe(self) -> Observation:
        return observe(self.state)

    def close(self) -> None:
        pass


class Model:
    name = "refimpl"

    def start(self, config: Config, job: JobSpec) -> ModelSession:
        return ModelSession(config, job)


_roots = itertools.count()


class FastimplSession:
    def __init__(self, config: Config, job: JobSpec, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root
        self.engine = InProcessEngine(config, job, fs, root, CounterIds(), deletion_log=True)

    def run(self, command: Command) -> Reason | None:
        try:
            apply(self.engine, command)
        except CommandError as err:
            return err.reason
        return None

    def observe(self) -> Observation:
        return self.engine.observe()

    def close(self) -> None:
        close_all = getattr(self.engine.storage, "close_all", None)
        if close_all is not None:
            close_all()
        self.engine.storage.drain()
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


class Fastimpl:
    """fastimpl's ``InProcessEngine`` with counter ids, on ``memory://`` (default) or under a
    local directory."""

    name = "fastimpl"

    def __init__(self, base: str | None = None) -> None:
        self.base = base

    def start(self, config: Config, job: JobSpec) -> FastimplSession:
        n = next(_roots)
        if self.base is None:
            return FastimplSession(config, job, fsspec.filesystem("memory"), f"/conf-{n}")
        fs = fsspec.filesystem("file")
        root = f"{self.base}/case-{n}"
        fs.makedirs(root, exist_ok=True)
        return FastimplSession(config, job, fs, root)
