"""Both implementations refuse exactly as ``spec/refusals.py`` says, in its order.

The order is data both execute: each implementation refuses through
``spec.refusals.check``, which walks a command's guards in the table's order over that
implementation's own predicate for each guard. So what is tested here is the predicates:

* each implementation's predicate table names exactly the guards of each command (the
  executor refuses a table that does not, so a guard cannot be left out);
* for every command and every guard of ``spec.refusals.GUARDS``, a scenario (commands run
  on both the reference model and fastimpl) ends in a probe command that fails that guard
  alone, in every merging mode: both must refuse it with the guard's ``Reason`` and
  change nothing, so each implementation's predicate for the guard is shown to fire. The
  probe without any violation must be accepted by both: that is what makes each refusal
  the guard's doing;
* every pair of guards i < j whose violations can be built together (and where guard j's
  violation does not need guard i to hold to mean anything) is violated at once, in one
  merging mode: both must answer with guard i's ``Reason``. The executor fixes the order;
  a pair shows that no predicate depends on a later guard and that nothing refuses
  before the executor runs.

fastimpl is driven only through ``model_tests.targets.FastimplTarget``, the adapter the
lockstep machine uses, so the test does not depend on the product's internals. The
model's own ``Harness.try_run`` checks that a refusal leaves its state the same object;
the product's observation must be equal before and after.

SPEC.md's refusal table must be the one generated from the data
(``python -m model_tests.refusal_table --write``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest
from attrs import frozen

from conformance.harness import DEFAULT_JOB, KS, OP, Harness, merging
from fastimpl import MetadataError
from model_tests import refusal_table
from model_tests.targets import FastimplTarget
from refimpl import guard_checks
from spec import commands as c
from spec import refusals as r
from spec.config import Config, MergingMode, RestoreMode
from spec.errors import CommandError, Reason
from spec.ids import SubtaskId, TmId

GHOST_SUBTASK = SubtaskId("ghost", 0, 1)
GHOST_TM = "tm-99"
NEVER_TRIGGERED = 99
_roots = itertools.count()


@frozen
class Violation:
    """How to fail one guard: commands to run before the probe, and fields of the probe
    to change. ``needs``: guards that must hold for this violation to be one at all (a
    subtask's TM cannot be lost if the subtask does not exist); pairs with them are not
    built."""

    before: tuple[c.Command, ...] = ()
    fields: Mapping[str, Any] = attrs.field(factory=dict)
    needs: frozenset[str] = frozenset()
    edit_setup: Callable[[list[c.Command]], list[c.Command]] | None = None
    """Changes the scenario's setup itself (leaves a command out)."""


@frozen
class Scenario:
    """The commands that bring both implementations to a state where ``probe`` is
    accepted, and a violation for every guard of the probe's command."""

    setup: tuple[c.Command, ...]
    probe: c.Command
    violations: Mapping[str, Violation]


@frozen
class Roles:
    """Who is who in the default job, read off a fresh model (the product places
    subtasks the same way: lockstep checks it)."""

    subtask: SubtaskId
    host: TmId
    other: TmId
    """A live TM that does not host ``subtask``."""


def _roles() -> Roles:
    h = Harness(Config(), DEFAULT_JOB)
    s = h.subtasks[0]
    host = h.tm_of(s)
    other = next(t for t in h.live_tms() if t != host)
    return Roles(s, host, other)


def _checkpoint(subtasks: list[SubtaskId], checkpoint: int) -> list[c.Command]:
    """Trigger ``checkpoint``; every subtask writes shared and operator state and
    acknowledges."""
    out: list[c.Command] = [c.Trigger()]
    for s in subtasks:
        out.append(c.WriteState(checkpoint, s, KS, "sst-1", 100))
        out.append(c.WriteState(checkpoint, s, OP, "offsets", 26, entries=2))
        out.append(c.Acknowledge(checkpoint, s))
    return out


def _completed_first() -> list[c.Command]:
    """Checkpoint 1 completed, its notifications still in flight (``DELIVER_ALL``
    delivers them)."""
    h = Harness(Config(), DEFAULT_JOB)
    return [*_checkpoint(h.subtasks, 1), c.Complete(1)]


DELIVER_ALL = c.DeliverNotification(-1)
"""A setup marker: deliver every notification in flight, oldest first."""
CANCEL = c.Cancel(retain=True)


def _writer_violations(roles: Roles, *, attempt: bool) -> dict[str, Violation]:
    """Violations of the writer guards (``spec.refusals._WRITER``): the probe writes for
    checkpoint 2 (pending) for ``roles.subtask`` from its host, after checkpoint 1
    completed and every TM learned it."""
    s, host, other = roles.subtask, roles.host, roles.other
    v = {
        "running": Violation(before=(CANCEL,)),
        "subtask_known": Violation(fields={"subtask": GHOST_SUBTASK}),
        "checkpoint_triggered": Violation(fields={"checkpoint": NEVER_TRIGGERED}),
        "host_alive": Violation(
            before=(c.CrashTm(host),),
            fields={"attempt": None} if attempt else {},
            needs=frozenset({"subtask_known"}),
        ),
        "not_finished_for_tm": Violation(
            fields={"checkpoint": 1},
            needs=frozenset({"subtask_known"} | ({"writer_known"} if attempt else set())),
        ),
        # The probe's checkpoint is then the acknowledged one, and its TM the one that
        # acknowledged: another checkpoint, subtask or attempt is not a repeat.
        "not_acknowledged": Violation(
            before=(c.Acknowledge(2, s),),
            needs=frozenset({"subtask_known", "checkpoint_triggered", "not_finished_for_tm"})
            | ({"writer_known", "attempt_hosted"} if attempt else set()),
        ),
    }
    if attempt:
        v["writer_known"] = Violation(fields={"attempt": GHOST_TM})
        v["attempt_lost"] = Violation(fields={"attempt": host})
        v["attempt_hosted"] = Violation(before=(c.CrashTm(other),), fields={"attempt": other})
    return v


def _database_violations(roles: Roles) -> dict[str, Violation]:
    """The writer's violations without the checkpoint's (``spec.refusals._DATABASE``)."""
    v = _writer_violations(roles, attempt=True)
    for name in ("checkpoint_triggered", "not_finished_for_tm", "not_acknowledged"):
        del v[name]
    return v


def _working_file(setup: tuple[c.Command, ...], subtask: SubtaskId) -> str:
    """The working file ``subtask``'s database uses after ``setup`` (names are the
    model's, R2: the product names them alike, lockstep checks it)."""
    h = Harness(Config(), DEFAULT_JOB)
    for cmd in setup:
        if cmd == DELIVER_ALL:
            h.deliver_all()
        else:
            h.run(cmd)
    (path,) = h.state.dbs[(h.tm_of(subtask), subtask)]
    return path


@functools.cache
def scenarios() -> dict[type[c.Command], Scenario]:
    roles = _roles()
    s, host = roles.subtask, roles.host
    subtasks = Harness(Config(), DEFAULT_JOB).subtasks
    first = (*_completed_first(), DELIVER_ALL)
    pending = (*first, c.Trigger())
    writer = _writer_violations(roles, attempt=True)
    host_writer = _writer_violations(roles, attempt=False)
    running = {"running": Violation(before=(CANCEL,))}
    in_use = (c.WriteWorking(s, 40), *first)  # its name is the first (R2), in every mode
    used = _working_file(in_use, s)
    return {
        c.Trigger: Scenario(first, c.Trigger(), running),
        c.WriteState: Scenario(pending, c.WriteState(2, s, KS, "sst-2", 40), writer),
        c.ReuseShared: Scenario(
            pending,
            c.ReuseShared(2, s, "sst-1"),
            writer
            | {
                "state_exists": Violation(
                    fields={"name": "never-written"}, needs=frozenset({"subtask_known"})
                )
            },
        ),
        c.Acknowledge: Scenario(pending, c.Acknowledge(2, s), writer),
        c.Decline: Scenario(pending, c.Decline(2, s), host_writer),
        c.Complete: Scenario(
            (*first, *_checkpoint(subtasks, 2)),
            c.Complete(2),
            {
                "running": Violation(before=(CANCEL,)),
                "checkpoint_triggered": Violation(fields={"checkpoint": NEVER_TRIGGERED}),
                "checkpoint_pending": Violation(fields={"checkpoint": 1}),
                "all_acknowledged": Violation(
                    edit_setup=_drop_last_ack,
                    needs=frozenset({"checkpoint_triggered", "checkpoint_pending"}),
                ),
            },
        ),
        c.Abort: Scenario(
            pending,
            c.Abort(2),
            {
                "running": Violation(before=(CANCEL,)),
                "checkpoint_triggered": Violation(fields={"checkpoint": NEVER_TRIGGERED}),
                "checkpoint_pending": Violation(fields={"checkpoint": 1}),
            },
        ),
        c.DeliverNotification: _notification_scenario(c.DeliverNotification(0)),
        c.DropNotification: _notification_scenario(c.DropNotification(0)),
        c.DuplicateNotification: _notification_scenario(c.DuplicateNotification(0)),
        c.CrashTm: Scenario(
            first,
            c.CrashTm(host),
            {
                "running": Violation(before=(CANCEL,)),
                "tm_known": Violation(fields={"tm": GHOST_TM}),
                "tm_alive_in_job": Violation(
                    before=(c.CrashTm(host),), needs=frozenset({"tm_known"})
                ),
            },
        ),
        c.ReplaceTm: Scenario(
            pending,
            c.ReplaceTm(host),
            {
                "running": Violation(before=(CANCEL,)),
                "tm_known": Violation(fields={"tm": GHOST_TM}),
                "tm_alive_in_job": Violation(
                    before=(c.ReplaceTm(host),), needs=frozenset({"tm_known"})
                ),
            },
        ),
        c.AttemptStopped: Scenario(
            (*first, c.CrashTm(host)),
            c.AttemptStopped(host),
            {
                "tm_known": Violation(fields={"tm": GHOST_TM}),
                # A stopped TM is not lost any more.
                "tm_lost": Violation(
                    before=(c.AttemptStopped(host),), needs=frozenset({"tm_known"})
                ),
            },
        ),
        c.CrashDuringWrite: Scenario(
            pending,
            c.CrashDuringWrite(2, s, KS, "sst-2", 40, 15),
            host_writer | {"partial_write": Violation(fields={"written": 0})},
        ),
        c.Failover: Scenario(first, c.Failover(), running),
        c.RestartCoordinator: Scenario(
            first,
            c.RestartCoordinator(),
            running | {"none_lost": Violation(before=(c.CrashTm(host),))},
        ),
        c.Restore: Scenario(
            first,
            c.Restore(1, (("src", 1),)),
            {
                "source_retained": Violation(fields={"checkpoint": NEVER_TRIGGERED}),
                "parallelism_valid": Violation(fields={"parallelism": (("src", 0),)}),
                "max_parallelism_same": Violation(fields={"max_parallelism": 64}),
            },
        ),
        c.FailNextCall: Scenario(first, c.FailNextCall(c.StorageOp.DELETE), {}),
        c.RetryDeletes: Scenario(first, c.RetryDeletes(), {}),
        c.Cancel: Scenario(first, c.Cancel(), running),
        c.WriteWorking: Scenario(
            first,
            c.WriteWorking(s, 40),
            _database_violations(roles) | {"working_bytes": Violation(fields={"size": 0})},
        ),
        c.DropWorking: Scenario(
            in_use,
            c.DropWorking(s, used),
            _database_violations(roles)
            | {
                "database_uses": Violation(
                    fields={"path": f"{used}-never"}, needs=frozenset({"subtask_known"})
                )
            },
        ),
        c.SnapshotWorking: Scenario((*in_use, c.Trigger()), c.SnapshotWorking(2, s, 10), writer),
        c.CollectWorking: Scenario(first, c.CollectWorking(), running),
    }


def _drop_last_ack(setup: list[c.Command]) -> list[c.Command]:
    """The last subtask writes for the checkpoint but does not acknowledge it."""
    last = max(i for i, cmd in enumerate(setup) if isinstance(cmd, c.Acknowledge))
    return setup[:last] + setup[last + 1 :]


def _notification_scenario(probe: c.Command) -> Scenario:
    """Checkpoint 1 completed, its notifications still in flight."""
    return Scenario(
        tuple(_completed_first()),
        probe,
        {"notification_exists": Violation(fields={"index": 5})},
    )


# ---------------------------------------------------------------------------- building cases


@frozen
class Case:
    command: type[c.Command]
    violated: tuple[str, ...]
    """Guard names, in the command's guard order; empty: the probe must be accepted."""
    expected: Reason | None


def _position(command: type[c.Command]) -> dict[str, int]:
    return {g.name: i for i, g in enumerate(r.GUARDS[command])}


def _compatible(a: Violation, b: Violation) -> bool:
    return all(b.fields.get(k, v) == v for k, v in a.fields.items())


def cases() -> Iterator[Case]:
    for command, sc in scenarios().items():
        yield Case(command, (), None)
        order = _position(command)
        for g in r.GUARDS[command]:
            yield Case(command, (g.name,), g.reason)
        for first, second in itertools.combinations(r.GUARDS[command], 2):
            a, b = sc.violations[first.name], sc.violations[second.name]
            if first.name in b.needs or not _compatible(a, b):
                continue
            assert order[first.name] < order[second.name]
            yield Case(command, (first.name, second.name), first.reason)


def build(sc: Scenario, violated: tuple[str, ...]) -> tuple[list[c.Command], c.Command]:
    """The setup and probe failing exactly the ``violated`` guards. Commands a violation
    adds run after the setup, the later guard's first: an earlier guard's violation (the
    job ended, a TM lost) would otherwise refuse the commands that set up a later one."""
    setup = list(sc.setup)
    fields: dict[str, Any] = {}
    for name in violated:
        fields |= sc.violations[name].fields
    for name in violated:
        edit = sc.violations[name].edit_setup
        if edit is not None:
            setup = edit(setup)
    for name in reversed(violated):
        setup += sc.violations[name].before
    return setup, attrs.evolve(sc.probe, **fields)


# ---------------------------------------------------------------------------- running cases


class Both:
    """The model (through ``Harness``) and fastimpl (through ``FastimplTarget``) on a
    fresh root of ``fs`` (``memory://`` unless given), fed the same commands."""

    def __init__(self, config: Config, fs: Any = None, base: str = "") -> None:
        self.model = Harness(config, DEFAULT_JOB)
        self.fs = fs if fs is not None else fsspec.filesystem("memory")
        self.root = f"{base}/refusals-{next(_roots)}"
        self.fs.makedirs(self.root, exist_ok=True)
        self.product = FastimplTarget(config, DEFAULT_JOB, self.fs, self.root)

    def setup(self, cmd: c.Command) -> None:
        if cmd == DELIVER_ALL:
            while self.model.state.channel:
                self.setup(c.DeliverNotification(0))
            return
        self.model.run(cmd)
        self.product.apply(cmd)

    def close(self) -> None:
        self.product.close()
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


def outcome(run: Callable[[], object]) -> Reason | None:
    try:
        run()
    except CommandError as err:
        return err.reason
    return None


def check(config: Config, case: Case, fs: Any = None, base: str = "") -> list[str]:
    """What is wrong with either implementation on one case (empty: both are right)."""
    setup, probe = build(scenarios()[case.command], case.violated)
    both = Both(config, fs, base)
    try:
        for cmd in setup:
            both.setup(cmd)
        model_before = both.model.state
        product_before = both.product.observe()
        model_got = outcome(lambda: both.model.run(probe))
        product_got = outcome(lambda: both.product.apply(probe))
        wrong = []
        label = f"{probe!r} violating {list(case.violated)}"
        for who, got in (("refimpl", model_got), ("fastimpl", product_got)):
            if got is not case.expected:
                wrong.append(f"{who}: {label}: expected {case.expected}, got {got}")
        if case.expected is not None:
            if model_got is not None and both.model.state is not model_before:
                wrong.append(f"refimpl: {label}: the refusal changed the state")
            if product_got is not None and both.product.observe() != product_before:
                wrong.append(f"fastimpl: {label}: the refusal changed the observation")
        return wrong
    finally:
        both.close()


CASES = list(cases())


def _case_id(case: Case) -> str:
    return f"{case.command.__name__}-{'+'.join(case.violated) or 'accepted'}"


# ---------------------------------------------------------------------------- tests


def test_every_command_has_its_guards_and_every_guard_a_violation() -> None:
    assert set(r.GUARDS) == set(r.COMMANDS)
    for command, sc in scenarios().items():
        names = [g.name for g in r.GUARDS[command]]
        assert len(names) == len(set(names)), command
        assert set(sc.violations) == set(names), command
        assert type(sc.probe) is command
        for v in sc.violations.values():
            assert v.needs <= set(names), (command, v.needs)


def test_pairs_cover_every_guard_but_the_first() -> None:
    """Each guard after the first is violated together with some earlier guard, so
    each one's place in the order is checked, not only its reason; the exception is a
    guard that cannot fail unless every earlier one holds (a TM that does not exist is
    neither lost nor not lost)."""
    paired = {(case.command, case.violated[1]) for case in CASES if len(case.violated) == 2}
    unpaired = []
    for command, guards in r.GUARDS.items():
        violations = scenarios()[command].violations
        for i, g in enumerate(guards[1:], start=1):
            if {e.name for e in guards[:i]} <= violations[g.name].needs:
                unpaired.append(f"{command.__name__}.{g.name}")
                continue
            assert (command, g.name) in paired, (command.__name__, g.name)
    assert unpaired == ["AttemptStopped.tm_lost"]


SINGLES = [k for k in CASES if len(k.violated) < 2]
PAIRS = [k for k in CASES if len(k.violated) == 2]
MODES = list(MergingMode)
PAIR_MODE = MergingMode.ACROSS_CHECKPOINT
"""The one mode the pairs run in (the order is the table's, the same in every mode):
merging across checkpoints, where a writer's records hold the most (pooled files)."""


@pytest.mark.parametrize("command", r.COMMANDS, ids=lambda k: k.__name__)
def test_each_implementation_has_a_predicate_for_exactly_the_commands_guards(
    command: type[c.Command],
) -> None:
    """Each implementation's predicate table for the command names its guards, no more
    and no fewer: the executor would refuse it otherwise, before any predicate runs."""
    probe = scenarios()[command].probe
    names = {g.name for g in r.GUARDS[command]}
    both = Both(merging(PAIR_MODE))
    try:
        assert set(guard_checks(both.model.state, probe)) == names
        assert set(both.product.guard_checks(probe)) == names
    finally:
        both.close()


def test_the_executor_refuses_a_table_that_misses_or_adds_a_guard() -> None:
    """A guard left out, or a name not among the command's guards, is an error: never a
    guard silently skipped."""
    probe = scenarios()[c.Complete].probe
    state = Harness(Config(), DEFAULT_JOB).state
    table = dict(guard_checks(state, probe))
    del table["all_acknowledged"]
    with pytest.raises(r.GuardTableError, match="all_acknowledged"):
        r.check(probe, table)
    with pytest.raises(r.GuardTableError, match="tm_lost"):
        r.check(probe, dict(guard_checks(state, probe)) | {"tm_lost": lambda: None})


def _rotated(cases: list[Case]) -> list[tuple[MergingMode, Case]]:
    """Each case in one merging mode, the modes taken in turn: every mode runs a share of
    the cases, and no case runs three times for what does not depend on the mode."""
    return [(MODES[i % len(MODES)], k) for i, k in enumerate(cases)]


def _mode_case_id(pair: tuple[MergingMode, Case]) -> str:
    return f"{pair[0].name}-{_case_id(pair[1])}"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("case", SINGLES, ids=_case_id)
def test_both_implementations_refuse_each_guard_as_the_spec_says(
    mode: MergingMode, case: Case
) -> None:
    """One guard violated (or none), in every merging mode: the guard's ``Reason``, and
    nothing changed."""
    assert check(merging(mode), case) == []


@pytest.mark.parametrize("case", PAIRS, ids=_case_id)
def test_both_implementations_check_the_guards_in_the_spec_order(case: Case) -> None:
    """Two guards violated at once: the earlier one's ``Reason``. Both implementations
    run the table's order (``spec.refusals.check``), the same in every mode, so the pairs
    run in one mode: they show that no predicate relies on a later guard."""
    assert check(merging(PAIR_MODE), case) == []


@pytest.mark.parametrize("pair", _rotated(SINGLES), ids=_mode_case_id)
def test_on_a_local_disk_a_refusal_touches_no_file(
    pair: tuple[MergingMode, Case], tmp_path: Path
) -> None:
    """The same on real files (fastimpl's observation lists them): a refused command
    creates, writes and deletes nothing on disk; each case in one mode, the modes in turn
    (in memory every case runs in every mode)."""
    mode, case = pair
    assert check(merging(mode), case, fsspec.filesystem("file"), str(tmp_path)) == []


def test_the_check_catches_a_wrong_reason_and_a_wrong_order() -> None:
    """The comparison is not vacuous: a spec that swapped two guards, or gave a guard
    another reason, would be contradicted by both implementations."""
    case = next(k for k in CASES if k.violated == ("running", "subtask_known"))
    swapped = attrs.evolve(case, expected=Reason.UNKNOWN_SUBTASK)
    wrong = check(Config(), swapped)
    assert len(wrong) == 2 and all("got Reason.JOB_NOT_RUNNING" in w for w in wrong)


def test_spec_md_refusal_table_is_generated_from_the_data() -> None:
    text = refusal_table.SPEC.read_text()
    assert not refusal_table.stale(text), "run `python -m model_tests.refusal_table --write`"
    for command, guards in r.GUARDS.items():
        for g in guards:
            assert f"| `{command.__name__}` | " in text and f"`{g.reason.name}`" in text


@pytest.mark.parametrize("mode", [RestoreMode.CLAIM, RestoreMode.NO_CLAIM], ids=lambda m: m.name)
@pytest.mark.parametrize("violated", ["parallelism_valid", "max_parallelism_same"])
def test_fastimpl_reads_the_restored_metadata_before_the_restore_arguments(
    mode: RestoreMode, violated: str
) -> None:
    """What SPEC.md says of errors outside the table: a damaged ``_metadata`` is found
    before the arguments are checked, and the restore changes nothing."""
    sc = scenarios()[c.Restore]
    setup, probe = build(sc, (violated,))
    assert isinstance(probe, c.Restore)
    both = Both(Config())
    try:
        for cmd in setup:
            both.setup(cmd)
        metadata = f"{both.root}/{both.model.state.retained[-1].metadata}"
        both.fs.pipe(metadata, b"{not json")
        before = both.product.observe()
        with pytest.raises(MetadataError, match="_metadata"):
            both.product.apply(attrs.evolve(probe, mode=mode))
        assert both.product.observe() == before
        # The model has no bad storage: it refuses by the table.
        expected = next(g.reason for g in r.GUARDS[c.Restore] if g.name == violated)
        assert outcome(lambda: both.model.run(probe)) is expected
    finally:
        both.close()
