"""MkDocs hooks (mkdocs.yml ``hooks:``): pages made from the repository at build time, so they cannot drift.

- ``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; the build replaces it with a table of
  the subcommands (their one-line help from ``flightfeed.server.cli.SUBCOMMANDS``) and each
  subcommand's ``--help`` (``tests/architecture/test_doc_blocks.py`` checks the flags the other
  pages name).
- ``docs/index.md`` holds the marker ``<!-- readme -->``; the build replaces it with README.md, its
  ``docs/`` links made relative to the site.
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
README_MARKER = "<!-- readme -->"
ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``flightfeed NAME``, as ``flightfeed.server.cli`` builds it."""
    from flightfeed.server.cli import SUBCOMMANDS

    module, help_text = SUBCOMMANDS[name]
    parser = argparse.ArgumentParser(
        prog=f"flightfeed {name}",
        description=help_text,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=WIDTH),
    )
    importlib.import_module(module).add_arguments(parser)
    return parser


def cli_reference() -> str:
    """Markdown: the commands table and every subcommand's ``--help``."""
    from flightfeed.server.cli import SUBCOMMANDS

    lines = ["| command | what |", "|---|---|"]
    lines += [f"| [`flightfeed {name}`](#flightfeed-{name}) | {text} |" for name, (_, text) in SUBCOMMANDS.items()]
    for name in SUBCOMMANDS:
        lines += ["", f"## `flightfeed {name}`", "", "```text", subcommand_parser(name).format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def readme_for_site() -> str:
    """README.md with its links into ``docs/`` made relative to the site, and its links to other files
    of the repository shown as paths (the site holds only ``docs/``)."""

    def link(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        if target.startswith(("http://", "https://")):
            return m.group(0)
        if target.startswith("docs/") and target != "docs/":
            return f"[{text}]({target.removeprefix('docs/')})"
        return f"`{target}`" if text.strip("`/") == target.strip("/") else f"{text} (`{target}`)"

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\[([^\]]+)\]\(([^)]+)\)", link, text)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if README_MARKER in markdown:
        markdown = markdown.replace(README_MARKER, readme_for_site())
    return markdown
