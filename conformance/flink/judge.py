"""Running cases on the Flink adapter and sorting the divergences: what kind each is (from
the judged part of the observations only, ``profile.judged``), and the shortest sequence
that still shows it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attrs import field, frozen

from conformance.adapter import Implementation
from conformance.case import Case
from conformance.compare import normalized
from conformance.flink.profile import judged
from conformance.harness import Harness
from conformance.runner import expected_steps
from spec.commands import Command
from spec.config import Config, JobSpec
from spec.errors import Reason
from spec.observation import Observation


@frozen
class Divergence:
    step: int
    """The 1-based step where Flink first differs."""
    command: Command
    label: str
    """The command's class name; for a delivered notification, with its kind
    (``DeliverNotification:abort``)."""
    kinds: tuple[str, ...]
    """What differs: ``kept`` (Flink keeps a file the model deletes), ``deleted`` (Flink
    deletes a file the model keeps), ``extra`` (a file only Flink wrote), ``missing`` (a file
    only the model wrote), ``size``, ``raised`` (a Flink call failed), ``refusal``."""
    paths: tuple[str, ...]
    """The paths (the model's names) the kinds are about."""
    detail: str


@frozen
class Outcome:
    name: str
    steps: int
    divergence: Divergence | None
    calls: tuple[str, ...]
    """The Flink calls up to the divergence (or the end), for a reproduction script."""
    expected: dict[str, list[int]]
    """The model's judged files at that step: Flink's directory (relative to the storage
    root) -> the sizes of the files the rules expect in it."""


def _kinds(model: Observation, flink: Observation, job: str) -> tuple[list[str], list[str]]:
    m_files, m_deleted = judged(model, job)
    f_files, f_deleted = judged(flink, job)
    kinds: list[str] = []
    paths: list[str] = []

    def add(kind: str, found: Sequence[str]) -> None:
        if found:
            kinds.append(kind)
            paths.extend(found)

    add("kept", sorted(p for p in f_files if p not in m_files and p in m_deleted))
    add("deleted", sorted(p for p in m_files if p not in f_files and p in f_deleted))
    add("extra", sorted(p for p in f_files if p not in m_files and p not in m_deleted))
    add("missing", sorted(p for p in m_files if p not in f_files and p not in f_deleted))
    add("size", sorted(p for p in m_files if p in f_files and m_files[p] != f_files[p]))
    return kinds, paths


def run(
    config: Config, job: JobSpec, commands: Sequence[Command], impl: Implementation, name: str
) -> Outcome:
    """Run ``commands`` on a session of ``impl`` (the Flink adapter) and stop at the first
    step whose judged observation or outcome differs from the model's."""
    steps = expected_steps(config, job, commands)
    session = impl.start(config, job)
    listed = config.open_files_readable
    try:
        for i, s in enumerate(steps):
            try:
                reason: Reason | None = session.run(s.command)
                got = normalized(session.observe(), open_files_listed=listed)
            except Exception as err:
                text = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                div = Divergence(
                    i + 1, s.command, _label(session, s.command), ("raised",), (), text
                )
                exp = _expected(session, s.observation)
                return Outcome(name, len(steps), div, _calls(session), exp)
            if reason != s.refused:
                text = f"model {s.refused}, adapter {reason}"
                div = Divergence(
                    i + 1, s.command, _label(session, s.command), ("refusal",), (), text
                )
                exp = _expected(session, s.observation)
                return Outcome(name, len(steps), div, _calls(session), exp)
            if got != s.observation:
                model = normalized(s.observation, open_files_listed=listed)
                kinds, paths = _kinds(model, got, getattr(session, "job", "job-0"))
                if not kinds:
                    kinds = ["other"]
                detail = _detail(model, got)
                div = Divergence(
                    i + 1, s.command, _label(session, s.command), tuple(kinds), tuple(paths), detail
                )
                return Outcome(name, len(steps), div, _calls(session), _expected(session, model))
        last = steps[-1].observation if steps else None
        exp = _expected(session, last) if last is not None else {}
        return Outcome(name, len(steps), None, _calls(session), exp)
    finally:
        session.close()


def _label(session: object, command: Command) -> str:
    name = type(command).__name__
    notice = getattr(session, "last_notice", "")
    return f"{name}:{notice}" if name == "DeliverNotification" and notice else name


def _calls(session: object) -> tuple[str, ...]:
    return tuple(getattr(session, "calls", ()))


def _expected(session: object, model: Observation) -> dict[str, list[int]]:
    """The judged files of ``model`` by Flink's directory (``FlinkSession.flink_dirs``)."""
    job = getattr(session, "job", "job-0")
    dirs: dict[str, str] = getattr(session, "flink_dirs", lambda: {})()
    out: dict[str, list[int]] = {d: [] for d in dirs.values()}
    files, _deleted = judged(model, job)
    for path, size in files.items():
        where = dirs.get(path.rsplit("/", 1)[0], path.rsplit("/", 1)[0])
        out.setdefault(where, []).append(size)
    return {d: sorted(v) for d, v in sorted(out.items())}


def _detail(model: Observation, flink: Observation) -> str:
    lines = []
    for name in ("files", "deletions"):
        a, b = getattr(model, name), getattr(flink, name)
        if a != b:
            if isinstance(a, dict) or hasattr(a, "items"):
                only_m = sorted(set(a.items()) - set(b.items()))
                only_f = sorted(set(b.items()) - set(a.items()))
            else:
                only_m = [x for x in a if x not in b]
                only_f = [x for x in b if x not in a]
            lines.append(f"{name}: only the model's {only_m}; only Flink's {only_f}")
    return "\n".join(lines) or "a field outside the judged part differs"


def run_case(case: Case, impl: Implementation) -> Outcome:
    return run(case.config, case.job, [s.command for s in case.steps], impl, case.name)


def signature(config: Config, div: Divergence) -> tuple[str, str, str]:
    """What groups divergences of one cause: the merging mode, the command at the step and
    the kinds of difference with the directory kind (shared or taskowned) of each path."""
    where = sorted({p.split("/")[1] for p in div.paths if "/" in p})
    return (
        config.merging_mode.value,
        div.label,
        "+".join(div.kinds) + (f" in {'+'.join(where)}" if where else ""),
    )


def shrink_by(
    commands: Sequence[Command], keeps: Callable[[Sequence[Command]], bool], budget: int = 400
) -> list[Command]:
    """A shorter sequence for which ``keeps`` still holds: greedily drop one command at a
    time, last first."""
    current = list(commands)
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        i = len(current) - 1
        while i >= 0 and tries < budget:
            candidate = current[:i] + current[i + 1 :]
            tries += 1
            if keeps(candidate):
                current = candidate
                changed = True
            i -= 1
    return current


def shrink(
    config: Config,
    job: JobSpec,
    commands: Sequence[Command],
    impl: Implementation,
    same: Callable[[Outcome], bool],
    budget: int = 400,
) -> list[Command]:
    """A shorter sequence that still shows the divergence (``same``): greedily drop one
    command at a time, last first, keeping a drop when the divergence stays."""
    current = list(commands)
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        i = len(current) - 2
        while i >= 0 and tries < budget:
            candidate = current[:i] + current[i + 1 :]
            tries += 1
            try:
                out = run(config, job, candidate, impl, "shrink")
            except Exception:  # the model refuses the shortened sequence's setup: keep it
                out = None
            if out is not None and out.divergence is not None and same(out):
                cut = out.divergence.step
                current = candidate[:cut]
                changed = True
                i = min(i, len(current) - 1) - 1
            else:
                i -= 1
    return current


@frozen
class Quiet:
    """Flink's storage once the system is quiet, judged by I6 and I1 from the disk and the
    handles Flink returned (no name pairing: file boundaries may differ from the model's)."""

    leaked: tuple[str, ...]
    """Files in the TM directories that no handle of a retained checkpoint points into
    (I6: no leak once quiet)."""
    dangling: tuple[str, ...]
    """Handles of retained checkpoints whose bytes are not on disk (I1: no dangling
    reference): what is lost."""
    commands: tuple[Command, ...] = ()
    """The sequence with the model's quiescing appended."""
    calls: tuple[str, ...] = ()
    expected: dict[str, list[int]] = field(factory=dict)
    """The model's TM files once quiet, by Flink directory (as ``Outcome.expected``)."""


def quiet(config: Config, job: JobSpec, commands: Sequence[Command], impl: Implementation) -> Quiet:
    """Run ``commands`` and then the model's quiescing (lost attempts stopped, every
    notification delivered, pending checkpoints aborted, ``num_retained + 1`` fault-free
    checkpoints completed) on Flink, and judge only the end."""
    h = Harness(config, job)
    for cmd in commands:
        h.try_run(cmd)
    n = len(h.history)
    h.quiesce()
    tail = h.history[n:]
    session = impl.start(config, job)
    try:
        for cmd in [*commands, *tail]:
            session.run(cmd)
            session.observe()
        files: dict[str, int] = session.flink_files()  # type: ignore[attr-defined]
        refs: list[tuple[str, int, int]] = session.retained_handles()  # type: ignore[attr-defined]
        calls = _calls(session)
        expected = _expected(session, h.observe())
    finally:
        session.close()
    used = {path for path, _start, _size in refs}
    leaked = tuple(sorted(p for p in files if p not in used))
    dangling = tuple(
        f"{path}@{start}+{size}" for path, start, size in refs if files.get(path, -1) < start + size
    )
    return Quiet(leaked, dangling, (*commands, *tail), calls, expected)
