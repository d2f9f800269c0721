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

