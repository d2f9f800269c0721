"""Must-fail twins of the reference model: one rule swapped for the buggy one it replaced.

Each twin reproduces a real bug (a Flink bug report, or a classic mistake) by patching
one method of ``refimpl.machine._Work`` from test code, never by a flag inside refimpl.
The exhaustive search (``explore.py --twin NAME``, ``make verify TWIN=NAME``) and the
tests must catch every one: a search that passes with a twin swapped in proves nothing.

A twin's patched rule reads and writes only the model state, so that the breadth-first
search, which revisits states along many paths, sees the same bug on each path. Each
twin names the bounds within which the search must find it, and the invariant it breaks.
The TLA+ must-fail models in ``tla/`` are the same bugs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
import pytest

from refimpl.machine import _Work
from refimpl.state import BackendRef
from spec import commands as c
from spec.config import MergingMode
from spec.effects import tm_actor
from spec.ids import TmId

ReuseRule = Callable[[_Work, c.ReuseShared], None]


@attrs.frozen
class Twin:
    name: str
    bug: str
    """What the buggy rule does, and the report it comes from."""
    breaks: str
    """The invariant the search must find broken (as ``check_safety`` names it)."""
    patch: Callable[[pytest.MonkeyPatch], None]
    mode: MergingMode
    subtasks: int
    tms: int
    max_checkpoints: int
    max_depth: int
    num_retained: int = 1
    crashes: bool = False


def no_last_used_advance(orig: ReuseRule) -> ReuseRule:
    """Reuse that leaves every segment's last_used as it was (FLINK-35570)."""

    def reuse_shared(self: _Work, cmd: c.ReuseShared) -> None:
        before = dict(self.segs)
        orig(self, cmd)
        for key, seg in list(self.segs.items()):
            if key in before and before[key].last_used != seg.last_used:
                self.segs[key] = before[key]

    return reuse_shared


def _watermark_off_by_one(mp: pytest.MonkeyPatch) -> None:
    original = _Work.tm_complete

    def tm_complete(self: _Work, tm: TmId, checkpoint: int, watermark: int, sp: bool) -> None:
        original(self, tm, checkpoint, watermark + 1, sp)

    mp.setattr(_Work, "tm_complete", tm_complete)


def _directory_counter(mp: pytest.MonkeyPatch) -> None:
    """FLINK-38347: a directory's uses are counted, every abort notice the TM hears counts
    one down, a completion notice ends the tracking, and the directory goes at zero. The
    TM's own state holds what the counter needs: the checkpoints that used the directory
    (``used_by``), the aborts it heard (``known_aborted``) and whether it heard a
    completion (``known_completed``, which in Flink only a completion notice sets)."""
    original_abort = _Work.tm_abort

    def tm_abort(self: _Work, tm: TmId, checkpoint: int, latest: int, sp: bool) -> None:
        heard = self.tms[tm].known_completed
        original_abort(self, tm, checkpoint, latest, sp)
        # Flink's abort notice carries no completed id: the TM learns nothing from it.
        self.tms[tm] = attrs.evolve(self.tms[tm], known_completed=heard)

    def release(self: _Work, tm: TmId) -> None:
        rec = self.tms[tm]
        for path, d in sorted(self.dirs.items()):
            if d.creator != tm or d.handed_over or not d.used_by:
                continue
            if self.dir_owner.get(path) != tm_actor(tm) or rec.known_completed:
                continue
            if len(d.used_by) - len(rec.known_aborted) <= 0:
                self._delete_dir(path, tm_actor(tm))

    mp.setattr(_Work, "tm_abort", tm_abort)
    mp.setattr(_Work, "_tm_release_dirs", release)


def _reuse_unconfirmed(mp: pytest.MonkeyPatch) -> None:
    """FLINK-25395 (with FLINK-35570, which masked it in Flink): shared state is reused
    before the checkpoint that uploaded it is known complete, and the reuse does not
    advance last_used; an abort then discards what a later checkpoint refers to."""
    original = _Work._reusable

    def reusable(self: _Work, tm: TmId, ref: BackendRef) -> bool:
        return original(self, tm, attrs.evolve(ref, confirmed=True))

    mp.setattr(_Work, "_reusable", reusable)
    mp.setattr(_Work, "reuse_shared", no_last_used_advance(_Work.reuse_shared))


def _failover_keeps_restored_only(mp: pytest.MonkeyPatch) -> None:
    """R61 broken: after a failover the restarting TM keeps only what the checkpoint it
    restores from (the newest retained one) refers to, and deletes the rest of its
    directories as garbage, though an older retained checkpoint still needs a file."""
    original = _Work._restore_manager

    def restore_manager(self: _Work, tm: TmId) -> None:
        kept = self.retained
        self.retained = kept[-1:]
        try:
            original(self, tm)
        finally:
            self.retained = kept

    mp.setattr(_Work, "_restore_manager", restore_manager)


TWINS: dict[str, Twin] = {
    t.name: t
    for t in [
        Twin(
            "watermark-off-by-one",
            "a TM discards segments up to the subsumed watermark + 1 (R24)",
            "I1",
            _watermark_off_by_one,
            MergingMode.WITHIN_CHECKPOINT,
            subtasks=2,
            tms=2,
            max_checkpoints=2,
            max_depth=6,
        ),
        Twin(
            "flink-38347",
            "a directory's uses are counted, and abort notices count down (FLINK-38347)",
            "I1",
            _directory_counter,
            MergingMode.WITHIN_CHECKPOINT,
            subtasks=1,
            tms=1,
            max_checkpoints=2,
            max_depth=8,
        ),
        Twin(
            "flink-25395",
            "unconfirmed shared state is reused, last_used not advanced (FLINK-25395, -35570)",
            "I1",
            _reuse_unconfirmed,
            MergingMode.WITHIN_CHECKPOINT,
            subtasks=1,
            tms=1,
            max_checkpoints=2,
            max_depth=8,
        ),
        Twin(
            "failover-restored-only",
            "failover cleanup keeps only the restored checkpoint's files (R61)",
            "I6",
            _failover_keeps_restored_only,
            MergingMode.WITHIN_CHECKPOINT,
            subtasks=1,
            tms=1,
            max_checkpoints=2,
            max_depth=9,
            num_retained=2,
            crashes=True,
        ),
    ]
}


@contextmanager
def swapped_in(name: str) -> Iterator[Twin]:
    """The model with twin ``name``'s buggy rule, for the duration of the block."""
    twin = TWINS[name]
    with pytest.MonkeyPatch.context() as mp:
        twin.patch(mp)
        yield twin
