"""RandomIds (fastimpl.ids), the default id source: unique names that are valid paths (R2, R3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fastimpl import RandomIds
from fastimpl.ids import _DIGITS, _base36
from spec.ids import SAFE, SubtaskId
from spec.layout import is_under, parent, shared_dir, taskowned_dir

ROOT = Path(__file__).resolve().parent.parent
DIRECTORY = shared_dir("job-0", SubtaskId("w", 0, 1))

# A child process draws from its own RandomIds and prints them as JSON.
_CHILD = """
import json
from fastimpl import RandomIds
ids = RandomIds()
print(json.dumps([[ids.file_name("d") for _ in range(N)], [ids.logical_id() for _ in range(N)]]))
"""


def _draw(ids: RandomIds, n: int) -> tuple[list[str], list[str]]:
    """``n`` file names and ``n`` logical ids, interleaved as a store draws them."""
    files: list[str] = []
    logical: list[str] = []
    for _ in range(n):
        logical.append(ids.logical_id())
        files.append(ids.file_name(DIRECTORY))
    return files, logical


def _assert_unique(files: list[str], logical: list[str]) -> None:
    assert len(set(files)) == len(files)
    assert len(set(logical)) == len(logical)
    assert not set(files) & set(logical)


def test_random_ids_are_unique_within_one_instance() -> None:
    _assert_unique(*_draw(RandomIds(), 100_000))


def test_random_ids_are_unique_across_instances() -> None:
    files: list[str] = []
    logical: list[str] = []
    for _ in range(1_000):
        f, s = _draw(RandomIds(), 100)
        files += f
        logical += s
    _assert_unique(files, logical)


def test_random_ids_are_unique_across_processes() -> None:
    n = 2_000
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD.replace("N", str(n))],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    files, logical = _draw(RandomIds(), n)  # this process too
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        f, s = json.loads(out)
        assert len(f) == len(s) == n
        files += f
        logical += s
    assert len(files) == len(logical) == 5 * n
    _assert_unique(files, logical)


def test_random_ids_are_valid_path_components() -> None:
    files, logical = _draw(RandomIds(), 10_000)
    assert all(f.startswith("f") for f in files)
    assert all(s.startswith("s") for s in logical)
    for name in files + logical:
        # The alphabet of escaped names (spec.ids.escape_name, R3): [A-Za-z0-9._-].
        assert name and set(name) <= SAFE, name
        assert name == name.lower(), name  # case-insensitive file systems merge cases
        assert not name.startswith((".", "-")), name  # never hidden, never an option
        assert name not in {".", ".."}
        assert len(name) <= 32, name
    for directory in (DIRECTORY, taskowned_dir("job-0", "tm-1")):
        for name in files:
            path = f"{directory}/{name}"
            assert parent(path) == directory and is_under(path, directory)


def test_random_ids_differ_by_more_than_case() -> None:
    """On a case-insensitive file system (macOS's, Windows's default) names that differ
    only by case are one file."""
    files, logical = _draw(RandomIds(), 20_000)
    assert len({n.lower() for n in files}) == len(files)
    assert len({n.lower() for n in logical}) == len(logical)


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    ids = RandomIds()
    ids.file_name(DIRECTORY)  # drawn before the fork, as a store built before it would
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next names, to the parent
        try:
            os.write(write, json.dumps(_draw(ids, 100)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_files, child_logical = json.loads(pipe.read())
    os.waitpid(pid, 0)
    files, logical = _draw(ids, 100)
    assert len(child_files) == 100
    _assert_unique(files + child_files, logical + child_logical)


def test_one_instance_shared_by_threads_never_repeats() -> None:
    ids = RandomIds()
    out: list[list[str]] = [[] for _ in range(8)]

    def draw(i: int) -> None:
        out[i] = [ids.logical_id() for _ in range(20_000)]

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drawn = [x for part in out for x in part]
    assert len(drawn) == len(set(drawn)) == 8 * 20_000


@given(st.integers(0, 2**100))
def test_the_counter_is_written_in_base_36_digit_by_digit(n: int) -> None:
    """``_base36`` looks two digits up at a time: the same string as one ``divmod`` per
    digit, most significant first, no leading zero (ids stay what they were)."""
    digits = []
    m = n
    while True:
        m, r = divmod(m, 36)
        digits.append(_DIGITS[r])
        if m == 0:
            break
    assert _base36(n) == "".join(reversed(digits))
    assert int(_base36(n), 36) == n
