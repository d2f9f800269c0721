"""The scripted demo (``make demo``, ``fastimpl/demo.py``) on local files, shortened.

The demo's own figures must agree with each other and with the files left on disk, every
scripted fault must have happened, and a store that breaks an invariant must make the demo
fail: a file removed behind the store's back is caught by the check after the next command.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from fastimpl import demo
from fastimpl.engine import InProcessEngine
from spec import commands as c
from spec.config import MergingMode
from spec.handles import stream_of

SHORT = demo.MIN_CHECKPOINTS


def files_on_disk(root: str) -> dict[str, int]:
    out = {}
    for here, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(here, name)
            out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> demo.DemoResult:
    base = tmp_path_factory.mktemp("demo")
    return demo.run_demo(base, checkpoints=SHORT, deterministic=True, out=io.StringIO())


def test_main_succeeds_and_prints_the_summary(tmp_path: Path) -> None:
    out = io.StringIO()
    status = demo.main(["--base", str(tmp_path), "--checkpoints", str(SHORT), "--summary"], out=out)
    text = out.getvalue()
    assert status == 0, text
    assert "Every invariant held on the real files." in text
    for mode in demo.MODES:
        assert f"== merging mode {mode.name}" in text
        assert any(files_on_disk(str(tmp_path / mode.value)))


def test_every_mode_runs_the_whole_script(result: demo.DemoResult) -> None:
    assert [m.mode for m in result.modes] == list(demo.MODES)
    assert result.ok
    for m in result.modes:
        assert m.error is None and not m.violations
        assert m.completed == SHORT + 2  # num_retained + 1 quiescing checkpoints
        assert m.aborted == 2  # the declined one and the one the crash aborted
        notes = " ".join(n for r in m.rows for n in r.notes)
        for event in ("declined", "notice lost", "lost mid-checkpoint", "zombie", "failover"):
            assert event in notes, (m.mode, event)
        assert "stopped" in notes and "CLAIM, window 4->3" in notes
        assert [r.status for r in m.rows[-2:]] == ["completed (quiesce)"] * 2
        assert m.commands > 100


def test_counts_agree_with_each_other_and_with_the_disk(result: demo.DemoResult) -> None:
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


def test_merging_creates_fewer_files(result: demo.DemoResult) -> None:
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
    on disk. The store does not know; the check after the next command lists the real
    files and reports a dangling reference (I1), and the demo exits with status 1."""
    call = demo._call
    done: list[str] = []

    def sabotaged(self: InProcessEngine, cmd: c.Command) -> None:
        call(self, cmd)
        if isinstance(cmd, c.Complete) and cmd.checkpoint == 5 and not done:
            stream = stream_of(self.observe().retained[-1].entries[0].handle)
            assert stream is not None
            path = stream.path
            os.remove(tmp_path / MergingMode.NONE.value / path)  # the first mode's root
            done.append(path)

    monkeypatch.setattr(demo, "_call", sabotaged)
    out = io.StringIO()
    status = demo.main(
        ["--base", str(tmp_path), "--checkpoints", str(SHORT), "--deterministic"], out=out
    )
    text = out.getvalue()
    assert status == 1
    assert done and f"missing file {done[0]}" in text
    assert "I1: chk 5:" in text and "Complete(checkpoint=5)" in text
    assert "FAILED" in text and "Every invariant held" not in text
