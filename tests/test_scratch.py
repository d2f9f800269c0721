"""The test scratch (``tests/scratch.py``): a killed run's RAM directory is removed by the
next run, and nothing else is."""

from __future__ import annotations

import os
from pathlib import Path

from tests.scratch import LOCK, PREFIX, hold, sweep_dead


def _scratch(parent: Path, name: str) -> Path:
    d = parent / name
    (d / "tmp_path/deep").mkdir(parents=True)
    (d / "tmp_path/deep/f").write_bytes(b"x")
    (d / LOCK).touch()
    return d


def test_only_the_directory_of_a_run_that_is_gone_is_swept(tmp_path: Path) -> None:
    ram = tmp_path / "shm"
    ram.mkdir()
    dead = _scratch(ram, f"{PREFIX}dead01")
    live = _scratch(ram, f"{PREFIX}live01")
    fd = hold(live)  # a run still running holds its lock
    unlocked = ram / f"{PREFIX}nolock"  # made, its lock not yet created: kept
    unlocked.mkdir()
    other = _scratch(ram, "someone-else")  # not a name this module gives
    target = _scratch(tmp_path, "elsewhere")
    link = ram / f"{PREFIX}link01"
    link.symlink_to(target, target_is_directory=True)
    a_file = ram / f"{PREFIX}file01"
    a_file.write_bytes(b"f")
    try:
        assert sweep_dead(ram) == [dead]
        assert sorted(p.name for p in ram.iterdir()) == sorted(
            p.name for p in (live, unlocked, other, link, a_file)
        )
        assert (target / "tmp_path/deep/f").read_bytes() == b"x"
        assert (live / "tmp_path/deep/f").read_bytes() == b"x"
    finally:
        os.close(fd)
    assert sweep_dead(ram) == [live]  # its run has let go
