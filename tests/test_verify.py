"""``make verify``'s driver (model_tests/verify.py): what it reports when a tool is
missing or wrong, and that its checks can fail. The whole run takes minutes and is
``make verify``'s own business; these are the parts that decide what it says."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from model_tests import tla_syntax, tlc, verify
from model_tests.twins import TWINS


def test_a_planted_wrong_contract_is_caught_by_crosshair() -> None:
    caught, lines = verify.planted_contract_caught()
    assert caught, lines
    assert any("planted_contract.py" in line and "error" in line for line in lines)


def test_without_tlc_the_models_are_not_run_and_it_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TLA2TOOLS_JAR", str(tmp_path / "absent.jar"))
    jar, why = tlc.find_jar()
    assert jar is None
    assert "absent.jar" in why and "is not a file" in why
    checks = verify.check_tla(include_soak=False)
    ran = [ck for ck in checks if ck.name.startswith("TLA+ model checking")]
    assert [ck.status for ck in ran] == ["NOT RUN"]
    assert ran[0].summary.startswith("NOT model-checked")
    assert not [ck for ck in checks if ck.name.startswith("TLC ")]


def test_with_no_jar_anywhere_it_says_nothing_was_model_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    monkeypatch.setenv("TLA2TOOLS_NO_DOWNLOAD", "1")
    monkeypatch.setattr(tlc, "CACHE_JAR", tmp_path / "cache" / "tla2tools.jar")
    monkeypatch.setattr(tlc, "SHARED_JAR", tmp_path / "shared" / "tla2tools.jar")
    jar, why = tlc.find_jar()
    assert jar is None and why.startswith("TLC is not available")
    monkeypatch.setattr(verify, "check_mypy", lambda: verify.Check("mypy", "ok"))
    for name in ("check_contracts", "check_diffbehavior"):
        monkeypatch.setattr(verify, name, lambda *_, n=name: verify.Check(n, "ok"))
    for name in ("check_trace", "check_search", "check_twins"):
        monkeypatch.setattr(verify, name, lambda: [])
    assert verify.main([]) == 0
    out = capsys.readouterr().out
    assert "No TLA+ model was model-checked on this machine" in out
    assert "[NOT RUN] TLA+ model checking (TLC): NOT model-checked: TLC is not available" in out


def _jar(path: Path, manifest: str, classes: tuple[str, ...]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", manifest)
        for name in classes:
            z.writestr(name, b"\xca\xfe\xba\xbe")
    return path


@pytest.mark.parametrize(
    ("manifest", "classes", "why"),
    [
        ("Manifest-Version: 1.0\n", ("tla2sany/SANY.class", "tlc2/TLC.class"), "names no version"),
        (
            "Implementation-Version: 1.7.3\n",
            ("tla2sany/SANY.class", "tlc2/TLC.class"),
            "older than v1.7.4",
        ),
        ("Implementation-Version: 1.7.4\n", ("tlc2/TLC.class",), "lacks tla2sany/SANY.class"),
        # Everything a jar shows from outside, but no working TLC inside: the trivial
        # spec is what refuses it.
        (
            "Implementation-Version: 1.8.0\n",
            ("tla2sany/SANY.class", "tlc2/TLC.class"),
            "trivial spec",
        ),
    ],
)
def test_a_jar_is_accepted_by_what_it_is(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    manifest: str,
    classes: tuple[str, ...],
    why: str,
) -> None:
    fake = _jar(tmp_path / "tla2tools.jar", manifest, classes)
    monkeypatch.setenv("TLA2TOOLS_JAR", str(fake))
    jar, said = tlc.find_jar()
    assert jar is None and why in said, said


def test_a_file_that_is_no_jar_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "tla2tools.jar"
    fake.write_bytes(b"not the release")
    why = tlc.accept(fake)
    assert why is not None and "no readable manifest" in why


def test_configs_say_their_module_expectation_count_and_simulation(tmp_path: Path) -> None:
    (tmp_path / "MCSmall.cfg").write_text("\\* expect: pass\n\\* states: 4,363\nINVARIANT I\n")
    (tmp_path / "MCBug.cfg").write_text(
        "\\* module: MCBugModule\n\\* expect: violates NoDanglingInv\n"
    )
    (tmp_path / "MCSim.cfg").write_text("\\* simulate: num=10 depth=30 seed=1\n")
    (tmp_path / "Plain.cfg").write_text("INIT Init\n")
    found = {
        m.cfg.name: (m.module.name, m.expect, m.states, m.simulate) for m in tlc.models(tmp_path)
    }
    assert found == {
        "MCBug.cfg": ("MCBugModule.tla", "violates NoDanglingInv", None, ()),
        "MCSim.cfg": (
            "MCSim.tla",
            "pass",
            None,
            ("-simulate", "num=10", "-depth", "30", "-seed", "1"),
        ),
        "MCSmall.cfg": ("MCSmall.tla", "pass", 4363, ()),
        "Plain.cfg": ("Plain.tla", "pass", None, ()),
    }
    (tmp_path / "MCBad.cfg").write_text("\\* simulate: num=10 seed=x\n")
    with pytest.raises(ValueError, match="want num=N depth=N seed=N"):
        tlc.models(tmp_path)


def _run(**kw: object) -> tlc.Run:
    base: dict[str, object] = dict(
        code=0,
        distinct=10,
        generated=20,
        violated=(),
        completed=True,
        deadlock=False,
        seconds=1.0,
        tail=(),
    )
    return tlc.Run(**{**base, **kw})  # type: ignore[arg-type]


def test_judge_wants_the_recorded_count_and_the_named_invariant(tmp_path: Path) -> None:
    passing = tlc.Model(tmp_path / "M.tla", tmp_path / "M.cfg", "pass", 10)
    failing = tlc.Model(tmp_path / "M.tla", tmp_path / "B.cfg", "violates NoDanglingInv", 7)
    assert tlc.judge(passing, _run())[0]
    ok, why = tlc.judge(passing, _run(distinct=11))
    assert not ok and "records 10" in why
    assert not tlc.judge(passing, _run(deadlock=True, code=11, completed=False))[0]
    assert not tlc.judge(passing, _run(code=12, violated=("OneOwnerInv",), completed=False))[0]
    broke = _run(code=12, violated=("NoDanglingInv",), completed=False, distinct=7)
    assert tlc.judge(failing, broke)[0]
    assert not tlc.judge(failing, _run(code=12, violated=("OneOwnerInv",), distinct=7))[0]
    assert not tlc.judge(failing, _run(code=11, deadlock=True, completed=False, distinct=7))[0]
    assert not tlc.judge(failing, _run())[0]


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_make_verify_exits_non_zero_on_each_must_fail_twin(
    twin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verify.main(["--twin", twin]) == 1
    assert f"twin {twin}: caught" in capsys.readouterr().out


def test_every_twin_is_reported_caught() -> None:
    checks = verify.check_twins()
    assert len(checks) == len(TWINS) >= 4
    assert all(ck.status == "ok" for ck in checks), [(c.name, c.summary) for c in checks]


def test_every_config_in_tla_names_its_module_expectation_count_and_defined_names() -> None:
    found = tlc.models()
    assert len(found) >= 5
    for m in found:
        assert m.module.exists(), m.cfg.name
        assert "\\* expect:" in m.cfg.read_text(), m.cfg.name
        assert tla_syntax.config_problems(m.module, m.cfg) == []
        # Only the generated trace model may leave its count out.
        assert m.states is not None or m.name == "MCTrace", m.cfg.name
    failing = [m.name for m in found if m.must_fail and m.name != "MCTrace"]
    assert len(failing) >= 3, failing
    assert any("soak" in m.name.lower() for m in found)


def test_the_readme_results_table_quotes_each_config_s_count() -> None:
    readme = (tlc.TLA_DIR / "README.md").read_text()
    for m in tlc.models():
        if m.states is None:
            continue
        rows = [ln for ln in readme.splitlines() if ln.startswith(f"| `{m.cfg.name}` |")]
        assert any(f"{m.states:,}" in ln for ln in rows), (m.cfg.name, m.states)


def test_a_config_naming_undefined_things_is_reported(tmp_path: Path) -> None:
    (tmp_path / "M.tla").write_text(
        "---- MODULE M ----\nCONSTANT N, K\nInit == TRUE\nInv == TRUE\n====\n"
    )
    (tmp_path / "M.cfg").write_text(
        "\\* module: M\nSPECIFICATION Spec\nCONSTANTS\n    N = 2\n    Z = 1\n"
        "INVARIANTS Inv Missing\nCHECK_DEADLOCK FALSE\nCONSTRAINT Bound\nCHECK_DEADLOCK no\n"
    )
    [m] = tlc.models(tmp_path)
    assert sorted(tla_syntax.config_problems(m.module, m.cfg)) == [
        "M.cfg: CHECK_DEADLOCK no is not TRUE or FALSE",
        "M.cfg: CONSTRAINT Bound is not defined in M.tla or what it extends",
        "M.cfg: INVARIANT Missing is not defined in M.tla or what it extends",
        "M.cfg: SPEC Spec is not defined in M.tla or what it extends",
        "M.cfg: constant K has no value",
        "M.cfg: constant Z is not declared",
    ]


def test_a_download_that_is_not_the_pinned_release_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: io.BytesIO(b"evil jar"))
    dest = tmp_path / "cache" / "tla2tools.jar"
    why = tlc.fetch_release(dest)
    assert why is not None and "not the pinned" in why
    assert not dest.exists() and not dest.with_suffix(".part").exists()


def test_the_trace_checks_pass_on_the_example_job() -> None:
    checks = verify.check_trace()
    assert [ck.status for ck in checks] == ["ok", "ok"], [(c.name, c.summary) for c in checks]
    assert "observations compared" in checks[0].summary
