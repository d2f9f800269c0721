"""The documentation (issue 36): the README says what the project is, how to start and
where each part's guide is, within its size; the site (mkdocs.yml, ``make docs``) lists
every page once, and its generated pages (docs/hooks.py) are made from what they
describe, so none can go stale. ``make docs`` itself (``mkdocs build --strict``, CI) finds
broken links; these tests pin the rules the hook applies and the README's contents."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mkdocs.config import load_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def _nav_pages(entries: list[Any]) -> list[str]:
    out: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_the_readme_is_short_and_says_how_to_start() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 15_000
    for command in ("make demo", "make test", "make docs"):
        assert f"`{command}" in text, command


@pytest.mark.parametrize(
    ("offering", "guide"),
    [
        ("the library", "docs/library.md"),
        ("the streaming job", "docs/stream.md"),
        ("the storage audit of our checkpoints", "docs/audit.md"),
        ("the audit of Flink's and Spark's checkpoints", "docs/foreign-audit.md"),
        ("the conformance suite", "CONFORMANCE.md"),
        ("model checking", "tla/README.md"),
    ],
)
def test_the_readme_table_gives_each_offering_an_example_and_its_guide(
    offering: str, guide: str
) -> None:
    rows = [
        line for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| {offering}")
    ]
    assert len(rows) == 1, offering
    cells = [c.strip() for c in rows[0].strip("|").split(" | ")]
    assert len(cells) == 4 and cells[2].startswith("`"), rows[0]  # the example
    assert f"]({guide}" in cells[3], rows[0]
    assert (ROOT / guide).exists()


def test_the_nav_lists_every_page_once_and_only_pages_that_exist() -> None:
    nav = _nav_pages(load_config(str(ROOT / "mkdocs.yml"))["nav"])
    generated = {*hooks.PAGES_FROM_FILES, hooks.CLI_PAGE, hooks.RESULTS_PAGE}
    written = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert sorted(nav) == sorted(set(nav))
    assert set(nav) == written | generated
    assert not written & generated  # a generated page would hide a written one
    assert all((ROOT / source).exists() for source in hooks.PAGES_FROM_FILES.values())


@pytest.mark.parametrize(
    ("page", "link", "site"),
    [
        ("index.md", "[stream](docs/stream.md)", "[stream](stream.md)"),
        ("index.md", "[a](docs/library.md#using-the-reference-model)",
         "[a](library.md#using-the-reference-model)"),
        ("index.md", "[spec](spec/SPEC.md)", "[spec](spec.md)"),
        ("conformance.md", "[d](docs/flink-divergences.md)", "[d](flink-divergences.md)"),
        ("audit.md", "[c](../CONFORMANCE.md)", "[c](conformance.md)"),
        ("audit.md", "[f](foreign-audit.md)", "[f](foreign-audit.md)"),
        ("flink-divergences.md", "[r](flink-repros/x.py)", "[r](flink-repros/x.py)"),
        ("model-checking.md", "[bench](../bench/README.md)", "[bench](benchmarks.md)"),
        # source code has no page: its path, in code type
        ("audit.md", "[the CLI](../pipeline/cli.py)", "the CLI (`pipeline/cli.py`)"),
        ("index.md", "[`ckpt/cli.py`](ckpt/cli.py)", "`ckpt/cli.py`"),
        ("index.md", "[web](https://example.org/a.md)", "[web](https://example.org/a.md)"),
        ("index.md", "[here](#quick-start)", "[here](#quick-start)"),
    ],
)
def test_links_written_for_the_repository_point_at_the_sites_pages(
    page: str, link: str, site: str
) -> None:
    assert hooks.site_links(f"see {link}.", page) == f"see {site}."


def test_the_cli_reference_documents_every_command_as_its_help_does() -> None:
    import typer

    from ckpt.cli import app

    text = hooks.cli_markdown()
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name in group.commands:
        assert f"## `ckpt {name}`" in text, name
    # help text is shown as written: an option's <placeholder> is no HTML tag
    assert "ckpt-audit-deletions-&lt;UTC time&gt;.jsonl" in text


def test_the_help_escaping_keeps_typers_markup_and_code() -> None:
    text = "**Usage**:\n\n```console\n$ ckpt <x>\n```\n\n* `--a <str>`: keep _this_ <as> [is]"
    assert hooks.escape_help(text) == (
        "**Usage**:\n\n```console\n$ ckpt <x>\n```\n\n"
        "* `--a <str>`: keep \\_this\\_ &lt;as&gt; \\[is\\]"
    )


def test_the_benchmark_page_has_every_figure_of_results_json() -> None:
    results = json.loads((ROOT / "bench" / "results.json").read_text(encoding="utf-8"))
    text = hooks.results_markdown(results)
    figures = {k: v for k, v in results.items() if k != "machine"}
    assert figures
    for figure in figures.values():
        assert f"## {figure['title']}" in text
        for case in figure.get("cases", []):
            assert re.search(rf"\| {re.escape(case['label'])} \|", text), case["label"]
    missed = [f["title"] for f in figures.values() if f.get("met") is False]
    assert text.count("**MISSED**") == len(missed)
