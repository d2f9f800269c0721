"""The Flink adapter (conformance/flink, issue 37). Without pyflink (CI): its pure parts,
which cases the task-manager profile can judge, what part of an observation it judges, how
Flink's file names pair with the model's and how a divergence is sorted. With pyflink and
Java 17 (``make conformance-flink``'s venv): one case that Flink passes and one Flink leak,
run on the real manager."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conformance.case import load_corpus
from conformance.flink import judge
from conformance.flink.naming import Namer
from conformance.flink.profile import NO_COUNTERPART, judged, out_of_reach, tm_side
from conformance.flink.verdicts import (
    DELIBERATE,
    FLINK_BUG,
    UNCLASSIFIED,
    quiet_class,
    quiet_verdict,
    verdict,
)
from conformance.harness import DEFAULT_JOB, KS, OP, S
from spec import commands as c
from spec.config import Config, MergingMode, StateKind
from spec.ids import SubtaskId
from spec.observation import DeletionRecord, Observation

WITHIN = Config.for_mode(MergingMode.WITHIN_CHECKPOINT)
ACROSS = Config.for_mode(MergingMode.ACROSS_CHECKPOINT)


def obs(files: dict[str, int], deleted: tuple[str, ...] = ()) -> Observation:
    return Observation(
        files=files,
        open_files=frozenset(),
        directories={},
        owners={},
        claims={},
        retained=(),
        restoring=(),
        ref_counts={},
        live_segments={},
        registry={},
        deletions=tuple(DeletionRecord(p, "tm:tm-1", "tm:tm-1", True, False) for p in deleted),
        pending_deletes=(),
        pool_files=frozenset(),
        metadata_files=frozenset(),
        live_parties=frozenset(),
    )


# ------------------------------------------------------------------ the profile


def test_task_manager_commands_are_in_reach() -> None:
    cmds: list[c.Command] = [
        c.Trigger(),
        c.WriteState(1, S, KS, "a", 10),
        c.ReuseShared(1, S, "a"),
        c.Acknowledge(1, S),
        c.Complete(1),
        c.DeliverNotification(0),
        c.CrashTm("tm-1"),
        c.Failover(),
        c.Cancel(),
    ]
    assert out_of_reach(WITHIN, cmds) is None
    assert out_of_reach(ACROSS, cmds) is None


@pytest.mark.parametrize(
    "config, command, why",
    [
        (Config(), c.Trigger(), "merging mode none"),
        (
            Config.for_mode(MergingMode.WITHIN_CHECKPOINT, open_files_readable=False),
            c.Trigger(),
            "object store",
        ),
        (WITHIN, c.Trigger(savepoint=True), "savepoint"),
        (WITHIN, c.Restore(1), "Restore"),
        (WITHIN, c.FailNextCall(c.StorageOp.DELETE), "FailNextCall"),
        (ACROSS, c.ReplaceTm("tm-1"), "ReplaceTm"),
        (ACROSS, c.WriteWorking(S, 10), "WriteWorking"),
        (Config.for_mode(MergingMode.ACROSS_CHECKPOINT, inline_threshold=64), c.Trigger(), "R107"),
    ],
)
def test_out_of_reach_says_why(config: Config, command: c.Command, why: str) -> None:
    commands: list[c.Command] = [c.Trigger(), command]
    reason = out_of_reach(config, commands)
    assert reason is not None and why in reason


def test_corpus_profile_splits_the_corpus() -> None:
    """Every case is in reach or out of it for a stated reason; the cases in reach use
    merging and only commands the adapter translates."""
    reach = out = 0
    for case in load_corpus():
        commands = [s.command for s in case.steps]
        if out_of_reach(case.config, commands) is None:
            reach += 1
            assert case.config.merging_mode is not MergingMode.NONE
            assert not any(type(cmd) in NO_COUNTERPART for cmd in commands)
        else:
            out += 1
    assert reach > 200 and out > 200


def test_judged_part_is_the_tm_directories() -> None:
    o = obs(
        {
            "job-0/chk-1/_metadata": -1,
            "job-0/shared/v-0-1/f000001": 10,
            "job-0/taskowned/tm-1/f000002": 5,
        },
        deleted=("job-0/shared/v-0-1/f000003", "job-0/chk-1/x"),
    )
    files, deleted = judged(o, "job-0")
    assert files == {"job-0/shared/v-0-1/f000001": 10, "job-0/taskowned/tm-1/f000002": 5}
    assert deleted == ["job-0/shared/v-0-1/f000003"]
    assert tm_side("job-0/shared/x/y", "job-0") and not tm_side("job-1/shared/x/y", "job-0")


# ------------------------------------------------------------------ names


def test_flink_files_pair_with_the_models_by_directory_and_order(tmp_path: Path) -> None:
    d = tmp_path / "shared" / "job_x_op_y_0_1"
    d.mkdir(parents=True)
    second, first, stray = d / "bbbb-uuid", d / "aaaa-uuid", d / "cccc-uuid"
    for f in (second, first, stray):
        f.write_bytes(b"x")
    namer = Namer()
    namer.directory(str(d), "job-0/shared/v-0-1")
    namer.saw(f"file:{second}")  # the first handle named this one
    namer.saw(str(first))
    on_disk = {str(p): 1 for p in (first, second, stray)}
    namer.pair(on_disk, {"job-0/shared/v-0-1/f000001", "job-0/shared/v-0-1/f000002"})
    assert namer.ours(str(second)) == "job-0/shared/v-0-1/f000001"
    assert namer.ours(str(first)) == "job-0/shared/v-0-1/f000002"
    assert namer.ours(str(stray)) == "job-0/shared/v-0-1/flink-cccc-uui"
    assert namer.flink_path("job-0/shared/v-0-1/f000001") == str(second)


# ------------------------------------------------------------------ sorting divergences


def test_kinds_of_difference() -> None:
    model = obs(
        {"job-0/shared/a/f1": 10, "job-0/shared/a/f2": 10, "job-0/shared/a/f4": 3},
        deleted=("job-0/shared/a/f3",),
    )
    flink = obs(
        {
            "job-0/shared/a/f1": 10,
            "job-0/shared/a/f3": 7,
            "job-0/shared/a/f4": 4,
            "job-0/shared/a/flink-x": 1,
        },
    )
    kinds, paths = judge._kinds(model, flink, "job-0")
    assert kinds == ["kept", "extra", "missing", "size"]
    assert paths == [
        "job-0/shared/a/f3",
        "job-0/shared/a/flink-x",
        "job-0/shared/a/f2",
        "job-0/shared/a/f4",
    ]


def test_a_model_file_is_paired_only_in_the_step_it_appears(tmp_path: Path) -> None:
    """A file only the model wrote (a crash Flink never flushed) must not be paired with
    a Flink file of a later step: the stand-in would delete Flink's file in its name."""
    d = tmp_path / "shared" / "dir"
    d.mkdir(parents=True)
    namer = Namer()
    namer.directory(str(d), "job-0/shared/v-0-1")
    namer.pair({}, {"job-0/shared/v-0-1/f000001"})
    later = d / "uuid-later"
    later.write_bytes(b"x")
    namer.pair({str(later): 1}, {"job-0/shared/v-0-1/f000001", "job-0/shared/v-0-1/f000002"})
    assert namer.ours(str(later)) == "job-0/shared/v-0-1/f000002"
    assert namer.flink_path("job-0/shared/v-0-1/f000001") is None


def test_quiet_classes() -> None:
    assert quiet_class("within", {"Trigger", "Failover"}) == "failover"
    assert quiet_class("within", {"Trigger", "Cancel"}) == "cancel"
    assert quiet_class("across", {"Trigger", "DropNotification"}) == "open pool"
    assert quiet_class("within", {"Trigger", "DropNotification"}) == "lost notification"
    assert quiet_verdict("lost notification").kind == FLINK_BUG
    assert quiet_verdict("other").kind == UNCLASSIFIED


def test_verdicts() -> None:
    assert verdict(("within", "Failover", "kept in shared")).kind == FLINK_BUG
    assert verdict(("across", "Cancel", "kept in taskowned")).kind == FLINK_BUG
    assert verdict(("across", "WriteState", "missing+size in shared")).kind == DELIBERATE
    assert verdict(("within", "Trigger", "deleted in shared")).kind == UNCLASSIFIED


# ------------------------------------------------------------------ on Flink itself


def _flink_ready() -> str | None:
    try:
        import pyflink  # noqa: F401
    except ImportError:
        return "pyflink is not installed (make conformance-flink's venv .venv-flink has it)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java 17 for pyflink's gateway"
    return None


flink_only = pytest.mark.skipif(_flink_ready() is not None, reason=str(_flink_ready()))


@flink_only
def test_on_flink_a_completed_checkpoint_matches_and_a_failover_leaks(tmp_path: Path) -> None:
    from conformance.flink.session import Flink

    impl = Flink(str(tmp_path))
    subs = [
        SubtaskId(v.name, i, v.parallelism)
        for v in DEFAULT_JOB.vertices
        for i in range(v.parallelism)
    ]
    agg0 = subs[2]
    clean: list[c.Command] = [c.Trigger()]
    clean += [c.WriteState(1, s, StateKind.KEYED_SHARED, "sst", 100) for s in subs]
    clean += [c.Acknowledge(1, s) for s in subs]
    clean += [c.Complete(1), c.DeliverNotification(0), c.DeliverNotification(0)]
    assert judge.run(WITHIN, DEFAULT_JOB, clean, impl, "clean").divergence is None
    leak: list[c.Command] = [c.Trigger(), c.WriteState(1, agg0, OP, "o", 10), c.Failover()]
    out = judge.run(WITHIN, DEFAULT_JOB, leak, impl, "leak")
    assert out.divergence is not None and out.divergence.step == 3
    assert verdict(judge.signature(WITHIN, out.divergence)).kind == FLINK_BUG
