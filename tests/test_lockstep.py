"""The lockstep machine (``tests/lockstep.py``) on every storage and merging mode, and the
checks that it takes the implementation as an argument and catches a broken one.
Soak runs: ``LOCKSTEP_EXAMPLES=N`` and ``LOCKSTEP_LOG=file`` (see ``tests/lockstep.py``).
"""

from __future__ import annotations

import fsspec  # type: ignore[import-untyped]
import pytest
from hypothesis import Phase

from conformance.harness import DEFAULT_JOB
from fastimpl import CounterIds
from fastimpl.engine import InProcessEngine
from model_tests.targets import FastimplTarget
from spec import commands as c
from spec.config import Config, MergingMode
from tests import lockstep as lockstep_module
from tests.lockstep import (
    OBJECT_STORE_MODES,
    Backend,
    _cases,
    _roots,
    _start_from_env,
    examples,
    lockstep,
)


@pytest.mark.parametrize(("backend", "mode"), _cases(), indirect=["backend"])
def test_lockstep(backend: Backend, mode: MergingMode) -> None:
    lockstep(_start_from_env(), backend, mode, examples(backend.name))


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_across_checkpoint_refused_on_s3(backend: Backend) -> None:
    """R16: on S3 (open files not readable) ACROSS_CHECKPOINT merging is a configuration
    error, with the documented message; the other two modes run there."""
    with pytest.raises(ValueError, match=r"across-checkpoint-boundary .* \(R16\)"):
        backend.config(Config.for_mode(MergingMode.ACROSS_CHECKPOINT))
    for mode in OBJECT_STORE_MODES:
        cfg = backend.config(Config.for_mode(mode))
        assert not cfg.open_files_readable
        root = backend.new_root()
        engine = InProcessEngine(
            cfg, DEFAULT_JOB, backend.fs, root, CounterIds(), deletion_log=True
        )
        engine.trigger()
        assert engine.observe().files == {}
        backend.remove(root)


class NotificationDroppingTarget(FastimplTarget):
    """A broken implementation: it accepts a delivered notification and ignores it."""

    def apply(self, cmd: c.Command) -> None:
        if not isinstance(cmd, c.DeliverNotification):
            super().apply(cmd)


def test_the_machine_takes_the_implementation_and_catches_a_broken_one() -> None:
    """The implementation is an argument: one that ignores notifications is caught, with
    the command sequence that shows it; the shipped one passes the same run."""
    backend = Backend("memory", fsspec.filesystem("memory"), f"/lockstep-arg-{next(_roots)}")
    lockstep(FastimplTarget, backend, MergingMode.WITHIN_CHECKPOINT, 5)
    # Shrinking a stateful failure takes minutes: the first failing sequence is enough.
    no_shrink = {"phases": [Phase.generate], "report_multiple_bugs": False}
    with pytest.raises(AssertionError, match=r"(?s)model: .*after commands:.*DeliverNotification"):
        lockstep(
            NotificationDroppingTarget, backend, MergingMode.WITHIN_CHECKPOINT, 50, **no_shrink
        )


def test_lockstep_impl_names_the_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lockstep_module, "IMPL", f"{__name__}:NotificationDroppingTarget")
    assert _start_from_env() is NotificationDroppingTarget
    monkeypatch.setattr(lockstep_module, "IMPL", "")
    assert _start_from_env() is FastimplTarget
