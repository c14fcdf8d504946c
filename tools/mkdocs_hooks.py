"""MkDocs hooks (mkdocs.yml ``hooks:``): the CLI reference is rendered from argparse at build time.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; the build replaces it with a table of
the subcommands (their one-line help from ``flightfeed.server.cli.SUBCOMMANDS``) and each
subcommand's ``--help``, so the page cannot drift from the parsers
(``tests/architecture/test_doc_blocks.py`` checks the flags the other pages name).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

MARKER = "<!-- cli-reference -->"
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


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
