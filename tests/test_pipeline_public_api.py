"""The Spark job uses only the public API of ``fastimpl`` (issue: "the Spark job uses only
the public API").

Two checks over every module of ``pipeline/``, by its syntax tree:

- imports: each ``import fastimpl...`` / ``from fastimpl... import`` names a module of
  ``fastimpl.parties.PUBLIC_MODULES``, and a ``from fastimpl import x`` imports no module
  that is not one;
- attributes: an attribute name that a class of ``fastimpl`` has (a method, a property,
  a class attribute or field, or an instance attribute its methods assign) is read or
  written only if ``fastimpl.parties.PUBLIC_MEMBERS`` documents it for some class, and
  no underscored attribute of a ``fastimpl`` class is touched at all.

The attribute check goes by name, not by type (the syntax tree has none). Two kinds of
name are left out because they are not ``fastimpl``'s to document: the fields and
methods of ``spec`` classes (the public vocabulary the messages, entries and
observations are written in, ``spec/``), and ``self.<name>`` inside a ``pipeline`` class
that defines ``<name>`` itself. Every other match is a violation. What is left of them is
a ratchet (``REMAINING``): the check fails on any new one, and on one listed that is gone
(the list is then shortened, so the count only goes down).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import pathlib
import pkgutil
import subprocess
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import fastimpl
import spec
from fastimpl.catalog import Catalog
from fastimpl.manager import Manager
from fastimpl.parties import (
    PUBLIC_MEMBERS,
    PUBLIC_MODULES,
    CheckpointCoordinator,
    Completed,
    Storage,
    TaskManager,
)
from fastimpl.records import Tm
from fastimpl.shared_registry import SharedStateRegistry
from fastimpl.working import Databases, SharedWorking

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipeline"
REMAINING_FILE = Path(__file__).with_name("pipeline_public_api_remaining.txt")


def _modules(package: ModuleType) -> Iterator[ModuleType]:
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        yield importlib.import_module(info.name)


def _class_members(cls: type) -> set[str]:
    """Every attribute name ``cls`` has: by introspection (methods, properties, class
    attributes, attrs fields, slots) and, for instance attributes that only exist once
    ``__init__`` ran, every ``self.<name> = ...`` in its source."""
    names = {n for n in vars(cls) if not (n.startswith("__") and n.endswith("__"))}
    names |= {a.name for a in getattr(cls, "__attrs_attrs__", ())}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return names
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _classes_of(package: ModuleType) -> dict[str, set[str]]:
    """The classes defined in ``package``'s modules, by qualified name, with their members."""
    out: dict[str, set[str]] = {}
    for mod in _modules(package):
        for _, obj in vars(mod).items():
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                out[f"{obj.__module__}.{obj.__qualname__}"] = _class_members(obj)
    return out


GUARDED = (
    CheckpointCoordinator,
    TaskManager,
    Storage,
    Completed,
    Catalog,
    Manager,
    Tm,
    SharedStateRegistry,
    Databases,
    SharedWorking,
)
"""The classes whose members are checked: the two parties and the storage the public
modules export, and the records they keep inside (a host that reaches one of these
reads the party's records, which only the party may change)."""

GENERIC = {
    n
    for t in (
        object, list, dict, set, frozenset, str, bytes, int,
        io.BufferedReader, io.TextIOWrapper, pathlib.Path, subprocess.Popen, threading.Thread,
    )
    for n in dir(t)
} | {"run"}  # fmt: skip
"""Method names of the builtin containers, files, paths, processes and threads (and
``subprocess.run``): ``x.get``, ``x.close`` or ``x.mkdir`` says nothing of whose ``x``
is."""


def fastimpl_members() -> dict[str, set[str]]:
    """Each attribute name of a guarded class (and the ``fastimpl`` classes it derives
    from), with the classes that have it."""
    out: dict[str, set[str]] = {}
    for guarded in GUARDED:
        for cls in guarded.__mro__:
            if not cls.__module__.startswith("fastimpl"):
                continue
            for n in _class_members(cls) - GENERIC:
                out.setdefault(n, set()).add(cls.__qualname__)
    return out


def spec_vocabulary() -> set[str]:
    """The attribute names of ``spec``'s classes: public, and not ``fastimpl``'s."""
    return {n for names in _classes_of(spec).values() for n in names if not n.startswith("_")}


def _is_fastimpl_module(name: str) -> bool:
    return name == "fastimpl" or name.startswith("fastimpl.")


def _submodules() -> set[str]:
    return {m.__name__ for m in _modules(fastimpl)}


def import_violations(tree: ast.AST, submodules: set[str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_fastimpl_module(a.name) and a.name not in PUBLIC_MODULES:
                    yield node.lineno, f"import {a.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not _is_fastimpl_module(node.module):
                continue
            if node.module not in PUBLIC_MODULES:
                yield node.lineno, f"from {node.module} import"
                continue
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in submodules and full not in PUBLIC_MODULES:
                    yield node.lineno, f"from {node.module} import {a.name}"


def _own_members(tree: ast.AST) -> dict[ast.AST, set[str]]:
    """For each node inside a class of the module, the names that class defines (its
    methods, class attributes and ``self.<name>`` assignments)."""
    owner: dict[ast.AST, set[str]] = {}
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        names: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
            elif isinstance(stmt, ast.Assign):
                names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        for node in ast.walk(cls):
            owner[node] = names  # the innermost class wins: walked outer first
    return owner


def attribute_violations(
    tree: ast.AST, members: dict[str, set[str]], vocabulary: set[str], allowed: set[str]
) -> Iterator[tuple[int, str]]:
    own = _own_members(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in members:
            continue
        name = node.attr
        if (
            isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and name in own.get(node, set())
        ):
            continue
        if name.startswith("_"):
            yield node.lineno, f".{name} (underscored, of {min(members[name])})"
        elif name not in allowed and name not in vocabulary:
            yield node.lineno, f".{name} (of {min(members[name])})"


def data_members() -> set[str]:
    """The guarded classes' records: fields and instance attributes, not methods."""
    out: set[str] = set()
    for guarded in GUARDED:
        for cls in guarded.__mro__:
            if cls.__module__.startswith("fastimpl"):
                methods = {
                    n for n, v in vars(cls).items() if callable(v) or isinstance(v, property)
                }
                out |= _class_members(cls) - methods - GENERIC
    return out


def pipeline_names(trees: list[ast.AST]) -> set[str]:
    """Every name ``pipeline`` defines itself: its functions and methods, its classes'
    attributes. A guarded class's method of the same name may be the pipeline's own
    (``subtask.snapshot()``), so only a guarded class's record is checked under it."""
    out: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                out.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        out.add(stmt.target.id)
    return out


def violations() -> list[str]:
    paths = sorted(PIPELINE.rglob("*.py"))
    trees = {p: ast.parse(p.read_text(), str(p)) for p in paths}
    records = data_members()
    members = {
        n: c
        for n, c in fastimpl_members().items()
        if n in records or n not in pipeline_names(list(trees.values()))
    }
    vocabulary = spec_vocabulary()
    allowed = {n for names in PUBLIC_MEMBERS.values() for n in names}
    submodules = _submodules()
    found: list[str] = []
    for path, tree in trees.items():
        rel = path.relative_to(ROOT)
        for line, what in import_violations(tree, submodules):
            found.append(f"{rel}:{line}: {what}")
        for line, what in attribute_violations(tree, members, vocabulary, allowed):
            found.append(f"{rel}:{line}: {what}")
    return found


def _key(v: str) -> str:
    """A violation without its line number: lines move when code around them changes."""
    file, _line, what = v.split(":", 2)
    return f"{file}:{what}"


def test_pipeline_uses_only_the_public_api() -> None:
    found = violations()
    print("\n".join(found))
    remaining = Counter(line for line in REMAINING_FILE.read_text().splitlines() if line.strip())
    now = Counter(_key(v) for v in found)
    new = now - remaining
    gone = remaining - now
    assert not new, "new uses of fastimpl outside its public API:\n" + "\n".join(
        v for v in found if _key(v) in new
    )
    assert not gone, (
        f"fixed, so remove from {REMAINING_FILE.name} (the count only goes down):\n"
        + "\n".join(sorted(gone))
    )


def test_the_check_catches_what_it_should() -> None:
    source = (
        "import fastimpl.taskmanager\n"
        "from fastimpl.coordinator import CheckpointCoordinator\n"
        "from fastimpl import engine, parties\n"
        "from fastimpl.parties import TaskManager\n"
        "co.engine = e\n"
        "tm.m.pfiles\n"
        "co.trigger()\n"
        "msg.checkpoint\n"
        "co._tms\n"
    )
    tree = ast.parse(source)
    assert list(import_violations(tree, _submodules())) == [
        (1, "import fastimpl.taskmanager"),
        (2, "from fastimpl.coordinator import"),
        (3, "from fastimpl import engine"),
    ]
    members = fastimpl_members() | {"_tms": {"CheckpointCoordinator"}}
    allowed = {n for names in PUBLIC_MEMBERS.values() for n in names}
    found = sorted(attribute_violations(tree, members, spec_vocabulary(), allowed))
    assert [line for line, _ in found] == [5, 6, 6, 9], found
