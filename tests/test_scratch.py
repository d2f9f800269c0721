"""The test scratch (``tests/scratch.py``): a killed run's RAM directory is removed by the
next run, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.scratch import PREFIX, sweep_dead


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_only_a_dead_runs_own_directory_is_swept(tmp_path: Path) -> None:
    ram = tmp_path / "shm"
    ram.mkdir()
    dead = ram / f"{PREFIX}{_dead_pid()}-abc123"
    (dead / "tmp_path/deep").mkdir(parents=True)
    (dead / "tmp_path/deep/f").write_bytes(b"x")
    live = ram / f"{PREFIX}{os.getpid()}-abc123"
    live.mkdir()
    foreign = ram / "ckpt-pytest-abc123"  # no pid in the name: not one this module gives
    foreign.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_bytes(b"k")
    link = ram / f"{PREFIX}{_dead_pid()}-link01"
    link.symlink_to(target, target_is_directory=True)
    a_file = ram / f"{PREFIX}{_dead_pid()}-file01"
    a_file.write_bytes(b"f")

    assert sweep_dead(ram) == [dead]
    assert sorted(p.name for p in ram.iterdir()) == sorted(
        [live.name, foreign.name, link.name, a_file.name]
    )
    assert (target / "keep").read_bytes() == b"k"
