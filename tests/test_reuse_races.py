"""The reuse-after-a-decided-delete races real RocksDB backends keep hitting (BRIEF §10),
as named scenarios against the model, with fastimpl in lockstep.

Each ``test_<ticket>_*`` replays the ticket's interleaving as spec commands on the reference
model and on fastimpl at once (``tests.lockstep.LockstepHarness`` on ``memory://``: every
command is compared, and I1-I5 are checked on both after every command). The model must
refuse the reuse or keep the file alive; the test says which, and ends quiet without a leak.

Each ``test_<ticket>_buggy_rule_is_caught`` swaps the rule that prevents the race out of the
model (``monkeypatch``; nothing under ``refimpl/`` changes) and runs the same interleaving on
the model alone: I1 must then break, so the scenario exercises that rule. Where two rules
guard the same race, the bite removes both and the docstring says so.

What the tickets say:

* SPARK-55892, https://github.com/apache/spark/pull/54697 ("Fix unable to load state store
  because reused SST file was deleted by maintenance"): "When there is a large delay between
  when a snapshot was created and when it was uploaded by maintenance, it is possible for the
  files that were reused from old versions, which are now eligible for deletion by another
  executor's maintenance to be deleted"; loading the uploaded snapshot then fails with
  FileNotFoundException for the reused SST.
* SPARK-55820: its text is not available (no PR or JIRA text for the id). The scenario
  follows BRIEF §10 ("a stale in-memory version-to-files cache after a retried batch") and
  the earlier ticket of the same family, SPARK-43404,
  https://github.com/apache/spark/pull/41089: on a task retry the first attempt "might have
  added an entry to the in-memory map for ``versionToRocksDBFiles`` for the given version",
  and the retry reused what that map named.
* FLINK-38574: its text is not available either. The scenario follows BRIEF §10: "a late
  confirmation plus a re-upload let a checkpoint reuse a file the coordinator had deleted".

The same three races against the streaming job's own RocksDB snapshot code are in
``tests/test_stream_reuse_races.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import fsspec  # type: ignore[import-untyped]
import pytest
from attrs import evolve

from conformance.harness import ALL_MODES, KS, ONE, OP, Harness, InvariantBroken, S
from model_tests.targets import FastimplTarget
from model_tests.twins import no_last_used_advance
from refimpl.machine import _Work
from refimpl.state import BackendRef, Completed
from spec import commands as c
from spec.config import Config, MergingMode
from spec.handles import FileHandle, PlaceholderHandle, SegmentHandle, StateEntry, stream_of
from tests.lockstep import Backend, LockstepHarness

F = "sst-F"
"""The SST whose upload is reused after its delete was decided."""
G = "sst-G"
"""An SST that replaces F (RocksDB's compaction retired F)."""

_roots = itertools.count()
AckRule = Callable[[_Work, c.Acknowledge], None]


# ---------------------------------------------------------------------------- helpers


def config(mode: MergingMode) -> Config:
    """One retained checkpoint, so the next completion subsumes the one that holds F; a
    file size of one SST, so no other segment keeps F's file alive in a merging mode."""
    return Config.for_mode(mode, num_retained=1, max_file_size=100)


def lockstep(mode: MergingMode) -> LockstepHarness:
    backend = Backend("memory", fsspec.filesystem("memory"), f"/reuse-races-{next(_roots)}")
    return LockstepHarness(config(mode), ONE, backend, backend.new_root(), FastimplTarget)


def model(mode: MergingMode) -> Harness:
    return Harness(config(mode), ONE)


def snapshot(
    h: Harness,
    cp: int,
    *,
    write: tuple[str, ...] = (),
    reuse: tuple[str, ...] = (),
    attempt: str | None = None,
) -> None:
    """S's RocksDB snapshot for ``cp``: reuse, then upload SSTs, then its operator state."""
    for name in reuse:
        h.run(c.ReuseShared(cp, S, name, attempt))
    for name in write:
        h.run(c.WriteState(cp, S, KS, name, 100, attempt=attempt))
    h.run(c.WriteState(cp, S, OP, "offsets", 26, entries=2, attempt=attempt))


def retained(h: Harness, cp: int) -> Completed:
    found = [r for r in h.state.retained if r.id == cp]
    assert found, f"checkpoint {cp} is not retained: {[r.id for r in h.state.retained]}"
    return found[0]


def handle_of(entries: tuple[StateEntry, ...], name: str) -> SegmentHandle | FileHandle:
    found = [s for e in entries if e.name == name and (s := stream_of(e.handle)) is not None]
    assert len(found) == 1, (name, entries)
    return found[0]


def acked_handle(h: Harness, cp: int, name: str) -> SegmentHandle | FileHandle:
    """What S acknowledged for ``cp`` under ``name`` (the checkpoint may not be complete)."""
    return handle_of(
        tuple(e for (_t, s, k), es in h.state.acked.items() if s == S and k == cp for e in es),
        name,
    )


def intact(h: Harness, cp: int) -> None:
    files = h.observe().files
    for e in retained(h, cp).entries:
        s = stream_of(e.handle)
        assert s is not None and s.path in files, f"chk {cp}: {e.name} -> {s}"


def quiet(h: Harness) -> None:
    broken = h.quiesce()
    assert broken == [], h._report(broken)


def gone_placeholder_trusts_the_tm(orig: AckRule) -> AckRule:
    """R22 off: a placeholder whose registry entry is gone is not refused; the coordinator
    takes the file handle the TM remembers for that name instead."""

    def acknowledge(self: _Work, cmd: c.Acknowledge) -> None:
        tm = cmd.attempt or self.placement[cmd.subtask]
        key = (tm, cmd.subtask, cmd.checkpoint)
        out = []
        for e in self.outputs.get(key, ()):
            h = e.handle
            if isinstance(h, PlaceholderHandle) and h.logical_id not in self.registry:
                e = evolve(e, handle=self.backend[(tm, cmd.subtask, e.name)].entry.handle)
            out.append(e)
        if key in self.outputs:
            self.outputs[key] = tuple(out)
        orig(self, cmd)

    return acknowledge


def reuse_unconfirmed(orig: Callable[[_Work, str, BackendRef], bool]) -> Callable[..., bool]:
    """R20 off: what the TM uploaded counts as reusable before any checkpoint confirmed it."""

    def reusable(self: _Work, tm: str, ref: BackendRef) -> bool:
        return orig(self, tm, evolve(ref, confirmed=True))

    return reusable


def zombie_ack_accepted(orig: AckRule) -> AckRule:
    """R56 off: a lost attempt's acknowledgement of a pending checkpoint counts as the
    subtask's (the rest of the pending path as the model has it: R43 hand-over, R22)."""

    def acknowledge(self: _Work, cmd: c.Acknowledge) -> None:
        if cmd.attempt is None or cmd.checkpoint not in self.pending:
            orig(self, cmd)
            return
        # the writer's guards ran before: ``apply`` checks every command first
        key = (cmd.attempt, cmd.subtask, cmd.checkpoint)
        entries = tuple(self.outputs.pop(key, ()))
        self.acked[key] = entries
        p = self.pending[cmd.checkpoint]
        received = self._take_over_files(entries)
        self.pending[cmd.checkpoint] = evolve(
            p, acks=dict(p.acks) | {cmd.subtask: entries}, received=p.received | received
        )
        if not self._placeholders_resolve(entries):
            self.coordinator_abort(cmd.checkpoint)

    return acknowledge


def expect_i1(run: Callable[[], object]) -> str:
    with pytest.raises(InvariantBroken) as info:
        run()
    message = str(info.value)
    assert message.startswith("I1: "), message
    return message


# ---------------------------------------------------------------------------- FLINK-38574


def _38574_late_confirmation(h: Harness, order: str) -> tuple[str, str]:
    """Checkpoint 1 uploads F and completes, but its confirmation is still on its way to
    the TM. Not knowing 1 completed, the TM uploads F again for checkpoint 2 (the
    re-upload, R20) next to G; 2 completes and subsumes 1, which decides the delete of
    F's first upload. Then the confirmation of 1 arrives: ``late`` before that of 2,
    ``reordered`` after it. Checkpoint 3 reuses F. Returns the paths of F's two uploads."""
    h.run(c.Trigger())
    snapshot(h, 1, write=(F,))
    h.run(c.Acknowledge(1, S))
    h.run(c.Complete(1))  # complete(1) stays in the channel
    first = retained(h, 1)
    f1 = handle_of(first.entries, F).path
    h.run(c.Trigger())
    snapshot(h, 2, reuse=(F,), write=(G,))
    h.run(c.Acknowledge(2, S))
    f2 = acked_handle(h, 2, F).path
    assert f2 != f1, "checkpoint 2 reused F without knowing checkpoint 1 completed"
    h.run(c.Complete(2))  # subsumes 1: F's first upload is no longer referenced
    assert [n.checkpoint for n in h.state.channel] == [1, 2]
    if order == "late":
        h.run(c.DeliverNotification(0))  # complete(1), after the coordinator moved on
    else:
        h.run(c.DeliverNotification(1))  # complete(2) overtakes it
        h.run(c.DeliverNotification(0))
    h.run(c.Trigger())
    snapshot(h, 3, reuse=(F,))
    h.run(c.Acknowledge(3, S))
    if 3 in h.state.pending:
        h.run(c.Complete(3))
    return f1, f2


@pytest.mark.parametrize("order", ["late", "reordered"])
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_flink_38574_late_confirmation_never_revives_a_deleted_upload(
    mode: MergingMode, order: str
) -> None:
    """FLINK-38574: a late confirmation plus a re-upload let a checkpoint reuse a file the
    coordinator had deleted (BRIEF §10; the ticket's text was not found).

    Without merging the coordinator deletes F's first upload as soon as checkpoint 2
    subsumes 1 (R54). A confirmation of 1 that arrives after that (``late``) makes the
    TM's baseline that deleted upload again (R23 confirms what 1 acknowledged); the reuse
    in 3 is a placeholder the registry cannot resolve, so checkpoint 3 is aborted (R22),
    and the abort's confirmation of 2 (R32) repairs the baseline: checkpoint 4 reuses the
    re-upload. In the merging modes the TM owns F's segment and discards it only when
    the watermark passes its last use: the reuse in 3 advances that (R21), so F's first
    upload stays alive for checkpoint 3. When the confirmation of 1 comes after that of
    2 (``reordered``) it changes nothing (R34: handlers are monotonic; 2's confirmation
    forgot 1's acknowledgement) and 3 reuses the re-upload."""
    h = lockstep(mode)
    f1, f2 = _38574_late_confirmation(h, order)
    if mode is MergingMode.NONE and order == "late":
        assert 3 in h.state.aborted, "a placeholder to a deleted upload was accepted"
        assert f1 not in h.observe().files
        h.deliver_all()
        h.run(c.Trigger())
        snapshot(h, 4, reuse=(F,))
        h.run(c.Acknowledge(4, S))
        h.run(c.Complete(4))
        assert handle_of(retained(h, 4).entries, F).path == f2
        intact(h, 4)
    else:
        want = f1 if mode is not MergingMode.NONE and order == "late" else f2
        assert handle_of(retained(h, 3).entries, F).path == want
        intact(h, 3)
        h.deliver_all()
        intact(h, 3)
    quiet(h)


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_flink_38574_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule that keeps the late confirmation harmless, swapped out: without merging,
    an acknowledged placeholder whose registry entry is gone is resolved from the TM's own
    file handle instead of aborting the checkpoint (R22), and checkpoint 3 completes on
    F's deleted first upload; with merging, the reuse leaves F's last use
    where it was (R21), and the delivery of complete(2) discards the segment checkpoint
    3 completed on. Either way I1 breaks."""
    if mode is MergingMode.NONE:
        monkeypatch.setattr(_Work, "acknowledge", gone_placeholder_trusts_the_tm(_Work.acknowledge))
    else:
        monkeypatch.setattr(_Work, "reuse_shared", no_last_used_advance(_Work.reuse_shared))
    h = model(mode)

    def run() -> None:
        _38574_late_confirmation(h, "late")
        h.deliver_all()

    message = expect_i1(run)
    assert f"chk 3: {F} -> missing file" in message, message


# ---------------------------------------------------------------------------- SPARK-55892


def _55892_delayed_upload(h: Harness) -> tuple[str, str]:
    """S's TM (``tm-1``, the first executor) reused F for checkpoint 2; before that
    snapshot is acknowledged, the coordinator gives ``tm-1`` up (the partition moves to
    another executor) while ``tm-1`` still runs. The new TM restores S from checkpoint 1,
    whose F a compaction then retires: checkpoint 3 holds G only and subsumes 1, which
    decides F's delete. Then the first executor's delayed upload arrives: its
    acknowledgement of 2, and a snapshot of the next pending checkpoint (4) that reuses
    F again. Returns (the lost TM, F's path)."""
    h.run(c.Trigger())
    snapshot(h, 1, write=(F,))
    h.run(c.Acknowledge(1, S))
    h.run(c.Complete(1))
    h.deliver_all()
    f = handle_of(retained(h, 1).entries, F).path
    lost = h.tm_of(S)
    h.run(c.Trigger())
    snapshot(h, 2, reuse=(F,))  # the snapshot is made; its upload is delayed
    h.run(c.CrashTm(lost))
    h.run(c.Failover())
    h.run(c.Trigger())
    snapshot(h, 3, write=(G,))
    h.run(c.Acknowledge(3, S))
    h.run(c.Complete(3))
    h.deliver_all()
    h.run(c.Trigger())
    h.run(c.Acknowledge(2, S, lost))  # the delayed upload of the first executor
    snapshot(h, 4, reuse=(F,), attempt=lost)
    h.run(c.Acknowledge(4, S, lost))
    return lost, f


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_spark_55892_delayed_upload_never_completes_on_a_deleted_reuse(mode: MergingMode) -> None:
    """SPARK-55892 (https://github.com/apache/spark/pull/54697): a snapshot that reused F
    was uploaded long after it was made, by which time another executor's maintenance had
    deleted F; the uploaded snapshot could not be loaded.

    Here the delayed upload never becomes part of a checkpoint: the failover aborted
    checkpoint 2 (R60), and an acknowledgement from the replaced attempt is ignored (R56),
    for checkpoint 2 and for checkpoint 4 alike. The delete the new owner decided for F
    waits until the first executor is known to have stopped (R64), so its reads of F
    never fail either; checkpoint 4 completes on the new TM's own snapshot, without F."""
    h = lockstep(mode)
    lost, f = _55892_delayed_upload(h)
    assert 2 in h.state.aborted and 4 in h.state.pending
    assert S not in h.state.pending[4].acks, "the replaced attempt's acknowledgement counted"
    obs = h.observe()
    assert f in obs.files and f in obs.pending_deletes, "F's delete must wait for tm-1 (R64)"
    snapshot(h, 4, write=(G + "2",))
    h.run(c.Acknowledge(4, S))
    h.run(c.Complete(4))
    assert all(s.path != f for e in retained(h, 4).entries if (s := stream_of(e.handle)))
    intact(h, 4)
    h.run(c.AttemptStopped(lost))
    assert f not in h.observe().files
    intact(h, 4)
    quiet(h)


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_spark_55892_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R56 swapped out (the delayed upload of the replaced attempt counts for the pending
    checkpoint 4, which then completes on it) and, without merging, R22 too (alone, R56
    off still ends in checkpoint 4 aborted: the registry refuses the placeholder to F's
    dropped entry; the mutant resolves it from the TM's file handle instead). When the
    first executor stops, F's delete, decided when checkpoint 3 subsumed 1, runs under
    checkpoint 4: I1 breaks."""
    monkeypatch.setattr(_Work, "acknowledge", zombie_ack_accepted(_Work.acknowledge))
    if mode is MergingMode.NONE:
        alone = model(mode)  # R56 alone off: the registry refuses the placeholder (R22)
        _55892_delayed_upload(alone)
        assert 4 in alone.state.aborted
        monkeypatch.setattr(_Work, "acknowledge", gone_placeholder_trusts_the_tm(_Work.acknowledge))
    h = model(mode)
    lost, _f = _55892_delayed_upload(h)

    def run() -> None:
        h.run(c.Complete(4))
        h.run(c.AttemptStopped(lost))

    message = expect_i1(run)
    assert f"chk 4: {F} -> missing file" in message, message


# ---------------------------------------------------------------------------- SPARK-55820


def _55820_retried_batch(h: Harness, abort_heard: bool) -> tuple[str, str]:
    """Checkpoint 1 holds F. The batch of checkpoint 2 makes G, and S uploads it and
    acknowledges; the batch fails elsewhere and checkpoint 2 is aborted (``abort_heard``:
    the TM hears of it before the retry; otherwise only after the retry completed). The
    retried batch, checkpoint 3, reuses what the TM's memory names for that version: F
    and G. Returns the paths of F's upload and of G's upload for 2."""
    h.run(c.Trigger())
    snapshot(h, 1, write=(F,))
    h.run(c.Acknowledge(1, S))
    h.run(c.Complete(1))
    h.deliver_all()
    f = handle_of(retained(h, 1).entries, F).path
    h.run(c.Trigger())
    snapshot(h, 2, reuse=(F,), write=(G,))
    h.run(c.Acknowledge(2, S))
    g2 = acked_handle(h, 2, G).path
    h.run(c.Abort(2))
    if abort_heard:
        h.deliver_all()
    h.run(c.Trigger())
    snapshot(h, 3, reuse=(F, G))
    h.run(c.Acknowledge(3, S))
    if 3 in h.state.pending:
        h.run(c.Complete(3))
    h.deliver_all()
    return f, g2


@pytest.mark.parametrize("abort_heard", [True, False], ids=["abort-heard", "abort-late"])
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_spark_55820_retried_batch_uploads_what_the_aborted_one_wrote(
    mode: MergingMode, abort_heard: bool
) -> None:
    """SPARK-55820 (BRIEF §10; text not found, see the module docstring): after a retried
    batch, a stale in-memory version-to-files map still named the files of the failed
    attempt, and the retry reused them.

    The TM reuses only state a checkpoint it knows completed holds (R20): F (from 1) is
    reused, G (from the aborted 2) is uploaded again, whether the abort was heard before
    the retry or not. The aborted upload of G is deleted (R43 without merging, R32 with)
    and checkpoint 3 never names it."""
    h = lockstep(mode)
    f, g2 = _55820_retried_batch(h, abort_heard)
    third = retained(h, 3)
    assert handle_of(third.entries, F).path == f
    g3 = handle_of(third.entries, G).path
    assert g3 != g2 and g2 not in h.observe().files
    intact(h, 3)
    quiet(h)


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_spark_55820_buggy_rule_is_caught(
    mode: MergingMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R20 swapped out (the aborted attempt's upload of G counts as reusable, as the stale
    map had it), with the rule that would still save it: without merging R22 (the
    registry refuses a placeholder to the aborted upload; the mutant resolves it from the
    TM's handle instead), with merging R21 (the reuse does not advance G's last use, so the
    late abort of 2 discards it). With R20 alone off checkpoint 3 is refused (R22) or
    intact (R21); with both, checkpoint 3 completes on the deleted G: I1 breaks."""
    monkeypatch.setattr(_Work, "_reusable", reuse_unconfirmed(_Work._reusable))
    alone = model(mode)  # R20 alone off: the second rule still saves checkpoint 3
    _55820_retried_batch(alone, abort_heard=False)
    if mode is MergingMode.NONE:
        assert 3 in alone.state.aborted  # R22: refused
    else:
        intact(alone, 3)  # R21: G kept alive
    if mode is MergingMode.NONE:
        monkeypatch.setattr(_Work, "acknowledge", gone_placeholder_trusts_the_tm(_Work.acknowledge))
    else:
        monkeypatch.setattr(_Work, "reuse_shared", no_last_used_advance(_Work.reuse_shared))
    h = model(mode)
    message = expect_i1(lambda: _55820_retried_batch(h, abort_heard=False))
    assert f"chk 3: {G} -> missing file" in message, message
