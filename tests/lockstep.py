"""An implementation in lockstep with the reference model, on four storages (issue 3).

A Hypothesis state machine drives the reference model (through ``Harness``) and an
implementation under test writing real files through fsspec, with the same commands:
``LockstepHarness.run`` sends every command to both. The implementation is an argument:
anything that ``Target`` describes (run a command, observe itself, say whether a
directory exists, settle and close), started by a ``StartTarget`` callable from a
configuration, a job, a file system and a root. ``FastimplTarget`` (``model_tests/targets.py``)
is the one this project ships; ``lockstep(start, backend, mode, examples)`` runs the
machine for any other, and ``LOCKSTEP_IMPL=module:callable`` runs ``test_lockstep`` with
that one instead. After every command:

* both accept it, or both refuse it with the same ``Reason``;
* ``observe()`` of both are equal, field by field. Normalizations: the byte size of
  ``_metadata`` files (the model counts entries, fastimpl writes JSON) is compared as
  existence only; every data file's size must match exactly; on an object store the
  model's open files are left out of its file list (see below);
* the managed directories the implementation reports exist on the real storage (on an object store:
  exactly when a file is stored under them, see below);
* every safety invariant (I1-I5) holds on the implementation's observation.

The rules are those of ``RefimplMachine`` (every command of the vocabulary, including
failing storage calls armed by ``FailNextCall``, and quiescing midway and in teardown,
which go through the same lockstep ``run``). The model's own purity check is not
repeated here.

Storages (``BACKENDS``), each a pytest parameter:

* ``memory-unreadable``: ``memory://`` with ``Config(open_files_readable=False)``, the
  object-store rules (R12, R16) at memory's speed; NONE and WITHIN_CHECKPOINT;
* ``local``: a directory under pytest's ``tmp_path``: builtin ``open``, ``os.fsync``,
  ``os.replace`` and fsspec's ``LocalFileSystem`` on the real disk;
* ``memory``: fsspec's ``memory://``;
* ``pyfakefs``: the same local code paths on pyfakefs's fake file system. The fake file
  system is active only while a sequence runs (resumed when the machine starts its target,
  paused in its teardown, after queued deletes are drained), so Hypothesis reads and
  writes its example database (``.hypothesis/``) on the real disk between sequences.
  One workaround: fsspec's ``LocalFileSystem.cat_file`` fails on pyfakefs's file objects
  and is replaced by a plain read (``_FakeFsLocal``);
* ``s3``: S3 through s3fs, against moto's S3 server started on 127.0.0.1 by a fixture,
  with dummy credentials. ``Config(open_files_readable=False)``: ACROSS_CHECKPOINT merging
  is refused there (R16, ``test_across_checkpoint_refused_on_s3``), so S3 runs NONE and
  WITHIN_CHECKPOINT only. Two things differ from a file system and are allowed for here,
  both by the nature of the store and not by fastimpl:
  - an object is written when its file is closed: a file still open has no object yet, so
    the model's open files (``Observation.open_files``) are removed from the model's
    ``files`` before the comparison; once closed, a file must be there with its exact size;
  - an empty directory does not exist (directories are key prefixes): a managed directory
    must "exist" exactly when some file fastimpl lists lies under it (asked when it is
    first reported and whenever that should change, not after every command).

Example counts: ``EXAMPLES`` per merging mode (``LONG_EXAMPLES`` in the ``long`` profile). The fake
file system and S3 are far slower per command than local files (pyfakefs resolves every
path in Python; moto answers each S3 call in tens of milliseconds), so CI runs few of
them; soak runs ask for more with ``LOCKSTEP_EXAMPLES=N`` (N per merging mode on every
selected storage) and can follow progress with ``LOCKSTEP_LOG=file`` (a line per finished
sequence), e.g.::

    LOCKSTEP_EXAMPLES=1000 LOCKSTEP_LOG=/tmp/s3.log \
        pytest "tests/test_lockstep.py::test_lockstep[s3-WITHIN_CHECKPOINT]"
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from pyfakefs.fake_filesystem_unittest import Patcher

from conformance.compare import differences, normalized, unmarked
from conformance.harness import DEFAULT_JOB, Harness, InvariantBroken
from conformance.machine import RefimplMachine
from fastimpl.reports import unrecorded_dirs
from model_tests.targets import FastimplTarget, StartTarget, Target
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode
from spec.effects import Effect
from spec.errors import CommandError
from spec.invariants import check_safety, working_files_kept
from spec.layout import is_under
from spec.observation import WorkingObservation
from tests.profile import PROFILE, QUICK_LOOP, left_to_ci, long_only

EXAMPLES = {"memory": 40, "local": 12, "pyfakefs": 2, "s3": 2, "memory-unreadable": 20}
"""Per merging mode, in the ``ci`` profile (the default profile, a developer's loop, runs
half: ``QUICK_EXAMPLES``). Seconds per sequence on two
shared cores, measured: memory ~0.6, local ~0.8 (an fsync per append, R12), pyfakefs ~15
(every listing resolves each path in Python, so it runs in the ``long`` profile only),
S3 on moto ~15 (three HTTP calls per
observation, one or two per storage call). The storages differ in what their calls do,
not in which commands reach them: the model's state machine is explored on ``memory``,
and the others show, on a few sequences each, that the same code paths behave alike on
them (pyfakefs runs the paths ``local`` runs on the real disk)."""
LONG_EXAMPLES = {"memory": 600, "local": 250, "pyfakefs": 30, "s3": 40, "memory-unreadable": 300}
"""The ``long`` profile's soak."""
QUICK_EXAMPLES = {"memory": 20, "local": 6, "pyfakefs": 1, "s3": 1, "memory-unreadable": 10}
"""The default profile's."""
OVERRIDE = os.environ.get("LOCKSTEP_EXAMPLES", "").strip()
"""``LOCKSTEP_EXAMPLES=N``: N sequences per merging mode on every selected storage."""
LOG = os.environ.get("LOCKSTEP_LOG", "").strip()
"""``LOCKSTEP_LOG=path``: a line per finished sequence, to follow a soak run."""
IMPL = os.environ.get("LOCKSTEP_IMPL", "").strip()
"""``LOCKSTEP_IMPL=module:callable``: the ``StartTarget`` that ``test_lockstep`` drives."""

BACKENDS = ("local", "memory", "pyfakefs", "s3", "memory-unreadable")
OBJECT_STORE_MODES = (MergingMode.NONE, MergingMode.WITHIN_CHECKPOINT)
"""ACROSS_CHECKPOINT needs open files to be readable and durable (R16)."""

S3_BUCKET = "lockstep"
_roots = itertools.count()


def examples(backend: str) -> int:
    if OVERRIDE:
        return int(OVERRIDE)
    return {"long": LONG_EXAMPLES, "ci": EXAMPLES}.get(PROFILE, QUICK_EXAMPLES)[backend]


# ---------------------------------------------------------------------------- implementations


def _start_from_env() -> StartTarget:
    if not IMPL:
        return FastimplTarget
    module, _, name = IMPL.partition(":")
    start: StartTarget = getattr(importlib.import_module(module), name or "start")
    return start


# ---------------------------------------------------------------------------- storages


class Backend:
    """Where the sequences of one test keep their files: a file system and a base path
    under which each sequence gets a fresh root."""

    object_store: ClassVar[bool] = False
    """Files appear only once closed, and directories are prefixes (S3)."""

    def __init__(self, name: str, fs: Any, base: str) -> None:
        self.name = name
        self.fs = fs
        self.base = base

    def config(self, cfg: Config) -> Config:
        """The configuration a sequence runs with on this storage."""
        return attrs.evolve(cfg, open_files_readable=False) if self.object_store else cfg

    def activate(self) -> None:
        """A sequence starts using the storage."""

    def deactivate(self, target: Target | None) -> None:
        """The sequence is over (called even if it never started)."""

    def new_root(self) -> str:
        root = f"{self.base}/run-{next(_roots)}"
        self.fs.makedirs(root, exist_ok=True)
        return root

    def remove(self, root: str) -> None:
        if self.fs.exists(root):
            self.fs.rm(root, recursive=True)


class S3Backend(Backend):
    object_store = True


class UnreadableOpenFilesBackend(Backend):
    """``memory://`` with ``Config(open_files_readable=False)``: the object-store rules
    (R12: an acknowledgement uploads every file holding its segments; R16) at memory's
    speed, both sides told by the configuration. Files are listed as on memory."""

    def config(self, cfg: Config) -> Config:
        return attrs.evolve(cfg, open_files_readable=False)


class _FakeFsLocal(LocalFileSystem):  # type: ignore[misc]
    """fsspec's local file system with one workaround for pyfakefs: ``cat_file`` reads
    through builtin ``open``. fsspec's own (``LocalFileOpener``) sets ``f.size`` on the
    file it opened, which pyfakefs refuses with an ``AttributeError`` since its
    ``FakeFileWrapper.size`` became a read-only property (pytest-dev/pyfakefs#1277).
    Everything else, and every write, is fsspec's and fastimpl's own code.

    (This module imports fsspec's local implementation before any ``Patcher`` starts:
    a module first imported while pyfakefs is active keeps the fake ``os`` afterwards.)"""

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        with open(self._strip_protocol(path), "rb") as f:
            size = f.seek(0, 2)
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(lo)
            return f.read(max(0, hi - lo))


class FakeFsBackend(Backend):
    """pyfakefs, active only while a sequence runs."""

    def __init__(self, patcher: Patcher, base: str) -> None:
        super().__init__("pyfakefs", _FakeFsLocal(), base)
        self.patcher = patcher

    def activate(self) -> None:
        self.patcher.resume()

    def deactivate(self, target: Target | None) -> None:
        if target is not None:
            # The implementation may delete in a background thread: let it finish on the
            # fake file system before the real one is back.
            target.settle()
        self.patcher.pause()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port), dummy credentials, one bucket. Not in
    the developer's loop: every test that reaches it, by argument or through
    ``request.getfixturevalue``, is skipped there, saying so."""
    if QUICK_LOOP:
        pytest.skip(left_to_ci("starts moto's S3 server"))
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_SESSION_TOKEN", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.delenv("AWS_PROFILE", raising=False)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("no_proxy", "127.0.0.1,localhost")
        werkzeug = logging.getLogger("werkzeug")
        level = werkzeug.level
        werkzeug.setLevel(logging.ERROR)  # one line per request otherwise
        # moto's S3 application served alone: moto's own server (ThreadedMotoServer)
        # finds the service of every request anew, listing moto's package folder and
        # matching every service's URL patterns: about 7% of the S3 tests' time
        server = make_server(
            "127.0.0.1", 0, create_backend_app("s3"), threaded=True,
            request_handler=MotoRequestHandler,
        )
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        try:
            host, port = server.server_address[:2]
            endpoint = f"http://{host!s}:{port}"
            try:
                s3(endpoint).mkdir(S3_BUCKET)
            except FileExistsError:
                pass  # moto keeps one in-process backend: another module's server made it
            yield endpoint
        finally:
            server.shutdown()
            serving.join()
            werkzeug.setLevel(level)


def s3(endpoint: str) -> Any:
    import s3fs  # type: ignore[import-untyped]

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": endpoint},
        key="testing",
        secret="testing",
        use_listings_cache=False,
        skip_instance_cache=True,
    )


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name: str = request.param
    if name == "memory":
        yield Backend(name, fsspec.filesystem("memory"), f"/lockstep-{next(_roots)}")
    elif name == "memory-unreadable":
        fs = fsspec.filesystem("memory")
        yield UnreadableOpenFilesBackend(name, fs, f"/lockstep-{next(_roots)}")
    elif name == "local":
        yield Backend(name, fsspec.filesystem("file"), str(tmp_path))
    elif name == "pyfakefs":
        with Patcher() as patcher:
            patcher.pause()
            yield FakeFsBackend(patcher, "/lockstep")
    elif name == "s3":
        endpoint: str = request.getfixturevalue("s3_endpoint")
        yield S3Backend(name, s3(endpoint), f"{S3_BUCKET}/t{next(_roots)}")
    else:
        raise AssertionError(f"unknown backend {name}")


# ---------------------------------------------------------------------------- lockstep


class LockstepHarness(Harness):
    """A harness whose every command also runs on the implementation, compared."""

    def __init__(
        self, config: Config, job: JobSpec, backend: Backend, root: str, start: StartTarget
    ) -> None:
        super().__init__(config, job)
        self.backend = backend
        self.target = start(config, job, backend.fs, root)
        self.dir_view: dict[str, bool] = {}
        """Object stores: whether each managed directory held a file at the last check."""
        self.impl_obs = self.target.observe()
        """The implementation's observation after the last command."""

    def run(self, cmd: c.Command) -> tuple[Effect, ...]:
        model_err: CommandError | None = None
        effects: tuple[Effect, ...] = ()
        try:
            effects = super().run(cmd)
        except CommandError as err:
            model_err = err
        except InvariantBroken:
            raise
        impl_err: CommandError | None = None
        try:
            self.target.apply(cmd)
        except CommandError as err:
            impl_err = err
        history = self.history + ([cmd] if model_err is not None else [])

        def repro() -> str:  # only a failing assertion spells out the sequence
            return "\n".join(f"    {x!r}," for x in history)

        assert (model_err is None) == (impl_err is None), (
            f"model {'refused: ' + str(model_err) if model_err else 'accepted'}, implementation "
            f"{'refused: ' + str(impl_err) if impl_err else 'accepted'} {cmd!r} after:\n{repro()}"
        )
        if model_err is not None and impl_err is not None:
            assert model_err.reason is impl_err.reason, f"{model_err} != {impl_err}\n{repro()}"
        impl = self.impl_obs = self.target.observe()
        listed = not self.backend.object_store
        model = normalized(Harness.observe(self), open_files_listed=listed)
        diff = differences(model, normalized(impl))
        assert not diff, "\n".join([*diff, "after commands:", repro()])
        if self.backend.object_store:
            # Directories are key prefixes on S3: there are no empty ones, and one "exists"
            # exactly when an object lies under it. A LIST request per directory after
            # every command would double an S3 sequence's time, so a directory is asked
            # about when it is first reported and whenever that answer should change.
            expected = {d: any(is_under(p, d) for p in impl.files) for d in impl.directories}
            wrong = [
                d
                for d, there in expected.items()
                if self.dir_view.get(d) is not there and self.target.exists_dir(d) is not there
            ]
            self.dir_view = expected
            assert not wrong, f"directory view disagrees with the files: {wrong}\n{repro()}"
        else:
            missing = [d for d in impl.directories if not self.target.exists_dir(d)]
            assert not missing, f"directories reported but not on storage: {missing}\n{repro()}"
        broken = check_safety(impl)
        assert not broken, "\n".join([*(str(v) for v in broken), repro()])
        if isinstance(self.target, FastimplTarget):
            unrecorded = unrecorded_dirs(self.target.engine.catalog)
            assert not unrecorded, f"directories owned with no record: {unrecorded}\n{repro()}"
            # §11: the parties' working files, databases and their operators (R105) are
            # the model's, and I7 holds on them
            impl_w = _in_use(self.target.observe_working(impl))
            model_w = _in_use(Harness.working(self))
            assert unmarked(impl_w) == model_w, "\n".join(
                ["working state differs:", *_working_diff(model_w, unmarked(impl_w)), repro()]
            )
            broken = working_files_kept(impl, impl_w)
            assert not broken, "\n".join([*(str(v) for v in broken), repro()])
        if impl_err is not None:
            raise impl_err  # the same reason as the model's
        return effects


def _in_use(w: WorkingObservation) -> WorkingObservation:
    """Without the databases that use no file: one side may keep an empty table."""
    uses = {db: paths for db, paths in w.uses.items() if paths}
    return attrs.evolve(w, uses=uses, operators={db: w.operators[db] for db in uses})


def _working_diff(model: WorkingObservation, impl: WorkingObservation) -> list[str]:
    out = []
    for field in attrs.fields(WorkingObservation):
        a, b = getattr(model, field.name), getattr(impl, field.name)
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                out.append(f"  {field.name}[{key}]: model {a.get(key)} != impl {b.get(key)}")
    return out


class LockstepMachine(RefimplMachine):
    backend: Backend
    start: ClassVar[StartTarget] = FastimplTarget

    root: str | None = None
    target: Target | None = None

    def make_harness(self, cfg: Config) -> Harness:
        self.backend.activate()
        self.root = self.backend.new_root()
        h = LockstepHarness(
            self.backend.config(cfg), DEFAULT_JOB, self.backend, self.root, type(self).start
        )
        self.target = h.target
        return h

    def transitions_are_pure(self) -> None:
        """The model's purity is test_refimpl_machine's business."""

    def teardown(self) -> None:
        # Hypothesis calls teardown in a ``finally``: what the sequence raised, if anything.
        outcome = sys.exc_info()[1]
        try:
            super().teardown()
        except BaseException as err:
            outcome = outcome or err
            raise
        finally:
            try:
                if self.target is not None:
                    self.target.close()
                if self.root is not None:
                    self.backend.remove(self.root)
            finally:
                self.backend.deactivate(self.target)
                if LOG and self.target is not None:  # on the real disk, after deactivate
                    self._log(outcome)

    def _log(self, outcome: BaseException | None) -> None:
        if outcome is None:
            end = "ok"
        elif type(outcome).__name__ == "StopTest":
            # Hypothesis ran out of its example budget mid-sequence: every step taken was
            # checked, only the end-of-sequence quiesce was not reached.
            end = "ok (cut at Hypothesis's size limit)"
        else:
            end = f"raised {type(outcome).__name__}"
        with open(LOG, "a") as log:
            log.write(
                f"{time.strftime('%H:%M:%S')} {self.backend.name} {self.mode.name} "
                f"{len(self.h.history)} commands {end}\n"
            )


_PYFAKEFS_LONG = long_only(
    "pyfakefs takes the code paths local takes on the real disk, at 15 s a sequence"
)


def _cases() -> list[Any]:
    return [
        pytest.param(b, m, id=f"{b}-{m.name}", marks=_PYFAKEFS_LONG if b == "pyfakefs" else ())
        for b in BACKENDS
        for m in (OBJECT_STORE_MODES if b in ("s3", "memory-unreadable") else list(MergingMode))
    ]


def lockstep(
    start: StartTarget, backend: Backend, mode: MergingMode, max_examples: int, **kw: Any
) -> None:
    """Run the lockstep machine on ``start``'s implementation: raises with the minimal
    command sequence if it ever disagrees with the model or breaks an invariant.
    ``kw``: more Hypothesis settings."""
    machine = type(
        f"Lockstep{backend.name.title()}{mode.name}",
        (LockstepMachine,),
        {"mode": mode, "backend": backend, "start": start},
    )
    run_state_machine_as_test(machine, settings=settings(max_examples=max_examples, **kw))
