"""Command traces (``fastimpl.trace``) replayed through the model (``model_tests.replay``).

Random sequences of the lockstep machine are traced on ``memory://`` and replayed at the
end of each sequence: every command, outcome and observation must agree with the model.
A job driven through the public API is traced and replayed too. Then the replay must
fail where it should: a tampered outcome, reason or observation, a real storage failure
(where it stops), a trace with random ids (observations not compared, and said so) and
an unreadable trace.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.compare import unmarked
from conformance.harness import Harness
from fastimpl import CheckpointStore, CommandTrace, CounterIds, testing
from model_tests.replay import TraceError, main, replay
from model_tests.targets import FastimplTarget
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.errors import CommandError, Reason
from tests.lockstep import Backend, LockstepMachine
from tests.profile import PROFILE

EXAMPLES = 200 if PROFILE == "long" else 5
"""Per merging mode. A traced sequence costs about 3 s on two shared cores (an observation
encoded, decoded and compared after every command, on top of the lockstep run itself);
what the replay must agree on is the trace's format and the model's reading of it, which
the lockstep's own sequences (``tests/test_lockstep.py``) do not exercise, so a few
sequences per mode carry every command type through it."""


class TracedMachine(LockstepMachine):
    """The lockstep machine with the cluster's commands traced, replayed at the end."""

    out: io.StringIO | None = None

    def make_harness(self, cfg: Config) -> Harness:
        h = super().make_harness(cfg)
        self.out = io.StringIO()
        assert isinstance(self.target, FastimplTarget)
        self.target.engine.start_trace(CommandTrace(self.out, observations=True))
        return h

    def teardown(self) -> None:
        super().teardown()
        if self.out is None:
            return
        lines = self.out.getvalue().splitlines()
        report = replay(lines)
        assert report.agrees, report.summary()
        assert report.stopped is None
        assert report.commands == len(lines) - 1
        refused = sum('"outcome":"refused"' in line for line in lines)
        assert report.observations_compared == report.commands - refused


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_random_sequences_replay_through_the_model(mode: MergingMode) -> None:
    import fsspec  # type: ignore[import-untyped]

    backend = Backend("memory", fsspec.filesystem("memory"), f"/trace-{mode.name}")
    machine = type(f"Traced{mode.name}", (TracedMachine,), {"mode": mode, "backend": backend})
    run_state_machine_as_test(machine, settings=settings(max_examples=EXAMPLES))


# ------------------------------------------------------------------ the public API

KS = StateKind.KEYED_SHARED
JOB = JobSpec((VertexSpec("win", 2),), num_tms=2)


def api_trace(tmp_path: Path, *, observations: bool = True, ids: str = "counter") -> list[str]:
    """A job through the public API on local files: checkpoints with reuse, an abort, a
    refused command, a TM crash with failover, and a rescaling CLAIM restore."""
    out = io.StringIO()
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, num_retained=2)
    store = CheckpointStore(
        str(tmp_path / "ckpt"),
        config,
        JOB,
        ids=CounterIds() if ids == "counter" else None,
        background_deletes=False,
        trace=CommandTrace(out, observations=observations),
    )
    coord = store.coordinator
    for n in range(1, 6):
        cid = coord.trigger()
        for sub, tm in sorted(store.placement().items()):
            mgr = store.task_manager(tm)
            mgr.write(cid, sub, KS, f"{n}.sst", b"x" * (10 * n))
            if n > 1:
                mgr.reuse_shared(cid, sub, "1.sst")
            mgr.acknowledge(cid, sub)
        if n == 3:
            coord.abort(cid)
        else:
            coord.complete(cid)
        store.deliver_notifications()
    with pytest.raises(CommandError) as refused:  # aborted above
        coord.complete(3)
    assert refused.value.reason is Reason.CHECKPOINT_NOT_PENDING
    testing.crash(store, sorted(store.placement().values())[0])
    coord.failover()
    coord.rescale(coord.retained()[-1].checkpoint, {"win": 3}, mode=RestoreMode.CLAIM)
    store.close()
    return out.getvalue().splitlines()


def test_a_job_through_the_public_api_replays(tmp_path: Path) -> None:
    lines = api_trace(tmp_path)
    report = replay(lines)
    assert report.agrees, report.summary()
    assert report.commands == len(lines) - 1 > 40
    assert report.observations_compared == report.commands - 1  # one refusal
    assert "agrees with the model" in report.summary()


def _edit(lines: list[str], index: int, **changes: object) -> list[str]:
    obj = json.loads(lines[index])
    obj.update(changes)
    return [*lines[:index], json.dumps(obj), *lines[index + 1 :]]


def _first(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if i > 0 and needle in line)


def test_a_changed_outcome_is_a_mismatch(tmp_path: Path) -> None:
    lines = api_trace(tmp_path)
    i = _first(lines, '"type":"Complete"')
    report = replay(_edit(lines, i, outcome="refused", reason="not_all_acknowledged"))
    assert not report.agrees and "the store refused" in str(report.mismatch)
    j = _first(lines, '"outcome":"refused"')
    report = replay(_edit(lines, j, reason="unknown_tm"))
    assert not report.agrees and "'unknown_tm' by the store" in str(report.mismatch)
    report = replay(_edit(lines, j, outcome="ok"))
    assert not report.agrees and "the model refused" in str(report.mismatch)


def test_a_changed_observation_is_a_mismatch(tmp_path: Path) -> None:
    lines = api_trace(tmp_path)
    i = _first(lines, '"type":"Acknowledge"')
    obs = json.loads(lines[i])["observation"]
    path = next(p for p in obs["files"] if "/shared/" in p)
    obs["files"][path] += 1
    report = replay(_edit(lines, i, observation=obs))
    assert not report.agrees
    # the replay compares paths as the model draws them, without the creator's mark
    assert "observations differ" in str(report.mismatch) and unmarked(path) in str(report.mismatch)
    assert "after commands:" in str(report.mismatch)


def test_a_real_storage_failure_stops_the_replay(tmp_path: Path) -> None:
    lines = api_trace(tmp_path)
    i = _first(lines, '"type":"WriteState"')
    report = replay(_edit(lines, i + 3, real_faults=1))
    assert report.agrees and report.commands == i + 2
    assert "the file system failed 1 call(s)" in str(report.stopped)


def test_random_ids_are_not_compared_and_the_report_says_so(tmp_path: Path) -> None:
    report = replay(api_trace(tmp_path, ids="random"))
    assert report.agrees and report.observations_compared == 0
    assert "observations NOT compared" in report.summary()


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty trace"),
        (["not json"], "line 1: not JSON"),
        (['{"format": "other", "version": 1}'], "format 'other'"),
        (['{"format": "ckpt-ownership/command-trace", "version": 9}'], "version 9"),
    ],
)
def test_an_unreadable_trace_is_refused(lines: list[str], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        replay(lines)


def test_a_bad_command_line_is_refused_with_its_line_number(tmp_path: Path) -> None:
    lines = api_trace(tmp_path, observations=False)
    with pytest.raises(TraceError, match=r"line 3: \$\.command\.type: 'Explode'"):
        replay(_edit(lines, 2, command={"type": "Explode"}))


def test_the_command_line_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = api_trace(tmp_path)
    good = tmp_path / "good.ndjson"
    good.write_text("\n".join(lines) + "\n")
    assert main([str(good)]) == 0
    assert "agrees with the model" in capsys.readouterr().out
    bad = tmp_path / "bad.ndjson"
    i = _first(lines, '"type":"Complete"')
    bad.write_text("\n".join(_edit(lines, i, outcome="refused", reason="x")) + "\n")
    assert main([str(bad)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.ndjson")]) == 2
    assert main([]) == 2


def test_a_trace_must_start_with_the_store(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "c"), Config(), JOB, ids=CounterIds())
    store.coordinator.trigger()
    with pytest.raises(ValueError, match="before its first command"):
        store._engine.start_trace(CommandTrace(io.StringIO()))
    store.close()
