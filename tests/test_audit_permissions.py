"""Issue 15, defect 4: a directory the audit may not read (permissions) is a report row,
never a traceback, and stops a deletion when it may hold a checkpoint that references
the base: a sibling application's folder beside the job, a checkpoint directory of the
job. A data directory it may not read is reported and left alone; the rest is collected.

This machine's tests run as root, for which ``chmod 000`` blocks nothing. The audit runs
in a subprocess without the capabilities that override file permissions
(``setpriv --bounding-set=-dac_override,-dac_read_search,-fowner``: still uid 0, so it
reads the venv under /root, but a mode-000 directory refuses it as it refuses any user).
A probe in that subprocess checks that a mode-000 directory really is unreadable, and
every case asserts the PermissionError in its report: nothing passes without one.
Both engines: the single-process engine on each case, Spark on one base
holding all of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_bases import JOB, _meta, _old, valid

REPO = Path(__file__).resolve().parent.parent
STRAY = f"{JOB}/shared/v-0-1/stray"

SCRIPT = r"""
import json, os, sys
from typer.testing import CliRunner
from ckpt.cli import app

probe, runs = json.loads(sys.argv[1])
try:
    os.listdir(probe)
    probe_error = None
except PermissionError as err:
    probe_error = repr(err)
out = {"probe": probe_error, "runs": []}
if probe_error is not None:
    for base, engine, log, delete in runs:
        args = ["audit", base, "-q", "--limit", "50", "--json", log + ".summary.json"]
        args += ["--delete-orphans", "--log", log] if delete else []
        args += ["--engine", "single"] if engine == "single" else ["--master", "local[2]"]
        r = CliRunner().invoke(app, args)
        summary = None
        if os.path.exists(log + ".summary.json"):
            with open(log + ".summary.json") as f:
                summary = json.load(f)
        out["runs"].append({"base": base, "engine": engine, "exit": r.exit_code,
                            "log": log if delete else None,
                            "output": r.output, "summary": summary,
                            "exception": None if r.exception is None
                            or isinstance(r.exception, SystemExit) else repr(r.exception)})
print("RESULT " + json.dumps(out))
"""


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: no way to make a directory unreadable")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def sibling_app(base: Path) -> tuple[Path, str]:
    """A sibling application's folder, unreadable, whose checkpoint references the stray."""
    other = base.parent / "other-app"
    (other / "chk-1").mkdir(parents=True)
    (other / "chk-1/_metadata").write_bytes(_meta(1, STRAY, job="other-app"))
    return other, "other-app"


def checkpoint_dir(base: Path) -> tuple[Path, str]:
    """A checkpoint directory of the job, unreadable, whose _metadata references the stray."""
    (base / "chk-2").mkdir()
    (base / "chk-2/_metadata").write_bytes(_meta(2, STRAY))
    return base / "chk-2", f"{JOB}/chk-2"


def data_dir(base: Path) -> tuple[Path, str]:
    """A subtask's data directory, unreadable: it holds no _metadata (the layout puts them
    in chk-N/ only), so the deletion goes on without its files, which are left alone."""
    _old(base / "shared/v-0-2/unseen")
    return base / "shared/v-0-2", f"{JOB}/shared/v-0-2"


def referenced_file(base: Path) -> tuple[Path, str]:
    """The file the retained checkpoint references, mode 000 (issue 32, finding 6): a
    restore cannot read it, so it dangles (exit 1, "DATA LOSS"), never "clean"."""
    f = base / "shared/v-0-1/f"
    return f, f"{JOB}/shared/v-0-1/f"


CASES = {"sibling_app": sibling_app, "checkpoint_dir": checkpoint_dir, "data_dir": data_dir,
         "referenced_file": referenced_file}
REFUSES = {"sibling_app": "cannot be listed", "checkpoint_dir": "became unreadable"}
AT_RISK = {"checkpoint_dir", "referenced_file"}
DANGLES = {"referenced_file"}
"""Cases whose report has a dangling reference (DATA LOSS): a deletion run pages (exit 1)
or is refused (exit 3); the referenced file is never deleted."""
"""A checkpoint directory that cannot be listed hides a _metadata: a report alone exits 1
(restorability unknown), never 0 ("nothing lost")."""


def everything(tmp: Path) -> tuple[Path, list[Path], list[str]]:
    """One base with every unreadable directory above (for one Spark run)."""
    base = valid(tmp).base
    locked, shown = [], []
    for make in CASES.values():
        d, s = make(base)
        locked.append(d)
        shown.append(s)
    return base, locked, shown


@pytest.fixture
def locked_dirs() -> Iterator[list[Path]]:
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        d.chmod(0o755)  # so that pytest can remove the temporary tree


def _run(prefix: list[str], probe: Path, runs: list[tuple[str, str, str, bool]]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # Spark's executors import this tree
    p = subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT, json.dumps([str(probe), runs])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-3000:] + p.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    if result["probe"] is None:
        pytest.skip(
            "a mode-000 directory is readable even without the override "
            "capabilities here: no honest permission error to test with"
        )
    return result


def _check(
    run: dict[str, Any], unreadable: list[str], refused: str | None, at_risk: bool = False,
    dangles: bool = False,
) -> None:
    out = " ".join(run["output"].split())  # messages wrap at the terminal's width
    assert run["exception"] is None and "Traceback" not in out, out
    assert run["summary"] is not None, out
    assert run["summary"]["unreadable"] == len(unreadable), out
    for s in unreadable:
        assert s in out, (s, out)
    assert out.count("PermissionError") >= len(unreadable), out
    if dangles:
        assert run["exit"] in ((1,) if run["log"] is None else (1, 3)), out
        assert "DATA LOSS" in out and "cannot be read: PermissionError" in out, out
    elif run["log"] is None:
        assert run["exit"] == (1 if at_risk else 0), out
        assert ("restorability unknown" in out) == at_risk, out
    elif refused is None:
        assert run["exit"] == 0, out
    else:
        assert run["exit"] == 3, out
        assert "deletion refused" in out and refused in out, out


def test_unreadable_directories_with_the_single_engine(
    tmp_path: Path, locked_dirs: list[Path]
) -> None:
    prefix = _unprivileged()
    probe = tmp_path / "probe"
    probe.mkdir()
    locked_dirs.append(probe)
    runs, cases = [], []
    for name, make in CASES.items():
        base = valid(tmp_path / name).base
        locked, shown = make(base)
        locked_dirs.append(locked)
        cases.append((name, base, shown))
        runs.append((str(base), "single", str(tmp_path / f"{name}-report.jsonl"), False))
        runs.append((str(base), "single", str(tmp_path / f"{name}.jsonl"), True))
    for d in locked_dirs:
        d.chmod(0)
    result = _run(prefix, probe, runs)
    pairs = zip(result["runs"][::2], result["runs"][1::2], strict=True)
    for (name, base, shown), (report, run) in zip(cases, pairs, strict=True):
        _check(report, [shown], None, at_risk=name in AT_RISK, dangles=name in DANGLES)
        _check(run, [shown], REFUSES.get(name), dangles=name in DANGLES)
        stray = base.parent / STRAY
        if name in DANGLES:
            assert (base.parent / shown).exists(), name
        elif name in REFUSES:
            assert stray.exists(), name
            assert not Path(f"{tmp_path}/{name}.jsonl").exists()
        else:
            assert not stray.exists(), name
            events = [
                json.loads(x) for x in Path(f"{tmp_path}/{name}.jsonl").read_text().splitlines()
            ]
            assert {e["path"] for e in events if e["event"] == "deleted"} == {STRAY}
    for d in locked_dirs:
        d.chmod(0o755)
    assert (tmp_path / "data_dir/root" / JOB / "shared/v-0-2/unseen").exists()
    assert (tmp_path / "sibling_app/root/other-app/chk-1/_metadata").exists()
    assert (tmp_path / "checkpoint_dir/root" / JOB / "chk-2/_metadata").exists()


@pytest.mark.spark  # starts Spark itself (tests/conftest.py: spark)
def test_unreadable_directories_on_spark_and_single_alike(
    tmp_path: Path, locked_dirs: list[Path]
) -> None:
    prefix = _unprivileged()
    base, locked, shown = everything(tmp_path)
    locked_dirs.extend(locked)
    for d in locked_dirs:
        d.chmod(0)
    runs = [
        (str(base), engine, str(tmp_path / f"{engine}{tail}.jsonl"), delete)
        for engine in ("single", "spark")
        for tail, delete in (("-report", False), ("", True))
    ]
    result = _run(prefix, locked[0], runs)
    single_report, single, spark_report, spark = result["runs"]
    for report in (single_report, spark_report):
        _check(report, shown, None, at_risk=True)
    for run in (single, spark):
        _check(run, shown, "cannot be listed")
    for run in (single_report, spark_report):  # the mode-000 referenced file dangles
        assert "cannot be read: PermissionError" in " ".join(run["output"].split())
    keys = (
        "files",
        "orphans",
        "pending",
        "checkpoints",
        "other_metadata",
        "references",
        "dangling",
        "corrupt_metadata",
        "unreadable",
        "referenced_files",
    )
    assert {k: spark["summary"][k] for k in keys} == {k: single["summary"][k] for k in keys}
    assert (base.parent / STRAY).exists()
