"""Failing storage calls through the public API (``tests/faultyfs.py`` wraps a local
directory or memory, optionally as an object store where a file appears only once closed;
on a local directory the calls failed are the OS calls of ``Storage``'s local-disk path:
builtin ``open``, ``os.fsync``, directory syncs, ``os.replace``, ``os.remove``).

After every fault: the failing call is raised as ``StorageFault`` naming the path (or, for
a metadata write, the checkpoint is aborted, R51), the checkpoint it broke does not
complete, every byte of the checkpoints completed before it reads back unchanged,
``check_invariants()`` is empty, later checkpoints succeed, and once the faults stop and
``num_retained + 1`` more checkpoints completed the job is quiet (I6). Deletes that keep
failing are reported, never forgotten and retried (R45); queued deletes go in bulk calls.
A Hypothesis state machine injects faults into random calls of random operations.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fastimpl import CheckpointStore, CompletionFailed, MetadataError, StorageFault, testing
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.errors import CommandError, Reason
from spec.handles import stream_of
from spec.ids import SubtaskId
from spec.layout import metadata_path, shared_dir
from spec.observation import RetainedView
from tests.faultyfs import LOCAL_WRITE_METHODS, FaultyFileSystem, Ledger, Place, payload
from tests.profile import PROFILE

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
JOB = JobSpec((VertexSpec("src", 2), VertexSpec("win", 2)), num_tms=2)
TARGET = SubtaskId("win", 1, 2)
"""The subtask whose write fails."""
KINDS = ["local", "memory", "object"]
"""Where the files live: local disk (``Storage``'s local path, its OS calls through
``FaultyOS``) and memory through the wrapper (open files readable), and memory behind the
wrapper as an object store (a file appears once closed)."""


def _open(
    kind: str, tmp_path: Path, places: list[Place], config: Config
) -> tuple[Place, CheckpointStore, FaultyFileSystem]:
    place = Place.make("local" if kind == "local" else "memory", tmp_path)
    places.append(place)
    store, fs = place.store(config, JOB, object_store=kind == "object")
    return place, store, fs


def _modes(kind: str) -> list[MergingMode]:
    return [m for m in MergingMode if not (kind == "object" and m is MergingMode.ACROSS_CHECKPOINT)]


CASES = [(k, m) for k in KINDS for m in _modes(k)]
CASE_IDS = [f"{k}-{m.name}" for k, m in CASES]


def checkpoint(
    store: CheckpointStore, ledger: Ledger, *, reuse: tuple[int, ...] = ()
) -> RetainedView | None:
    """A fault-free checkpoint: new keyed state, reused keyed state, operator state."""
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        _write_subtask(store, ledger, cid, sub, tm, reuse)
        store.task_manager(tm).acknowledge(cid, sub)
    done = coord.complete(cid)
    store.deliver_notifications()
    return done


def _write_subtask(
    store: CheckpointStore,
    ledger: Ledger,
    cid: int,
    sub: SubtaskId,
    tm: str,
    reuse: tuple[int, ...] = (),
) -> None:
    mgr = store.task_manager(tm)
    job = store.job_id
    name = f"sst-{cid}"
    ledger.record(job, cid, sub, name, payload(sub, name))
    mgr.write(cid, sub, KS, name, payload(sub, name))
    for old in reuse:
        ledger.record(job, cid, sub, f"sst-{old}", payload(sub, f"sst-{old}"))
        mgr.reuse_shared(cid, sub, f"sst-{old}")
    ledger.record(job, cid, sub, "offsets", payload(sub, "offsets", cid))
    mgr.write(cid, sub, OP, "offsets", payload(sub, "offsets", cid))


def _history(store: CheckpointStore, ledger: Ledger) -> None:
    """Two completed checkpoints, the second reusing the first's keyed state."""
    assert checkpoint(store, ledger) is not None
    assert checkpoint(store, ledger, reuse=(1,)) is not None
    assert ledger.problems(store) == []


def _settle(store: CheckpointStore, ledger: Ledger, first: int) -> None:
    """After the faults: more checkpoints complete, every byte is there, the job is quiet."""
    for _ in range(store.config.num_retained + 1):
        assert checkpoint(store, ledger, reuse=(first,)) is not None
    assert store.retry_deletes() == []
    assert ledger.problems(store) == []
    assert testing.check_invariants(store, quiet=True) == []


# --------------------------------------------------------------------------- writes


WRITE_CASES = [
    (k, m, f)
    for k, m in CASES
    for f in ["open", "write", "flush"]
    + (["close"] if k == "object" and m is MergingMode.NONE else [])
    + (["fsync", "fsync_dir"] if k == "local" else [])
]
"""A close fails at a stream's close only on an object store without merging (the
upload; a readable store loses nothing, see below; a pooled file closes at acknowledge,
see test_a_failed_upload_at_acknowledge_declines_the_checkpoint). On a local disk the
file's ``fsync`` (at every append) and its directory's (once, when it is created) fail
too: a handle whose bytes or name are not durable must not exist."""


@pytest.mark.parametrize(
    ("kind", "mode", "method"), WRITE_CASES, ids=[f"{k}-{m.name}-{f}" for k, m, f in WRITE_CASES]
)
def test_a_failing_write_declines_and_loses_nothing(
    tmp_path: Path, places: list[Place], kind: str, mode: MergingMode, method: str
) -> None:
    """R17, R12: a create/write/flush (on an object store: the close, which is the
    upload) that fails while a stream closes raises ``StorageFault`` naming the path; the
    subtask declines, so the checkpoint is aborted; nothing completed is touched."""
    # every write opens a file of its own where the fault must hit the create
    at_create = method in ("open", "fsync_dir")
    size = 1 if at_create and mode is not MergingMode.NONE else 32 * 2**20
    config = Config.for_mode(mode, num_retained=1, max_file_size=size)
    _, store, fs = _open(kind, tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        if sub != TARGET:
            _write_subtask(store, ledger, cid, sub, tm, reuse=(1,))
            store.task_manager(tm).acknowledge(cid, sub)
            continue
        mgr = store.task_manager(tm)
        fs.fail(method, path_contains=shared_dir(store.job_id, sub))
        stream = mgr.open_stream(cid, sub, KS, f"sst-{cid}")
        stream.write(payload(sub, f"sst-{cid}"))
        with pytest.raises(StorageFault) as info:
            stream.close_and_get_handle()
        err = info.value
        assert fs.faults_fired == 1
        # a directory sync fails on the directory of the file being created
        failed = err.path.rsplit("/", 1)[0] if method == "fsync_dir" else err.path
        assert fs.fault_log[0][1].endswith("/" + failed)
        assert err.path in str(err) and "injected fault" in str(err)
        assert stream.handle is None
    assert cid not in coord.pending()  # declined: aborted
    with pytest.raises(CommandError) as refused:
        coord.complete(cid)
    assert refused.value.reason is Reason.CHECKPOINT_NOT_PENDING
    store.deliver_notifications()
    assert [r.checkpoint for r in coord.retained()] == [2]
    assert ledger.problems(store) == []
    assert testing.check_invariants(store) == []
    _settle(store, ledger, 1)


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_an_error_closing_a_flushed_file_loses_nothing(
    tmp_path: Path, places: list[Place], mode: MergingMode
) -> None:
    """On a store whose open files are readable every append was flushed (and synced)
    before its handle existed: a failing close is logged, and the checkpoint completes."""
    config = Config.for_mode(mode, num_retained=1, max_file_size=1)
    _, store, fs = _open("memory", tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    fs.fail("close", times=3)
    assert checkpoint(store, ledger, reuse=(1,)) is not None
    assert fs.faults_fired == 3
    assert ledger.problems(store) == [] and testing.check_invariants(store) == []
    _settle(store, ledger, 1)


METADATA_CASES = [
    (k, m, f)
    for k, m in CASES
    for f in (["fsync", "replace", "fsync_dir"] if k == "local" else ["pipe_file"])
]
"""The call of a metadata write that fails: the single PUT (``pipe_file``) or, on a local
disk, the sync of the temporary file, the rename, or the directory sync after it."""


@pytest.mark.parametrize("lost_reply", [False, True], ids=["failed", "lost-reply"])
@pytest.mark.parametrize(
    ("kind", "mode", "method"),
    METADATA_CASES,
    ids=[f"{k}-{m.name}-{f}" for k, m, f in METADATA_CASES],
)
def test_a_failing_metadata_write_aborts_the_checkpoint(
    tmp_path: Path,
    places: list[Place],
    kind: str,
    mode: MergingMode,
    method: str,
    lost_reply: bool,
) -> None:
    """R51: ``complete`` returns None, the checkpoint is aborted, no ``_metadata`` of it
    stays (also when the write happened and only its answer was lost: recovery would
    take it for a completed checkpoint whose files the abort deletes), nor a temporary
    ``_metadata.inprogress``."""
    config = Config.for_mode(mode, num_retained=1)
    place, store, fs = _open(kind, tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    coord = store.coordinator
    cid = coord.trigger()
    for sub, tm in sorted(store.placement().items()):
        _write_subtask(store, ledger, cid, sub, tm, reuse=(1,))
        store.task_manager(tm).acknowledge(cid, sub)
    where = f"chk-{cid}" if method == "fsync_dir" else "_metadata"
    fs.fail(method, path_contains=where, lost_reply=lost_reply)
    with pytest.raises(CompletionFailed) as failed:
        coord.complete(cid)
    assert failed.value.checkpoint == cid and isinstance(failed.value.cause, StorageFault)
    assert fs.faults_fired == 1
    assert cid not in coord.pending()
    store.deliver_notifications()
    store.flush()
    left = place.snapshot()
    assert metadata_path(store.job_id, cid) not in left
    assert metadata_path(store.job_id, cid) + ".inprogress" not in left
    assert [r.checkpoint for r in coord.retained()] == [2]
    assert ledger.problems(store) == []
    assert testing.check_invariants(store) == []
    _settle(store, ledger, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_create_whose_file_was_made_leaves_nothing(
    tmp_path: Path, places: list[Place], kind: str
) -> None:
    """The store created the file but the answer was lost: the file is removed, so
    nobody is left owning a file on storage that no bookkeeping knows."""
    config = Config.for_mode(MergingMode.NONE, num_retained=1)
    _, store, fs = _open(kind, tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    cid = store.coordinator.trigger()
    tm = store.placement()[TARGET]
    fs.fail("open" if kind != "object" else "close", lost_reply=True)
    with pytest.raises(StorageFault):
        store.task_manager(tm).write(cid, TARGET, KS, "x", b"lost reply")
    store.deliver_notifications()
    assert testing.check_invariants(store) == []
    _settle(store, ledger, 1)


def test_across_merging_is_refused_on_an_object_store(tmp_path: Path, places: list[Place]) -> None:
    with pytest.raises(ValueError, match="R16"):
        _open("object", tmp_path, places, Config.for_mode(MergingMode.ACROSS_CHECKPOINT))


# --------------------------------------------------------------------------- deletes


@pytest.mark.parametrize(("kind", "mode"), CASES, ids=CASE_IDS)
def test_a_delete_that_keeps_failing_is_reported_retried_and_never_forgotten(
    tmp_path: Path, places: list[Place], kind: str, mode: MergingMode
) -> None:
    """R45: retried in the background with backoff, then listed by ``delete_failures()``
    (path and error) and in ``pending_deletes``; still listed after more checkpoints and
    failing retries; ``retry_deletes()`` removes it once the store works again."""
    config = Config.for_mode(mode, num_retained=1)
    place, store, fs = _open(kind, tmp_path, places, config)
    ledger = Ledger()
    victim = metadata_path(store.job_id, 1)
    fs.fail("rm_file", times=10**6, path_contains=victim)
    fs.fail("rm", times=10**6, path_contains=victim)
    _history(store, ledger)  # completing 2 subsumes 1: its _metadata is deleted
    failures = store.delete_failures()
    assert [f.path for f in failures] == [victim]
    assert isinstance(failures[0].error, OSError) and "injected fault" in str(failures[0].error)
    assert failures[0].attempts == 3  # Storage.delete_attempts
    assert victim in repr(failures[0])
    assert victim in testing.observe(store).pending_deletes
    assert victim in place.snapshot()
    assert testing.check_invariants(store) == []
    # never forgotten: not by more checkpoints, not by a retry that fails again
    assert checkpoint(store, ledger, reuse=(1,)) is not None
    assert [f.path for f in store.retry_deletes()] == [victim]
    assert store.delete_failures()[0].attempts == 4
    assert victim in testing.observe(store).pending_deletes
    assert ledger.problems(store) == []
    fs.heal()
    assert store.retry_deletes() == []
    assert store.delete_failures() == []
    assert victim not in place.snapshot()
    assert victim not in testing.observe(store).pending_deletes
    _settle(store, ledger, 1)


@pytest.mark.parametrize(("kind", "mode"), CASES, ids=CASE_IDS)
def test_deletes_failing_while_the_job_ends_are_retried(
    tmp_path: Path, places: list[Place], kind: str, mode: MergingMode
) -> None:
    """Every delete of ``cancel(retain=False)`` fails (files and managed directories);
    they are all retried later and nothing of the job remains."""
    config = Config.for_mode(mode, num_retained=2)
    place, store, fs = _open(kind, tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    fs.fail("rm_file", times=10**6)
    fs.fail("rm", times=10**6)
    store.coordinator.cancel(retain=False)
    failed = {f.path for f in store.delete_failures()}
    assert failed and all(f.startswith(store.job_id + "/") for f in failed)
    assert set(testing.observe(store).pending_deletes) >= failed
    assert place.snapshot()
    fs.heal()
    assert store.retry_deletes() == []
    assert not [p for p in place.snapshot() if p.startswith(store.job_id + "/")]
    assert testing.check_invariants(store, quiet=True) == []


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_queued_deletes_go_in_fewer_calls_than_paths(
    tmp_path: Path, places: list[Place], kind: str
) -> None:
    """Background deletes are batched: on a store with a bulk call (``fs.rm(list)``) the
    deletes a subsume queues together take fewer calls than paths."""
    job = JobSpec((VertexSpec("w", 8),), num_tms=2)
    place = Place.make(kind, tmp_path)
    places.append(place)
    store, fs = place.store(Config.for_mode(MergingMode.NONE, num_retained=1), job)
    ledger = Ledger()
    assert checkpoint(store, ledger) is not None
    first = set(place.snapshot())  # everything checkpoint 1 wrote: subsumed by 2
    gate = fs.hold("rm_file")
    fs.gates["rm"] = gate  # the first delete waits until every delete is queued
    assert checkpoint(store, ledger) is not None
    storage = store._engine.storage
    gate.set()
    store.flush()
    assert len(first) == 2 * 8 + 1  # 16 state files and a _metadata
    assert not first & set(place.snapshot())
    assert storage.deletes_done == len(first)
    assert storage.delete_calls <= 2 < len(first)
    if kind == "local":
        return  # a local disk has no bulk call: one os.remove per path, in one batch
    # How the paths split between the (at most two) calls depends on when the worker
    # wakes: one path then 16, or the coordinator's 9 then the TMs' 8.
    assert len(fs.bulk_rm_sizes) <= 2 and sum(fs.bulk_rm_sizes) >= len(first) - 1
    assert testing.check_invariants(store) == []


def test_a_file_whose_delete_keeps_failing_keeps_its_owner(
    tmp_path: Path, places: list[Place]
) -> None:
    _, store, fs = _open("memory", tmp_path, places, Config.for_mode(MergingMode.NONE))
    fs.fail("rm_file", times=10**6)
    fs.fail("rm", times=10**6)
    _history(store, Ledger())
    assert store.delete_failures()
    assert testing.check_invariants(store) == []


def test_a_failed_upload_at_acknowledge_declines_the_checkpoint(
    tmp_path: Path, places: list[Place]
) -> None:
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT)
    _, store, fs = _open("object", tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    cid = store.coordinator.trigger()
    tm = store.placement()[TARGET]
    _write_subtask(store, ledger, cid, TARGET, tm)
    fs.fail("close", path_contains=shared_dir(store.job_id, TARGET))
    with pytest.raises(StorageFault):
        store.task_manager(tm).acknowledge(cid, TARGET)
    assert cid not in store.coordinator.pending()


def test_delivering_notifications_survives_a_failed_upload(
    tmp_path: Path, places: list[Place]
) -> None:
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT)
    _, store, fs = _open("object", tmp_path, places, config)
    ledger = Ledger()
    _history(store, ledger)
    cid = store.coordinator.trigger()
    tm = store.placement()[TARGET]
    store.task_manager(tm).write(cid, TARGET, KS, "unfinished", b"bytes nobody acknowledged")
    store.coordinator.abort(cid)
    fs.fail("close")
    store.deliver_notifications()


@pytest.mark.parametrize("mode", [MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT])
def test_reusing_state_whose_checkpoint_was_aborted(
    tmp_path: Path, places: list[Place], mode: MergingMode
) -> None:
    place = Place.make("memory", tmp_path)
    places.append(place)
    job = JobSpec((VertexSpec("w", 1),), num_tms=1)
    store, _ = place.store(Config.for_mode(mode), job, background_deletes=False)
    coord = store.coordinator
    ((sub, tm),) = store.placement().items()
    mgr = store.task_manager(tm)
    cid = coord.trigger()
    mgr.write(cid, sub, KS, "a.sst", b"A" * 10)
    mgr.acknowledge(cid, sub)
    assert coord.complete(cid) is not None
    store.deliver_notifications()
    cid = coord.trigger()
    mgr.write(cid, sub, KS, "b.sst", b"B" * 10)
    mgr.acknowledge(cid, sub)
    coord.abort(cid)
    store.deliver_notifications()
    cid = coord.trigger()
    try:
        entry = mgr.reuse_shared(cid, sub, "b.sst")
    except CommandError as err:
        assert err.reason is Reason.NO_SUCH_STATE  # acceptable: the caller writes it again
        return
    assert entry is not None and store.read(entry) == b"B" * 10


# --------------------------------------------------------------------------- random faults

FAULTY_METHODS = ["open", "write", "flush", "close", "makedirs", "pipe_file", "cat_file"]
LOCAL_FAULTY_METHODS = [*LOCAL_WRITE_METHODS, "cat_file"]
"""On a local disk: the OS calls of ``Storage``'s local path (and its fsspec reads)."""
SMALL_JOB = JobSpec((VertexSpec("src", 1), VertexSpec("win", 2)), num_tms=2)
EXAMPLES = {"long": 3000, "ci": 300}.get(PROFILE, 200)
LOCAL_EXAMPLES = {"long": 1000, "ci": 60}.get(PROFILE, 40)
"""Local disk: every append and directory sync is a real ``fsync``, so fewer examples."""
MAX_OPS = 60 if PROFILE == "long" else 30

Fault = tuple[str, int, int, bool]
"""(method, after, times, lost_reply): ``FaultyFileSystem.fail`` arguments."""
Op = tuple[str, int, Fault | None]


def _ops(methods: list[str]) -> st.SearchStrategy[Op]:
    faults: st.SearchStrategy[Fault | None] = st.one_of(
        st.none(),
        st.none(),
        st.tuples(st.sampled_from(methods), st.integers(0, 12), st.integers(1, 2), st.booleans()),
    )
    return st.one_of(
        *[st.tuples(st.just("checkpoint"), st.booleans(), faults)] * 6,
        st.tuples(st.just("savepoint"), st.just(False), faults),
        st.tuples(st.just("abandon"), st.integers(0, 3), faults),
        st.tuples(st.just("failover"), st.just(False), faults),
        st.tuples(st.just("restart"), st.just(False), faults),
        *[st.tuples(st.just("break_deletes"), st.integers(0, 10**6), st.none())] * 2,
        st.tuples(st.just("heal_deletes"), st.just(False), st.none()),
        st.tuples(st.just("retry_deletes"), st.just(False), st.none()),
    )


ops = _ops(FAULTY_METHODS)
local_ops = _ops(LOCAL_FAULTY_METHODS)


class FaultyJob:
    """A job on the failing file system, driven by random operations with random faults.

    After every operation no retained checkpoint lost a byte (read past the wrapper, so
    that reading does not consume armed faults), completed savepoints are intact, and
    ``check_invariants()`` is empty; at the end, with the faults gone, the job is quiet.
    """

    def __init__(self, place: Place, config: Config, object_store: bool) -> None:
        self.place = place
        self.store, self.fs = place.store(config, SMALL_JOB, object_store=object_store)
        self.ledger = Ledger()
        self.savepoints: list[RetainedView] = []
        self.completed = 0
        self.delete_failures = 0

    def apply(self, op: str, arg: int, fault: Fault | None) -> None:
        if fault is not None:
            method, after, times, lost_reply = fault
            self.fs.fail(method, after=after, times=times, lost_reply=lost_reply)
        coord = self.store.coordinator
        if op == "checkpoint":
            self.checkpoint(reuse=bool(arg), savepoint=False)
        elif op == "savepoint":
            self.checkpoint(reuse=False, savepoint=True)
        elif op == "abandon":  # written by some subtasks, then aborted
            self.checkpoint(reuse=True, savepoint=False, only=arg)
        elif op == "failover":
            coord.failover()
        elif op == "restart":
            try:
                coord.restart()
            except MetadataError as err:
                assert "cannot be read" in str(err)  # an injected read fault: nothing changed
        elif op == "break_deletes":
            files = sorted(self.place.snapshot())
            if files:
                victim = files[arg % len(files)]
                self.fs.fail("rm_file", times=10**6, path_contains=victim)
                self.fs.fail("rm", times=10**6, path_contains=victim)
        elif op == "heal_deletes":
            self.fs.heal("rm_file", "rm")
        elif op == "retry_deletes":
            self.store.retry_deletes()
        self.deliver()
        self.check()

    def deliver(self) -> None:
        # A failed upload while handling a notice poisons a garbage file (R17) and
        # never escapes: see test_delivering_notifications_survives_a_failed_upload.
        self.store.deliver_notifications()

    def reusable(self, sub: SubtaskId) -> list[str]:
        retained = self.store.coordinator.retained()
        if not retained or retained[-1].job != self.store.job_id:
            return []
        return sorted({e.name for e in retained[-1].entries if e.subtask == sub and e.kind is KS})

    def checkpoint(
        self, *, reuse: bool, savepoint: bool, only: int | None = None
    ) -> RetainedView | None:
        store, ledger = self.store, self.ledger
        coord = store.coordinator
        cid = coord.trigger(savepoint=savepoint)
        job = store.job_id
        for n, (sub, tm) in enumerate(sorted(store.placement().items())):
            if only is not None and n >= only:
                break
            mgr = store.task_manager(tm)
            try:
                name = f"sst-{cid}"
                ledger.record(job, cid, sub, name, payload(sub, name))
                mgr.write(cid, sub, KS, name, payload(sub, name))
                for old in self.reusable(sub)[-2:] if reuse else []:
                    ledger.record(job, cid, sub, old, payload(sub, old))
                    try:
                        mgr.reuse_shared(cid, sub, old)
                    except CommandError as err:
                        assert err.reason is Reason.NO_SUCH_STATE
                        mgr.write(cid, sub, KS, old, payload(sub, old))
                ledger.record(job, cid, sub, "offsets", payload(sub, "offsets", cid))
                mgr.write(cid, sub, OP, "offsets", payload(sub, "offsets", cid))
                mgr.acknowledge(cid, sub)
            except StorageFault:
                continue  # the subtask declined (R17); the others go on
        done = None
        if cid in coord.pending():
            if only is not None:
                coord.abort(cid)
            else:
                # A failed upload at acknowledge declines (R17), so a checkpoint still
                # pending here has every acknowledgement.
                try:
                    done = coord.complete(cid)
                except CompletionFailed:  # the _metadata write failed: aborted (R51)
                    done = None
        if done is not None and savepoint:
            self.savepoints.append(done)
        self.completed += done is not None
        return done

    def check(self) -> None:
        read = self.place.read_entry
        assert self.ledger.problems(self.store, read=read) == []
        assert self.ledger.problems(self.store, views=self.savepoints, read=read) == []
        assert testing.check_invariants(self.store) == []
        self.delete_failures += bool(self.store.delete_failures())

    def quiesce(self) -> None:
        store = self.store
        self.fs.heal()
        self.deliver()
        assert store.retry_deletes() == []
        for _ in range(store.config.num_retained + 1):
            assert self.checkpoint(reuse=True, savepoint=False) is not None
            self.deliver()
        assert store.retry_deletes() == []
        self.check()
        assert testing.check_invariants(store, quiet=True) == []


@settings(max_examples=EXAMPLES)
@given(
    mode=st.sampled_from(MergingMode),
    object_store=st.booleans(),
    num_retained=st.integers(1, 2),
    small_files=st.booleans(),
    steps=st.lists(ops, min_size=10, max_size=MAX_OPS),
)
def test_random_faults_never_lose_a_byte(
    mode: MergingMode,
    object_store: bool,
    num_retained: int,
    small_files: bool,
    steps: list[Op],
) -> None:
    _random_faults("memory", mode, object_store, num_retained, small_files, steps)


@settings(max_examples=LOCAL_EXAMPLES)
@given(
    mode=st.sampled_from(MergingMode),
    num_retained=st.integers(1, 2),
    small_files=st.booleans(),
    steps=st.lists(local_ops, min_size=10, max_size=MAX_OPS),
)
def test_random_faults_never_lose_a_byte_on_local_disk(
    mode: MergingMode, num_retained: int, small_files: bool, steps: list[Op]
) -> None:
    """The same on a local directory: faults in the OS calls of ``Storage``'s local path
    (builtin ``open``, ``os.fsync``, directory syncs, ``os.replace``)."""
    _random_faults("local", mode, False, num_retained, small_files, steps)


def _random_faults(
    kind: str,
    mode: MergingMode,
    object_store: bool,
    num_retained: int,
    small_files: bool,
    steps: list[Op],
) -> None:
    if object_store and mode is MergingMode.ACROSS_CHECKPOINT:
        mode = MergingMode.WITHIN_CHECKPOINT
    size = 512 if small_files else 32 * 2**20
    config = Config.for_mode(mode, num_retained=num_retained, max_file_size=size)
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        place = Place.make(kind, Path(tmp))
        try:
            _run_faulty_job(place, config, object_store, steps)
        finally:
            place.cleanup()


def _run_faulty_job(place: Place, config: Config, object_store: bool, steps: list[Op]) -> None:
    job = FaultyJob(place, config, object_store)
    for op, arg, fault in steps:
        job.apply(op, arg, fault)
    fired = job.fs.faults_fired
    event(f"faults fired: {min(fired, 5)}{'+' if fired > 4 else ''}")
    event(f"a delete failed for good: {job.delete_failures > 0}")
    event(f"checkpoints completed: {min(job.completed, 5)}{'+' if job.completed > 4 else ''}")
    job.quiesce()


def test_reading_past_the_wrapper_agrees_with_the_store(
    tmp_path: Path, places: list[Place]
) -> None:
    """``Place.read_entry`` (past the wrapper) agrees with ``store.read``."""
    _, store, _ = _open("memory", tmp_path, places, Config.for_mode(MergingMode.ACROSS_CHECKPOINT))
    ledger = Ledger()
    _history(store, ledger)
    for r in store.coordinator.retained():
        for e in r.entries:
            if stream_of(e.handle) is not None:
                assert places[0].read_entry(e) == store.read(e)
