"""The mutant zoo (``model_tests/mutants.py``) bites: every mutant of fastimpl is killed by
its own case of the conformance corpus (its bug's scenario, or the rule the mistake
breaks), which the unmutated fastimpl passes, and a mutant leaves no trace in fastimpl
once its patch is undone. ``make mutants`` runs the whole corpus and the lockstep tests
against every mutant as well; here the lockstep only for one, cheaply, to show that path
works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from model_tests import mutants
from model_tests.mutants import MUTANTS, ZOO, applied, case_path, passes_unmutated, run_own_case

FLINK_BUGS = (
    "FLINK-38347",
    "FLINK-36125",
    "FLINK-35570",
    "FLINK-35784",
    "FLINK-35400",
    "FLINK-25395",
    "FLINK-26985",
    "FLINK-29913",
    "FLINK-35803",
    "FLINK-32086",
)


def test_zoo_has_at_least_twelve_uniquely_named_mutants() -> None:
    assert len(ZOO) >= 12
    assert len(MUTANTS) == len(ZOO), "two mutants share a name"
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9-]*", m.name) for m in ZOO)


def test_every_flink_bug_of_the_brief_has_a_mutant() -> None:
    mirrored = {m.mirrors.split()[0] for m in ZOO}
    assert set(FLINK_BUGS) <= mirrored


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_killed_by_its_own_case(name: str) -> None:
    own = MUTANTS[name].case
    run = run_own_case(name)
    assert run.killed, f"{name} survived its own case {own}"
    assert run.case == own and run.step >= 1
    # A case fastimpl fails anyway would "kill" every mutant and prove nothing.
    assert passes_unmutated(case_path(own)), f"{own} fails without {name}"


def test_each_flink_bug_has_its_own_case_named_after_it() -> None:
    """One home per Flink bug of the brief: its mutant's case is the bug's scenario."""
    for m in ZOO:
        bug = m.mirrors.split()[0]
        if bug in FLINK_BUGS:
            assert m.case.startswith(bug.lower() + "-"), (m.name, m.case)


def _fastimpl_modules() -> list[ModuleType]:
    loaded = sorted(sys.modules.items())
    return [m for n, m in loaded if n.split(".")[0] == "fastimpl" and m is not None]


def _snapshot() -> dict[tuple[str, str, str], object]:
    """Every module-level and class-level attribute of every loaded fastimpl module (the
    mutants patch classes of the coordinator's parts, the TM's parts ``fastimpl.tm_*``,
    ``fastimpl.catalog`` and ``fastimpl.manager``, all loaded)."""
    out: dict[tuple[str, str, str], object] = {}
    for module in _fastimpl_modules():
        for attr, value in vars(module).items():
            out[(module.__name__, "", attr)] = value
            if isinstance(value, type) and value.__module__ == module.__name__:
                for k, v in vars(value).items():
                    out[(module.__name__, value.__name__, k)] = v
    return out


def _changed(
    a: dict[tuple[str, str, str], object], b: dict[tuple[str, str, str], object]
) -> set[tuple[str, str, str]]:
    return {k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] is not b[k]}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_patch_changes_fastimpl_and_undoing_it_restores_it(name: str) -> None:
    before = _snapshot()
    with applied(name):
        during = _snapshot()
    after = _snapshot()
    assert _changed(before, during), f"{name} patches nothing in fastimpl"
    assert not _changed(before, after), f"{name} left {_changed(before, after)} behind"


def test_plugin_applies_the_named_mutant(tmp_path: Path) -> None:
    """The plugin, on a throwaway test that looks at fastimpl and at Hypothesis's settings
    from inside the session."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from hypothesis import Phase, settings\n"
        "from fastimpl.manager import Manager\n"
        "def test_probe():\n"
        "    assert Manager.created_for.__module__ == 'model_tests.mutants'\n"
        "    assert Phase.shrink not in settings.default.phases\n"
    )
    cmd = [sys.executable, "-m", "pytest", str(probe), "-q", "-p", "model_tests.mutant_plugin"]
    cmd += ["-p", "no:cacheprovider", "--rootdir", str(tmp_path)]

    def run(mutant: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, mutants.ENV: mutant}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)

    applied_run = run("abort-discards-reused")
    assert applied_run.returncode == 0, applied_run.stdout + applied_run.stderr
    assert f"{mutants.APPLIED_MARK}abort-discards-reused" in applied_run.stdout.splitlines()
    baseline = run(mutants.NO_MUTANT)
    assert baseline.returncode == 1, "without the mutant the probe must fail"
    unknown = run("no-such-mutant")
    assert unknown.returncode == pytest.ExitCode.USAGE_ERROR
    assert "no-such-mutant" in unknown.stderr


def test_lockstep_kills_a_mutant_in_a_subprocess() -> None:
    """The one lockstep run of this file: a mutant that breaks the first write of a merging
    mode, with few sequences, through the same path as ``make mutants``."""
    run = mutants.run_lockstep("forget-taskowned-dir", 5)
    assert run.status == "killed", run
    assert "test_lockstep[memory-" in run.first_line
