"""Bearer tokens, checked the same way by the server, the client and the tools.

A token travels in the ``authorization: Bearer <token>`` header, so it must be a non-empty run
of visible ASCII characters. Surrounding whitespace (the newline ``echo TOKEN > file`` writes)
is stripped; anything else is refused with a message naming where the token came from. An empty
token is never taken to mean "no authentication": that must be said by passing no token at all.
"""

from __future__ import annotations

from pathlib import Path

from flightfeed.wire.errors import ConfigError

__all__ = ["normalize_token", "read_token_file", "MAX_TOKEN_CHARS"]

MAX_TOKEN_CHARS = 4096


def normalize_token(token: str | bytes, source: str = "the auth token") -> str:
    """``token`` without surrounding whitespace; ConfigError when it cannot be a bearer token."""
    if isinstance(token, bytes):
        try:
            token = token.decode("ascii")
        except UnicodeDecodeError:
            raise ConfigError(f"{source} is not ASCII text: a bearer token must be visible ASCII characters") from None
    if not isinstance(token, str):
        raise ConfigError(f"{source} must be a str, got {type(token).__name__}")
    text = token.strip()
    if not text:
        raise ConfigError(
            f"{source} is empty (or only whitespace): an empty token would turn authentication off; "
            "put the token in it, or pass no token to run without authentication"
        )
    if len(text) > MAX_TOKEN_CHARS:
        raise ConfigError(f"{source} is {len(text)} characters long; a bearer token may have at most {MAX_TOKEN_CHARS}")
    bad = sorted({c for c in text if not 0x21 <= ord(c) <= 0x7E})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        raise ConfigError(
            f"{source} contains characters a bearer token cannot have ({shown}): "
            "use visible ASCII only (e.g. the output of `openssl rand -hex 32`)"
        )
    return text


def read_token_file(path: str | Path, flag: str = "--auth-token-file") -> str:
    """The token in ``path`` (see :func:`normalize_token`); ConfigError when unreadable or empty."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    return normalize_token(data, f"{flag} {path}")
