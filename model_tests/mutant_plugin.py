"""A pytest plugin that runs a whole session with one mutant of ``model_tests/mutants.py``.

    CKPT_MUTANT=flink-38347 pytest -p model_tests.mutant_plugin tests/test_lockstep.py

The mutant named by ``CKPT_MUTANT`` (``none``: no mutant, for a baseline run) is patched
into fastimpl before any test runs and removed when the session ends. The terminal summary
names it, so that the caller (``python -m model_tests.mutants``) can tell a mutant that
survived from one that was never applied. Hypothesis does not shrink in such a session:
one failing sequence kills the mutant, and shrinking a stateful one takes minutes.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import Phase, settings

from model_tests.mutants import APPLIED_MARK, ENV, MUTANTS, NO_MUTANT

_patch: pytest.MonkeyPatch | None = None
_name: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _patch, _name
    name = os.environ.get(ENV, "").strip()
    if name != NO_MUTANT and name not in MUTANTS:
        raise pytest.UsageError(
            f"{ENV}={name!r}: expected {NO_MUTANT!r} or one of {', '.join(sorted(MUTANTS))}"
        )
    _name = name
    _patch = pytest.MonkeyPatch()
    if name != NO_MUTANT:
        MUTANTS[name].patch(_patch)


def pytest_collection_finish(session: pytest.Session) -> None:
    # After collection, so that the profile conftest.py loaded is the parent.
    parent = settings.default
    assert parent is not None
    settings.register_profile(
        "mutant", parent, phases=[p for p in parent.phases if p is not Phase.shrink]
    )
    settings.load_profile("mutant")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _name is not None:
        terminalreporter.write_line(f"{APPLIED_MARK}{_name}")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _patch
    if _patch is not None:
        _patch.undo()
        _patch = None
