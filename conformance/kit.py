"""The pytest test kit: subclass ``ConformanceSuite``, say how to start your
implementation, and pytest runs every case of the corpus against it (as fsspec's
abstract test classes do for file systems)::

    from conformance.kit import ConformanceSuite

    class TestMyStore(ConformanceSuite):
        def implementation(self) -> Implementation:
            return MyStoreAdapter()

A failing case prints the step, the command, the differing fields of the observation
and the commands up to it.
"""

from __future__ import annotations

import pytest

from conformance.adapter import Implementation
from conformance.case import Case, case_name, corpus_files, load
from conformance.runner import run_case

CASES = corpus_files()


class ConformanceSuite:
    """Subclass it with a name starting with ``Test`` and define ``implementation``."""

    def implementation(self) -> Implementation:
        raise NotImplementedError("a conformance suite says which implementation it tests")

    @pytest.mark.parametrize("path", CASES, ids=case_name)
    def test_case(self, path: object) -> None:
        from pathlib import Path

        assert isinstance(path, Path)
        case: Case = load(path)
        result = run_case(case, self.implementation())
        assert result.passed, result.mismatch
