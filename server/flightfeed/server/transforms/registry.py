"""The transform registry: named, parameterised, validated steps that run on the data node.

A client only *names* transforms (and gives JSON parameters); no code travels. The server's
operator adds custom transforms in one of two ways:

* an entry point in the group ``flightfeed.transforms`` whose object is a :class:`Transform`
  (or a zero-argument callable returning one or a list of them), loaded by ``flightfeed serve``
  at startup (``defaults.load_entry_points``); a client can never trigger loading;
* ``register_transform`` (``defaults.py``) from Python, before the server starts, e.g.::

      from flightfeed.server.transforms import Param, register_transform

      def slow(batch, params, key):           # per message: batch is (rows, *shape) numpy
          time.sleep(params["ms"] / 1000)
          return batch

      register_transform("sleep_per_message", slow, per="message",
                         params=[Param("ms", float, 10.0, low=0.0, high=60_000.0)])

  A ``per="row"`` function gets ``(row, params, rng)``: one row as a numpy array (HWC uint8 for
  images; the column's per-row tensor otherwise) and a ``numpy.random.Generator`` that is a pure
  function of (dataset fingerprint, seed, epoch, stored row, step index); it returns an array.
  A ``per="message"`` function gets ``(batch, params, key)`` with the whole message's column
  ``(rows, *shape)`` and the message's :class:`DrawKey`; it must come after every per-row step.
  ``output(spec, params) -> spec`` says what the step makes of its input (default: the same).

Built-in steps (``ops.py``): decode, resize, center_crop, random_resized_crop, hflip, to_chw, cast;
and ``defer_decode`` (``deferred.py``: the trainer decodes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightfeed.server.transforms.spec import ColumnSpec
from flightfeed.wire.errors import ConfigError, InvalidRequest

__all__ = [
    "Param",
    "Transform",
    "Registry",
    "RowFn",
    "SpecFn",
    "same_spec",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "flightfeed.transforms"
_MISSING = object()


@dataclass(frozen=True)
class Param:
    """One parameter: JSON type (``int``, ``float``, ``bool``, ``str``, ``list``), default
    (``_MISSING``/omitted = required), inclusive bounds, allowed choices, list length."""

    name: str
    kind: type
    default: Any = _MISSING
    low: float | None = None
    high: float | None = None
    choices: Sequence[Any] | None = None
    length: int | None = None  # for lists: exactly this many numbers

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind is list:
            return f"a list of {self.length} numbers" + self._range()
        what = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[self.kind]
        return what + self._range()

    def _range(self) -> str:
        if self.low is None and self.high is None:
            return ""
        return f" in [{self.low if self.low is not None else '-inf'}, {self.high if self.high is not None else 'inf'}]"

    def check(self, step: str, value: Any) -> Any:
        def bad() -> InvalidRequest:
            return InvalidRequest(
                f"transform {step!r}: parameter {self.name!r} is {value!r}; allowed: {self.allowed()}",
                field=f"transform.{step}.{self.name}",
            )

        if self.kind is list:
            if not isinstance(value, list | tuple) or (self.length is not None and len(value) != self.length):
                raise bad()
            items = [self._number(v, float, bad) for v in value]
            return tuple(items)
        value_checked = self._number(value, self.kind, bad) if self.kind in (int, float) else value
        if self.kind in (bool, str) and not isinstance(value, self.kind):
            raise bad()
        if self.choices is not None and value_checked not in self.choices:
            raise bad()
        return value_checked

    def _number(self, value: Any, kind: type, bad: Callable[[], InvalidRequest]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad()
        if kind is int and (isinstance(value, float) and not value.is_integer()):
            raise bad()
        v = kind(value)
        if v != v or (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            raise bad()
        return v


RowFn = Callable[[Any, Mapping[str, Any], Any], Any]
SpecFn = Callable[[ColumnSpec, Mapping[str, Any]], ColumnSpec]


def same_spec(spec: ColumnSpec, params: Mapping[str, Any]) -> ColumnSpec:
    return spec


@dataclass(frozen=True)
class Transform:
    """A named step. ``fn``: see the module doc. ``random``: draws from its generator (a row step
    gets one per row). ``takes``: what a row step's ``fn`` receives: ``"array"`` (numpy, custom
    steps), ``"frame"`` (a lazy :class:`Frame`, built-in geometry) or ``"bytes"`` (``decode``)."""

    name: str
    fn: RowFn
    params: Sequence[Param] = ()
    output: SpecFn = same_spec
    per: str = "row"
    random: bool = False
    takes: str = "array"
    doc: str = ""
    _by_name: dict[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.per not in ("row", "message"):
            raise ConfigError(f"transform {self.name!r}: per is {self.per!r}; allowed: 'row', 'message'")
        if self.takes not in ("array", "frame", "bytes"):
            raise ConfigError(f"transform {self.name!r}: takes is {self.takes!r}; allowed: array, frame, bytes")
        object.__setattr__(self, "_by_name", {p.name: p for p in self.params})

    def bind(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Validated parameters with defaults filled in; unknown or missing ones are refused."""
        unknown = sorted(set(given) - set(self._by_name))
        if unknown:
            raise InvalidRequest(
                f"transform {self.name!r}: unknown parameter(s) {unknown}; parameters: "
                f"{sorted(self._by_name) or 'none'}",
                field=f"transform.{self.name}.{unknown[0]}",
            )
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name in given:
                out[p.name] = p.check(self.name, given[p.name])
            elif p.required:
                raise InvalidRequest(
                    f"transform {self.name!r}: parameter {p.name!r} is required ({p.allowed()})",
                    field=f"transform.{self.name}.{p.name}",
                )
            else:
                out[p.name] = p.default
        return out


class Registry:
    """Name -> :class:`Transform`, plus presets (name -> list of step dicts)."""

    def __init__(
        self, transforms: Iterable[Transform] = (), presets: Mapping[str, list[dict[str, Any]]] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._transforms: dict[str, Transform] = {}
        self._presets: dict[str, list[dict[str, Any]]] = {}
        for t in transforms:
            self.add(t)
        for name, steps in dict(presets or {}).items():
            self.add_preset(name, steps)

    def add(self, transform: Transform, *, replace: bool = False) -> None:
        with self._lock:
            if transform.name in self._transforms and not replace:
                raise ConfigError(f"transform {transform.name!r} is registered twice")
            self._transforms[transform.name] = transform

    def add_preset(self, name: str, steps: Sequence[Mapping[str, Any]]) -> None:
        if not isinstance(steps, list | tuple) or not all(isinstance(s, Mapping) and "name" in s for s in steps):
            raise ConfigError(f"preset {name!r}: expected a list of {{name = ..., params...}} steps")
        with self._lock:
            self._presets[name] = [dict(s) for s in steps]

    def get(self, name: str) -> Transform:
        t = self._transforms.get(name)
        if t is None:
            raise InvalidRequest(
                f"unknown transform {name!r}; transforms on this server: {self.names()}", field="transform.name"
            )
        return t

    def preset(self, name: str) -> list[dict[str, Any]]:
        steps = self._presets.get(name)
        if steps is None:
            raise InvalidRequest(
                f"unknown transform preset {name!r}; presets on this server: {sorted(self._presets)}",
                field="transforms",
            )
        return [dict(s) for s in steps]

    def names(self) -> list[str]:
        return sorted(self._transforms)

    def transforms(self) -> list[Transform]:
        with self._lock:
            return list(self._transforms.values())

    def preset_names(self) -> list[str]:
        return sorted(self._presets)

    def copy(self) -> Registry:
        with self._lock:
            return Registry(self._transforms.values(), self._presets)
