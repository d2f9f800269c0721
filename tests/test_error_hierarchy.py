"""One error hierarchy (issue 34): every exception class the product packages define
derives from ``spec.errors.CkptError``, so a host catches the library's errors with one
clause. The one exception: the stream job's simulated SIGKILL (``Killed``), a
``BaseException`` on purpose so that no ``except Exception`` of a task swallows it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from spec.errors import CkptError

PACKAGES = ("spec", "refimpl", "fastimpl", "pipeline", "conformance")
NOT_ERRORS = {"pipeline.stream.kills.Killed"}


def _modules() -> list[str]:
    out = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        out.append(pkg)
        out += [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".")]
    return sorted(out)


def _defined_exceptions() -> list[type[BaseException]]:
    found = []
    for name in _modules():
        try:
            mod = importlib.import_module(name)
        except ImportError as err:  # an optional dependency (pyflink) is not installed
            if "pyflink" in str(err) or "py4j" in str(err):
                continue
            raise
        for _n, obj in inspect.getmembers(mod, inspect.isclass):
            if (issubclass(obj, BaseException) and obj.__module__ == name
                    and not obj.__name__.startswith("_")):
                found.append(obj)
    return found


def test_the_scan_finds_the_errors_of_every_layer() -> None:
    names = {f"{e.__module__}.{e.__name__}" for e in _defined_exceptions()}
    for known in ("spec.errors.CommandError", "fastimpl.faults.StorageFault",
                  "pipeline.deletion.DeletionRefused", "conformance.case.CaseError"):
        assert known in names


@pytest.mark.parametrize("error", _defined_exceptions(),
                         ids=lambda e: f"{e.__module__}.{e.__name__}")
def test_every_error_derives_from_the_common_base(error: type[BaseException]) -> None:
    if f"{error.__module__}.{error.__name__}" in NOT_ERRORS:
        assert not issubclass(error, Exception)
        return
    assert issubclass(error, CkptError), error.__mro__
