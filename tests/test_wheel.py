"""The built wheel works on its own (``model_tests/wheel_check.py``; ``make wheel-check``
does the same with the dependencies installed from the index).

The whole check: pip builds the wheel of this repository; the wheel must hold the product
packages with the corpus and ``schema.json`` and nothing of ``model_tests``, ``bench``,
``examples`` or ``tests``; it is installed alone (``--no-deps``) in a new virtual
environment that sees this environment's dependencies behind its own site-packages (no
download); there, run from a folder outside the repository, every product module must come
from the wheel and ``model_tests``, ``bench``, ``examples`` and ``tests`` must not import;
and the installed ``ckpt conformance --impl fastimpl`` must run every case of the corpus
and pass. About 20 s.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from model_tests import wheel_check
from model_tests.wheel_check import ROOT, WheelCheckError, contents_problems


def test_the_built_wheel_runs_the_whole_corpus_from_a_fresh_venv(tmp_path: Path) -> None:
    corpus = len(list((ROOT / "conformance" / "corpus").glob("*.json*")))
    r = wheel_check.check(tmp_path / "wheel", deps="here")
    assert r.cases == r.passed == corpus > 600


def _wheel(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "ckpt_ownership-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n in names:
            z.writestr(n, "")
    return path


def test_the_contents_check_names_what_is_missing_or_extra(tmp_path: Path) -> None:
    """A wheel in a layout the check must refuse: model_tests and bench as top-level
    packages, the corpus inside model_tests, no conformance or ckpt package; and the
    examples, which stay in the repository too. Each problem is named (ships, lacks)."""
    old = _wheel(
        tmp_path,
        [
            *(f"{p}/__init__.py" for p in ("spec", "refimpl", "fastimpl", "pipeline", "bench")),
            "model_tests/__init__.py",
            "model_tests/conformance/case.py",
            "examples/scripted_job/job.py",
            "ckpt_ownership-0.1.0.dist-info/RECORD",
        ],
    )
    problems = contents_problems(old)
    for expected in (
        "ships bench/",
        "ships model_tests/",
        "ships examples/",
        "lacks conformance/",
        "lacks ckpt/",
        "lacks conformance/schema.json",
        "lacks conformance/corpus/",
    ):
        assert expected in problems, problems
    assert any(p.startswith("ships 0 corpus cases") for p in problems), problems


def test_the_check_refuses_to_work_inside_the_repository() -> None:
    with pytest.raises(WheelCheckError, match="inside the repository"):
        wheel_check.check(ROOT / "build" / "wheel-check")
