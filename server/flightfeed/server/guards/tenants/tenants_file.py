"""Read and check a ``--tenants`` file (TOML; docs/security.md has the format).

```toml
[tenant.vision]
token = "..."            # or token_sha256 = "<hex>" / "SALT:HEX", token_file = "/run/secrets/vision",
                         # token_env = "VISION_TOKEN"; each may also be a list (old and new token)
datasets = ["imagenet*", "coco-train"]
weight = 1.0             # share of a busy node (default 1)
max_streams = 32         # optional: streams open at once on one serving process
max_bytes_per_s = "200MiB"  # optional: bytes/s this tenant's streams send from one serving process
```

Every problem is a one-line ``ConfigError`` naming the file, the tenant and the key. Secrets that
live elsewhere (``token_file``, ``token_env``) are looked up through :class:`Secrets`, which the CLI
gives (library code never reads ``os.environ``). Plain ``token`` values are returned in
``ParsedTenants.plain`` so the caller can rewrite them as salted hashes (``rewrite``).
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flightfeed.server.guards.tenants.table import Credential, Tenant, TenantTable, salted
from flightfeed.server.storage.cli_options import parse_size
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import normalize_token

__all__ = ["Secrets", "ParsedTenants", "parse_tenants", "KEYS"]

KEYS = ("token", "token_sha256", "token_file", "token_env", "datasets", "weight", "max_streams", "max_bytes_per_s")
_TOKEN_KEYS = ("token", "token_sha256", "token_file", "token_env")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SALTED = re.compile(r"([0-9a-f]{2,128}):([0-9a-f]{64})")
MAX_WEIGHT = 1e6


@dataclass(frozen=True)
class Secrets:
    """Where ``token_file`` and ``token_env`` are looked up (given by the CLI)."""

    read_file: Callable[[str], bytes]
    environ: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ParsedTenants:
    table: TenantTable
    #: tenant name -> its plain ``token`` values (to be rewritten as salted hashes)
    plain: dict[str, list[str]]


def parse_tenants(text: bytes, path: str, secrets: Secrets) -> ParsedTenants:
    where = f"--tenants {path}"
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text; write the file as TOML (UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: cannot parse it as TOML ({_one_line(str(exc))})") from None
    extra = sorted(k for k in data if k != "tenant")
    if extra:
        raise ConfigError(f"{where}: unknown top-level key {extra[0]!r}; the file holds only [tenant.NAME] tables")
    tables = data.get("tenant")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{where}: no [tenant.NAME] tables; add one per tenant (see docs/security.md)")
    tenants: dict[str, Tenant] = {}
    plain: dict[str, list[str]] = {}
    owner: dict[bytes, str] = {}  # unsalted digests (plain tokens, files, env, unsalted hashes) -> tenant
    for name, body in tables.items():
        what = f"{where}: [tenant.{_shown(name)}]"
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{what}: a tenant name is 1-64 letters, digits, '_' or '-'")
        if not isinstance(body, dict):
            raise ConfigError(f"{what}: expected a table of settings, got {type(body).__name__}")
        tenant, tokens = _tenant(name, body, what, secrets)
        for digest in {c.digest for c in tenant.credentials if not c.salt}:
            if digest in owner:
                raise ConfigError(f"{what}: a token of it is also held by tenant {owner[digest]!r}; give each its own")
            owner[digest] = name
        tenants[name] = tenant
        if tokens:
            plain[name] = tokens
    return ParsedTenants(TenantTable(tenants, where), plain)


def _tenant(name: str, body: dict[str, Any], what: str, secrets: Secrets) -> tuple[Tenant, list[str]]:
    for key in body:
        if key not in KEYS:
            near = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{what}: unknown key {_shown(key)!r}{hint}; keys: {', '.join(KEYS)}")
    if not any(k in body for k in _TOKEN_KEYS):
        raise ConfigError(f"{what}: no token; give token, token_sha256, token_file or token_env")
    creds: set[Credential] = set()
    plain = [normalize_token(_check_token(t, what), f"{what} token") for t in _strings(body, "token", what)]
    unsalted = [salted(t, b"") for t in plain]
    for value in _strings(body, "token_sha256", what):
        creds.add(_hash(value, f"{what} token_sha256"))
    for file in _strings(body, "token_file", what):
        try:
            data = secrets.read_file(file)
        except OSError as exc:
            raise ConfigError(f"{what} token_file {_shown(file)}: cannot read it ({exc.strerror or exc})") from None
        unsalted.append(salted(normalize_token(data, f"{what} token_file {_shown(file)}"), b""))
    for var in _strings(body, "token_env", what):
        found = secrets.environ.get(var)
        if found is None:
            raise ConfigError(f"{what} token_env {_shown(var)}: no such environment variable; set it or remove the key")
        unsalted.append(salted(normalize_token(found, f"{what} token_env {_shown(var)}"), b""))
    creds.update(unsalted)
    patterns = _strings(body, "datasets", what)
    if not patterns:
        raise ConfigError(f'{what}: datasets is missing or empty; list the names or globs it may read (["train*"])')
    tenant = Tenant(
        name,
        frozenset(creds),
        tuple(patterns),
        weight=_weight(body.get("weight", 1.0), what),
        max_streams=_positive_int(body.get("max_streams"), f"{what} max_streams"),
        max_bytes_per_s=_rate(body.get("max_bytes_per_s"), f"{what} max_bytes_per_s"),
    )
    return tenant, plain


def _strings(body: dict[str, Any], key: str, what: str) -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ConfigError(f"{what} {key}: expected a non-empty string or a list of them, got {_kind(value)}")
    return list(values)


def _check_token(token: str, what: str) -> str:
    if token.strip() != token:
        raise ConfigError(f"{what} token: has surrounding whitespace; remove it")
    return token


def _hash(value: str, what: str) -> Credential:
    text = value.strip().lower()
    if _HEX64.fullmatch(text):
        return Credential(b"", bytes.fromhex(text))
    m = _SALTED.fullmatch(text)
    if m and len(m.group(1)) % 2 == 0:
        return Credential(bytes.fromhex(m.group(1)), bytes.fromhex(m.group(2)))
    raise ConfigError(
        f"{what}: expected 64 hex digits (printf %s TOKEN | sha256sum) or SALT:HEX as written by the server"
    )


def _weight(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{what} weight = {_shown(value)}: expected a number > 0 (default 1)")
    if not 0 < value <= MAX_WEIGHT:
        raise ConfigError(f"{what} weight = {value}: must be > 0 and <= {MAX_WEIGHT:g}")
    return float(value)


def _positive_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} = {_shown(value)}: expected a whole number >= 1 (or leave it out: no limit)")
    return value


def _rate(value: Any, what: str) -> int | None:
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {_one_line(str(exc))}") from None
    return _positive_int(value, f"{what} (bytes per second)")


def _kind(value: Any) -> str:
    """The value's type, never its content (it may hold a token)."""
    if isinstance(value, list):
        return "a list of " + ", ".join(sorted({type(v).__name__ for v in value})) if value else "an empty list"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("ascii", "backslashreplace").decode()
    return _one_line(text[:80] + ("…" if len(text) > 80 else ""))


def _one_line(text: str) -> str:
    return " ".join(text.split())
