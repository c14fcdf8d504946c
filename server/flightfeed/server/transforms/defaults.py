"""The process-wide transform registry: the built-in steps, the presets, and what operators add
(``register_transform`` in code, or packages through the ``flightfeed.transforms`` entry points).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib.metadata import entry_points

from flightfeed.server.transforms.deferred import DEFER_STEP
from flightfeed.server.transforms.ops import BUILTINS
from flightfeed.server.transforms.presets import PRESETS
from flightfeed.server.transforms.registry import (
    ENTRY_POINT_GROUP,
    Param,
    Registry,
    RowFn,
    SpecFn,
    Transform,
    same_spec,
)
from flightfeed.wire.errors import ConfigError

__all__ = ["default_registry", "register_transform", "load_entry_points"]

_DEFAULT: Registry | None = None
_DEFAULT_LOCK = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry: built-ins and presets, plus whatever was registered."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Registry((*BUILTINS, DEFER_STEP), PRESETS)
        return _DEFAULT


def register_transform(
    name: str,
    fn: RowFn,
    *,
    params: Sequence[Param] = (),
    output: SpecFn | None = None,
    per: str = "row",
    random: bool = False,
    replace: bool = False,
) -> Transform:
    """Add a custom transform to the process-wide registry (see the module doc)."""
    t = Transform(name, fn, tuple(params), output or same_spec, per=per, random=random)
    default_registry().add(t, replace=replace)
    return t


def load_entry_points(registry: Registry | None = None) -> list[str]:
    """Register every ``flightfeed.transforms`` entry point; returns the names added."""
    reg = registry or default_registry()
    added: list[str] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # the operator's package is broken: say which entry point
            raise ConfigError(f"transform entry point {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        items = obj() if callable(obj) and not isinstance(obj, Transform) else obj
        for t in items if isinstance(items, list | tuple) else [items]:
            if not isinstance(t, Transform):
                raise ConfigError(
                    f"transform entry point {ep.name!r} ({ep.value}) gave {type(t).__name__}; "
                    "expected flightfeed.server.transforms.Transform (or a function returning them)"
                )
            reg.add(t, replace=True)
            added.append(t.name)
    return added
