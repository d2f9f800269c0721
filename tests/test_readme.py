"""The library guide's example (docs/library.md, linked from the README) runs as
written, and does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "docs" / "library.md"


def _example() -> str:
    text = README.read_text()
    section = text.split("## Using the library", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m is not None, "the README lost its library example"
    return m.group(1)


def test_readme_library_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(_example(), "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "1 job-0/chk-1/_metadata 4 entries",
        "2 job-0/chk-2/_metadata 6 entries",
        "3 job-0/chk-3/_metadata 6 entries",
    ]
    restored = out[3:]
    assert len(restored) == 3  # window rescaled to 3 subtasks
    # Every new subtask gets the keyed state of the old subtasks whose key groups it
    # overlaps; operator list state ("offsets", one entry per old subtask) goes to two.
    assert all("'000001.sst'" in line and "'000003.sst'" in line for line in restored)
    assert sum("'offsets'" in line for line in restored) == 2
