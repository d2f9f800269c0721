"""One error hierarchy (issue 34): every exception class the product packages define
derives from ``spec.errors.CkptError``, so a host catches the library's errors with one
clause. The one exception: the stream job's simulated SIGKILL (``Killed``), a
``BaseException`` on purpose so that no ``except Exception`` of a task swallows it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from spec.errors import CkptError, NotFoundError, OperationFailed, UsageError, WrongTypeError

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


BUILTIN_RAISES = {"ValueError", "TypeError", "KeyError", "RuntimeError", "OSError", "Exception"}
KEPT_BUILTIN = {
    # a dict's __missing__ raises KeyError by the mapping protocol; get() catches it
    ("fastimpl/attempts.py", "__missing__", "KeyError"),
}


def _builtin_raises() -> list[tuple[str, str, str, int]]:
    """Each ``raise <built-in error>(...)`` in the product packages, with the function it
    is in: a caller of the library would need a clause besides ``except CkptError``."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for pkg in (*PACKAGES, "ckpt"):
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            where: dict[ast.Raise, str] = {}
            for fn in ast.walk(tree):  # breadth first: an inner function's name wins
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    for node in ast.walk(fn):
                        if isinstance(node, ast.Raise):
                            where[node] = fn.name
            for node in ast.walk(tree):
                if not isinstance(node, ast.Raise) or node.exc is None:
                    continue
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTIN_RAISES:
                    rel = str(path.relative_to(root))
                    found.append((rel, where.get(node, "<module>"), exc.id, node.lineno))
    return found


def test_the_library_raises_no_bare_built_in_error() -> None:
    raised = {(f, fn, e) for f, fn, e, _ in _builtin_raises()}
    assert raised - KEPT_BUILTIN == set(), sorted(raised - KEPT_BUILTIN)


def test_the_raise_scan_sees_a_raise() -> None:
    assert ("fastimpl/attempts.py", "__missing__", "KeyError") in {
        (f, fn, e) for f, fn, e, _ in _builtin_raises()
    }


@pytest.mark.parametrize(
    ("error", "builtin"),
    [(UsageError, ValueError), (WrongTypeError, TypeError), (NotFoundError, KeyError),
     (OperationFailed, RuntimeError)],
)
def test_each_usage_error_is_also_the_built_in_its_callers_knew(
    error: type[CkptError], builtin: type[Exception]
) -> None:
    assert issubclass(error, CkptError) and issubclass(error, builtin)
