"""The scripted job of ``make demo DEMO=scripted`` (``examples/scripted_job``, written on
the public API) on local files, shortened.

Its figures must agree with each other and with the files left on disk, every scripted
fault must have happened, and a store that breaks an invariant must make it fail: a file
removed behind the store's back is caught by the check after the next call.
"""

from __future__ import annotations

import ast
import io
import os
from pathlib import Path

import pytest

import fastimpl
from examples import scripted_job
from examples.scripted_job.__main__ import main
from fastimpl import Coordinator
from spec.config import MergingMode
from spec.handles import FileHandle, SegmentHandle, extent_of, stream_of
from spec.observation import RetainedView

SHORT = scripted_job.MIN_CHECKPOINTS
EXAMPLE = Path(scripted_job.__file__).parent


def files_on_disk(root: str) -> dict[str, int]:
    out = {}
    for here, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(here, name)
            out[os.path.relpath(path, root)] = os.path.getsize(path)
    out.pop("_writer", None)  # the store's lease, not checkpoint data
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> scripted_job.DemoResult:
    base = tmp_path_factory.mktemp("demo")
    return scripted_job.run_demo(base, checkpoints=SHORT, deterministic=True, out=io.StringIO())


def test_main_succeeds_and_prints_the_summary(tmp_path: Path) -> None:
    out = io.StringIO()
    status = main(["--base", str(tmp_path), "--checkpoints", str(SHORT), "--summary"], out=out)
    text = out.getvalue()
    assert status == 0, text
    assert "Every invariant held on the real files." in text
    for mode in scripted_job.MODES:
        assert f"== merging mode {mode.name}" in text
        assert any(files_on_disk(str(tmp_path / mode.value)))


def test_every_mode_runs_the_whole_script(result: scripted_job.DemoResult) -> None:
    assert [m.mode for m in result.modes] == list(scripted_job.MODES)
    assert result.ok
    for m in result.modes:
        assert m.error is None and not m.violations
        assert m.completed == SHORT + 2  # num_retained + 1 quiescing checkpoints
        assert m.aborted == 2  # the declined one and the one the crash aborted
        notes = " ".join(n for r in m.rows for n in r.notes)
        for event in ("declined", "notice late", "lost mid-checkpoint", "zombie", "failover"):
            assert event in notes, (m.mode, event)
        assert "stopped" in notes and "CLAIM, window 4->3" in notes
        assert [r.status for r in m.rows[-2:]] == ["completed (quiesce)"] * 2
        assert m.steps > 100


def test_counts_agree_with_each_other_and_with_the_disk(result: scripted_job.DemoResult) -> None:
    for m in result.modes:
        on_disk = files_on_disk(m.root)
        created = m.created + m.meta_created
        deleted = m.deleted + m.meta_deleted
        assert created - deleted == m.files_at_end == len(on_disk) == m.rows[-1].files
        assert m.meta_created == m.completed and m.metadata_at_end == 1
        meta = [p for p in on_disk if p.endswith("_metadata")]
        assert len(meta) == 1
        assert m.stored_at_end == sum(n for p, n in on_disk.items() if p not in meta)
        assert m.stored_at_end == m.rows[-1].stored and m.live_at_end == m.rows[-1].live
        # quiet: every state byte on disk is in a file some retained checkpoint refers to
        assert 0 < m.live_at_end <= m.stored_at_end
        assert m.amplification >= 1.0
        assert m.peak_amplification >= m.amplification
        assert sum(r.created - r.deleted for r in m.rows) == m.created - m.deleted


def test_merging_creates_fewer_files(result: scripted_job.DemoResult) -> None:
    by_mode = {m.mode: m for m in result.modes}
    none = by_mode[MergingMode.NONE]
    within = by_mode[MergingMode.WITHIN_CHECKPOINT]
    across = by_mode[MergingMode.ACROSS_CHECKPOINT]
    assert across.created < within.created < none.created
    assert none.amplification == 1.0  # one file per handle: nothing dead once quiet


def test_a_file_removed_behind_the_stores_back_fails_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sabotage: once the fifth checkpoint completes, delete one of the files it refers to
    on disk. The store does not know; the check after the next call lists the real files
    and reports a dangling reference (I1), and the job exits with status 1."""
    complete = Coordinator.complete
    done: list[str] = []

    def sabotaged(self: Coordinator, checkpoint: int) -> RetainedView:
        view = complete(self, checkpoint)
        if checkpoint == 5 and not done:
            stream = stream_of(view.entries[0].handle)
            assert stream is not None
            os.remove(tmp_path / MergingMode.NONE.value / stream.path)  # the first mode's root
            done.append(stream.path)
        return view

    monkeypatch.setattr(Coordinator, "complete", sabotaged)
    out = io.StringIO()
    status = main(
        ["--base", str(tmp_path), "--checkpoints", str(SHORT), "--deterministic"], out=out
    )
    text = out.getvalue()
    assert status == 1
    assert done and f"missing file {done[0]}" in text
    assert "I1: chk 5:" in text and "coordinator.complete(5)" in text
    assert "FAILED" in text and "Every invariant held" not in text


INTERNAL = ("conformance", "refimpl", "tests", "model_tests")
"""Layers behind the API that the example must not import (nor ``spec.commands``, the
tests' command vocabulary, nor any module inside ``fastimpl`` but its test seam)."""
TEST_SEAM = "fastimpl.testing"
"""The documented module through which the simulated job loses TMs and checks the
invariants: the one module inside ``fastimpl`` it may import."""
ENGINE_NAMES = ("InProcessEngine", "Storage", "recover")
"""The engine behind the store, its storage layer and the recovery that returns an
engine: not a user's job's API, so the package root does not export them (the scan
flags any name the root does not export)."""


def _internal_module(name: str) -> bool:
    top, *rest = name.split(".")
    if name == TEST_SEAM:
        return False
    return top in INTERNAL or name == "spec.commands" or (top == "fastimpl" and bool(rest))


def reaches_behind_the_api(source: str) -> list[str]:
    """Each import of an internal module or engine name, and each private attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if _internal_module(a.name)]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _internal_module(node.module):
                found.append(f"{node.lineno}: from {node.module}")
            for a in node.names:
                whole = f"{node.module}.{a.name}"
                if whole == "spec.commands" or (
                    node.module == "fastimpl" and whole != TEST_SEAM
                    and a.name not in fastimpl.__all__
                ):
                    found.append(f"{node.lineno}: import {whole}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not (node.attr.startswith("__") and node.attr.endswith("__")):
                found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_the_package_root_exports_no_engine_name() -> None:
    for name in ENGINE_NAMES:
        assert name not in fastimpl.__all__ and not hasattr(fastimpl, name), name
    assert "CheckpointStore" in fastimpl.__all__ and "CompletionFailed" in fastimpl.__all__


def test_the_scan_finds_what_it_looks_for() -> None:
    probe = (
        "from spec import commands as c\n"
        "from fastimpl.engine import InProcessEngine\n"
        "from fastimpl import InProcessEngine as E\n"
        "import conformance.fastimpl_commands\n"
        "from fastimpl import CheckpointStore, testing\n"
        "def f(store):\n    return store._engine.channel, store.__class__\n"
    )
    assert reaches_behind_the_api(probe) == [
        "1: import spec.commands",
        "2: from fastimpl.engine",
        "3: import fastimpl.InProcessEngine",
        "4: import conformance.fastimpl_commands",
        "7: ._engine",
    ]


def test_the_example_uses_only_the_public_api() -> None:
    """A user learns the API by reading the example: it imports what ``fastimpl`` exports
    for jobs, its test seam (``fastimpl.testing``: the simulated faults and the invariant
    checks) and the shared vocabulary of ``spec`` (config, ids, errors, invariants), never
    another module inside ``fastimpl``, the store's engine or the spec commands that drive
    it in the tests, and touches no private attribute."""
    found = [
        f"{path.relative_to(EXAMPLE)}:{line}"
        for path in sorted(EXAMPLE.rglob("*.py"))
        for line in reaches_behind_the_api(path.read_text(encoding="utf-8"))
    ]
    assert len(list(EXAMPLE.rglob("*.py"))) >= 5
    assert found == []


def test_bytes_changed_behind_the_stores_back_fail_the_restore_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sabotage the other way: just before the failover, overwrite in place (same size)
    the bytes of a handle the latest checkpoint refers to. No invariant can see it (the
    file is there, within its size); the job reads back what every subtask restores and
    fails on the handle whose bytes are not the ones written."""
    failover = Coordinator.failover
    done: list[str] = []

    def sabotaged(self: Coordinator) -> None:
        if not done:
            entry = self.retained()[-1].entries[0]
            stream = stream_of(entry.handle)
            assert isinstance(stream, SegmentHandle | FileHandle)
            with open(tmp_path / MergingMode.NONE.value / stream.path, "r+b") as f:
                f.seek(extent_of(stream).offset)
                f.write(bytes(stream.length))
            done.append(entry.name)
        failover(self)

    monkeypatch.setattr(Coordinator, "failover", sabotaged)
    out = io.StringIO()
    status = main(["--base", str(tmp_path), "--checkpoints", str(SHORT), "--summary"], out=out)
    text = out.getvalue()
    assert status == 1
    assert done and f"restored {done[0]!r}" in text and "not the bytes that were written" in text
    assert "coordinator.failover()" in text and "FAILED" in text
