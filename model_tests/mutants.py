"""The mutant zoo: fastimpl with one seeded bug at a time, which the tests must kill.

Each mutant reproduces a real bug (a Flink bug of the design brief, or a classic mistake)
in fastimpl's own code paths by patching one or two methods of a party
(the coordinator's parts, the TM's parts ``fastimpl.tm_*``, ``fastimpl.catalog``,
``fastimpl.manager``) or of the in-process engine (``fastimpl.engine.InProcessEngine``) from
test code, as ``twins.py`` does for the reference model: the buggy behaviour lives here,
never as a flag inside fastimpl. A mutant keeps what it needs to remember per party in a
``WeakKeyDictionary`` (or ``WeakSet``) keyed by the party (a TM's by its ``TmAttempt``, the
record its parts share, or by the part), created afresh by each ``patch``, so that nothing
outlives the patch.

    python -m model_tests.mutants                       # every mutant (make mutants)
    python -m model_tests.mutants --only flink-38347    # one
    python -m model_tests.mutants --lockstep-examples 0 # the conformance corpus only

For each mutant the runner (a) runs the conformance corpus in process against fastimpl
with the mutant applied, named cases first, and stops at the first case that fails: the
case and the step that killed it; (b) runs the lockstep machine on ``memory://``
(``tests/test_lockstep.py``) in a pytest subprocess that applies the mutant through
``model_tests/mutant_plugin.py``: whether it failed, and its first error line. Each
killing case is then run against the unmutated fastimpl, which must pass it (else the
kill proves nothing), and the lockstep run is done once without a mutant first, for the
same reason. Exit 1 if a mutant survives the corpus, if a kill is not a kill (the case
fails unmutated too), if the lockstep run fails without a mutant, or if a lockstep run
could not complete; a mutant the lockstep tests miss is reported, not failed.

FLINK-35778 (special characters in ids reaching paths) has no mutant: the escaping is
``spec.ids.escape_name``, shared by the model and fastimpl, so a mutant of it would change
the expectations as much as the implementation (``test_flink_bugs.py`` covers it).
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import attrs
import pytest

from conformance.adapter import Fastimpl
from conformance.case import OBSERVATION_FIELDS, Case, case_name, corpus_files, load
from conformance.runner import run_case
from fastimpl.catalog import Catalog
from fastimpl.coordinator import CheckpointCoordinator
from fastimpl.engine import InProcessEngine
from fastimpl.failover import Failover
from fastimpl.job_end import JobEnd
from fastimpl.manager import Manager
from fastimpl.records import BackendRef, Completed, Deferred, PFile, Seg, StoredFile
from fastimpl.retention import Retention
from fastimpl.tm_attempt import TmAttempt
from fastimpl.tm_duties import TmDuties
from fastimpl.tm_files import TmFiles
from fastimpl.tm_notices import TmNotices
from fastimpl.tm_reuse import TmReuse
from fastimpl.working import Databases, SharedWorking
from spec import commands as c
from spec.config import Scope, StateKind
from spec.effects import COORDINATOR, USER, tm_actor
from spec.handles import FileHandle, SegmentHandle, stream_of
from spec.ids import SubtaskId, TmId
from spec.layout import is_under, taskowned_dir

ROOT = Path(__file__).resolve().parent.parent
ENV = "CKPT_MUTANT"
"""The environment variable through which ``mutant_plugin`` learns which mutant to apply."""
NO_MUTANT = "none"
"""``CKPT_MUTANT=none``: the plugin applies nothing (the baseline lockstep run)."""


@attrs.frozen
class Mutant:
    name: str
    description: str
    """The seeded bug: what the mutated code does."""
    mirrors: str
    """The Flink bug it reproduces, or the classic mistake."""
    patch: Callable[[pytest.MonkeyPatch], None]
    case: str
    """The corpus case of the bug's own scenario (or of the rule the mistake breaks): it
    must kill the mutant by itself, whatever other case of the corpus kills it first."""


# ---------------------------------------------------------------------------- Flink bugs


def _flink_38347(mp: pytest.MonkeyPatch) -> None:
    """The pre-fix DirectoryHandleWithReferenceTrack, as ``test_flink_38347_buggy_rule``
    puts it into the model: +1 per checkpoint that used the directory, -1 per abort notice
    the TM hears, tracking stops at the first completion notice, recursive delete at 0.
    A lost completion notice followed by an abort deletes a directory a completed
    checkpoint still uses."""
    aborts: weakref.WeakKeyDictionary[TmAttempt, int] = weakref.WeakKeyDictionary()
    completed: weakref.WeakSet[TmAttempt] = weakref.WeakSet()
    orig_abort, orig_complete = TmNotices._tm_abort, TmNotices._tm_complete

    def tm_abort(self: TmNotices, checkpoint: int, latest: int, sp: bool) -> None:
        aborts[self.a] = aborts.get(self.a, 0) + 1
        orig_abort(self, checkpoint, latest, sp)

    def tm_complete(self: TmNotices, checkpoint: int, mark: int, sp: bool) -> None:
        completed.add(self.a)
        orig_complete(self, checkpoint, mark, sp)

    def release(self: TmFiles) -> None:
        a = self.a
        heard = aborts.get(a, 0)
        if a in completed:
            return
        cat = a.catalog
        for path in sorted(cat.dirs):
            d = cat.dirs.get(path)
            if d is None or d.creator != a.tm or path not in cat.dir_owner:
                continue
            if len(d.used_by) - heard <= 0:
                cat.delete_dir(path, tm_actor(a.tm))

    mp.setattr(TmNotices, "_tm_abort", tm_abort)
    mp.setattr(TmNotices, "_tm_complete", tm_complete)
    mp.setattr(TmFiles, "_release_dirs", release)


def _flink_36125(mp: pytest.MonkeyPatch) -> None:
    """Flink's second discard path (a completion notice walks the acknowledged upload sets
    of subsumed checkpoints and discards their segments again) with a discard that is not
    idempotent: a segment discarded before decrements its file's count once more."""
    gone: weakref.WeakKeyDictionary[TmFiles, dict[str, Seg]] = weakref.WeakKeyDictionary()
    orig_complete = TmNotices._tm_complete

    def discard(self: TmFiles, lid: str) -> None:
        m = self.a.m
        seen = gone.setdefault(self, {})
        seg = m.remove(lid) or seen.get(lid)
        if seg is None:
            return
        seen[lid] = seg
        pf = m.pfiles.get(seg.path)
        if pf is None:
            return
        pf.ref_count -= 1
        pf.live_bytes -= seg.length
        self._check_file(seg.path)

    def tm_complete(self: TmNotices, checkpoint: int, watermark: int, sp: bool) -> None:
        uploaded = dict(self.a.acked)
        orig_complete(self, checkpoint, watermark, sp)
        m = self.a.m
        for (_s, cp), entries in sorted(uploaded.items(), key=lambda kv: str(kv[0])):
            if cp > watermark:
                continue
            for e in entries:
                h = e.handle
                if isinstance(h, SegmentHandle):
                    seg = m.segs.get(h.logical_id)
                    if seg is None or seg.last_used <= watermark:
                        self.files._discard(h.logical_id)

    mp.setattr(TmFiles, "_discard", discard)
    mp.setattr(TmNotices, "_tm_complete", tm_complete)


def _flink_35570(mp: pytest.MonkeyPatch) -> None:
    """Reuse leaves the segment's last_used where it was (Flink's placeholder path), so the
    subsume of the checkpoint that created it discards what the reusing one still uses."""

    def touch(self: Manager, seg: Seg, last_used: int) -> None:
        pass

    mp.setattr(Manager, "touch", touch)


def _flink_35784(mp: pytest.MonkeyPatch) -> None:
    """Completion registers the file handles only: the directory handles the TMs reported
    never reach the registry nor the coordinator, which never deletes the directories."""
    orig = Retention.register

    def register(self: Retention, done: Completed, recorded: Completed | None = None) -> None:
        orig(
            self,
            Completed(done.id, done.job, done.savepoint, done.entries, (), done.metadata),
            recorded,
        )

    mp.setattr(Retention, "register", register)


def _flink_35400(mp: pytest.MonkeyPatch) -> None:
    """A failover keeps a surviving TM's manager (pools, segments, uploads of the old
    attempt) and rebuilds on top of it from the retained checkpoints: the TM's reset
    (``ResetTm``) closes its files but forgets nothing."""

    def reset(self: TmDuties) -> None:
        a = self.a
        self.files.drop_outputs_where(lambda cp: True)
        for path in sorted(a.m.pfiles):
            if a.m.pfiles[path].open:
                a.catalog.close(path)

    mp.setattr(TmDuties, "reset", reset)


def _flink_25395(mp: pytest.MonkeyPatch) -> None:
    """Shared state is reused before the TM knows the checkpoint that uploaded it completed
    (fastimpl's last_used advance is left intact: unlike the model twin, this alone shows)."""
    orig = TmReuse._reusable

    def reusable(self: TmReuse, ref: BackendRef) -> bool:
        return orig(self, BackendRef(ref.entry, ref.checkpoint, True))

    mp.setattr(TmReuse, "_reusable", reusable)


def _flink_26985(mp: pytest.MonkeyPatch) -> None:
    """Subsuming a restored (claimed) checkpoint discards all its shared state, as if it
    alone referred to it, though the new job's checkpoint reuses some of it."""
    orig = Retention.subsume

    def subsume(self: Retention, old: Completed) -> None:
        orig(self, old)
        if old.job == self.run.job:
            return
        catalog = self.run.catalog
        for e in old.entries:
            s = stream_of(e.handle)
            if s is not None and s.scope is Scope.SHARED and s.path in catalog.files:
                catalog.delete_file(s.path, COORDINATOR)

    mp.setattr(Retention, "subsume", subsume)


def _flink_29913(mp: pytest.MonkeyPatch) -> None:
    """The shared-state registry is keyed by the local file name; a second upload under a
    known name is taken for a duplicate and discarded, though a checkpoint refers to it."""
    orig = Retention.register

    def register(self: Retention, done: Completed, recorded: Completed | None = None) -> None:
        catalog = self.run.catalog
        for e in done.entries:
            h = e.handle
            if not isinstance(h, SegmentHandle | FileHandle) or h.scope is not Scope.SHARED:
                continue
            known = self.registry.get(e.name)
            if known is not None and known.path != h.path:
                f = catalog.files.get(h.path)
                if f is not None and f.owner == COORDINATOR:
                    catalog.delete_file(h.path, COORDINATOR)  # "a duplicate upload"
                self.registry.register(e.name, known.path, known.handle, known.owned, done.id)
                continue
            self.registry.register(e.name, h.path, h, isinstance(h, FileHandle), done.id)
        # the directories are registered as fastimpl does: the bug is in the file keys
        orig(
            self,
            Completed(done.id, done.job, done.savepoint, (), done.directories, done.metadata),
            recorded,
        )

    mp.setattr(Retention, "register", register)


def _flink_35803(mp: pytest.MonkeyPatch) -> None:
    """After a restore, each new TM's manager takes the restored shared files for its own
    (the paths match what it would track) and offers them for reuse: confirmed backend
    state and live segments, whatever the restore mode and the job that wrote them."""
    orig = CheckpointCoordinator.restore

    def restore(self: CheckpointCoordinator, cmd: c.Restore) -> None:
        orig(self, cmd)
        engine = self.engine
        assert isinstance(engine, InProcessEngine)
        for subtask, entries in sorted(self.assignment.items()):
            party = engine.parties[self.placement[subtask]]
            for e in entries:
                if e.kind is not StateKind.KEYED_SHARED:
                    continue
                h = e.handle
                if isinstance(h, SegmentHandle):
                    m = party.m
                    if h.logical_id not in m.segs:
                        cp = cmd.checkpoint
                        m.add(Seg(h.logical_id, h.path, h.offset, h.length, cp, cp, True))
                        pf = m.pfiles.get(h.path)
                        if pf is None:
                            f = self.catalog.files.get(h.path)
                            size = 0 if f is None else f.size
                            pf = m.pfiles[h.path] = PFile(h.path, h.scope, None, None, False, size)
                        pf.ref_count += 1
                        pf.live_bytes += h.length
                elif not isinstance(h, FileHandle):
                    continue
                party.backend[(subtask, e.name)] = BackendRef(e, cmd.checkpoint, True)

    mp.setattr(CheckpointCoordinator, "restore", restore)


def _flink_32086(mp: pytest.MonkeyPatch) -> None:
    """A managed directory that no completed checkpoint used is never deleted: neither by
    the TM that made it when its checkpoints abort (R41), nor when the job ends (R90)."""
    orig = Catalog.delete_dir

    def delete_dir(self: Catalog, path: str, actor: str) -> None:
        d = self.dirs.get(path)
        if d is not None and not d.handed_over:
            return
        orig(self, path, actor)

    mp.setattr(Catalog, "delete_dir", delete_dir)


# ---------------------------------------------------------------------------- classic mistakes


def _abort_discards_reused(mp: pytest.MonkeyPatch) -> None:
    """An abort notice discards the segments the aborted checkpoint used (its last_used
    bucket) instead of those it created: a segment an older, completed checkpoint wrote
    and the aborted one only reused goes too (R32)."""

    def created_for(self: Manager, checkpoint: int) -> list[str]:
        return sorted(self.by_last_used.get(checkpoint, ()))

    mp.setattr(Manager, "created_for", created_for)


def _watermark_off_by_one(mp: pytest.MonkeyPatch) -> None:
    """A TM discards the segments used up to the subsumed watermark + 1 (R31)."""
    orig = TmNotices._tm_complete

    def tm_complete(self: TmNotices, checkpoint: int, watermark: int, sp: bool) -> None:
        orig(self, checkpoint, watermark + 1, sp)

    mp.setattr(TmNotices, "_tm_complete", tm_complete)


def _sweep_ignores_owner(mp: pytest.MonkeyPatch) -> None:
    """The job-end sweep lists storage under the job's bases and deletes every file no
    retained checkpoint refers to, as Flink's whole-directory delete does, without asking
    who owns it or who may still write it: a zombie attempt's open file, the user's
    savepoints, an older job's files restored without claiming."""
    orig = JobEnd.end_job

    def end_job(self: JobEnd, *, retain: bool) -> None:
        orig(self, retain=retain)
        catalog, storage = self.run.catalog, self.run.storage
        for path in sorted(storage.list_files()):
            ours = any(is_under(path, b) for b in self.run.bases)
            if not ours or self.retention.referenced(path):
                continue
            if path not in catalog.files:
                catalog.files[path] = StoredFile(storage.size(path), False, COORDINATOR, None)
            catalog.files[path].owner = COORDINATOR
            catalog.delete_file(path, COORDINATOR)

    mp.setattr(JobEnd, "end_job", end_job)


def _reuse_not_reusable(mp: pytest.MonkeyPatch) -> None:
    """Reuse checks that the segment is still tracked but not that its file may be reused:
    a file whose write failed (R17) or that is past the space-amplification bound (R81)
    is referred to again."""
    orig = TmReuse._reusable

    def reusable(self: TmReuse, ref: BackendRef) -> bool:
        h = ref.entry.handle
        m = self.a.m
        if ref.confirmed and isinstance(h, SegmentHandle):
            return h.logical_id in m.segs and h.path in m.pfiles
        return orig(self, ref)

    mp.setattr(TmReuse, "_reusable", reusable)


def _forget_taskowned_dir(mp: pytest.MonkeyPatch) -> None:
    """A TM creates its directory for exclusive state on storage but never records it as
    a managed directory: it is not reported with acknowledgements, not handed over, not
    owned by anyone, and never deleted whole."""
    orig = Catalog.mkdir

    def mkdir(self: Catalog, path: str, actor: str, creator: TmId) -> None:
        if path == taskowned_dir(path.split("/")[0], creator):  # the job's base
            self.storage.mkdir(path)
            return
        orig(self, path, actor, creator)

    mp.setattr(Catalog, "mkdir", mkdir)


def _tm_deletes_shared_working(mp: pytest.MonkeyPatch) -> None:
    """A database's attempt keeps its records of the working files an acknowledgement
    referred to in place: they still say it wrote and owns them, so once a compaction
    leaves them unused and no snapshot pins them it deletes them, though they are shared
    now (the coordinator's, R102) and a retained checkpoint uses them."""

    def handed_over(self: Databases, paths: Iterable[str]) -> None:
        return None

    mp.setattr(Databases, "handed_over", handed_over)


def _replace_keeps_acks(mp: pytest.MonkeyPatch) -> None:
    """A task-level failover (R66) keeps the acknowledgements the replaced attempt sent
    for pending checkpoints: a checkpoint completes without the new attempt's, naming
    files of an attempt the coordinator gave up on, which its stop may sweep first."""

    def withdraw_acks(self: Failover, subtasks: list[SubtaskId]) -> None:
        return None

    mp.setattr(Failover, "withdraw_acks", withdraw_acks)


def _deferred_dir_delete_unchecked(mp: pytest.MonkeyPatch) -> None:
    """A directory delete that waited (for a zombie to stop, R64, or for a retry, R45)
    runs when it is released without asking its owner's rule again (R41, R42): a new
    attempt that wrote into the directory meanwhile, under a retained checkpoint, loses
    its files (the long soak's seed 1028-across-local)."""
    orig = Catalog._run_deferred

    def run_deferred(self: Catalog, d: Deferred) -> None:
        owner = self.dir_owner.get(d.path)
        if d.is_dir and owner is not None and owner != USER:
            self.delete_dir(d.path, owner)
            return
        orig(self, d)

    mp.setattr(Catalog, "_run_deferred", run_deferred)


def _opens_by_key_groups(mp: pytest.MonkeyPatch) -> None:
    """A restore or failover opens each database on every working file of the checkpoint
    whose key groups overlap its own, whatever operator wrote it (R105): with two
    operators keeping working state, one's database opens the other's files and keeps
    them from the collection (R104). Done by listing every in-place file under every
    operator before the real opening runs, which then matches by key groups alone."""
    orig = SharedWorking.open_databases

    def open_databases(
        self: SharedWorking,
        source: Completed | None,
        epoch: int,
        users: bool = False,
        only: TmId | None = None,
    ) -> None:
        if source is not None:
            blind = copy.copy(source)
            blind.working = tuple(
                (SubtaskId(v.name, s.index, s.parallelism), w)
                for s, w in source.working
                for v in self.coord.vertices
            )
            source = blind
        orig(self, source, epoch, users, only)

    mp.setattr(SharedWorking, "open_databases", open_databases)


ZOO: list[Mutant] = [
    Mutant(
        "flink-38347",
        "directory uses counted; abort notices count down; recursive delete at 0",
        "FLINK-38347 (a counter, not a set)",
        _flink_38347,
        "flink-38347-lost-complete-then-abort-keeps-directory-merging",
    ),
    Mutant(
        "flink-36125",
        "a second discard path with a non-idempotent discard: counts drop twice",
        "FLINK-36125 (double discard)",
        _flink_36125,
        "flink-36125-duplicate-notifications-discard-once-mergingmode",
    ),
    Mutant(
        "flink-35570",
        "reuse does not advance the segment's last_used",
        "FLINK-35570 (reuse keeps last-used)",
        _flink_35570,
        "flink-35570-placeholder-reuse-advances-last-used-mergingmode",
    ),
    Mutant(
        "flink-35784",
        "directory handles never registered; directories never deleted",
        "FLINK-35784 (dir handles unregistered)",
        _flink_35784,
        "flink-35784-directories-are-registered-and-deleted-mergingmo",
    ),
    Mutant(
        "flink-35400",
        "a failover reuses the surviving TMs' stale managers",
        "FLINK-35400 (stale manager reused)",
        _flink_35400,
        "flink-35400-failover-rebuilds-the-manager-mergingmode-within",
    ),
    Mutant(
        "flink-25395",
        "shared state reused before its checkpoint is known complete",
        "FLINK-25395 (reuse of unconfirmed files)",
        _flink_25395,
        "flink-25395-unconfirmed-state-is-uploaded-again-mergingmode",
    ),
    Mutant(
        "flink-26985",
        "subsuming the claimed checkpoint discards all its shared state",
        "FLINK-26985 (restore discards shared)",
        _flink_26985,
        "flink-26985-claimed-shared-state-reused-by-the-new-job",
    ),
    Mutant(
        "flink-29913",
        "registry keyed by local file names; a 'duplicate' upload is discarded",
        "FLINK-29913 (registry keyed by name)",
        _flink_29913,
        "flink-29913-registry-keys-are-unique-handle-ids-mergingmode",
    ),
    Mutant(
        "flink-35803",
        "new TMs take restored files of the older job for their own, reusable",
        "FLINK-35803 (restored files reused)",
        _flink_35803,
        "flink-35803-restored-files-are-not-reused-nor-deleted-by-tms",
    ),
    Mutant(
        "flink-32086",
        "directories no completed checkpoint used are never deleted",
        "FLINK-32086 (unused dirs not cleaned)",
        _flink_32086,
        "flink-32086-job-ending-before-any-checkpoint-leaves-nothing",
    ),
    Mutant(
        "abort-discards-reused",
        "an abort notice discards what the checkpoint used, reused segments too",
        "delete on abort without checking reuse",
        _abort_discards_reused,
        "r32-abort-keeps-an-older-segment-it-reused-mergingmode-withi",
    ),
    Mutant(
        "watermark-off-by-one",
        "TMs discard segments up to the subsumed watermark + 1",
        "off-by-one in the subsume watermark",
        _watermark_off_by_one,
        "r31-complete-discards-segments-up-to-watermark-mergingmode-w",
    ),
    Mutant(
        "sweep-ignores-owner",
        "the job-end sweep deletes every unreferenced file storage holds under the job's bases",
        "deleting a non-owned file",
        _sweep_ignores_owner,
        "r65-an-object-store-never-has-a-file-its-stopped-writer-left",
    ),
    Mutant(
        "reuse-not-reusable",
        "reuse ignores a file marked not reusable (failed write, amplification)",
        "reusing a file marked not reusable",
        _reuse_not_reusable,
        "r20-reuse-from-file-no-longer-reusable-uploads-again-merging",
    ),
    Mutant(
        "forget-taskowned-dir",
        "the TM's exclusive-state directory is created but never registered",
        "forgetting to register a directory",
        _forget_taskowned_dir,
        "r40-directories-created-lazily-at-first-write-mergingmode-wi",
    ),
    Mutant(
        "replace-keeps-acks",
        "a task-level failover keeps the replaced attempt's acknowledgements",
        "R66: completing with an attempt given up on (Spark: a retried task's first ack)",
        _replace_keeps_acks,
        "r66-a-replaced-tm-leaves-pending-checkpoints-pending-and-its",
    ),
    Mutant(
        "tm-deletes-shared-working",
        "a database's attempt still owns the working files it handed over, and deletes them",
        "ForSt: the DB deletes a file it no longer owns (R102)",
        _tm_deletes_shared_working,
        "r102-a-database-never-deletes-a-shared-file",
    ),
    Mutant(
        "opens-by-key-groups",
        "a restored database opens every file on its key groups, of any operator",
        "R105: matching working files by key groups alone (issue 38)",
        _opens_by_key_groups,
        "r105-a-database-opens-only-its-own-operators-files-claim-1",
    ),
    Mutant(
        "deferred-dir-delete-unchecked",
        "a directory delete that waited runs without asking its owner's rule again",
        "acting on a decision taken before the wait (R64, R45)",
        _deferred_dir_delete_unchecked,
        "r64-a-waiting-directory-delete-is-decided-again-when-it-runs",
    ),
]
MUTANTS: dict[str, Mutant] = {m.name: m for m in ZOO}


@contextmanager
def applied(name: str) -> Iterator[Mutant]:
    """fastimpl with mutant ``name`` for the duration of the block."""
    mutant = MUTANTS[name]
    with pytest.MonkeyPatch.context() as mp:
        mutant.patch(mp)
        yield mutant


# ---------------------------------------------------------------------------- the runner


@attrs.frozen
class CorpusRun:
    """A mutant against the conformance corpus, up to the first case it fails."""

    mutant: str
    case: str | None
    """The first case that failed (the killer); None: every case passed (it survived)."""
    step: int
    """The step of ``case`` at which it differed (1-based); 0 if it survived."""
    first_line: str
    """The first line of the case's mismatch report."""
    fields: tuple[str, ...]
    """The observation fields that differed at that step (none: the outcome differed)."""
    cases_run: int
    seconds: float

    @property
    def killed(self) -> bool:
        return self.case is not None


@attrs.frozen
class LockstepRun:
    """A mutant against the lockstep machine on ``memory://``, in a pytest subprocess."""

    mutant: str
    status: str
    """``killed`` (a test failed), ``survived`` (all passed), ``not run``, or ``error``."""
    first_line: str
    """The first error line pytest printed, or why the run did not count."""
    seconds: float


def ordered_corpus() -> list[Path]:
    """Named cases first: each pins one rule or bug in a few steps, so a mutant dies fast
    and the killer says what it broke; the long random cases come after."""
    return sorted(corpus_files(), key=lambda p: (case_name(p).startswith("random-"), case_name(p)))


@cache
def cached_case(path: Path) -> Case:
    """Decoding a case costs more than running it; every mutant reuses the same ones."""
    return load(path)


def run_corpus(name: str, paths: Sequence[Path] | None = None) -> CorpusRun:
    """Run the corpus (or ``paths``, in order) against fastimpl with mutant ``name``,
    stopping at the first case it fails."""
    t0 = time.perf_counter()
    todo = ordered_corpus() if paths is None else list(paths)
    impl = Fastimpl()
    with applied(name):
        for n, path in enumerate(todo, 1):
            case = cached_case(path)
            result = run_case(case, impl)
            if not result.passed:
                lines = (result.mismatch or "").splitlines()
                first = lines[0] if lines else ""
                took = time.perf_counter() - t0
                return CorpusRun(
                    name, case.name, result.steps_run, first, _fields(lines[1:]), n, took
                )
    return CorpusRun(name, None, 0, "", (), len(todo), time.perf_counter() - t0)


def _fields(diff: Sequence[str]) -> tuple[str, ...]:
    """The observation fields a diff names (``compare.differences``: a ``field:`` line
    each), in order, up to the list of commands that follows it."""
    out: list[str] = []
    for line in diff:
        text = line.strip()
        if text.startswith("after commands") or text.startswith("commands up to"):
            break
        if text.endswith(":") and text[:-1] in OBSERVATION_FIELDS and text[:-1] not in out:
            out.append(text[:-1])
    return tuple(out)


def run_own_case(name: str) -> CorpusRun:
    """Mutant ``name`` against its own case alone (``Mutant.case``)."""
    return run_corpus(name, [case_path(MUTANTS[name].case)])


def passes_unmutated(case_file: Path) -> bool:
    """Whether fastimpl as it is passes a case: a kill counts only if it does."""
    return run_case(cached_case(case_file), Fastimpl()).passed


def case_path(case: str) -> Path:
    return next(p for p in corpus_files() if case_name(p) == case)


LOCKSTEP_TIMEOUT = 1200.0
APPLIED_MARK = "mutant applied: "
"""Printed by ``mutant_plugin`` at the end of a session: proof the mutant was in place."""


def run_lockstep(name: str, examples: int) -> LockstepRun:
    """The lockstep tests on ``memory://`` (every merging mode) with mutant ``name``
    (``NO_MUTANT``: none), in a pytest subprocess that stops at the first failure."""
    if examples <= 0:
        return LockstepRun(name, "not run", "--lockstep-examples 0", 0.0)
    env = dict(os.environ)
    env.pop("LOCKSTEP_LOG", None)
    env.update({ENV: name, "LOCKSTEP_EXAMPLES": str(examples), "HYPOTHESIS_PROFILE": "ci"})
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_lockstep.py",
        "-k",
        "test_lockstep and memory",
        "-x",
        "-q",
        "-p",
        "model_tests.mutant_plugin",
        "-p",
        "no:cacheprovider",
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=LOCKSTEP_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        took = time.perf_counter() - t0
        return LockstepRun(name, "error", f"timed out after {LOCKSTEP_TIMEOUT:.0f} s", took)
    took = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    if f"{APPLIED_MARK}{name}" not in lines:
        tail = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        return LockstepRun(name, "error", f"mutant not confirmed applied: {tail}", took)
    if proc.returncode == 0:
        return LockstepRun(name, "survived", "", took)
    if proc.returncode == 1:
        return LockstepRun(name, "killed", _first_error(lines), took)
    tail = next((ln for ln in reversed(lines) if ln.strip()), "no output")
    return LockstepRun(name, "error", f"pytest exit code {proc.returncode}: {tail}", took)


def _first_error(lines: list[str]) -> str:
    """The failing test, the first assertion line, and the observation fields named in
    the diff that follows it (the lockstep harness prints one block per field)."""
    test = next((ln.split()[1] for ln in lines if ln.startswith("FAILED ")), "a test")
    test = test.rsplit("::", 1)[-1]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    if not errors:
        return f"{test} failed"
    fields = _fields([errors[0].rsplit(" ", 1)[-1], *errors[1:]])
    return f"{test}: {errors[0]}" + (f" [fields: {', '.join(fields)}]" if fields else "")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(MUTANTS), help="run one mutant")
    parser.add_argument(
        "--lockstep-examples",
        type=int,
        default=30,
        help="LOCKSTEP_EXAMPLES per merging mode for the lockstep run (0: skip it)",
    )
    args = parser.parse_args(argv)
    names = [args.only] if args.only else list(MUTANTS)
    t_start = time.perf_counter()
    problems: list[str] = []

    baseline = run_lockstep(NO_MUTANT, args.lockstep_examples)
    print(
        f"lockstep without a mutant: {baseline.status} ({baseline.seconds:.1f} s)"
        + (f": {baseline.first_line}" if baseline.first_line else ""),
        flush=True,
    )
    lockstep_counts = baseline.status == "survived"
    if baseline.status in ("killed", "error"):
        problems.append(f"the lockstep run fails without a mutant ({baseline.status})")

    rows: list[tuple[Mutant, CorpusRun, bool | None, LockstepRun]] = []
    own_kills = 0
    for name in names:
        mutant = MUTANTS[name]
        corpus = run_corpus(name)
        valid = None if corpus.case is None else passes_unmutated(case_path(corpus.case))
        own = run_own_case(name)
        own_kills += own.killed
        if not own.killed:
            problems.append(f"{name} survives its own case {mutant.case}")
        if lockstep_counts:
            lock = run_lockstep(name, args.lockstep_examples)
        else:
            why = "--lockstep-examples 0" if baseline.status == "not run" else "baseline failed"
            lock = LockstepRun(name, "not run", why, 0.0)
        rows.append((mutant, corpus, valid, lock))
        where = f"{corpus.case}@{corpus.step}" if corpus.killed else "SURVIVED"
        print(
            f"  {name}: own case {mutant.case} "
            f"{f'kills it at step {own.step}' if own.killed else 'LETS IT SURVIVE'}; "
            f"corpus {where} ({corpus.cases_run} cases, {corpus.seconds:.1f} s); "
            f"lockstep {lock.status} ({lock.seconds:.1f} s)",
            flush=True,
        )
        if not corpus.killed:
            problems.append(f"{name} survives the conformance corpus")
        elif not valid:
            problems.append(f"{name}: {corpus.case} fails without the mutant too: not a kill")
        if lock.status == "error":
            problems.append(f"{name}: the lockstep run did not complete ({lock.first_line})")

    print()
    header = (
        f"{'mutant':<22} {'mirrors':<40} {'killed by conformance (case@step)':<66} "
        f"{'lockstep':<9} {'seconds':>8}"
    )
    print(header)
    print("-" * len(header))
    for mutant, corpus, valid, lock in rows:
        if corpus.case is None:
            where = f"SURVIVED ({corpus.cases_run} cases)"
        elif not valid:
            where = f"NOT A KILL: {corpus.case}@{corpus.step} fails unmutated"
        else:
            where = f"{corpus.case}@{corpus.step}"
        lockstep = {"killed": "yes", "survived": "no"}.get(lock.status, lock.status)
        print(
            f"{mutant.name:<22} {_clip(mutant.mirrors, 40):<40} {where:<66} {lockstep:<9} "
            f"{corpus.seconds + lock.seconds:>8.1f}"
        )
    print()
    print("first difference (conformance) / first error line (lockstep):")
    for mutant, corpus, _valid, lock in rows:
        print(f"  {mutant.name}")
        if corpus.first_line:
            fields = f" [fields: {', '.join(corpus.fields)}]" if corpus.fields else ""
            print(f"    conformance: {_clip(corpus.first_line, 200)}{fields}")
        if lock.first_line:
            print(f"    lockstep ({lock.status}): {_clip(lock.first_line, 220)}")

    killed = [r for r in rows if r[1].killed and r[2]]
    both = [r for r in killed if r[3].status == "killed"]
    if lockstep_counts:
        scope = f"memory://, {args.lockstep_examples} examples per merging mode"
    else:
        scope = f"lockstep not counted: {baseline.status}"
    print()
    print(
        f"{len(killed)} of {len(rows)} mutants killed by the conformance corpus; "
        f"{len(both)} of them also by the lockstep tests ({scope}); "
        f"{own_kills} of {len(rows)} by their own case alone. "
        f"Total {time.perf_counter() - t_start:.1f} s."
    )
    for p in problems:
        print(f"FAILED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
