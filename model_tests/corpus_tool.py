"""Build and check the conformance corpus (``conformance/corpus/*.json``).

    python -m model_tests.corpus_tool record    # cases from the rule tests
    python -m model_tests.corpus_tool random N  # N generated random cases
    python -m model_tests.corpus_tool regen     # recompute every expectation
    python -m model_tests.corpus_tool check     # exit 1 on any problem

``record`` runs the hand-written rule and bug tests (``test_rules_*.py``,
``test_flink_bugs.py``, ``test_invariants.py``) under pytest with the model's ``Harness``
watched: every command sequence a test drives through a harness becomes a case named
after the test (``test_r12_bytes_durable_before_handle`` -> ``r12-bytes-durable-...``)
that pins the rule, invariant or Flink bug the test is named for. A test that edits the
model's state by hand between commands cannot be replayed from commands alone and gives
no case. ``random`` records the sequences that the model's random state machine
(``conformance.machine.RefimplMachine``, derandomized) drives, in every merging mode.

Expectations always come from the model (``runner.expected_steps``), never from the test
that produced the sequence: a test monkeypatched with a buggy rule (the Flink bug twins)
gives its sequence, and the correct model says what must happen on it.

``check`` validates every file against ``schema.json``, decodes it, checks that names are
unique and short, that stored expectations equal the model's (else: run ``regen``), and
that every rule and invariant of SPEC.md and every Flink bug of the brief has a case.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from conformance.case import (
    CORPUS,
    GZIP_PREFIX,
    NAME,
    Case,
    CaseError,
    case_name,
    corpus_files,
    from_json,
    load,
    read_json,
    schema,
    write_case,
)
from conformance.harness import DEFAULT_JOB, KS, Harness
from conformance.runner import expected_steps, recomputed
from model_tests import traceability
from spec import commands as c
from spec.commands import Command
from spec.config import Config, JobSpec, MergingMode, RestoreMode, VertexSpec

ROOT = Path(__file__).resolve().parents[1]
RULE_TESTS = (
    "tests/test_rules_layout_segments.py",
    "tests/test_rules_reuse_notifications.py",
    "tests/test_rules_ownership_failover.py",
    "tests/test_rules_coordinator_restore.py",
    "tests/test_rules_working_state.py",
    "tests/test_flink_bugs.py",
    "tests/test_invariants.py",
)
FLINK_BUGS = (
    "FLINK-25395",
    "FLINK-26985",
    "FLINK-29913",
    "FLINK-32086",
    "FLINK-35400",
    "FLINK-35570",
    "FLINK-35778",
    "FLINK-35784",
    "FLINK-35803",
    "FLINK-36125",
    "FLINK-38347",
)
"""The Flink bugs of ../shared/BRIEF.md section 6; a clone without the brief beside it
checks these, and one with it checks these and whatever the brief adds (``flink_bugs``)."""
PER_TEST = 1
"""Sequences kept per test node (a Hypothesis-driven test drives many)."""
MAX_STEPS = 150


# ------------------------------------------------------------------ recording harnesses


class _Tape:
    def __init__(self, config: Config, job: JobSpec) -> None:
        self.config = config
        self.job = job
        self.commands: list[Command] = []
        self.last_state: object = None
        self.tainted = False


class Recorder:
    """Watches every ``Harness`` while tests run; ``tapes[test id]`` holds what each
    harness of that test was driven through."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.tapes: dict[str, list[_Tape]] = defaultdict(list)
        self._by_harness: dict[int, _Tape] = {}

    @contextmanager
    def watching(self) -> Iterator[None]:
        rec = self
        init, run = Harness.__init__, Harness.run

        def patched_init(self: Harness, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if rec.test is None:
                return
            st = self.state
            tape = _Tape(st.config, JobSpec(st.vertices, st.num_tms))
            tape.tainted = kwargs.get("state") is not None
            tape.last_state = st
            rec._by_harness[id(self)] = tape
            rec.tapes[rec.test].append(tape)

        def patched_run(self: Harness, cmd: Command) -> Any:
            tape = rec._by_harness.get(id(self))
            if tape is not None and self.state is not tape.last_state:
                tape.tainted = True  # the test edited the state by hand
            try:
                return run(self, cmd)
            finally:
                if tape is not None:
                    tape.commands.append(cmd)
                    tape.last_state = self.state

        Harness.__init__ = patched_init  # type: ignore[method-assign]
        Harness.run = patched_run  # type: ignore[method-assign]
        try:
            yield
        finally:
            Harness.__init__ = init  # type: ignore[method-assign]
            Harness.run = run  # type: ignore[method-assign]

    # pytest hooks
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        self.test = item.nodeid
        try:
            return (yield)
        finally:
            self.test = None
            self._by_harness.clear()


def _short(nodeid: str) -> str:
    func = nodeid.split("::")[-1]
    base, _, param = func.partition("[")
    name = base.removeprefix("test_").replace("_", "-").lower()
    if param:
        p = re.sub(r"[^a-z0-9]+", "-", param.rstrip("]").lower()).strip("-")
        p = re.sub(r"(^|-)model(?=-|$)", "", p)  # the impl fixture's id: tapes are the model's
        p = p.replace("checkpoint", "").replace("--", "-").strip("-")
        name = f"{name}-{p}" if p else name
    return name


def rules_of(nodeid: str) -> tuple[str, ...]:
    func = nodeid.split("::")[-1].removeprefix("test_")
    m = re.match(r"(r|i)(\d+)_", func)
    if m:
        return (f"{m.group(1).upper()}{m.group(2)}",)
    m = re.match(r"flink_(\d+)", func)
    if m:
        return (f"FLINK-{m.group(1)}",)
    return ()


def _fit(name: str, taken: set[str]) -> str:
    name = re.sub(r"-+", "-", name).strip("-")[:60].rstrip("-")
    out, n = name, 2
    while out in taken:
        out = f"{name[:57].rstrip('-')}-{n}"
        n += 1
    taken.add(out)
    return out


_SHORT_MODE = {
    MergingMode.NONE: "none",
    MergingMode.WITHIN_CHECKPOINT: "within",
    MergingMode.ACROSS_CHECKPOINT: "across",
}
"""The merging mode in case names."""


def _case(name: str, rules: tuple[str, ...], desc: str, source: str, tape: _Tape) -> Case:
    steps = expected_steps(tape.config, tape.job, tape.commands[:MAX_STEPS])
    return Case(name, rules, desc, source, tape.config, tape.job, steps)


# Hand-written sequences for what the rule tests check on observations or states built by
# hand (the invariant predicates' own tests, odd TM ids), so that a case pins it too.


def _dup_notices_delete_once(h: Harness) -> None:
    for _ in range(3):
        cp = h.checkpoint(deliver=False)
        h.run(c.DuplicateNotification(0))
        h.run(c.DuplicateNotification(len(h.state.channel) - 1))
        del cp
        h.deliver_all()


def _handover_at_acknowledge(h: Harness) -> None:
    h.run(c.Trigger())
    for s in h.subtasks:
        h.run(c.WriteState(1, s, KS, "sst-1", 60))
    for s in h.subtasks:
        h.run(c.Acknowledge(1, s))
    h.run(c.Complete(1))
    h.deliver_all()
    h.checkpoint(reuse=("sst-1",), shared=())


def _counts_follow_reuse(h: Harness) -> None:
    h.checkpoint(shared=("sst-1", "sst-2"))
    h.checkpoint(reuse=("sst-1",), shared=("sst-3",))
    h.checkpoint(reuse=("sst-1", "sst-3"), shared=())
    h.checkpoint(shared=("sst-4",))


def _no_claim_never_deletes_the_source(h: Harness) -> None:
    h.checkpoint(shared=("sst-1",))
    h.checkpoint(reuse=("sst-1",), shared=("sst-2",))
    h.run(c.Restore(2, mode=RestoreMode.NO_CLAIM))
    for _ in range(3):
        h.checkpoint(shared=("sst-9",))


def _reuse_then_end_before_acknowledging(h: Harness) -> None:
    h.checkpoint(shared=("sst-1",))

    def reuse_only() -> int:
        h.run(c.Trigger())
        cp = h.last_checkpoint
        for s in h.subtasks:
            h.run(c.ReuseShared(cp, s, "sst-1"))
        return cp

    h.run(c.Abort(reuse_only()))
    h.deliver_all()
    h.run(c.Decline(reuse_only(), h.subtasks[0]))
    h.deliver_all()
    reuse_only()
    h.run(c.Failover())
    h.deliver_all()
    h.checkpoint(reuse=("sst-1",), shared=())
    h.checkpoint(shared=("sst-2",))


def _odd_vertex_names(h: Harness) -> None:
    h.checkpoint()
    h.checkpoint(reuse=("sst-1",), shared=("sst-2",))
    h.run(c.Failover())
    h.deliver_all()
    h.checkpoint(reuse=("sst-1",), shared=())


ODD_JOB = JobSpec(
    (
        VertexSpec("Source: Kafka[topic=a/b]", 2),
        VertexSpec("a/b", 1),
        VertexSpec("a:b", 1),
        VertexSpec("..", 1),
    ),
    num_tms=2,
)
HAND: tuple[tuple[str, tuple[str, ...], str, Any, JobSpec], ...] = (
    (
        "i2-duplicated-notices-delete-each-file-once",
        ("I2", "R34"),
        "Every completion notice is delivered three times: each subsumed file is deleted once.",
        _dup_notices_delete_once,
        DEFAULT_JOB,
    ),
    (
        "i3-ownership-handed-over-at-acknowledge",
        ("I3", "R40"),
        "Files written for a checkpoint belong to the writing TM until acknowledged, then "
        "to the owner the mode gives them; never to two parties.",
        _handover_at_acknowledge,
        DEFAULT_JOB,
    ),
    (
        "i4-ref-counts-follow-reuse-and-subsume",
        ("I4", "R21", "R30"),
        "Shared state reused over several checkpoints: ref counts and registry references "
        "follow exactly the retained checkpoints that use each file.",
        _counts_follow_reuse,
        DEFAULT_JOB,
    ),
    (
        "i5-no-claim-restore-never-deletes-the-source",
        ("I5", "R72"),
        "A job restored in NO_CLAIM mode subsumes its own checkpoints but never deletes a "
        "file of the checkpoint it restored from.",
        _no_claim_never_deletes_the_source,
        DEFAULT_JOB,
    ),
    (
        "r32-reused-segment-survives-its-checkpoint-ending-unacked",
        ("R32", "R21", "R62"),
        "Shared state reused for a checkpoint that is aborted, declined or cut short by a "
        "failover before the subtask acknowledged: the reused segment belongs to an older "
        "checkpoint and stays until that one is subsumed.",
        _reuse_then_end_before_acknowledging,
        DEFAULT_JOB,
    ),
    (
        "flink-35778-odd-vertex-names-stay-in-safe-paths",
        ("FLINK-35778", "R3"),
        "Vertex names with '/', ':', '[' and '..' reach no path unescaped and never share a "
        "directory; failover keeps every retained file.",
        _odd_vertex_names,
        ODD_JOB,
    ),
)


def hand_cases() -> list[Case]:
    out = []
    for mode in MergingMode:
        for name, rules, desc, build, job in HAND:
            h = Harness(Config.for_mode(mode), job)
            build(h)
            short = _SHORT_MODE[mode]
            tape = _Tape(h.state.config, job)
            tape.commands = list(h.history)
            out.append(_case(f"{name}-{short}", rules, desc, f"corpus_tool.{build.__name__}", tape))
    return out


def record(files: tuple[str, ...] = RULE_TESTS) -> list[Case]:
    rec = Recorder()
    with rec.watching():
        code = pytest.main(
            ["-q", "-p", "no:cacheprovider", "-x", *[str(ROOT / f) for f in files]],
            plugins=[rec],
        )
    if code not in (0, 5):
        raise SystemExit(f"the rule tests failed (pytest exit {code}): no corpus written")
    cases = hand_cases()
    hand = len(cases)
    taken = {case.name for case in cases}
    for nodeid, tapes in sorted(rec.tapes.items()):
        rules = rules_of(nodeid)
        if not rules:
            continue
        usable = [t for t in tapes if not t.tainted and t.commands]
        for tape in usable[:PER_TEST]:
            name = _fit(_short(nodeid), taken)
            desc = f"The sequence {nodeid.split('::')[-1]} drives through the model."
            cases.append(_case(name, rules, desc, nodeid, tape))
    if len(cases) == hand:
        raise SystemExit("no rule test drove a harness that can be replayed: no corpus written")
    return cases


def record_random(count: int) -> list[Case]:
    """``count`` sequences of the model's random state machine, spread over the modes."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from conformance import machine as m

    rec = Recorder()
    modes = list(MergingMode)
    cases: list[Case] = []
    with rec.watching():
        for i, mode in enumerate(modes):
            want = count // len(modes) + (1 if i < count % len(modes) else 0)

            class Machine(m.RefimplMachine):
                pass

            Machine.mode = mode
            short = _SHORT_MODE[mode]
            rec.test = f"random-{short}"
            run_state_machine_as_test(
                Machine,
                settings=settings(
                    max_examples=want, derandomize=True, database=None, deadline=None
                ),
            )
            rec.test = None
    taken: set[str] = set()
    for test, tapes in sorted(rec.tapes.items()):
        for n, tape in enumerate(t for t in tapes if not t.tainted and len(t.commands) > 1):
            name = _fit(f"{test}-{n + 1:03d}", taken)
            assert name.startswith(GZIP_PREFIX)
            desc = "A sequence of the model's random state machine (derandomized Hypothesis)."
            cases.append(_case(name, (), desc, f"random:{test}:{n + 1}", tape))
    return cases


# --------------------------------------------------------------------------- checking


def flink_bugs() -> tuple[str, ...]:
    """The Flink bugs of ../shared/BRIEF.md section 6, if the brief is there."""
    brief = ROOT.parent / "shared" / "BRIEF.md"
    found = set(FLINK_BUGS)
    if brief.exists():
        text = brief.read_text(encoding="utf-8")
        m = re.search(r"^## *6\b.*?(?=^## *7\b|\Z)", text, re.M | re.S)
        found |= set(re.findall(r"FLINK-\d+", m.group(0) if m else ""))
    return tuple(sorted(found, key=lambda s: int(s[6:])))


NOT_A_STORE_RULE = {
    "R96": "the streaming engine's order of sink, complete and Spark's commit: no store"
    " command can show it (tests/test_stream_driver_kill.py does)",
}
"""Rules of SPEC.md that bind the engine around the store, not a store implementation:
the conformance suite cannot hold a case for them."""


def required() -> list[str]:
    spec = traceability.SPEC.read_text(encoding="utf-8")
    rules = [r for r in traceability.spec_rules(spec) if r not in NOT_A_STORE_RULE]
    return [*rules, *traceability.spec_invariants(spec), *flink_bugs()]


def check(folder: Path = CORPUS, *, expectations: bool = True, schema_every: int = 1) -> list[str]:
    """Problems of the corpus in ``folder``; ``schema_every=n`` validates every n-th file
    against the schema only (validation is most of the time; every file decodes anyway)."""
    problems: list[str] = []
    validator = jsonschema.Draft202012Validator(schema())
    names: dict[str, str] = {}
    covered: set[str] = set()
    files = corpus_files(folder)
    if not files:
        return [f"no case in {folder}"]
    for n, path in enumerate(files):
        try:
            data = read_json(path)
        except CaseError as err:
            problems.append(str(err))
            continue
        validated = validator.iter_errors(data) if n % schema_every == 0 else iter(())
        errors = sorted(validated, key=lambda e: list(e.absolute_path))
        for e in errors[:3]:
            where = "/".join(str(p) for p in e.absolute_path) or "(top)"
            problems.append(f"{path.name}: schema: at {where}: {e.message[:200]}")
        if errors:
            continue
        try:
            case = from_json(data, path.name)
        except CaseError as err:
            problems.append(str(err))
            continue
        if not NAME.match(case.name):
            problems.append(f"{path.name}: name {case.name!r} is not short")
        if case_name(path) != case.name:
            problems.append(f"{path.name}: file name and case name {case.name!r} differ")
        if case.name in names:
            problems.append(f"{path.name}: name {case.name!r} also in {names[case.name]}")
        names[case.name] = path.name
        covered.update(case.rules)
        if expectations and recomputed(case) != case:
            problems.append(f"{path.name}: stored expectations differ from the model: run regen")
    missing = [r for r in required() if r not in covered]
    if missing:
        problems.append(f"no case for: {', '.join(missing)}")
    return problems


def write(cases: list[Case], folder: Path = CORPUS, *, random: bool) -> int:
    """Replace the random cases (``random``) or the recorded ones with ``cases``."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in corpus_files(folder):
        if case_name(old).startswith(GZIP_PREFIX) == random:
            old.unlink()
    for case in cases:
        write_case(case, folder)
    return len(cases)


def regen(folder: Path = CORPUS) -> int:
    n = 0
    for path in corpus_files(folder):
        case = load(path)
        fresh = recomputed(case)
        if fresh != case:
            path.unlink()
            write_case(fresh, folder)
            n += 1
    return n


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd = argv[0]
    if cmd == "record":
        print(f"wrote {write(record(), random=False)} cases recorded from the rule tests")
        return 0
    if cmd == "random":
        cases = record_random(int(argv[1]) if len(argv) > 1 else 300)
        print(f"wrote {write(cases, random=True)} random cases")
        return 0
    if cmd == "regen":
        print(f"{regen()} case(s) rewritten with the model's expectations")
        return 0
    if cmd == "check":
        problems = check()
        for p in problems:
            print(p)
        n = len(corpus_files())
        print(f"{n} cases: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
        return 1 if problems else 0
    print(f"unknown command {cmd!r}\n{__doc__}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
