"""A command a test starts (``tests.supervised``) ends with the test: when the test process
is SIGKILLed (no ``finally`` of it runs), when the ``with`` block is left by a timeout,
and what the command left in its group when it exits. The command here is a process
tree as a ``ckpt stream`` driver's is: a parent whose child (its JVM, its Python
workers) runs on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.supervised import supervised, supervised_argv

TREE = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
"""


def _gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of a dead parent is reaped by init: gone for good
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_killed_test_leaves_no_process_of_its_command_behind(tmp_path: Path) -> None:
    """The test process (here a stand-in started for it) is SIGKILLed while its command
    runs: the kernel's death signal reaches the supervisor, which ends the group."""
    test = r"""
import subprocess, sys, time
from tests.supervised import supervised_argv
proc = subprocess.Popen(supervised_argv([sys.executable, "-c", sys.argv[1], "wait"]),
                        stdout=subprocess.PIPE, text=True)
print(proc.pid, proc.stdout.readline().strip(), flush=True)
time.sleep(600)
"""
    stand_in = subprocess.Popen(
        [sys.executable, "-c", test, TREE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert stand_in.stdout is not None
    supervisor, grandchild = (int(x) for x in stand_in.stdout.readline().split())
    try:
        assert not _gone(grandchild, within_s=0.5)
        stand_in.kill()
        stand_in.wait()
        assert _gone(grandchild), "the command's child outlived the killed test"
        assert _gone(supervisor)
    finally:
        _kill(grandchild)
        _kill(supervisor)


def test_a_timeout_ends_the_whole_command() -> None:
    with (
        pytest.raises(subprocess.TimeoutExpired),
        supervised([sys.executable, "-c", TREE, "wait"], stdout=subprocess.PIPE, text=True) as proc,
    ):
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        proc.communicate(timeout=0.5)
    assert _gone(grandchild)
    assert proc.returncode is not None


def test_what_the_command_leaves_running_ends_with_it() -> None:
    """The command exits (as a driver does) while a child of it runs on (a JVM that
    missed its end): the supervisor ends the group, and passes the exit status on."""
    with supervised(
        [sys.executable, "-c", TREE + "\nsys.exit(3)", "exit"], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert _gone(grandchild)


def test_the_supervisor_refuses_to_run_for_a_parent_already_gone() -> None:
    """Started for a test process that is not its parent (the test died before the
    supervisor asked for the death signal), it starts nothing."""
    argv = supervised_argv([sys.executable, "-c", "print('ran')"])
    argv[3] = str(os.getpid() + 1_000_000)  # no process is that parent
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 143 and "ran" not in done.stdout
