"""The ``--config`` file of ``flightfeed serve``: TOML or JSON with the same settings as the flags
(flags win).

A setting's key is its flag's name without the dashes (``cache_size`` or ``cache-size`` for
``--cache-size``), plus ``datasets`` (a table of NAME = URI, checked as such) and ``transforms`` (presets). Every key
is checked when the file is read: a key that is no setting (a typo) is an error naming it and the
nearest setting, never silently ignored, and a value of the wrong kind is an error naming the key.
``merge_config`` then fills the flags the command line left unset with the file's values, converted
as the flag's own parser converts them (sizes such as ``"8MiB"`` included; a number must be finite:
TOML's ``inf``/``nan`` and JSON's ``NaN`` or ``1e400`` are refused), so every setting of the
file reaches the same code as its flag (TLS, S3, the shard cache, casts: all of them) and the
``--workers`` processes, which are given the merged flags.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from flightfeed.server.storage.cli_options import parse_size, size_argument
from flightfeed.wire.errors import ConfigError

__all__ = ["load_config", "merge_config"]

#: keys of the file that are no flag of their own
_EXTRA = ("datasets", "transforms")
#: flags a file cannot set (the file itself; the coordinator's private flag for its workers)
_NOT_IN_FILE = ("config", "exit_with_parent")
#: flags whose file form (a group, or a table of dataset name -> group) ``storage.cli_options.apply_config`` reads
_TABLES = ("hdf5_group", "hdf5_columns")


def load_config(path: str | None) -> dict[str, Any]:
    """The parsed file (``{}`` without one); a file that cannot be read or parsed, or whose top level
    is not a table, is a ``ConfigError`` naming it."""
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(f"--config {path}: cannot read it ({why}); give a TOML or JSON file") from None
    try:
        data: Any = json.loads(text) if path.endswith(".json") else tomllib.loads(text.decode())
    except (ValueError, tomllib.TOMLDecodeError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"--config {path}: cannot parse ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a table of settings at the top, got {type(data).__name__}")
    return data


def merge_config(args: argparse.Namespace, config: Mapping[str, Any], path: str | None, parser: Any) -> None:
    """Check every key of ``config`` against ``parser``'s flags and set each flag the command line
    left unset (``None``, ``False`` or an empty list) to the file's value, converted and checked."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in _NOT_IN_FILE}
    known = sorted([*actions, *_EXTRA])
    where = f"--config {path}"
    seen: dict[str, str] = {}
    for raw_key, value in config.items():
        key = str(raw_key).replace("-", "_")
        if key in seen:
            raise ConfigError(f"{where}: {seen[key]!r} and {raw_key!r} are the same setting; keep one")
        seen[key] = str(raw_key)
        if key == "datasets":
            _check_datasets(value, f"{where}: {raw_key}")
        if key in _EXTRA:
            continue
        action = actions.get(key)
        if action is None:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"{where}: unknown setting {raw_key!r}{hint}; a setting is a flag's name without the dashes "
                f"(cache_size for --cache-size), or datasets / transforms"
            )
        if key in _TABLES:
            continue
        given = getattr(args, key, None)
        if not (given is None or given is False or given == []):  # (by identity: --port 0 is given)
            continue  # the flag was given: it wins
        setattr(args, key, _converted(action, value, f"{where}: {raw_key}"))


def _check_datasets(value: Any, what: str) -> None:
    """``datasets`` is a table of NAME = "URI" (a path or a list made an AttributeError traceback)."""
    form = 'expected a table of NAME = "URI" (TOML: a [datasets] section with train = "/data/train")'
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} = {value!r}: {form}")
    for name, uri in value.items():
        if not isinstance(uri, str) or not uri:
            raise ConfigError(f"{what}.{name} = {uri!r}: {form}")


def _converted(action: argparse.Action, value: Any, what: str) -> Any:
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{what} = {value!r}: expected true or false")
        return value
    if isinstance(action, argparse._AppendAction):  # --cast: a table COLUMN = DTYPE or a list "COLUMN=DTYPE"
        if isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
            return [f"{k}={v}" for k, v in value.items()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f'{what} = {value!r}: expected a table of COLUMN = "DTYPE" or a list of "COLUMN=DTYPE"')
    kind: Callable[..., Any] | None = action.type  # type: ignore[assignment]
    if kind is size_argument:
        if isinstance(value, str):
            try:
                return parse_size(value)
            except ConfigError as exc:
                raise ConfigError(f"{what}: {exc}") from None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ConfigError(f'{what} = {value!r}: expected a size in bytes, e.g. 536870912 or "512MiB"')
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{what} = {value!r}: expected a whole number")
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            tail = " (a number past 1.8e308, e.g. 1e400, reads as inf)" if math.isinf(value) else ""
            raise ConfigError(f"{what} = {value!r}: expected a finite number{tail}")
        raise ConfigError(f"{what} = {value!r}: expected a number")
    if isinstance(value, list) and all(isinstance(v, str) for v in value) and action.dest == "peers":
        value = ",".join(value)
    if not isinstance(value, str):
        raise ConfigError(f"{what} = {value!r}: expected a string")
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{what} = {value!r}: expected one of {', '.join(map(str, action.choices))}")
    return value
