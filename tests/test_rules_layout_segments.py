"""Rule tests for layout (R1-R3) and segments and physical files (R10-R17) of SPEC.md.

Every test runs twice (``tests/rule_impls.py``): on the reference model through ``Harness``
(which checks I1-I5 after every command), and on the product in lockstep with the model,
and asserts on the storage effects, the observation or the refusal reason.
The default job has two TMs: tm-1 hosts agg[0] and src[0], tm-2 hosts agg[1] and src[1].
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest
from attrs import evolve
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conformance.harness import ALL_MODES, DEFAULT_JOB, JOB, MERGING, Harness, of_type
from refimpl import initial_state
from refimpl.state import TmRec, TmStatus, place, subtasks_of
from spec import commands as c
from spec.commands import StorageOp
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind, VertexSpec
from spec.effects import (
    AppendBytes,
    CallFailed,
    CloseFile,
    CreateFile,
    DeleteDir,
    DeleteFile,
    Effect,
    MakeDir,
    WriteMetadata,
)
from spec.errors import Reason
from spec.handles import InlineHandle, extent_of, stream_of
from spec.ids import SAFE, SubtaskId, escape_name, unescape_name
from spec.layout import metadata_path, savepoint_dir, shared_dir, taskowned_dir, working_dir
from tests.rule_impls import channel, current_impl, impl, impl_free, segments, start, start_as  # noqa: F401 (impl: an autouse fixture)

AGG0, AGG1 = SubtaskId("agg", 0, 2), SubtaskId("agg", 1, 2)
SRC0, SRC1 = SubtaskId("src", 0, 2), SubtaskId("src", 1, 2)
SHARED, EXCL = StateKind.KEYED_SHARED, StateKind.OPERATOR_LIST
PATH_RE = re.compile(r"[A-Za-z0-9._\-/]+")


class ExtentTracker(Harness):
    """A harness that also checks, after every command, that a logical id keeps naming the
    same bytes (path, offset, length) in every retained checkpoint."""

    def __init__(self, config: Config, job: JobSpec = DEFAULT_JOB) -> None:
        super().__init__(config, job)
        self.logical: dict[str, tuple[str, int, int]] = {}

    def run(self, cmd: c.Command) -> tuple[Effect, ...]:
        out = super().run(cmd)
        for r in self.observe().retained:
            for e in r.entries:
                h = stream_of(e.handle)
                if h is not None:
                    ext = extent_of(h)
                    assert self.logical.setdefault(h.logical_id, ext) == ext, h.logical_id
        return out


def make(mode: MergingMode, job: JobSpec = DEFAULT_JOB, **kwargs: object) -> Harness:
    return start(Config.for_mode(mode, **kwargs), job)


def write(
    h: Harness,
    cp: int,
    sub: SubtaskId,
    name: str = "sst-1",
    size: int = 100,
    kind: StateKind = SHARED,
) -> tuple[Effect, ...]:
    return h.run(c.WriteState(cp, sub, kind, name, size))


def written_path(effects: Iterable[Effect]) -> str:
    appends = of_type(effects, AppendBytes)
    assert len(appends) == 1, effects
    return appends[0].path


def ack_all(h: Harness, cp: int, skip: Iterable[SubtaskId] = ()) -> None:
    for s in h.subtasks:
        if s not in set(skip):
            h.run(c.Acknowledge(cp, s))


def reason(h: Harness, cmd: c.Command) -> Reason | None:
    err = h.try_run(cmd)
    return None if err is None else err.reason


def ws(cp: int, sub: SubtaskId, name: str = "sst-1", size: int = 10) -> c.WriteState:
    return c.WriteState(cp, sub, SHARED, name, size)


def _aborted(h: Harness, cp: int) -> bool:
    return reason(h, c.Complete(cp)) is Reason.CHECKPOINT_NOT_PENDING


def assert_safe_path(path: str) -> None:
    assert PATH_RE.fullmatch(path), path
    assert all(part not in ("", ".", "..") for part in path.split("/")), path


# ---------------------------------------------------------------------------- R1 layout


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r1_shared_in_subtask_dir_exclusive_in_checkpoint_or_tm_dir(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    eff = write(h, 1, SRC0) + write(h, 1, SRC1, "offsets", 10, EXCL)
    shared, excl = (a.path for a in of_type(eff, AppendBytes))
    assert shared.startswith(f"{JOB}/shared/src-0-2/")
    if mode is MergingMode.NONE:
        assert excl.startswith(f"{JOB}/chk-1/") and not of_type(eff, MakeDir)
    else:
        assert excl.startswith(f"{JOB}/taskowned/tm-2/")
        assert {m.path for m in of_type(eff, MakeDir)} == {
            f"{JOB}/shared/src-0-2",
            f"{JOB}/taskowned/tm-2",
        }
    ack_all(h, 1)
    assert of_type(h.run(c.Complete(1)), WriteMetadata)[0].path == f"{JOB}/chk-1/_metadata"
    in_chk = {p for p in h.observe().files if p.startswith(f"{JOB}/chk-1/")}
    assert in_chk == {f"{JOB}/chk-1/_metadata"} | ({excl} if mode is MergingMode.NONE else set())


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r1_every_path_under_job_base_or_savepoints(mode: MergingMode) -> None:
    h = start_as(ExtentTracker, Config.for_mode(mode))
    h.checkpoint()
    h.checkpoint(savepoint=True)
    h.checkpoint(shared=("sst-2",))
    h.run(c.Cancel(retain=False))
    paths = [e.path for e in h.effects]
    assert paths and all(p.startswith((f"{JOB}/", "savepoints/")) for p in paths)
    sp_files = {e.path for e in of_type(h.effects, CreateFile) if "savepoint" in e.path}
    assert sp_files and all(p.startswith(savepoint_dir(2) + "/") for p in sp_files)


def test_r1_savepoint_metadata_lives_in_savepoint_dir() -> None:
    h = start_as(ExtentTracker, Config.for_mode(MergingMode.NONE))
    h.checkpoint(savepoint=True)
    metas = [m.path for m in of_type(h.effects, WriteMetadata)]
    assert metas == [f"{savepoint_dir(1)}/_metadata"]


@impl_free
def test_r1_tm_directory_never_contains_working_dirs() -> None:
    tm_dir = taskowned_dir(JOB, "working")
    assert not working_dir(JOB, AGG0).startswith(tm_dir + "/")


# ---------------------------------------------------------------------------- R2 fresh ids


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r2_paths_and_logical_ids_never_reused(mode: MergingMode) -> None:
    h = start_as(ExtentTracker, Config.for_mode(mode, max_file_size=250))
    h.checkpoint(shared=("sst-1", "sst-2"))
    h.checkpoint(shared=("sst-3",), reuse=("sst-1",))
    h.run(c.Trigger())
    write(h, 3, AGG0, "sst-9")
    h.run(c.Abort(3))
    h.deliver_all()
    h.run(c.FailNextCall(StorageOp.APPEND))
    h.run(c.Trigger())
    write(h, h.last_checkpoint, AGG0, "sst-8")  # fails: the checkpoint is declined (R17)
    h.deliver_all()
    h.run(c.CrashTm("tm-2"))
    h.run(c.AttemptStopped("tm-2"))
    h.run(c.Failover())
    h.checkpoint()
    h.checkpoint()
    h.run(c.Restore(h.last_checkpoint, mode=RestoreMode.CLAIM))
    h.checkpoint()
    h.checkpoint()
    assert not h.quiesce()
    created = [e.path for e in h.effects if isinstance(e, CreateFile | WriteMetadata)]
    assert len(created) == len(set(created)), "a path was created twice"
    assert of_type(h.effects, DeleteFile), "the scenario must delete something"
    extents = list(h.logical.values())
    assert len(extents) == len(set(extents)), "two logical ids name the same bytes"
    assert len(h.logical) >= 8


# ---------------------------------------------------------------------------- R3 escaping


@impl_free
@given(st.text())
def test_r3_escape_round_trip(name: str) -> None:
    assert unescape_name(escape_name(name)) == name


@impl_free
@given(st.text(), st.text())
@example("a/b", "a_2Fb")
@example("", "_")
@example(".", "_2E")
@example("x_", "x__")
def test_r3_escape_injective(a: str, b: str) -> None:
    if a != b:
        assert escape_name(a) != escape_name(b)


@impl_free
@given(st.text())
def test_r3_escape_uses_only_safe_characters(name: str) -> None:
    out = escape_name(name)
    assert out and set(out) <= SAFE | {"_"}
    assert not out.startswith(".") and out not in (".", "..")


def _weird_state(mode: MergingMode, tm: str, job_id: str, vertex: str) -> Harness:
    """A job of one vertex on one TM with the names given. The product names its TMs
    itself (``tm-1``, ...): there ``tm`` is not used."""
    job = JobSpec((VertexSpec(vertex, 2),), num_tms=1)
    if current_impl() == "product":
        return start(Config.for_mode(mode), job, job_id=job_id)
    s = initial_state(Config.for_mode(mode), job, job_id)
    s = evolve(
        s, placement=place(subtasks_of(job.vertices), [tm]), tms={tm: TmRec(tm, TmStatus.ALIVE)}
    )
    return Harness(state=s)


def _run_checkpoints(h: Harness) -> list[Effect]:
    out: list[Effect] = []
    for _ in range(3):
        h.run(c.Trigger())
        cp = h.last_checkpoint
        for s in h.subtasks:
            out += write(h, cp, s)
            out += write(h, cp, s, "offsets", 10, EXCL)
            out += h.run(c.Acknowledge(cp, s))
        out += h.run(c.Complete(cp))
        while channel(h):
            out += h.run(c.DeliverNotification(0))
    out += h.run(c.Cancel(retain=False))
    return out


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r3_special_tm_job_and_vertex_ids_stay_safe_in_paths(mode: MergingMode) -> None:
    tm, job_id, vertex = "tm/../ü x:1", "my job/..", "../op é"
    if current_impl() == "product":  # it names its TMs, and a job id is a name (no "/")
        tm, job_id = "tm-1", "my job ü:1"
    h = _weird_state(mode, tm, job_id, vertex)
    effects = _run_checkpoints(h)
    paths = [e.path for e in effects] + list(h.observe().files)
    assert paths
    for p in paths:
        assert_safe_path(p)
        assert p.startswith(escape_name(job_id) + "/") or p.startswith("savepoints/")
    shared_dirs = {p.split("/")[2] for p in paths if p.split("/")[1] == "shared"}
    assert shared_dirs == {f"{escape_name(vertex)}-0-2", f"{escape_name(vertex)}-1-2"}
    if mode is not MergingMode.NONE:
        tm_dirs = {p.split("/")[2] for p in paths if p.split("/")[1] == "taskowned"}
        assert tm_dirs == {escape_name(tm)}
        assert unescape_name(tm_dirs.pop()) == tm


@settings(max_examples=30)
@given(tm=st.text(min_size=1, max_size=8), vertex=st.text(min_size=1, max_size=8))
def test_r3_any_tm_id_or_vertex_never_leaves_safe_alphabet(tm: str, vertex: str) -> None:
    h = _weird_state(MergingMode.ACROSS_CHECKPOINT, tm, "job-0", vertex)
    for p in [e.path for e in _run_checkpoints(h)]:
        assert_safe_path(p)


def test_r3_lookalike_vertices_get_distinct_directories() -> None:
    job = JobSpec((VertexSpec("a/b", 1), VertexSpec("a_2Fb", 1)), num_tms=1)
    h = start(Config.for_mode(MergingMode.WITHIN_CHECKPOINT), job)
    h.run(c.Trigger())
    dirs = {m.path for s in h.subtasks for m in of_type(write(h, 1, s), MakeDir)}
    assert dirs == {"job-0/shared/a_2Fb-0-1", "job-0/shared/a__2Fb-0-1"}


# ---------------------------------------------------------------------------- R10 writes


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r10_empty_snapshot_creates_no_file(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    before = h.observe()
    assert write(h, 1, SRC0, "empty", 0) == ()
    assert write(h, 1, SRC0, "empty-op", 0, EXCL) == ()
    assert h.observe() == before
    ack_all(h, 1)
    h.run(c.Complete(1))
    names = {e.name for r in h.observe().retained for e in r.entries}
    assert "empty" not in names and "empty-op" not in names


@pytest.mark.parametrize("mode", MERGING)
def test_r10_write_creates_one_segment_with_last_used_c(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    h.run(c.Trigger())
    before = h.observe()
    path = written_path(write(h, 2, SRC0, "sst-new", 70))
    after = h.observe()
    assert after.ref_counts[path] == before.ref_counts.get(path, 0) + 1
    new = set(after.live_segments[path]) - set(before.live_segments.get(path, ()))
    assert len(new) == 1 and new.pop()[1] == 70
    segs = segments(h, h.tm_of(SRC0)).values()
    assert [(n, last) for p, n, made, last in segs if p == path and made == 2] == [(70, 2)]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r10_write_refused_before_trigger_and_after_acknowledge(mode: MergingMode) -> None:
    h = make(mode)
    assert reason(h, ws(1, SRC0)) is Reason.UNKNOWN_CHECKPOINT
    h.run(c.Trigger())
    h.run(c.Acknowledge(1, SRC0))
    assert reason(h, ws(1, SRC0)) is Reason.ALREADY_ACKNOWLEDGED
    assert reason(h, ws(1, AGG0)) is None


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r10_write_for_aborted_checkpoint_valid_until_tm_learns(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    h.run(c.Abort(1))
    assert write(h, 1, SRC0) != ()  # tm-1 does not know yet
    h.run(c.DeliverNotification(0))  # abort(1) to tm-1
    assert reason(h, ws(1, AGG0)) is Reason.CHECKPOINT_FINISHED_FOR_TM
    assert reason(h, ws(1, SRC1)) is None  # tm-2 does not know


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r10_write_for_checkpoint_finished_by_later_completion_refused(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    h.checkpoint(deliver=False)
    tm1_complete = next(i for i, n in enumerate(channel(h)) if n.tm == "tm-1" and n.checkpoint == 2)
    h.run(c.DeliverNotification(tm1_complete))
    assert reason(h, ws(1, SRC0)) is Reason.CHECKPOINT_FINISHED_FOR_TM
    assert reason(h, ws(1, SRC1)) is None


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r10_new_attempt_never_writes_for_older_checkpoints(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint(savepoint=True)  # savepoint 1 completes before tm-3 exists
    h.run(c.CrashTm("tm-2"))
    h.run(c.Failover())
    assert h.tm_of(SRC1) == "tm-3"
    assert reason(h, ws(1, SRC1)) is Reason.CHECKPOINT_FINISHED_FOR_TM
    h.run(c.Trigger())
    assert write(h, 2, SRC1) != ()


# ---------------------------------------------------------------------------- R11 no merging


def test_r11_every_handle_is_its_own_file() -> None:
    h = make(MergingMode.NONE)
    h.run(c.Trigger())
    kinds = [("a", SHARED), ("b", SHARED), ("x", EXCL), ("y", StateKind.KEYED_FULL)]
    creates = [of_type(write(h, 1, SRC0, n, 10, k), CreateFile) for n, k in kinds]
    paths = [cr[0].path for cr in creates if len(cr) == 1]
    assert len(set(paths)) == 4
    assert all(p.startswith(f"{JOB}/shared/src-0-2/") for p in paths[:2])
    assert all(p.startswith(f"{JOB}/chk-1/") for p in paths[2:])


def test_r11_writing_tm_owns_file_until_acknowledge() -> None:
    h = make(MergingMode.NONE)
    h.run(c.Trigger())
    shared = written_path(write(h, 1, SRC1))
    excl = written_path(write(h, 1, SRC1, "o", 10, EXCL))
    owners = h.observe().owners
    assert owners[shared] == owners[excl] == "tm:tm-2"
    h.run(c.Acknowledge(1, SRC1))
    owners = h.observe().owners
    assert owners[shared] == owners[excl] == "coordinator"


# ---------------------------------------------------------------------------- R12 durability, roll


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r12_bytes_durable_before_handle(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    write(h, 1, SRC0, "a", 30)
    eff = write(h, 1, SRC0, "b", 50)
    path = written_path(eff)
    if mode is MergingMode.NONE:  # the stream's own file is closed
        assert eff == (
            CreateFile(path, "tm:tm-1"),
            AppendBytes(path, 0, 50, "tm:tm-1"),
            CloseFile(path, "tm:tm-1"),
        )
        assert path not in h.observe().open_files
    else:  # appended to the pool before the handle exists
        assert eff == (AppendBytes(path, 30, 50, "tm:tm-1"),)
        assert h.observe().files[path] == 80


@pytest.mark.parametrize("mode", MERGING)
def test_r12_roll_at_max_file_size(mode: MergingMode) -> None:
    h = make(mode, max_file_size=250)
    h.run(c.Trigger())
    first = written_path(write(h, 1, SRC0, "a"))
    assert written_path(write(h, 1, SRC0, "b")) == first
    eff = write(h, 1, SRC0, "c")
    assert [type(e) for e in eff] == [CloseFile, CreateFile, AppendBytes]
    assert eff[0].path == first and eff[1].path == eff[2].path != first
    assert eff[2] == AppendBytes(eff[1].path, 0, 100, "tm:tm-1")
    obs = h.observe()
    assert obs.files[first] == 200 and first not in obs.open_files


@pytest.mark.parametrize("mode", MERGING)
def test_r12_file_reaching_max_size_is_closed(mode: MergingMode) -> None:
    h = make(mode, max_file_size=200)
    h.run(c.Trigger())
    first = written_path(write(h, 1, SRC0, "a"))
    eff = write(h, 1, SRC0, "b")
    assert [type(e) for e in eff] == [AppendBytes, CloseFile] and eff[1].path == first
    assert first not in h.observe().open_files
    big = write(h, 1, SRC0, "c", 250)  # over the size on its own: a file of its own
    assert [type(e) for e in big] == [CreateFile, AppendBytes, CloseFile]
    assert big[0].path != first and h.observe().files[big[0].path] == 250


def test_r12_across_rolls_across_checkpoints() -> None:
    h = make(MergingMode.ACROSS_CHECKPOINT, max_file_size=150)
    h.checkpoint(shared=("sst-1",), size=100)
    h.run(c.Trigger())
    old = {p for p in h.observe().files if p.startswith(f"{JOB}/shared/src-0-2/")}
    eff = write(h, 2, SRC0, "sst-2")
    assert [e.path for e in of_type(eff, CloseFile)] == sorted(old)
    assert of_type(eff, CreateFile)[0].path not in old


# ---------------------------------------------------------------------------- R13 merge scope


@pytest.mark.parametrize("mode", MERGING)
def test_r13_shared_state_merged_per_subtask(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    a = written_path(write(h, 1, AGG0))
    s = written_path(write(h, 1, SRC0))
    assert h.tm_of(AGG0) == h.tm_of(SRC0) == "tm-1"
    assert a != s
    assert a.startswith(shared_dir(JOB, AGG0) + "/") and s.startswith(shared_dir(JOB, SRC0) + "/")
    assert written_path(write(h, 1, SRC0, "sst-2")) == s


@pytest.mark.parametrize("mode", MERGING)
def test_r13_exclusive_state_merged_per_tm(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    a = write(h, 1, AGG0, "o", 40, EXCL)
    s = write(h, 1, SRC0, "o", 40, EXCL)
    other = written_path(write(h, 1, AGG1, "o", 40, EXCL))
    assert of_type(s, AppendBytes) == [AppendBytes(written_path(a), 40, 40, "tm:tm-1")]
    assert written_path(a).startswith(taskowned_dir(JOB, "tm-1") + "/")
    assert other.startswith(taskowned_dir(JOB, "tm-2") + "/")


# ---------------------------------------------------------------------------- R14 pooling


@pytest.mark.parametrize("finish", [c.Acknowledge, c.Decline])
def test_r14_within_shared_file_closes_on_acknowledge_or_decline(
    finish: type[c.Acknowledge] | type[c.Decline],
) -> None:
    h = make(MergingMode.WITHIN_CHECKPOINT)
    h.run(c.Trigger())
    path = written_path(write(h, 1, AGG0))
    h.run(c.Acknowledge(1, SRC0))  # another subtask on tm-1: not this file
    assert path in h.observe().open_files
    assert CloseFile(path, "tm:tm-1") in h.run(finish(1, AGG0))
    assert path not in h.observe().open_files


def test_r14_within_exclusive_file_closes_when_every_subtask_on_tm_acked() -> None:
    h = make(MergingMode.WITHIN_CHECKPOINT)
    h.run(c.Trigger())
    path = written_path(write(h, 1, AGG0, "o", 10, EXCL))
    write(h, 1, SRC0, "o", 10, EXCL)
    assert CloseFile(path, "tm:tm-1") not in h.run(c.Acknowledge(1, AGG0))
    assert path in h.observe().open_files
    assert CloseFile(path, "tm:tm-1") in h.run(c.Acknowledge(1, SRC0))


@pytest.mark.parametrize("finish", [c.Acknowledge, c.Decline])
def test_r12_object_store_acknowledgement_closes_every_file_holding_its_segments(
    finish: type[c.Acknowledge] | type[c.Decline],
) -> None:
    """Where open files are not durable, the first subtask to finish closes the TM's
    EXCLUSIVE file too (its upload), and the TM's other subtask goes on in a new file."""
    h = make(MergingMode.WITHIN_CHECKPOINT, open_files_readable=False)
    h.run(c.Trigger())
    path = written_path(write(h, 1, AGG0, "o", 10, EXCL))
    shared = written_path(write(h, 1, AGG0, "sst-1", 10))
    write(h, 1, SRC0, "o", 10, EXCL)
    eff = h.run(finish(1, AGG0))
    assert CloseFile(path, "tm:tm-1") in eff and CloseFile(shared, "tm:tm-1") in eff
    assert path not in h.observe().open_files and shared not in h.observe().open_files
    later = write(h, 1, SRC0, "o2", 10, EXCL)
    assert written_path(later) != path and of_type(later, CreateFile)
    if finish is c.Acknowledge:
        h.run(c.Acknowledge(1, SRC0))
        h.run(c.Acknowledge(1, AGG1))
        h.run(c.Acknowledge(1, SRC1))
        h.run(c.Complete(1))
        retained = h.observe().retained
        assert retained and not set(h.observe().open_files) & {
            s.path for cp in retained for e in cp.entries if (s := stream_of(e.handle)) is not None
        }


def test_r14_within_exclusive_file_closes_when_last_subtask_declines() -> None:
    h = make(MergingMode.WITHIN_CHECKPOINT)
    h.run(c.Trigger())
    path = written_path(write(h, 1, AGG0, "o", 10, EXCL))
    write(h, 1, SRC0, "o", 10, EXCL)
    h.run(c.Acknowledge(1, AGG0))
    h.run(c.Decline(1, SRC0))
    assert path not in h.observe().open_files


def test_r14_within_file_closes_when_tm_learns_abort() -> None:
    h = make(MergingMode.WITHIN_CHECKPOINT)
    h.run(c.Trigger())
    path = written_path(write(h, 1, AGG0, "o", 10, EXCL))
    h.run(c.Abort(1))
    assert path in h.observe().open_files
    eff = h.run(c.DeliverNotification(0))  # abort(1) to tm-1
    assert CloseFile(path, "tm:tm-1") in eff
    assert path not in h.observe().files  # nothing live was left in it (R15)


def test_r14_within_file_closes_when_tm_learns_later_completion() -> None:
    h = make(MergingMode.WITHIN_CHECKPOINT)
    h.run(c.Trigger())
    path = written_path(write(h, 1, AGG0, "o", 10, EXCL))
    h.checkpoint(deliver=False)  # completes 2, aborts 1
    for i in reversed(range(len(channel(h)))):
        if channel(h)[i].checkpoint == 1:
            h.run(c.DropNotification(i))
    assert path in h.observe().open_files
    eff = h.run(c.DeliverNotification(0))  # complete(2) to tm-1
    assert CloseFile(path, "tm:tm-1") in eff


@pytest.mark.parametrize("mode", MERGING)
def test_r14_within_pools_per_checkpoint_across_keeps_one_open_file(mode: MergingMode) -> None:
    h = make(mode)
    h.checkpoint()
    path = next(p for p in h.observe().files if p.startswith(shared_dir(JOB, SRC0)))
    assert (path in h.observe().open_files) is (mode is MergingMode.ACROSS_CHECKPOINT)
    h.run(c.Trigger())
    eff = write(h, 2, SRC0, "sst-2", 50)
    if mode is MergingMode.ACROSS_CHECKPOINT:
        assert eff == (AppendBytes(path, 100, 50, "tm:tm-1"),)
    else:
        assert written_path(eff) != path and of_type(eff, CreateFile)


# ---------------------------------------------------------------------------- R15 deletion


@pytest.mark.parametrize("mode", MERGING)
def test_r15_closed_unreferenced_file_deleted_once_by_owner(mode: MergingMode) -> None:
    h = start_as(ExtentTracker, Config.for_mode(mode, max_file_size=100))
    h.checkpoint(shared=("sst-1",))
    old = sorted(p for p in h.observe().files if p.startswith(shared_dir(JOB, SRC0)))
    assert len(old) == 1 and old[0] not in h.observe().open_files
    h.checkpoint(shared=("sst-2",))  # subsumes 1: its segments go at watermark 1
    assert old[0] not in h.observe().files
    h.checkpoint(shared=("sst-3",))
    dels = [d for d in h.observe().deletions if d.path == old[0]]
    assert [(d.actor, d.owner) for d in dels] == [("tm:tm-1", "tm:tm-1")]
    assert [e for e in h.effects if isinstance(e, DeleteFile) and e.path == old[0]] == [
        DeleteFile(old[0], "tm:tm-1")
    ]


def test_r15_open_file_not_deleted_at_zero_ref_count() -> None:
    # the space-amplification bound is off: with it, R81 rolls such a file at once
    h = make(MergingMode.ACROSS_CHECKPOINT, max_space_amplification=0.0)
    h.checkpoint(shared=("sst-1",))
    path = next(p for p in h.observe().files if p.startswith(shared_dir(JOB, SRC0)))
    h.checkpoint(shared=())  # subsumes 1: sst-1's segments are discarded
    obs = h.observe()
    assert obs.ref_counts[path] == 0 and obs.live_segments.get(path, ()) == ()
    assert path in obs.files and path in obs.open_files
    assert all(d.path != path for d in obs.deletions)
    eff = h.run(c.Cancel(retain=False))  # closes the pool: now it goes
    assert eff.index(CloseFile(path, "tm:tm-1")) < eff.index(DeleteFile(path, "tm:tm-1"))


@pytest.mark.parametrize("mode", MERGING)
def test_r15_closed_file_with_live_segment_kept(mode: MergingMode) -> None:
    h = make(mode, max_file_size=150)
    h.checkpoint(shared=("sst-1",))
    h.run(c.Trigger())
    first = written_path(write(h, 2, SRC0, "sst-x", 100))
    write(h, 2, SRC0, "sst-y", 100)  # rolls: first is closed with one live segment
    obs = h.observe()
    assert first not in obs.open_files and obs.ref_counts[first] == 1
    h.run(c.Abort(2))
    h.deliver_all()
    assert first not in h.observe().files  # its segment went with abort(2)


# ---------------------------------------------------------------------------- R16 config


@impl_free
def test_r16_across_refused_without_readable_open_files() -> None:
    with pytest.raises(ValueError, match=r"(?s)across-checkpoint.*within-checkpoint"):
        Config.for_mode(MergingMode.ACROSS_CHECKPOINT, open_files_readable=False)
    with pytest.raises(ValueError, match="R16"):
        Config(
            file_merging_enabled=True, across_checkpoint_boundary=True, open_files_readable=False
        )


@pytest.mark.parametrize("mode", [MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT])
def test_r16_other_modes_accept_object_stores(mode: MergingMode) -> None:
    cfg = Config.for_mode(mode, open_files_readable=False)
    assert cfg.merging_mode is mode
    h = start(cfg)
    h.checkpoint()
    assert len(h.observe().retained) == 1


# ---------------------------------------------------------------------------- R17 write faults


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r17_failed_create_aborts_checkpoint(mode: MergingMode) -> None:
    h = make(mode, max_file_size=100)  # full files roll: the next write creates one
    h.checkpoint()
    before = h.observe().files
    h.run(c.Trigger())
    h.run(c.FailNextCall(StorageOp.CREATE))
    eff = write(h, 2, SRC0, "sst-2")
    failed = of_type(eff, CallFailed)
    assert [f.op for f in failed] == ["create"] and not of_type(eff, CreateFile)
    assert failed[0].path not in h.observe().files
    assert _aborted(h, 2)
    assert all(h.observe().files.get(p) == n for p, n in before.items())


@pytest.mark.parametrize("mode", [MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT])
def test_r17_failed_append_to_fresh_file_closes_and_deletes_it(mode: MergingMode) -> None:
    h = make(mode)
    h.run(c.Trigger())
    h.run(c.FailNextCall(StorageOp.APPEND))
    eff = write(h, 1, SRC0)
    path = of_type(eff, CreateFile)[0].path
    assert [type(e) for e in eff if not isinstance(e, MakeDir)] == [
        CreateFile,
        CallFailed,
        CloseFile,
        DeleteFile,
    ]
    assert of_type(eff, DeleteFile) == [DeleteFile(path, "tm:tm-1")]
    assert _aborted(h, 1)


@pytest.mark.parametrize("kind", [SHARED, EXCL])
def test_r17_failed_append_poisons_across_file_keeps_acknowledged(kind: StateKind) -> None:
    h = make(MergingMode.ACROSS_CHECKPOINT)
    h.run(c.Trigger())
    path = written_path(write(h, 1, SRC0, "st", 100, kind))
    ack_all(h, 1)
    h.run(c.Complete(1))
    h.deliver_all()
    before = h.observe()
    h.run(c.Trigger())
    h.run(c.FailNextCall(StorageOp.APPEND))
    eff = write(h, 2, SRC0, "st-2", 30, kind)
    assert eff == (CallFailed("append", path, "tm:tm-1"), CloseFile(path, "tm:tm-1"))
    obs = h.observe()
    assert obs.files[path] == before.files[path] and path not in obs.open_files
    assert obs.live_segments[path] == before.live_segments[path]
    assert _aborted(h, 2)
    h.deliver_all()
    h.run(c.Trigger())
    later = write(h, 3, SRC0, "st-3", 30, kind)
    assert written_path(later) != path and of_type(later, CreateFile)
    if kind is SHARED:  # never reused: the same state is uploaded again elsewhere
        again = of_type(h.run(c.ReuseShared(3, SRC0, "st")), AppendBytes)
        assert [(a.path != path, a.length) for a in again] == [(True, 100)]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r17_nothing_acknowledged_is_deleted(mode: MergingMode) -> None:
    h = start_as(ExtentTracker, Config.for_mode(mode))
    h.checkpoint(shared=("sst-1", "sst-2"))
    retained = {p for p in h.observe().files}
    h.run(c.Trigger())
    write(h, 2, AGG0, "sst-3", 40)
    h.run(c.Acknowledge(2, AGG0))
    agg_live = h.observe().live_segments
    h.run(c.FailNextCall(StorageOp.APPEND))
    eff = write(h, 2, SRC0, "o", 40, EXCL)
    assert not ({e.path for e in eff if isinstance(e, DeleteFile | DeleteDir)} & retained)
    obs = h.observe()
    assert retained <= set(obs.files)
    for p, segs in agg_live.items():
        if p.startswith(shared_dir(JOB, AGG0)):
            assert obs.live_segments.get(p) == segs
    h.deliver_all()
    assert not h.quiesce()


# ---------------------------------------------------------------------------- R107 inline state


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r107_small_private_state_is_inline_and_makes_no_file(mode: MergingMode) -> None:
    h = make(mode, inline_threshold=64)
    h.run(c.Trigger())
    before = h.observe()
    assert write(h, 1, SRC0, "offsets", 63, EXCL) == ()
    assert write(h, 1, SRC0, "manifest", 1, StateKind.KEYED_FULL) == ()
    assert h.observe() == before  # no file, segment, ref count, owner or directory
    assert of_type(write(h, 1, SRC0, "big", 64, EXCL), AppendBytes)  # at the threshold: a file
    assert of_type(write(h, 1, SRC0, "sst", 10), AppendBytes)  # SHARED: a file, whatever its size
    ack_all(h, 1)
    h.run(c.Complete(1))
    [r] = h.observe().retained
    inline = {e.name: e.handle for e in r.entries if isinstance(e.handle, InlineHandle)}
    assert set(inline) == {"offsets", "manifest"}
    assert inline["offsets"].length == 63 and inline["offsets"].content() == bytes(63)
    kinds = {e.name: type(e.handle) for e in r.entries}
    assert kinds["big"] is not InlineHandle and kinds["sst"] is not InlineHandle


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r107_inline_state_is_restored_and_nothing_deletes_it(mode: MergingMode) -> None:
    h = make(mode, inline_threshold=1024)
    first = h.checkpoint(size=100)  # the operator state (26 bytes) goes inline
    for _ in range(2):
        h.checkpoint(size=100)
    # the first checkpoint is subsumed: its metadata goes, and no delete concerns its
    # inline state, which names no path
    assert metadata_path(JOB, first) in {d.path for d in h.observe().deletions}
    ops = [e for r in h.observe().retained for e in r.entries if e.name == "offsets"]
    assert ops and all(isinstance(e.handle, InlineHandle) for e in ops)
    latest = h.last_checkpoint
    h.run(c.Cancel(retain=True))
    h.run(c.Restore(latest, (("agg", 4), ("src", 4))))  # operator state redistributed (R76)
    restoring = h.observe().restoring
    restored_ops = [e for e in restoring if e.name == "offsets"]
    assert restored_ops and all(
        isinstance(e.handle, InlineHandle) and e.handle.content() == bytes(26) for e in restored_ops
    )
    assert not h.quiesce()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_r107_a_savepoint_keeps_small_private_state_in_its_metadata(mode: MergingMode) -> None:
    h = make(mode, inline_threshold=64)
    h.run(c.Trigger(savepoint=True))
    sp = h.last_checkpoint
    assert write(h, sp, SRC0, "offsets", 10, EXCL) == ()
    assert written_path(write(h, sp, SRC0, "sst", 10)).startswith(savepoint_dir(sp) + "/")
    ack_all(h, sp)
    h.run(c.Complete(sp))
    h.deliver_all()
    h.run(c.Cancel(retain=False))
    h.run(c.Restore(sp))
    ops = [e for e in h.observe().restoring if e.name == "offsets"]
    assert len(ops) == 1 and isinstance(ops[0].handle, InlineHandle), ops
    assert ops[0].handle.content() == bytes(10)
