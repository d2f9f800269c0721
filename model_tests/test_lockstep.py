"""fastimpl in lockstep with the reference model (issue 3).

A Hypothesis state machine drives the reference model (through ``Harness``) and a
``fastimpl.Cluster`` writing real files through fsspec, with the same commands:
``LockstepHarness.run`` sends every command to both. After every command:

* both accept it, or both refuse it with the same ``Reason``;
* ``observe()`` of both are equal, field by field. The only normalization: the byte size
  of ``_metadata`` files (the model counts entries, fastimpl writes JSON) is compared as
  existence only; every data file's size must match exactly;
* the managed directories fastimpl reports exist on the real storage;
* every safety invariant (I1-I5) holds on fastimpl's observation.

The rules are those of ``RefimplMachine`` (every command of the vocabulary, including
quiescing midway and in teardown, which go through the same lockstep ``run``). The
model's own purity check is not repeated here. Backends: a local directory under
pytest's ``tmp_path`` and fsspec's ``memory://``; all three merging modes.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from fastimpl import Cluster, CounterIds
from model_tests.harness import DEFAULT_JOB, Harness, InvariantBroken
from model_tests.test_refimpl_machine import RefimplMachine
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode
from spec.effects import Effect
from spec.errors import CommandError
from spec.invariants import check_safety
from spec.observation import Observation

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or "default"
SCALE = 10 if PROFILE == "long" else 1
EXAMPLES = {"memory": 100 * SCALE, "local": 50 * SCALE}
"""Per merging mode. Local files are fsync-ed on every append (R12), which makes a local
example about twice as slow as a memory one; these counts keep the file near 3 minutes."""

METADATA_SUFFIX = "/_metadata"
_roots = itertools.count()


def normalized(obs: Observation) -> Observation:
    """Metadata files are compared by existence, not by byte size."""
    files = {p: (-1 if p.endswith(METADATA_SUFFIX) else n) for p, n in obs.files.items()}
    return attrs.evolve(obs, files=files)


def differences(model: Observation, impl: Observation) -> list[str]:
    out = []
    for f in attrs.fields(Observation):
        a, b = getattr(model, f.name), getattr(impl, f.name)
        if a != b:
            out.append(f"{f.name}:\n    model: {a!r}\n    fast:  {b!r}")
    return out


class LockstepHarness(Harness):
    """A harness whose every command also runs on a fastimpl cluster, compared."""

    def __init__(self, config: Config, job: JobSpec, fs: Any, root: str) -> None:
        super().__init__(config, job)
        self.cluster = Cluster(config, job, fs, root, CounterIds())

    def run(self, cmd: c.Command) -> tuple[Effect, ...]:
        model_err: CommandError | None = None
        effects: tuple[Effect, ...] = ()
        try:
            effects = super().run(cmd)
        except CommandError as err:
            model_err = err
        except InvariantBroken:
            raise
        impl_err: CommandError | None = None
        try:
            self.cluster.apply(cmd)
        except CommandError as err:
            impl_err = err
        history = self.history + ([cmd] if model_err is not None else [])
        repro = "\n".join(f"    {x!r}," for x in history)
        assert (model_err is None) == (impl_err is None), (
            f"model {'refused: ' + str(model_err) if model_err else 'accepted'}, fastimpl "
            f"{'refused: ' + str(impl_err) if impl_err else 'accepted'} {cmd!r} after:\n{repro}"
        )
        if model_err is not None and impl_err is not None:
            assert model_err.reason is impl_err.reason, f"{model_err} != {impl_err}\n{repro}"
        impl = self.cluster.observe()
        diff = differences(normalized(self.observe()), normalized(impl))
        assert not diff, "\n".join([*diff, "after commands:", repro])
        missing = [d for d in impl.directories if not self.cluster.storage.exists_dir(d)]
        assert not missing, f"directories reported but not on storage: {missing}\n{repro}"
        broken = check_safety(impl)
        assert not broken, "\n".join([*(str(v) for v in broken), repro])
        if model_err is not None:
            raise model_err
        return effects


class LockstepMachine(RefimplMachine):
    backend: str = "memory"
    base: str = ""

    def make_harness(self, cfg: Config) -> Harness:
        n = next(_roots)
        if self.backend == "memory":
            self.fs = fsspec.filesystem("memory")
            self.root = f"/lockstep-{n}"
        else:
            self.fs = fsspec.filesystem("file")
            self.root = f"{self.base}/run-{n}"
            os.makedirs(self.root)
        return LockstepHarness(cfg, DEFAULT_JOB, self.fs, self.root)

    def transitions_are_pure(self) -> None:
        """The model's purity is test_refimpl_machine's business."""

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if getattr(self, "fs", None) is not None and self.fs.exists(self.root):
                self.fs.rm(self.root, recursive=True)


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
@pytest.mark.parametrize("backend", ["local", "memory"])
def test_lockstep(backend: str, mode: MergingMode, tmp_path: Path) -> None:
    machine = type(
        f"Lockstep{backend.title()}{mode.name}",
        (LockstepMachine,),
        {"mode": mode, "backend": backend, "base": str(tmp_path)},
    )
    run_state_machine_as_test(machine, settings=settings(max_examples=EXAMPLES[backend]))
