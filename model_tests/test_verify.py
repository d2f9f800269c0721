"""``make verify``'s driver (model_tests/verify.py): what it reports when a tool is
missing or wrong, and that its checks can fail. The whole run takes minutes and is
``make verify``'s own business; these are the parts that decide what it says."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_tests import tla_syntax, verify
from model_tests.twins import TWINS


def test_a_planted_wrong_contract_is_caught_by_crosshair() -> None:
    caught, lines = verify.planted_contract_caught()
    assert caught, lines
    assert any("planted_contract.py" in line and "error" in line for line in lines)


def test_without_tlc_the_models_are_not_run_and_it_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TLA2TOOLS_JAR", str(tmp_path / "absent.jar"))
    jar, why = verify.tlc_jar()
    assert jar is None
    assert "TLC is not available" in why and "absent.jar" in why
    checks = verify.check_tla(include_soak=False)
    tlc = [ck for ck in checks if ck.name.startswith("TLA+ model checking")]
    assert [ck.status for ck in tlc] == ["NOT RUN"]
    assert tlc[0].summary.startswith("NOT model-checked")


def test_a_jar_that_is_not_the_pinned_release_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "tla2tools.jar"
    fake.write_bytes(b"not the release")
    monkeypatch.setenv("TLA2TOOLS_JAR", str(fake))
    monkeypatch.delenv("TLA2TOOLS_ANY_VERSION", raising=False)
    jar, why = verify.tlc_jar()
    assert jar is None and "not the pinned v1.7.4" in why


def test_configs_say_their_module_and_expectation(tmp_path: Path) -> None:
    (tmp_path / "MCSmall.cfg").write_text("\\* expect: pass\nINVARIANT NoDanglingInv\n")
    (tmp_path / "MCBug.cfg").write_text(
        "\\* module: MCBugModule\n\\* expect: violates NoDanglingInv\n"
    )
    (tmp_path / "Plain.cfg").write_text("INIT Init\n")
    models = {cfg.name: (mod.name, exp) for mod, cfg, exp in verify.tla_models(tmp_path)}
    assert models == {
        "MCBug.cfg": ("MCBugModule.tla", "violates NoDanglingInv"),
        "MCSmall.cfg": ("MCSmall.tla", "pass"),
        "Plain.cfg": ("Plain.tla", "pass"),
    }


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


def test_every_config_in_tla_names_its_module_and_expectation_and_defined_names() -> None:
    models = verify.tla_models()
    assert len(models) >= 5
    for module, cfg, _ in models:
        assert module.exists(), cfg.name
        assert "\\* expect:" in cfg.read_text(), cfg.name
        assert tla_syntax.config_problems(module, cfg) == []
    failing = [cfg.name for _, cfg, expect in models if expect.startswith("violates")]
    assert len(failing) >= 3, failing
    assert any("soak" in cfg.name.lower() for _, cfg, _ in models)


def test_a_config_naming_undefined_things_is_reported(tmp_path: Path) -> None:
    (tmp_path / "M.tla").write_text(
        "---- MODULE M ----\nCONSTANT N, K\nInit == TRUE\nInv == TRUE\n====\n"
    )
    (tmp_path / "M.cfg").write_text(
        "\\* module: M\nSPECIFICATION Spec\nCONSTANTS\n    N = 2\n    Z = 1\n"
        "INVARIANTS Inv Missing\n"
    )
    [(module, cfg, _)] = verify.tla_models(tmp_path)
    assert sorted(tla_syntax.config_problems(module, cfg)) == [
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
    why = verify.fetch_tlc(dest)
    assert why is not None and "not the pinned" in why
    assert not dest.exists() and not dest.with_suffix(".part").exists()


def test_the_trace_checks_pass_on_the_example_job() -> None:
    checks = verify.check_trace()
    assert [ck.status for ck in checks] == ["ok", "ok"], [(c.name, c.summary) for c in checks]
    assert "observations compared" in checks[0].summary
