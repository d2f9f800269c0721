"""Processes a test starts that must not outlive it: a ``ckpt stream`` driver with its
Spark JVM and Python workers, a standalone cluster's daemons.

A ``finally`` that kills a process group runs only while the test process lives: a test
run that is itself killed (SIGKILL or SIGTERM by a CI timeout, a developer's ``kill``)
runs no ``finally``, and a group started with ``start_new_session`` lives on, holding
cores and ports. So the command runs under a small supervisor (``SUPERVISOR``): it asks
the kernel for a SIGTERM when the test process dies (``PR_SET_PDEATHSIG``, Linux), starts
the command in a process group of its own, and on SIGTERM, SIGHUP or SIGINT ends that
group (SIGTERM, then SIGKILL after ``grace_s``) before it exits; when the command exits
it ends what the command left in its group. ``supervised`` ends the supervisor, and so
the group, when the ``with`` block is left, also by an exception (a timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

SUPERVISOR = r"""
import ctypes, os, signal, subprocess, sys, time

parent, grace = int(sys.argv[1]), float(sys.argv[2])
ends = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
asked = []

def end_group(child, sig):
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass

for s in ends:
    signal.signal(s, lambda *_: asked.append(1))
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != parent:  # the test died before the request
    os._exit(143)
signal.pthread_sigmask(signal.SIG_BLOCK, ends)  # no end before the child is known
child = subprocess.Popen(
    sys.argv[3:],
    start_new_session=True,
    preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, ends),
)
signal.pthread_sigmask(signal.SIG_UNBLOCK, ends)
while child.poll() is None and not asked:
    time.sleep(0.05)
if asked:
    end_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    end_group(child, signal.SIGKILL)
    os._exit(143)
end_group(child, signal.SIGKILL)  # what the command left running in its group
rc = child.returncode
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def supervised_argv(argv: Sequence[str], grace_s: float = 5.0) -> list[str]:
    """``argv`` under the supervisor of this module (see its docstring)."""
    return [sys.executable, "-c", SUPERVISOR, str(os.getpid()), str(grace_s), *argv]


@contextmanager
def supervised(
    argv: Sequence[str], *, grace_s: float = 5.0, **popen: Any
) -> Iterator[subprocess.Popen[str]]:
    """Run ``argv`` supervised (``subprocess.Popen`` with ``popen``); leaving the block
    ends the supervisor, which ends every process of the command's group. Start and
    leave it in one thread (the kernel's death signal follows the thread that started
    the supervisor)."""
    proc: subprocess.Popen[str] = subprocess.Popen(supervised_argv(argv, grace_s), **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=grace_s + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
