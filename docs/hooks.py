"""The documentation site's generated pages (mkdocs.yml ``hooks:``; ``make docs``).

Some pages of the site live elsewhere in the repository, where their readers on the
repository find them (the README, CONFORMANCE.md, the spec, tla/README.md,
bench/README.md), and some are made from the code (the ``ckpt`` command reference from
the command tree, the benchmark tables from ``bench/results.json``). Each is made afresh
by every build, in memory, so no copy is committed to go stale and nothing is written
into ``docs/``.

Links are written for the repository (``docs/stream.md`` in the README, ``../spec/SPEC.md``
in a guide); on the site each points to the page made from that file, and a link to a
file that is no page (source code) becomes the file's path in code type, since the site
has no copy of it to point to.
"""

from __future__ import annotations

import html
import json
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parent.parent

PAGES_FROM_FILES: dict[str, str] = {
    "index.md": "README.md",
    "conformance.md": "CONFORMANCE.md",
    "spec.md": "spec/SPEC.md",
    "model-checking.md": "tla/README.md",
    "benchmarks.md": "bench/README.md",
}
"""Site page -> the repository file it shows, as it is."""

CLI_PAGE = "cli.md"
RESULTS_PAGE = "benchmark-results.md"
RESULTS = "bench/results.json"

PAGE_OF_FILE = {source: page for page, source in PAGES_FROM_FILES.items()}
LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def _repo_path(page_uri: str) -> str:
    """The repository file a page is written in (links in it are relative to that)."""
    return PAGES_FROM_FILES.get(page_uri, f"docs/{page_uri}")


def site_links(markdown: str, page_uri: str) -> str:
    """``markdown`` of the page ``page_uri`` with every relative link pointed at the site's
    page for its file, or, for a file that is no page, replaced by the file's path."""
    here = posixpath.dirname(_repo_path(page_uri))
    page_dir = posixpath.dirname(page_uri) or "."

    def one(m: re.Match[str]) -> str:
        bang, text, target = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, hashmark, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(here, path))
        if resolved in PAGE_OF_FILE:
            doc = PAGE_OF_FILE[resolved]
        elif resolved.startswith("docs/"):
            doc = resolved.removeprefix("docs/")
        else:
            return text if resolved in text else f"{text} (`{resolved}`)"
        return f"{bang}[{text}]({posixpath.relpath(doc, page_dir)}{hashmark}{anchor})"

    return LINK.sub(one, markdown)


MARKUP = re.compile(r"^(\* |\*\*\w+\*\*:|#+ )")
"""What typer's markdown itself writes at the start of a line: list items, its **Usage**:
headings and the command headings."""
SPECIAL = re.compile(r"([\\`*_\[\]])")


def _plain(text: str) -> str:
    # typer escapes help text for HTML, some of it twice (``&amp;lt;`` for ``<``): undone
    # down to the text --help prints, then escaped once for markdown and HTML.
    while (unescaped := html.unescape(text)) != text:
        text = unescaped
    escaped = SPECIAL.sub(r"\\\1", text)
    return escaped.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_help(markdown: str) -> str:
    """typer's markdown with the help texts in it shown as plain text: outside code blocks,
    code spans and typer's own markup, every character markdown would read as markup
    (``<UTC time>`` as an HTML tag, ``\\`` as an escape, ``_`` and ``*`` as emphasis) is
    escaped, so the page says what ``--help`` says."""
    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith("```"):
            out.append(line)
            continue
        m = MARKUP.match(line)
        prefix = m.group(0) if m else ""
        parts = re.split(r"(`[^`]*`)", line[len(prefix) :])
        out.append(prefix + "".join(p if p.startswith("`") else _plain(p) for p in parts))
    return "\n".join(out)


def cli_markdown() -> str:
    """The ``ckpt`` reference: typer's own documentation of the command tree
    (what ``typer ckpt.cli utils docs --name ckpt`` prints), so it says what ``--help`` says."""
    import typer
    from typer.cli import get_docs_for_click
    from typer.core import MARKUP_MODE_KEY

    from ckpt.cli import app

    command = typer.main.get_command(app)
    # As `typer ... utils docs` sets it up: a context, with the app's markup mode in it.
    ctx = typer.Context(command, info_name="ckpt", obj={MARKUP_MODE_KEY: app.rich_markup_mode})
    body = get_docs_for_click(obj=command, ctx=ctx, name="ckpt")
    return (
        "# Command line reference: `ckpt`\n\n"
        "Made by `make docs` from the commands themselves (`ckpt/cli.py`); "
        "`ckpt COMMAND --help` prints the same.\n\n" + escape_help(body.split("\n", 1)[1])
    )


def _number(x: Any) -> str:
    if not isinstance(x, int | float) or isinstance(x, bool):
        return "" if x is None else str(x)
    if x == 0 or 0.01 <= abs(x) < 1e6:
        return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return f"{x:.3g}"


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def results_markdown(results: dict[str, Any]) -> str:
    """The figures of a ``bench/results.json`` (``make bench``) as tables: per figure its
    headline against its goal, then one row per case. The numbers are the file's, as
    measured; how each is measured and read is on the benchmarks page."""
    machine = results.get("machine", {})
    out = [
        "# Benchmark results",
        "",
        f"Made by `make docs` from `{RESULTS}`, written by `make bench` "
        "([how each figure is measured and read](benchmarks.md)).",
        "",
        f"Measured {machine.get('date', '?')} on {machine.get('cpus_usable', '?')} usable CPUs, "
        f"Python {machine.get('python', '?')}, commit `{machine.get('git_commit', '?')}`, "
        f"{machine.get('repeats', '?')} runs per timing (medians); load average "
        f"{machine.get('load_average_at_start', '?')} at the start, "
        f"{machine.get('load_average_at_end', '?')} at the end.",
    ]
    if machine.get("note"):
        out += ["", f"Note: {machine['note']}."]
    out += [
        "",
        "| figure | value | baseline | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    figures = [(k, v) for k, v in results.items() if k != "machine" and isinstance(v, dict)]
    for _, f in figures:
        met = "yes" if f.get("met") is True else "**MISSED**" if f.get("met") is False else ""
        out.append(
            f"| {_cell(f.get('title', ''))} | {_number(f.get('value'))} {f.get('unit', '')} "
            f"| {_number(f.get('baseline'))} | {_number(f.get('ratio'))} "
            f"| {_cell(f.get('goal', ''))} | {met} |"
        )
    for key, f in figures:
        out += ["", f"## {_cell(f.get('title', key))}", "", f"`{key}`, in {f.get('unit', '')}."]
        if f.get("baseline_what"):
            out.append(f"Baseline: {_cell(f['baseline_what'])}.")
        if f.get("ratio_what"):
            out.append(f"Ratio: {_cell(f['ratio_what'])}.")
        cases = f.get("cases") or []
        if cases:
            out += ["", "| case | value | baseline | ratio | note |", "|---|---|---|---|---|"]
            out += [
                f"| {_cell(c.get('label', ''))} | {_number(c.get('value'))} "
                f"| {_number(c.get('baseline'))} | {_number(c.get('ratio'))} "
                f"| {_cell(c.get('note', ''))} |"
                for c in cases
            ]
    return "\n".join(out) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the pages made from files outside ``docs/`` and from the code."""
    for page, source in PAGES_FROM_FILES.items():
        text = (REPO / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=text))
    files.append(File.generated(config, CLI_PAGE, content=cli_markdown()))
    results = REPO / RESULTS
    text = (
        results_markdown(json.loads(results.read_text(encoding="utf-8")))
        if results.exists()
        else "# Benchmark results\n\nNo `bench/results.json`: run `make bench`.\n"
    )
    files.append(File.generated(config, RESULTS_PAGE, content=text))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point each page's relative links at the site's pages."""
    return site_links(markdown, page.file.src_uri)
