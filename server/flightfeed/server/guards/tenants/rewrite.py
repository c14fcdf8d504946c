"""Load a ``--tenants`` file, turning its plain ``token`` values into salted hashes in place.

A plain token is accepted once: the ``token = ...`` line of its tenant becomes (or joins) a
``token_sha256 = ["SALT:HEX", ...]`` line, written atomically (a temporary file renamed over the
old one, same permissions). The rest of the file (comments, order) is kept. When the file cannot be
rewritten (a read-only Secret mount, a token spread over several lines) one warning says so and
the tokens are kept in memory only as unsalted hashes. docs/security.md describes the format.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import tomllib
from pathlib import Path

from flightfeed.server.guards.tenants.table import Credential, TenantTable, salted
from flightfeed.server.guards.tenants.tenants_file import ParsedTenants, Secrets, parse_tenants
from flightfeed.wire.errors import ConfigError

__all__ = ["load_tenants", "hashed_text"]

log = logging.getLogger("flightfeed.server.tenants")

_HEADER = re.compile(r"^\s*\[\s*tenant\s*\.\s*(?:\"([^\"]+)\"|'([^']+)'|([A-Za-z0-9_-]+))\s*\]\s*(?:#.*)?$")
_ANY_HEADER = re.compile(r"^\s*\[")
_KEY = re.compile(r"^\s*(token|token_sha256)\s*=")


def load_tenants(path: str, secrets: Secrets) -> TenantTable:
    """The checked tenants of ``path``; plain tokens are hashed in the file first (see above)."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--tenants {path}: cannot read it ({exc.strerror or exc})") from None
    parsed = parse_tenants(text, path, secrets)
    if not parsed.plain:
        return parsed.table
    fresh = {name: [salted(t) for t in tokens] for name, tokens in parsed.plain.items()}
    new_text = hashed_text(text.decode("utf-8"), parsed, fresh)
    if new_text is None:
        log.warning("--tenants %s: plain tokens kept (cannot rewrite their lines); use token_sha256", path)
        return parsed.table
    try:
        reparsed = parse_tenants(new_text.encode(), path, secrets)
    except ConfigError:
        log.warning("--tenants %s: plain tokens kept (the rewritten file would not read back)", path)
        return parsed.table
    if reparsed.plain or {n: t.credentials for n, t in reparsed.table.tenants.items()} != _expected(parsed, fresh):
        log.warning("--tenants %s: plain tokens kept (the rewritten file would read back differently)", path)
        return parsed.table
    try:
        _write_atomically(path, new_text)
    except OSError as exc:
        log.warning("--tenants %s: plain tokens kept in memory, not hashed in the file (%s)", path, exc.strerror or exc)
        return parsed.table
    log.info("--tenants %s: %d plain token(s) replaced by salted hashes", path, sum(map(len, fresh.values())))
    return reparsed.table


def _expected(parsed: ParsedTenants, fresh: dict[str, list[Credential]]) -> dict[str, frozenset[Credential]]:
    out = {}
    for name, tenant in parsed.table.tenants.items():
        plain = {salted(t, b"") for t in parsed.plain.get(name, [])}
        others = {c for c in tenant.credentials if c not in plain}
        # a plain token equal to a file/env token keeps that unsalted credential too
        out[name] = frozenset(others | set(fresh.get(name, [])))
    return out


def hashed_text(text: str, parsed: ParsedTenants, fresh: dict[str, list[Credential]]) -> str | None:
    """``text`` with each tenant's ``token`` line folded into its ``token_sha256`` line; None when a
    line cannot be rewritten safely (the tables or values are written in another shape)."""
    lines = text.splitlines(keepends=True)
    section: str | None = None
    found: dict[str, dict[str, int]] = {}
    for i, line in enumerate(lines):
        header = _HEADER.match(line)
        if header:
            section = next(g for g in header.groups() if g is not None)
            continue
        if _ANY_HEADER.match(line):
            section = None
            continue
        key = _KEY.match(line)
        if key and section in fresh:
            found.setdefault(section, {})[key.group(1)] = i
    for name, creds in fresh.items():
        at = found.get(name, {})
        if "token" not in at:
            return None
        old = _one_line_value(lines[at["token"]], "token")
        if old is None or sorted([old] if isinstance(old, str) else old) != sorted(parsed.plain[name]):
            return None
        stored: list[str] = []
        if "token_sha256" in at:
            prior = _one_line_value(lines[at["token_sha256"]], "token_sha256")
            if prior is None:
                return None
            stored = [prior] if isinstance(prior, str) else list(prior)
        stored += [c.stored() for c in creds]
        indent = lines[at["token"]][: len(lines[at["token"]]) - len(lines[at["token"]].lstrip())]
        lines[at["token"]] = indent + "token_sha256 = [" + ", ".join(f'"{s}"' for s in stored) + "]\n"
        if "token_sha256" in at:
            lines[at["token_sha256"]] = ""
    return "".join(lines)


def _one_line_value(line: str, key: str) -> str | list[str] | None:
    try:
        value = tomllib.loads(line).get(key)
    except tomllib.TOMLDecodeError:
        return None
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    return None


def _write_atomically(path: str, text: str) -> None:
    target = Path(path)
    mode = target.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=".tenants-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


