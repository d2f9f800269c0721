"""The layout keeps its promises (issue 16): no module imports a test module, and the
packages the wheel ships import nothing that stays in the repository."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("spec", "refimpl", "fastimpl", "pipeline", "conformance", "ckpt")
REPOSITORY_ONLY = ("model_tests", "bench", "examples", "tests")
FOLDERS = (*PRODUCT, *REPOSITORY_ONLY)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module named by an import statement of ``path`` (at any depth, lazy imports
    included), with its line; ``from a import b`` counts as ``a`` and ``a.b``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def sources(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def test_the_scan_sees_the_imports_it_looks_for(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import tests.test_a\nfrom tests import test_b\n"
        "def f():\n    from model_tests.twins import TWINS\n",
        encoding="utf-8",
    )
    names = [n for _, n in imports(probe)]
    assert "tests.test_a" in names and "tests.test_b" in names
    assert "model_tests.twins" in names


def test_no_module_imports_a_test_module() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources(FOLDERS)
        for line, name in imports(path)
        if any(part.startswith("test_") for part in name.split("."))
    ]
    assert found == []


def test_the_shipped_packages_import_nothing_left_in_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources(PRODUCT)
        for line, name in imports(path)
        if name.split(".")[0] in REPOSITORY_ONLY
    ]
    assert found == []


OURS = (*PRODUCT, *REPOSITORY_ONLY)
LAYER_RULES: dict[str, tuple[str, ...]] = {
    # what each layer may import of ours (besides itself): the brief's one-way imports
    "spec": (),
    "refimpl": ("spec",),
    "fastimpl": ("spec",),
    "pipeline": ("spec", "fastimpl"),
}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """``spec`` imports nothing of ours; ``refimpl`` and ``fastimpl`` import ``spec`` and
    never each other (a model and a product written from one reading fail together: they
    must not share code either); ``pipeline`` imports ``fastimpl`` and ``spec``."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for layer, allowed in LAYER_RULES.items()
        for path in sources((layer,))
        for line, name in imports(path)
        if name.split(".")[0] in OURS and name.split(".")[0] not in (layer, *allowed)
    ]
    assert found == []


def module_name(root: Path, path: Path) -> str:
    """``a/b.py`` -> ``a.b``; ``a/__init__.py`` -> ``a``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """The strongly connected components of more than one module of the import graph of
    ``packages`` under ``root`` (Tarjan's algorithm), each sorted. Every import counts,
    lazy and ``TYPE_CHECKING`` ones included: hiding an import does not break a circle."""
    files = {module_name(root, p): p for f in packages for p in sorted((root / f).rglob("*.py"))}
    graph = {
        m: sorted({n for _, n in imports(p) if n in files and n != m}) for m, p in files.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(graph[start]))]
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(graph[step])))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_cycle_scan_finds_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "a.py").write_text("from probe.b import g\n", encoding="utf-8")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import probe.a\n"
        "def g():\n    from probe import a\n",
        encoding="utf-8",
    )
    (pkg / "c.py").write_text("import probe.a\n", encoding="utf-8")
    assert import_cycles(tmp_path, ("probe",)) == [["probe.a", "probe.b"]]
    (pkg / "b.py").write_text("def g():\n    pass\n", encoding="utf-8")
    assert import_cycles(tmp_path, ("probe",)) == []


def test_no_import_circles_in_the_product_packages() -> None:
    """Modules that import each other (at any depth, lazily or for annotations only) are
    one module split in files: none may be read, tested or changed alone. Each product
    package's imports form a graph without a circle (issue 34: break one by moving what
    both need below both, or by passing in what the lower one calls)."""
    cycles = import_cycles(ROOT, PRODUCT)
    assert cycles == [], "modules importing each other: " + "; ".join(
        "{" + ", ".join(c) + "}" for c in cycles
    )
