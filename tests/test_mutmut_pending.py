"""model_tests.mutmut_pending: resuming a stopped mutation run names exactly the mutants of
the selection that have no verdict (mutmut runs again every mutant it is named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_tests import mutmut_pending

_CAT = "fastimpl.catalog.xǁCatalogǁ"


def _meta(root: Path, name: str, codes: dict[str, int | None]) -> None:
    path = root / "fastimpl" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}), encoding="utf-8")


@pytest.fixture
def mutants(tmp_path: Path) -> Path:
    root = tmp_path / "mutants"
    _meta(
        root,
        "catalog.py.meta",
        {
            f"{_CAT}delete_dir__mutmut_1": 1,
            f"{_CAT}delete_dir__mutmut_2": 0,
            f"{_CAT}delete_dir__mutmut_3": None,
            f"{_CAT}delete_dir__mutmut_4": 2,
            f"{_CAT}owners__mutmut_1": None,
        },
    )
    _meta(root, "metadata.py.meta", {"fastimpl.metadata.x_base_of__mutmut_1": None})
    return root


def test_only_the_selections_mutants_without_a_verdict_are_named(
    mutants: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = mutmut_pending.main(["--mutants", str(mutants), f"{_CAT}delete_dir__mutmut_*"])
    out, err = capsys.readouterr()
    assert rc == 0
    # not run, and stopped mid-run (exit code 2); the killed and the survivor are kept
    assert out.split() == [f"{_CAT}delete_dir__mutmut_3", f"{_CAT}delete_dir__mutmut_4"]
    assert "4 mutants selected, 2 without a verdict" in err


def test_an_exact_name_and_a_pattern_select_as_mutmut_does(mutants: Path) -> None:
    codes = mutmut_pending.verdicts(mutants)
    assert len(codes) == 6
    chosen = mutmut_pending.select(codes, [f"{_CAT}owners__mutmut_1", "fastimpl.metadata.*"])
    assert chosen == [f"{_CAT}owners__mutmut_1", "fastimpl.metadata.x_base_of__mutmut_1"]


def test_the_verdict_listing_names_each_mutants_verdict(
    mutants: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutmut_pending.main(["--mutants", str(mutants), "--verdicts", f"{_CAT}delete_dir__mutmut_*"])
    lines = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert lines == {
        f"{_CAT}delete_dir__mutmut_1": "killed",
        f"{_CAT}delete_dir__mutmut_2": "survived",
        f"{_CAT}delete_dir__mutmut_3": "not checked",
        f"{_CAT}delete_dir__mutmut_4": "check was interrupted by user",
    }


def test_a_missing_mutants_directory_or_an_empty_selection_is_an_error(
    mutants: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mutmut_pending.main(["--mutants", str(tmp_path / "none"), "x*"]) == 2
    assert "no mutation run here yet" in capsys.readouterr().err
    assert mutmut_pending.main(["--mutants", str(mutants), "fastimpl.nothing.*"]) == 2
    assert "no mutant" in capsys.readouterr().err
