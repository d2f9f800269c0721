"""fastimpl through the conformance suite in process (the test kit), and the corpus
itself: valid, named, covering every rule, and with the model's own expectations."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from conformance.adapter import Fastimpl, Implementation, Model
from conformance.case import (
    CaseError,
    corpus_files,
    dumps,
    from_json,
    load,
    schema,
    to_json,
)
from conformance.kit import ConformanceSuite, case_traits, covering_sample, named_cases
from conformance.process import ProcessImplementation, ProtocolError
from conformance.runner import run_case
from conformance.schema_gen import text as schema_text
from model_tests import corpus_tool
from spec import commands as c
from spec.errors import Reason
from tests.profile import PROFILE

SERVER = f"{sys.executable} -m conformance.fastimpl_server"


FULL_CORPUS = PROFILE == "long" or bool(os.environ.get("FULL_CORPUS"))
"""Run the random cases in process too: in the ``long`` profile, and in the mutation run
(``make mutate`` sets ``FULL_CORPUS``), so that its verdicts count these cases too."""


class TestFastimplInProcess(ConformanceSuite):
    """Every named case. The random cases are recorded from the model's random machine,
    which the lockstep (``tests/test_lockstep.py``) runs against fastimpl step by step
    already; they are for implementations without a lockstep of their own (and run here
    with ``FULL_CORPUS``)."""

    def implementation(self) -> Implementation:
        return Fastimpl()

    def cases(self) -> list[Path]:
        return corpus_files() if FULL_CORPUS else named_cases()


class TestFastimplOverProcess(ConformanceSuite):
    """The JSON-lines path, one server process for the whole class, on the cases that
    between them carry every command type, refusal reason and merging mode: what is
    behind the pipe is the implementation the in-process suite runs whole."""

    impl: ClassVar[ProcessImplementation | None] = None

    def cases(self) -> list[Path]:
        return covering_sample()

    def implementation(self) -> Implementation:
        if TestFastimplOverProcess.impl is None:
            TestFastimplOverProcess.impl = ProcessImplementation(SERVER)
        return TestFastimplOverProcess.impl

    @classmethod
    def teardown_class(cls) -> None:
        if cls.impl is not None:
            cls.impl.close()
            cls.impl = None


def test_the_corpus_is_valid_named_and_covers_every_rule() -> None:
    """Every file decodes, names are unique and short, every rule is covered; one file in
    ten is validated against the schema here (``corpus_tool check`` validates them all,
    and recomputes every expectation)."""
    assert corpus_tool.check(expectations=False, schema_every=10) == []
    names = [p.name for p in corpus_files()]
    assert len(names) >= 600
    assert sum(n.startswith("random-") for n in names) >= 200


def test_the_process_sample_covers_what_the_corpus_has() -> None:
    """Every command type, refusal reason and merging mode of the corpus is in the sample
    the process suite runs, and the sample is a small part of the corpus."""
    everything = set().union(*(case_traits(load(p)) for p in corpus_files()))
    sample = covering_sample()
    assert set().union(*(case_traits(load(p)) for p in sample)) == everything
    assert len(sample) * 10 < len(corpus_files())


def test_schema_json_is_generated_from_the_vocabulary() -> None:
    assert schema() == json.loads(schema_text())


def test_a_case_round_trips_through_its_json() -> None:
    for path in corpus_files()[:40]:
        case = load(path)
        assert from_json(json.loads(dumps(case))) == case
        assert from_json(to_json(case)) == case


def _first() -> Path:
    return next(p for p in corpus_files() if p.name.startswith("r41-"))


def test_the_model_passes_its_own_cases() -> None:
    for path in corpus_files()[::25]:
        result = run_case(load(path), Model())
        assert result.passed, result.mismatch


def test_a_wrong_outcome_is_reported_with_the_step_and_commands() -> None:
    case = load(_first())
    i = next(i for i, s in enumerate(case.steps) if s.refused is None and i > 2)
    wrong = case.steps[i].__class__(
        case.steps[i].command, Reason.NO_SUCH_STATE, case.steps[i].observation
    )
    bad = type(case)(
        case.name,
        case.rules,
        case.description,
        case.source,
        case.config,
        case.job,
        (*case.steps[:i], wrong, *case.steps[i + 1 :]),
    )
    result = run_case(bad, Fastimpl())
    assert not result.passed and result.mismatch is not None
    assert f"step {i + 1} of" in result.mismatch
    assert "expected refused (no_such_state), got accepted" in result.mismatch
    assert repr(case.steps[i].command) in result.mismatch


def test_a_changed_observation_is_a_minimal_field_diff() -> None:
    case = load(_first())
    i = len(case.steps) - 1
    s = case.steps[i]
    files = dict(s.observation.files)
    files["job-0/ghost"] = 7
    import attrs

    obs = attrs.evolve(s.observation, files=files)
    bad = attrs.evolve(case, steps=(*case.steps[:i], attrs.evolve(s, observation=obs)))
    result = run_case(bad, Fastimpl())
    assert not result.passed and result.mismatch is not None
    assert "files:" in result.mismatch and "job-0/ghost" in result.mismatch
    assert "owners:" not in result.mismatch


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda d: d.update(version=9), "version 9"),
        (lambda d: d["steps"][0].update(outcome="maybe"), "steps[0].outcome"),
        (lambda d: d["steps"][0]["command"].update(type="Explode"), "steps[0].command.type"),
        (lambda d: d["steps"][0].update(observation={"files": 3}), "steps[0].observation.files"),
        (lambda d: d.update(name="Not A Short Name"), "name"),
    ],
    ids=["version", "outcome", "command", "observation", "name"],
)
def test_a_broken_case_file_is_refused_naming_the_place(edit: object, problem: str) -> None:
    data = json.loads(dumps(load(_first())))
    assert callable(edit)
    edit(data)
    with pytest.raises(CaseError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        from_json(data, "case")


def test_a_case_file_is_checked_against_the_schema(tmp_path: Path) -> None:
    good = load(_first())
    (tmp_path / f"{good.name}.json").write_text(dumps(good))
    data = json.loads(dumps(good))
    data["steps"][1]["colour"] = "red"
    (tmp_path / "other.json").write_text(json.dumps(data))
    problems = corpus_tool.check(tmp_path, expectations=True)
    assert any("other.json: schema" in p and "colour" in p for p in problems)
    assert any(p.startswith("no case for:") for p in problems)


def test_stale_expectations_are_found(tmp_path: Path) -> None:
    import attrs

    case = load(_first())
    s = case.steps[-1]
    stale = attrs.evolve(case, steps=(*case.steps[:-1], attrs.evolve(s, command=c.RetryDeletes())))
    (tmp_path / f"{case.name}.json").write_text(dumps(stale))
    problems = corpus_tool.check(tmp_path, expectations=True)
    assert any("stored expectations differ from the model" in p for p in problems)


def test_a_process_that_breaks_the_protocol_fails_the_case_clearly(tmp_path: Path) -> None:
    script = tmp_path / "liar.py"
    script.write_text("import sys\nfor line in sys.stdin:\n    print('not json', flush=True)\n")
    impl = ProcessImplementation(f"{sys.executable} {script}")
    with pytest.raises(ProtocolError, match="answered with no JSON"):
        impl.start(load(_first()).config, load(_first()).job)
    impl.close()
    dead = ProcessImplementation(f"{sys.executable} -c pass")
    result = run_case(load(_first()), dead)
    assert not result.passed and result.mismatch is not None
    assert "closed its output" in result.mismatch


def test_live_mode_shrinks_a_mismatch_to_a_case_the_candidate_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attrs

    from conformance.live import live
    from fastimpl.engine import InProcessEngine
    from spec.config import MergingMode

    shown = InProcessEngine.observe

    def hides_the_coordinator(self: InProcessEngine) -> object:
        obs = shown(self)
        if not self.coord.pending:
            return obs
        return attrs.evolve(obs, live_parties=obs.live_parties - {"coordinator"})

    monkeypatch.setattr(InProcessEngine, "observe", hides_the_coordinator)
    found = live(Fastimpl(), MergingMode.WITHIN_CHECKPOINT, 20, tmp_path, derandomize=True)
    assert found.mismatch is not None and found.case is not None
    assert "live_parties" in found.mismatch
    case = load(found.case)
    assert case.name.startswith("live-within-checkpoint-")
    # Shrunk to a few commands ending with the trigger that leaves a checkpoint pending.
    assert len(case.steps) <= 3, [s.command for s in case.steps]
    assert type(case.steps[-1].command).__name__ == "Trigger"
    assert not run_case(case, Fastimpl()).passed
    monkeypatch.undo()
    assert run_case(case, Fastimpl()).passed
    assert run_case(case, Model()).passed
    clean = live(Fastimpl(), MergingMode.NONE, 5, tmp_path, derandomize=True)
    assert clean.mismatch is None and clean.case is None


def test_the_command_line_reports_and_exits_by_outcome(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ckpt.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["conformance", "--impl", "fastimpl", "--cases", "r41-*"])
    assert ok.exit_code == 0, ok.output
    assert "conformance of fastimpl" in ok.output
    usage = runner.invoke(app, ["conformance"])
    assert usage.exit_code == 2 and "exactly one of --impl and --impl-cmd" in usage.output
    none = runner.invoke(app, ["conformance", "--impl", "fastimpl", "--cases", "zzz*"])
    assert none.exit_code == 2 and "no case matches" in none.output
    quitter = tmp_path / "quitter.py"
    quitter.write_text("import sys\nsys.stdin.readline()\nprint('{\"ok\": true}', flush=True)\n")
    bad = runner.invoke(
        app, ["conformance", "--impl-cmd", f"{sys.executable} {quitter}", "--cases", "r41-*"]
    )
    assert bad.exit_code == 1, bad.output
    assert "FAIL" in bad.output and "first mismatch" in bad.output
    # The quitter exits after its first answer: the next command either finds its input
    # closed (it has exited: a broken pipe) or is written and then meets the end of its
    # output; which one depends on the scheduler, and both name the dead process.
    assert "closed its output" in bad.output or "stopped reading its input" in bad.output
