"""The two implementations every rule test (``tests/test_rules_*.py``) runs against.

A rule test builds its harness with ``start`` (or ``start_as`` for a harness subclass of
its own) and runs once per implementation, chosen by the autouse fixture ``impl`` that
each rule module imports:

* ``model``: ``conformance.harness.Harness``, the reference model alone;
* ``product``: ``ProductHarness``, the same commands in lockstep on the model and on
  fastimpl (``FastimplTarget``) writing real files on a fresh ``memory://`` root. Every
  command is applied to both; both accept it or both refuse it with the same reason, the
  observations must be equal and the invariants hold on the product's (``LockstepHarness``).
  What the test then reads is the product's: ``observe()`` and ``working()`` are the
  product's observations, a refusal is the product's ``CommandError``, a refused command
  must leave the product's observation as it was, ``channel()`` is the notices in the
  product's transport, and the effects a command returns (the model's list of storage
  calls, which the product does not keep) are first checked against what the product did
  on storage in that command: the files it created, the bytes it appended at which
  offsets, the files it closed and the directories it made, and the files it deleted with
  who deleted them (``footprint_differences``).

The coordinator's and TMs' records a test asserts on are read from the implementation
under test with ``pending``, ``placement``, ``pins`` and ``segments`` (the product's are
read from its ``InProcessEngine``), and a ``ProductHarness``'s ``subtasks``,
``last_checkpoint``, ``tm_of``, ``live_tms`` and ``lost_tms`` are the product's. A test
reads ``Harness.state`` itself only to choose its commands, or for an assertion that has
no product counterpart, under ``if is_model(h)``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol, TypeVar, cast

import pytest
from fsspec.implementations.memory import MemoryFileSystem  # type: ignore[import-untyped]

from conformance.compare import unmarked
from conformance.harness import DEFAULT_JOB, JOB, Harness
from fastimpl import CounterIds
from fastimpl.engine import InProcessEngine
from fastimpl.party_observation import observe_working
from fastimpl.records import Status
from model_tests.targets import FastimplTarget
from refimpl import initial_state
from refimpl.state import Notice, NoticeKind
from spec import commands as c
from spec.config import Config, JobSpec
from spec.effects import (
    AppendBytes,
    CloseFile,
    CreateFile,
    DeleteDir,
    DeleteFile,
    Effect,
    MakeDir,
    WriteMetadata,
)
from spec.errors import CommandError
from spec.handles import StateEntry
from spec.ids import SubtaskId
from spec.layout import is_under
from spec.messages import CheckpointAborted, CheckpointComplete
from spec.observation import Observation, WorkingObservation
from tests.lockstep import Backend, LockstepHarness

IMPLS = ("model", "product")
"""``none`` too: a test marked ``impl_free``, which starts no harness."""
H = TypeVar("H", bound=Harness)

_impl = ["model"]
_started: list[ProductHarness] = []
_roots = itertools.count()
_count = [0]


def _roots_started() -> int:
    return _count[0]


@pytest.fixture(params=IMPLS, autouse=True)
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which implementation the test's harnesses run: ``model`` or ``product``. The
    product's harnesses are closed and their roots removed after the test. A test whose
    product variant starts no harness reaches neither: it is marked ``impl_free``."""
    _impl[0] = request.param
    _started.clear()
    started = _roots_started()
    try:
        yield request.param
    finally:
        _impl[0] = "model"
        while _started:
            _started.pop().close()
    if request.param == "product":
        assert _roots_started() > started, "the product variant started no harness: impl_free?"


impl_free = pytest.mark.parametrize("impl", ["none"], indirect=True)
"""For a test of ``spec`` alone (no harness): it runs once, and starting a harness fails."""


def current_impl() -> str:
    """``model`` or ``product``: the implementation of the running test."""
    return _impl[0]


def start(
    config: Config | None = None, job: JobSpec = DEFAULT_JOB, *, job_id: str = JOB
) -> Harness:
    """A harness on the implementation of the running test."""
    if _impl[0] == "model":
        if job_id == JOB:  # built from its arguments, so the corpus recorder can replay it
            return Harness(config, job)
        return Harness(state=initial_state(config or Config(), job, job_id))
    assert _impl[0] == "product", "an impl_free test starts no harness"
    return ProductHarness(config, job, job_id=job_id)


def start_as(cls: type[H], config: Config, job: JobSpec | None = None) -> H:
    """A harness of ``cls`` (a subclass of ``Harness`` built with ``config`` and, if
    given, ``job``) on the implementation of the running test."""
    if _impl[0] != "model":
        assert _impl[0] == "product", "an impl_free test starts no harness"
        cls = cast(type[H], _product_class(cls))
    return cls(config) if job is None else cls(config, job)


_product_classes: dict[type[Harness], type[Harness]] = {}


def _product_class(cls: type[Harness]) -> type[Harness]:
    """``cls`` on ``ProductHarness``: its own steps and checks, run in lockstep."""
    if cls not in _product_classes:
        _product_classes[cls] = type(f"Product{cls.__name__}", (cls, ProductHarness), {})
    return _product_classes[cls]


def is_model(h: Harness) -> bool:
    """Whether ``h`` runs the model alone (what only the model's state shows may be read)."""
    return not isinstance(h, ProductHarness)


def channel(h: Harness) -> list[Notice]:
    """The notices in flight, oldest first: the model's, or the product's transport."""
    return h.channel() if isinstance(h, ProductHarness) else list(h.state.channel)


class PendingView(Protocol):
    """A pending checkpoint as the coordinator keeps it (the model's and fastimpl's)."""

    @property
    def acks(self) -> Mapping[SubtaskId, tuple[StateEntry, ...]]: ...

    @property
    def received(self) -> AbstractSet[str]: ...


def pending(h: Harness) -> Mapping[int, PendingView]:
    """The coordinator's pending checkpoints: what it acknowledged and received so far."""
    return h.engine.coord.pending if isinstance(h, ProductHarness) else h.state.pending


def placement(h: Harness) -> Mapping[SubtaskId, str]:
    """Which TM attempt runs each subtask, as the coordinator placed them."""
    return h.engine.placement if isinstance(h, ProductHarness) else h.state.placement


def pins(h: Harness) -> dict[str, frozenset[int]]:
    """Each shared-state registry key -> the pending checkpoints whose placeholders pin it
    (R22, R66)."""
    if isinstance(h, ProductHarness):
        return {e.key: frozenset(e.pinned_by) for e in h.engine.coord.registry.entries()}
    return {k: frozenset(r.pins) for k, r in h.state.registry.items()}


def segments(h: Harness, tm: str) -> dict[str, tuple[str, int, int, int]]:
    """TM ``tm``'s segment table: logical id -> (path, length, created for, last used)."""
    if isinstance(h, ProductHarness):
        segs = h.engine.parties[tm].m.segs
        return {
            k: (unmarked(g.path), g.length, g.created_for, g.last_used) for k, g in segs.items()
        }
    return {
        lid: (g.path, g.length, g.created_for, g.last_used)
        for (t, lid), g in h.state.segs.items()
        if t == tm
    }


class _Product(FastimplTarget):
    """``FastimplTarget`` for a job of any id."""

    def __init__(self, config: Config, job: JobSpec, fs: object, root: str, job_id: str) -> None:
        self.engine = InProcessEngine(
            config, job, fs, root, CounterIds(), job_id, deletion_log=True
        )


def _own_memory() -> MemoryFileSystem:
    """A ``memory://`` file system with a store of its own: listing it does not walk the
    files of every other harness of the test."""
    own = type("OwnMemoryFileSystem", (MemoryFileSystem,), {"store": {}, "pseudo_dirs": [""]})
    return own(skip_instance_cache=True)


class ProductHarness(LockstepHarness):
    """The model and fastimpl in lockstep on a fresh ``memory://`` root; what the test
    reads is the product's (see the module's docstring)."""

    def __init__(
        self, config: Config | None = None, job: JobSpec = DEFAULT_JOB, *, job_id: str = JOB
    ) -> None:
        cfg = config or Config()
        backend = Backend("memory", _own_memory(), f"/rules-{next(_roots)}")
        start_target = functools.partial(_Product, job_id=job_id)
        self.root = backend.new_root()
        super().__init__(cfg, job, backend, self.root, start_target)
        self.state = initial_state(cfg, job, job_id)
        _started.append(self)
        _count[0] += 1

    def close(self) -> None:
        self.target.close()
        self.backend.remove(self.root)

    def run(self, cmd: c.Command) -> tuple[Effect, ...]:
        before = self.impl_obs
        effects = super().run(cmd)
        wrong = footprint_differences(
            effects,
            unmarked(before),
            unmarked(self.impl_obs),
            unwritten_may_vanish=not self.state.config.open_files_readable,
        )
        assert not wrong, "\n".join([f"{cmd!r}: the product's storage calls differ:", *wrong])
        return effects

    def try_run(self, cmd: c.Command) -> CommandError | None:
        before = self.impl_obs
        err = super().try_run(cmd)
        if err is not None:
            assert self.impl_obs == before, f"the product changed on a refused {cmd!r}"
        return err

    @property
    def engine(self) -> InProcessEngine:
        assert isinstance(self.target, FastimplTarget)
        return self.target.engine

    # What the coordinator shows of its TMs and checkpoints: the product's.

    @property
    def subtasks(self) -> list[SubtaskId]:
        return sorted(self.engine.placement)

    @property
    def last_checkpoint(self) -> int:
        return self.engine.coord.next_checkpoint - 1

    def tm_of(self, subtask: SubtaskId) -> str:
        return self.engine.placement[subtask]

    def live_tms(self) -> list[str]:
        tms = self.engine.coord.tms
        return sorted({t for t in self.engine.placement.values() if tms[t].status is Status.ALIVE})

    def lost_tms(self) -> list[str]:
        return sorted(t for t, r in self.engine.coord.tms.items() if r.status is Status.LOST)

    def observe(self) -> Observation:
        """The product's observation after the last command, its file names as the
        model draws them (``conformance.compare.unmarked``)."""
        return unmarked(self.impl_obs)

    def working(self) -> WorkingObservation:
        """The product's working files (§11)."""
        engine = self.engine
        return unmarked(observe_working(engine.coord, engine.parties, self.impl_obs))

    def channel(self) -> list[Notice]:
        """The notices in the product's transport, as the model's ``Notice``."""
        out = []
        for tm, msg in self.engine.channel:
            if isinstance(msg, CheckpointComplete):
                kind, mark, pending = NoticeKind.COMPLETE, msg.subsumed, msg.pending_savepoints
            elif isinstance(msg, CheckpointAborted):
                kind, mark, pending = NoticeKind.ABORT, msg.latest_completed, frozenset()
            else:
                raise AssertionError(f"not a notice: {msg!r}")
            out.append(Notice(tm, kind, msg.checkpoint, mark, msg.savepoint, pending))
        return out


def footprint_differences(
    effects: Iterable[Effect],
    before: Observation,
    after: Observation,
    *,
    unwritten_may_vanish: bool = False,
) -> list[str]:
    """How the storage calls ``effects`` (in order) disagree with what an implementation
    showed before and after them: which files exist and with what size (a ``_metadata``'s
    size is the implementation's own), which were closed, which directories were made,
    and which files were deleted by whom (its new deletion records).
    ``unwritten_may_vanish``: open files are not readable (an object store, R12, R65): a
    file open before the calls may be gone after them with no delete, never written."""
    size: dict[str, int | None] = dict(before.files)
    made: set[str] = set()
    closed: set[str] = set()
    expected_deletes: list[tuple[str, str]] = []
    out: list[str] = []
    for e in effects:
        match e:
            case CreateFile(path=p):
                size[p] = 0
            case WriteMetadata(path=p):
                size[p] = None
            case AppendBytes(path=p, offset=off, length=n):
                if size.get(p, -1) != off:
                    out.append(f"  append to {p} at {off}, the file had {size.get(p)} bytes")
                size[p] = (size.get(p) or 0) + n
            case CloseFile(path=p):
                closed.add(p)
            case MakeDir(path=p):
                made.add(p)
            case DeleteFile(path=p, actor=actor):
                size.pop(p, None)
                expected_deletes.append((p, actor))
            case DeleteDir(path=d, actor=actor):
                for p in sorted(p for p in size if is_under(p, d)):
                    del size[p]
                    expected_deletes.append((p, actor))
                made = {m for m in made if not is_under(m, d)}
    if unwritten_may_vanish:
        deleted = {p for p, _ in expected_deletes}
        for p in (before.open_files - set(after.files)) - deleted:
            size.pop(p, None)
    if set(size) != set(after.files):
        out.append(f"  files: expected {sorted(size)}, on storage {sorted(after.files)}")
    out += [
        f"  {p}: {n} bytes expected, {after.files[p]} on storage"
        for p, n in size.items()
        if n is not None and p in after.files and after.files[p] != n
    ]
    out += [f"  {p} still open" for p in sorted(closed & after.open_files & set(size))]
    out += [f"  directory {d} not made" for d in sorted(made - set(after.directories))]
    new = [(r.path, r.actor) for r in after.deletions[len(before.deletions) :]]
    if sorted(new) != sorted(expected_deletes):
        out.append(f"  deleted: expected {sorted(expected_deletes)}, recorded {sorted(new)}")
    return out
