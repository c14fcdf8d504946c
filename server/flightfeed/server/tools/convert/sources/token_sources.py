"""``flightfeed convert --from nanogpt|megatron``: which token source a kind opens, and the checks
of the token options (``--eot``, ``--token-dtype``) against the kind."""

from __future__ import annotations

import argparse

from flightfeed.server.tools.convert.sources.split_files import refuse_mixed_splits
from flightfeed.server.tools.convert.sources.tabular import find_files, require
from flightfeed.server.tools.convert.sources.tokens import TOKEN_DTYPES, TokenDocuments
from flightfeed.server.tools.convert.sources.tokens_megatron import megatron_source
from flightfeed.server.tools.convert.sources.tokens_nanogpt import nanogpt_source
from flightfeed.wire.errors import ConfigError

__all__ = ["TOKEN_KINDS", "open_token_source", "refuse_token_options", "add_token_arguments"]

#: the ``--from`` kinds that are token corpora
TOKEN_KINDS = ("nanogpt", "megatron")


def refuse_token_options(kind: str, eot: int | None, token_dtype: str | None) -> None:
    """--eot and --token-dtype only mean something for a flat nanoGPT token file."""
    given = [flag for flag, value in (("--eot", eot), ("--token-dtype", token_dtype)) if value is not None]
    if given and kind != "nanogpt":
        verb = "applies" if len(given) == 1 else "apply"
        tail = " (a Megatron index records its dtype and documents)" if kind == "megatron" else ""
        raise ConfigError(f"{' and '.join(given)} {verb} only to --from nanogpt; the source is {kind}{tail}")


def open_token_source(kind: str, src: str, eot: int | None, token_dtype: str | None) -> TokenDocuments:
    refuse_token_options(kind, eot, token_dtype)
    if kind == "megatron":
        return megatron_source(src)
    files = require(find_files(src, (".bin",)), src, "nanoGPT token (.bin)", (".bin",))
    refuse_mixed_splits(src, files, "token files", "{first}")
    return nanogpt_source(files, eot, token_dtype or "uint16")


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--eot", type=int, metavar="ID",
        help="--from nanogpt: the end-of-text token id after which each document ends (GPT-2: 50256)",
    )
    parser.add_argument(
        "--token-dtype", choices=TOKEN_DTYPES, metavar="DTYPE",
        help=f"--from nanogpt: the dtype of the token file ({', '.join(TOKEN_DTYPES)}; default uint16)",
    )
