"""The ``flightfeed`` command. Subcommands live in their own modules and load lazily, so
``flightfeed serve`` never imports torch and ``flightfeed demo`` never imports FastAPI or h5py.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``. This is the
one place (with those ``run`` functions) where settings enter from the environment.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from flightfeed.wire.errors import FlightFeedError

__all__ = ["main", "SUBCOMMANDS"]

#: name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("flightfeed.server.serve", "serve datasets over Arrow Flight (and the metrics sidecar)"),
    "demo": ("flightfeed.client._cli.demo", "make a small dataset, serve it, read one epoch into torch"),
    "convert": ("flightfeed.server.tools.convert.cli", "convert HDF5/Parquet/NumPy/image folders into .arrow shards"),
    "inspect": ("flightfeed.server.tools.inspect", "schema, rows, shards and bytes of a path, s3:// URI or server"),
    "bench": ("flightfeed.client._cli.bench", "measure client throughput and stall against a server"),
    "sidecar": ("flightfeed.server.sidecar.cli", "run the metrics sidecar as its own process"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``flightfeed SUB: error: ...`` and where every flag is listed,
    instead of the whole usage block (docs/cli.md)."""

    def error(self, message: str) -> NoReturn:
        lists = "every flag" if " " in self.prog else "the commands"
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists {lists})\n")


def _unknown(sub: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """``unrecognized arguments: ...``, naming the flag each misspelt one is close to."""
    flags = [f for action in sub._actions for f in action.option_strings if f.startswith("--")]
    close: list[tuple[str, str]] = []
    for extra in extras:
        given = extra.partition("=")[0]
        match = difflib.get_close_matches(given, flags, n=1, cutoff=0.6) if given.startswith("-") else []
        close += [(given, match[0])] if match else []
    named = [m if len(close) == 1 else f"{m} (for {g})" for g, m in close]
    hint = f"; did you mean {', '.join(named)}?" if close else ""
    return f"unrecognized arguments: {' '.join(extras)}{hint}"


def _parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser], str | None]:
    parser = _Parser(
        prog="flightfeed",
        description="flightfeed: Arrow Flight data serving that keeps GPUs fed.",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    # only the chosen subcommand's module is imported
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        parsers[name] = sub = subs.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(sub)
    return parser, parsers, chosen


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser, parsers, chosen = _parser(args_list)
    args, extras = parser.parse_known_args(args_list)
    if extras:  # named by the subcommand whose flags they miss, not by the top-level parser
        (parsers[chosen] if chosen is not None else parser).error(_unknown(parsers.get(chosen or "", parser), extras))
    if chosen is None or args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    module = importlib.import_module(SUBCOMMANDS[chosen][0])
    try:
        code: int = module.run(args)
        return code
    except FlightFeedError as exc:
        print(f"flightfeed {chosen}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `flightfeed inspect ... | head`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit's flush of stdout would fail again
        return 141


if __name__ == "__main__":
    sys.exit(main())
