"""The ``flightfeed`` command. Subcommands live in their own modules and load lazily, so
``flightfeed serve`` never imports torch and ``flightfeed demo`` never imports FastAPI or h5py.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``. This is the
one place (with those ``run`` functions) where settings enter from the environment.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

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


def _parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(
        prog="flightfeed",
        description="flightfeed: Arrow Flight data serving that keeps GPUs fed.",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    # only the chosen subcommand's module is imported
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(sub)
    return parser, chosen


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser, chosen = _parser(args_list)
    args = parser.parse_args(args_list)
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


if __name__ == "__main__":
    sys.exit(main())
