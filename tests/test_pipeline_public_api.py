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
that defines ``<name>`` itself, nor ``x.<name>`` where the pipeline's own annotations
(which ``mypy --strict`` holds the code to) make ``x`` an instance of a ``pipeline`` class
that defines ``<name>`` (``loc.fs()`` of a ``loc: Location``, ``run.storage`` of a
``StreamRun``: the store's words are common words, and the pipeline's records may use them).
Every other match is a violation. What is left of them is
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
    names |= _self_stores(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _self_stores(tree: ast.AST) -> set[str]:
    """The names of every ``self.<name> = ...`` in ``tree``: instance attributes."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


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
        names = _class_names(cls)
        for node in ast.walk(cls):
            owner[node] = names  # the innermost class wins: walked outer first
    return owner


ClassKey = tuple[str, str]
"""A ``pipeline`` class: its module and its name."""


def _class_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its methods, class attributes and ``self.<name>`` stores."""
    names = _self_stores(cls)
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return names


class PipelineTypes:
    """The ``pipeline`` classes and what the pipeline's annotations say of its names.

    Deliberately small: a name is typed by its annotation (a parameter's, or ``x: C``),
    or else by its assignments when every one of them is a ``pipeline`` class's
    constructor, a ``pipeline`` function or method whose return annotation names one, or
    another name so typed; ``x.a`` is typed by the annotation of the field ``a`` of
    ``x``'s class. A name also bound any other way (a loop, a tuple, ``with``) is untyped,
    and so checked as before. A class deriving from a ``fastimpl`` one is not typed (what
    it reads may be its base's). Besides the pipeline's classes, an annotation may name a
    class the module imports from a library other than ``fastimpl`` (``DataFrame``)."""

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        self.trees = trees
        self.scope = {mod: self._module_scope(mod, tree) for mod, tree in trees.items()}
        self.classes: dict[ClassKey, ast.ClassDef] = {
            (mod, n.name): n
            for mod, tree in trees.items()
            for n in tree.body
            if isinstance(n, ast.ClassDef)
        }
        self.functions: dict[tuple[str, ...], ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for mod, tree in trees.items():
            for n in tree.body:
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions[(mod, n.name)] = n
                elif isinstance(n, ast.ClassDef):
                    for m in n.body:
                        if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef):
                            self.functions[(mod, n.name, m.name)] = m
        self._members: dict[ClassKey, set[str]] = {}
        self.external: dict[str, dict[str, ClassKey]] = {
            mod: {
                a.asname or a.name: (n.module, a.name)
                for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
                if not (_is_fastimpl_module(n.module) or n.module.split(".")[0] == "pipeline")
                for a in n.names
            }
            for mod, tree in trees.items()
        }
        self.from_fastimpl: dict[str, set[str]] = {
            mod: {
                (a.asname or a.name).split(".")[0]
                for n in ast.walk(tree)
                if isinstance(n, ast.Import | ast.ImportFrom)
                and (
                    (isinstance(n, ast.ImportFrom) and _is_fastimpl_module(n.module or ""))
                    or (
                        isinstance(n, ast.Import)
                        and any(_is_fastimpl_module(a.name) for a in n.names)
                    )
                )
                for a in n.names
            }
            for mod, tree in trees.items()
        }

    def _module_scope(self, mod: str, tree: ast.Module) -> dict[str, tuple[str, ...]]:
        """Each name bound at a module's top level to a ``pipeline`` class, function or
        module: ``(module, name)`` or ``(module,)``."""
        out: dict[str, tuple[str, ...]] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                for a in n.names:
                    if f"{n.module}.{a.name}" in self.trees:
                        out[a.asname or a.name] = (f"{n.module}.{a.name}",)
                    elif n.module in self.trees:
                        out[a.asname or a.name] = (n.module, a.name)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.asname and a.name in self.trees:
                        out[a.asname] = (a.name,)
        for n in tree.body:
            if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                out[n.name] = (mod, n.name)
        return out

    def _external_members(self, key: ClassKey) -> set[str]:
        try:
            cls = getattr(importlib.import_module(key[0]), key[1])
        except (ImportError, AttributeError):
            return set()
        return set(dir(cls)) if inspect.isclass(cls) else set()

    def _fastimpl_derived(self, key: ClassKey, seen: frozenset[ClassKey] = frozenset()) -> bool:
        """Whether a ``pipeline`` class derives, at any depth, from a ``fastimpl`` one."""
        for base in self.classes[key].bases:
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.from_fastimpl[key[0]]:
                return True
            b = self._ref(key[0], base)
            if b is not None and b in self.classes and b not in seen:
                if self._fastimpl_derived((b[0], b[1]), seen | {key}):
                    return True
        return False

    def fields(self, key: ClassKey) -> dict[str, frozenset[ClassKey] | None]:
        """The classes a ``pipeline`` class's annotated fields hold (its bases' too)."""
        if key not in self.classes:
            return {}
        out: dict[str, frozenset[ClassKey] | None] = {}
        cls = self.classes[key]
        for base in cls.bases:
            b = self._ref(key[0], base)
            if b is not None and b in self.classes and b != key:
                out |= self.fields((b[0], b[1]))
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out[stmt.target.id] = self.annotation(key[0], stmt.annotation)
        return out

    def members(self, key: ClassKey) -> set[str]:
        """What a ``pipeline`` class defines, with what its ``pipeline`` bases define; what
        a library's class has."""
        if key not in self.classes:
            return self._external_members(key)
        if key not in self._members:
            self._members[key] = set()  # a cycle ends here
            cls = self.classes[key]
            names = _class_names(cls)
            for base in cls.bases:
                b = self._ref(key[0], base)
                if b is not None and b in self.classes:
                    names |= self.members((b[0], b[1]))
            self._members[key] = names
        return self._members[key]

    def _ref(self, mod: str, expr: ast.expr) -> tuple[str, ...] | None:
        """What a ``Name`` or ``module.Name`` refers to in ``mod``, if it is pipeline's."""
        if isinstance(expr, ast.Name):
            return self.scope[mod].get(expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            m = self.scope[mod].get(expr.value.id)
            if m is not None and len(m) == 1:
                return (m[0], expr.attr)
        return None

    def annotation(self, mod: str, expr: ast.expr | None) -> frozenset[ClassKey] | None:
        """The ``pipeline`` classes an annotation names (``C``, ``C | None``, ``"C"``);
        ``None`` if it names anything else."""
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                return self.annotation(mod, ast.parse(expr.value, mode="eval").body)
            except SyntaxError:
                return None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            left, right = self.annotation(mod, expr.left), self.annotation(mod, expr.right)
            return None if left is None or right is None else left | right
        if isinstance(expr, ast.Constant) and expr.value is None:
            return frozenset()
        ref = self._ref(mod, expr)
        if ref is not None and len(ref) == 2 and ref in self.classes:
            key = (ref[0], ref[1])
            return None if self._fastimpl_derived(key) else frozenset({key})
        if isinstance(expr, ast.Name) and expr.id in self.external[mod]:
            return frozenset({self.external[mod][expr.id]})
        return None

    def _returns(self, mod: str, call: ast.Call) -> frozenset[ClassKey] | None:
        """What a call gives by the pipeline's annotations: a class's instance, or what a
        function's or a class's (static or class) method's return annotation names."""
        ref = self._ref(mod, call.func)
        if ref is not None and len(ref) == 2:
            if ref in self.classes:
                key = (ref[0], ref[1])
                return None if self._fastimpl_derived(key) else frozenset({key})
            fn = self.functions.get(ref)
            return None if fn is None else self.annotation(ref[0], fn.returns)
        f = call.func
        if isinstance(f, ast.Attribute):
            owner = self._ref(mod, f.value)
            if owner is not None and len(owner) == 2 and owner in self.classes:
                method = self.functions.get((*owner, f.attr))
                if method is not None:
                    return self.annotation(owner[0], method.returns)
        return None

    def names(self, mod: str) -> dict[ast.AST, dict[str, frozenset[ClassKey]]]:
        """For each node of ``mod``, the names of its scope (and the enclosing ones) that
        the annotations type as ``pipeline`` classes."""
        out: dict[ast.AST, dict[str, frozenset[ClassKey]]] = {}

        def visit(scope: ast.AST, outer: dict[str, frozenset[ClassKey]]) -> None:
            typed = dict(outer)
            local = self._scope_types(mod, scope)
            for name in self._bound(scope):
                typed.pop(name, None)
            typed.update(local)
            inner: list[ast.AST] = []
            stack = list(ast.iter_child_nodes(scope))
            while stack:
                node = stack.pop()
                out[node] = typed
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    inner.append(node)
                else:
                    stack.extend(ast.iter_child_nodes(node))
            for node in inner:
                visit(node, typed)

        visit(self.trees[mod], {})
        return out

    @staticmethod
    def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
        """The nodes of a scope, not those of the functions inside it."""
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                stack.extend(ast.iter_child_nodes(node))

    def _bound(self, scope: ast.AST) -> set[str]:
        out: set[str] = set()
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = scope.args
            out |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
            out |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        for node in self._own_nodes(scope):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                out.add(node.id)
        return out

    def _scope_types(self, mod: str, scope: ast.AST) -> dict[str, frozenset[ClassKey]]:
        declared: dict[str, frozenset[ClassKey] | None] = {}
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            a = scope.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                declared[arg.arg] = self.annotation(mod, arg.annotation)
        if isinstance(scope, ast.Lambda):
            a = scope.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                declared[arg.arg] = None
        for node in self._own_nodes(scope):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                declared[node.target.id] = self.annotation(mod, node.annotation)
        # Unannotated names: typed only when every binding is a typed call or name.
        values: dict[str, list[ast.expr | None]] = {}
        for node in self._own_nodes(scope):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                values.setdefault(node.targets[0].id, []).append(node.value)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                if not any(
                    isinstance(p, ast.Assign) and p.targets == [node]
                    for p in self._own_nodes(scope)
                ):
                    values.setdefault(node.id, []).append(None)  # any other binding
        typed = {n: t for n, t in declared.items() if t}
        for _ in range(len(values) + 1):  # names typed by names: to a fixed point
            for name, vs in values.items():
                if name in declared:
                    continue
                kinds: set[ClassKey] = set()
                for v in vs:
                    t: frozenset[ClassKey] | None = None
                    if isinstance(v, ast.Call):
                        t = self._returns(mod, v)
                    elif isinstance(v, ast.Name):
                        t = typed.get(v.id)
                    if not t:
                        break
                    kinds |= t
                else:
                    typed[name] = frozenset(kinds)
        return typed

    def classes_of(
        self, expr: ast.expr, names: dict[str, frozenset[ClassKey]]
    ) -> frozenset[ClassKey] | None:
        """The classes the annotations give ``expr``: a typed name, or a field of one."""
        if isinstance(expr, ast.Name):
            return names.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owners = self.classes_of(expr.value, names)
            if not owners:
                return None
            out: set[ClassKey] = set()
            for k in owners:
                t = self.fields(k).get(expr.attr)
                if not t:
                    return None
                out |= t
            return frozenset(out)
        return None

    def receiver_defines(self, node: ast.Attribute, names: dict[str, frozenset[ClassKey]]) -> bool:
        """Whether ``node`` reads a name off a value the annotations type as classes
        (the pipeline's, or a library's) that each define it."""
        kinds = self.classes_of(node.value, names)
        return bool(kinds) and all(node.attr in self.members(k) for k in kinds or ())


def attribute_violations(
    tree: ast.AST,
    members: dict[str, set[str]],
    vocabulary: set[str],
    allowed: set[str],
    types: PipelineTypes | None = None,
    module: str = "",
) -> Iterator[tuple[int, str]]:
    own = _own_members(tree)
    typed = types.names(module) if types is not None else {}
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
        if types is not None and types.receiver_defines(node, typed.get(node, {})):
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations() -> list[str]:
    paths = sorted(PIPELINE.rglob("*.py"))
    trees = {p: ast.parse(p.read_text(), str(p)) for p in paths}
    records = data_members()
    own = pipeline_names(list(trees.values()))
    members = {n: c for n, c in fastimpl_members().items() if n in records or n not in own}
    vocabulary = spec_vocabulary()
    allowed = {n for names in PUBLIC_MEMBERS.values() for n in names}
    submodules = _submodules()
    modules = {_module_name(p): t for p, t in trees.items()}
    types = PipelineTypes(modules)
    found: list[str] = []
    for path, tree in trees.items():
        rel = path.relative_to(ROOT)
        for line, what in import_violations(tree, submodules):
            found.append(f"{rel}:{line}: {what}")
        for line, what in attribute_violations(
            tree, members, vocabulary, allowed, types, _module_name(path)
        ):
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


def test_the_pipelines_own_typed_values_are_not_the_stores() -> None:
    """A read off a value the pipeline's annotations type as its own class (directly, by
    a constructor or a function's return annotation, or as an annotated field of one)
    is that class's; an untyped name, a class deriving from a ``fastimpl`` one, or a
    name the class does not define is checked as before."""
    lib = ast.parse(
        "from attrs import frozen\n"
        "from fastimpl.parties import CheckpointCoordinator\n"
        "@frozen\n"
        "class Order:\n"
        "    watermark: int\n"
        "@frozen\n"
        "class Run:\n"
        "    order: Order\n"
        "class Patched(CheckpointCoordinator):\n"
        "    watermark: int\n"
        "def make() -> Order: ...\n"
    )
    user = ast.parse(
        "from pipeline.lib import Order, Patched, Run, make\n"
        "def f(o: Order, r: Run, p: Patched, co) -> None:\n"
        "    o.watermark\n"
        "    r.order.watermark\n"
        "    made = make()\n"
        "    made.watermark\n"
        "    p.watermark\n"
        "    co.watermark\n"
        "    o.pending\n"
        "    for made2 in (o,):\n"
        "        made2.watermark\n"
    )
    types = PipelineTypes({"pipeline.lib": lib, "pipeline.user": user})
    members = {"watermark": {"CheckpointCoordinator"}, "pending": {"CheckpointCoordinator"}}
    found = sorted(attribute_violations(user, members, set(), set(), types, "pipeline.user"))
    assert [line for line, _ in found] == [7, 8, 9, 11], found
