"""The node's transform service from the CLI's settings: the decode pool size, the operator's
presets (``[transforms.presets]`` in the ``--config`` file) and the ``flightfeed.transforms``
entry points. Called once by ``flightfeed serve``; a client can never trigger it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flightfeed.server.transforms.defaults import default_registry, load_entry_points
from flightfeed.server.transforms.execute import Transformer
from flightfeed.server.transforms.registry import Registry
from flightfeed.wire.errors import ConfigError, InvalidRequest

__all__ = ["transformer_from_config"]


def transformer_from_config(config: Mapping[str, Any], workers: int, metrics: Any = None) -> Transformer:
    """``config``: the parsed ``--config`` file, e.g. (TOML)::

        [transforms.presets]
        small_train = [{name = "decode"}, {name = "random_resized_crop", size = 128}, {name = "hflip"}]
    """
    if int(workers) < 1:
        raise ConfigError(f"--decode-workers {workers}: must be >= 1")
    registry = default_registry().copy()  # register_transform() calls made so far, plus:
    load_entry_points(registry)
    section = config.get("transforms", {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"config 'transforms' must be a table, got {type(section).__name__}")
    presets = section.get("presets", {})
    if not isinstance(presets, Mapping):
        raise ConfigError(f"config 'transforms.presets' must be a table of name = [steps], got {presets!r}")
    for name, steps in presets.items():
        check = Registry(registry.transforms())
        check.add_preset(str(name), steps)  # structure
        for step in check.preset(str(name)):
            params = {k: v for k, v in step.items() if k not in ("name", "column")}
            try:
                registry.get(str(step["name"])).bind(params)
            except InvalidRequest as exc:
                raise ConfigError(f"config preset {name!r}: {exc}") from None
        registry.add_preset(str(name), steps)
    return Transformer(registry, workers=int(workers), metrics=metrics)
