"""The embedding example (``examples/embedding``): a coordinator in this process and TMs
in spawned OS processes, written on ``fastimpl.parties`` alone.

It runs as a user runs it (``python -m examples.embedding BASE``) in each merging mode,
and must exit 0 with the audit's verdict clean: no orphan (I6 once the job ended), no
dangling reference (I1), every retained checkpoint read. The audit it relies on must be
able to say otherwise: a file planted in the job's base is an orphan to it. And the
example stays on the public surface: it imports nothing of ``fastimpl`` but
``fastimpl.parties`` and reads no private attribute.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.embedding.__main__ import audit
from examples.embedding.job import JOB, RETAINED
from fastimpl import parties

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "embedding"


def run_example(base: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "examples.embedding", str(base), "--mode", mode]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("mode", ["none", "within", "across"])
def test_the_embedding_example_runs_and_its_audit_is_clean(tmp_path: Path, mode: str) -> None:
    done = run_example(tmp_path, mode)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    summary = json.loads((tmp_path / "audit-summary.json").read_text())
    assert summary["orphans"] == 0, out
    assert summary["dangling"] == 0, out
    assert summary["corrupt_metadata"] == 0, out
    assert summary["checkpoints"] == RETAINED, out
    assert "killed (SIGKILL, exit code -9)" in out
    assert "failover: " in out
    assert "reused from earlier checkpoints" in out
    assert "TM processes' exit codes: [0, -9, 0]" in out
    # the base holds the retained checkpoints' _metadata and nothing of the killed
    # attempt's exclusive directory (R63: abandoned to the coordinator at its stop, R64,
    # then collected)
    job_base = tmp_path / "checkpoints" / JOB
    metadata = sorted(p.parent.name for p in job_base.glob("chk-*/_metadata"))
    assert len(metadata) == RETAINED, metadata
    assert not list((job_base / "taskowned").glob("tm-2/*"))
    # the verdict is not vacuous: a file nobody refers to is an orphan to the same audit
    (job_base / "shared" / "window-0-2" / "planted").write_bytes(b"nobody refers to this")
    code, again = audit(tmp_path)
    assert code == 0  # an orphan loses nothing: reported, not failed (docs/audit.md)
    assert (again["orphans"], again["dangling"]) == (1, 0)


def imports_outside_the_surface(source: str) -> list[str]:
    """Each import of a ``fastimpl`` module other than ``fastimpl.parties``, and each
    private attribute read."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "fastimpl" and a.name != "fastimpl.parties"
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top == "fastimpl" and node.module != "fastimpl.parties":
                found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not (node.attr.startswith("__") and node.attr.endswith("__")):
                found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_the_surface_check_catches_what_it_should() -> None:
    source = (
        "import fastimpl.taskmanager\n"
        "from fastimpl.coordinator import CheckpointCoordinator\n"
        "from fastimpl import TaskManager\n"
        "from fastimpl.parties import TaskManager\n"
        "import fastimpl.parties\n"
        "x = tm._facts\n"
        "y = tm.__class__\n"
    )
    assert imports_outside_the_surface(source) == [
        "1: import fastimpl.taskmanager",
        "2: from fastimpl.coordinator",
        "3: from fastimpl",
        "6: ._facts",
    ]


def test_the_example_uses_only_the_public_embedding_surface() -> None:
    files = sorted(EXAMPLE.glob("*.py"))
    assert files
    found = {str(p.relative_to(ROOT)): imports_outside_the_surface(p.read_text()) for p in files}
    assert {p: f for p, f in found.items() if f} == {}


def test_parties_re_exports_what_it_names() -> None:
    """Each public name is its defining module's object (a re-export, not a copy)."""
    defined_here = [
        n
        for n in parties.__all__
        if getattr(getattr(parties, n), "__module__", None) == parties.__name__
    ]
    assert defined_here == []
    assert sorted(parties.__all__) == sorted(set(parties.__all__))
    for name in parties.__all__:
        assert hasattr(parties, name), name
