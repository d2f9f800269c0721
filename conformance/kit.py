"""The pytest test kit: subclass ``ConformanceSuite``, say how to start your
implementation, and pytest runs every case of the corpus against it (as fsspec's
abstract test classes do for file systems)::

    from conformance.kit import ConformanceSuite

    class TestMyStore(ConformanceSuite):
        def implementation(self) -> Implementation:
            return MyStoreAdapter()

A failing case prints the step, the command, the differing fields of the observation
and the commands up to it. Every case runs unless the subclass narrows ``cases``: to
``named_cases()`` (the cases written for a rule, a bug or an invariant, without the random
ones) or to ``covering_sample()`` (a few cases that between them run every command type,
every refusal reason and every merging mode: a quick check of a transport, such as the
process protocol, whose implementation behind it runs the whole corpus elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from conformance.adapter import Implementation
from conformance.case import GZIP_PREFIX, Case, case_name, corpus_files, load
from conformance.runner import run_case

CASES = corpus_files()


def named_cases(paths: Sequence[Path] = CASES) -> list[Path]:
    """The cases written for a rule, an invariant or a bug: every case but the random
    sequences (``random-*``), which are recorded from the reference model's random state
    machine and are there for implementations that have no lockstep of their own."""
    return [p for p in paths if not case_name(p).startswith(GZIP_PREFIX)]


def case_traits(case: Case) -> set[str]:
    """What a case carries: its merging mode, its command types, its outcomes."""
    traits = {f"mode:{case.config.merging_mode.name}"}
    for s in case.steps:
        traits.add(f"command:{type(s.command).__name__}")
        traits.add("outcome:accepted" if s.refused is None else f"refused:{s.refused.name}")
    return traits


def covering_sample(paths: Sequence[Path] = CASES) -> list[Path]:
    """Few cases that between them run every command type, every refusal reason and
    every merging mode the corpus has: each kind of message a transport carries, at least
    once. Greedy (the case adding most first; ties by name), from the named cases and
    then from the random ones for what no named case has."""
    named = named_cases(paths)
    pools = [named, [p for p in paths if p not in set(named)]]
    traits = {p: case_traits(load(p)) for p in paths}
    need = set().union(*traits.values()) if traits else set()
    chosen: list[Path] = []
    for pool in pools:
        left = sorted(pool, key=case_name)
        while need and left:
            best = max(left, key=lambda p: len(traits[p] & need))
            if not traits[best] & need:
                break
            chosen.append(best)
            left.remove(best)
            need -= traits[best]
    return sorted(chosen, key=case_name)


class ConformanceSuite:
    """Subclass it with a name starting with ``Test`` and define ``implementation``."""

    def implementation(self) -> Implementation:
        raise NotImplementedError("a conformance suite says which implementation it tests")

    def cases(self) -> Sequence[Path]:
        """The case files to run: the whole corpus unless a subclass narrows it."""
        return CASES

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "path" in metafunc.fixturenames:
            metafunc.parametrize("path", list(self.cases()), ids=case_name)

    def test_case(self, path: Path) -> None:
        case: Case = load(path)
        result = run_case(case, self.implementation())
        assert result.passed, result.mismatch
