"""A request's transform steps -> a validated plan with its output schema.

Presets named in ``ReadCommand.transforms`` are expanded into explicit ``TransformStep``s when
tickets are made (:func:`resolve_command`), so a ticket carries the exact steps and any node can
re-validate and serve it, whatever presets that node's config defines. Every name and parameter
is checked here, before any stream starts; so is the output shape (it must end fixed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flightfeed.server.transforms.deferred import DEFER, crop_name, flip_name, params_fields
from flightfeed.server.transforms.params import parse_params
from flightfeed.server.transforms.registry import Registry, Transform
from flightfeed.server.transforms.spec import ColumnSpec, arrow_type, spec_of_field
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.transforms import steps_from_dicts

__all__ = ["Step", "ColumnPlan", "Plan", "compile_plan", "resolve_command", "steps_from_dicts", "DEFAULT_COLUMN"]

DEFAULT_COLUMN = "image"


@dataclass(frozen=True)
class Step:
    transform: Transform
    params: Mapping[str, Any]
    index: int  # position in the request's step list: part of every random draw's key


@dataclass(frozen=True)
class ColumnPlan:
    column: str
    source: ColumnSpec
    output: ColumnSpec
    row_steps: tuple[Step, ...]
    message_steps: tuple[Step, ...]
    deferred: bool = False  # ends with defer_decode: bytes + crop + flip go out, the trainer decodes

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.output)

    def fields(self, stored: pa.Field[Any]) -> list[pa.Field[Any]]:
        """The output field(s) in place of the stored one."""
        if self.deferred:
            return [stored, *params_fields(self.column, self.output)]
        return [pa.field(stored.name, self.arrow_type, nullable=False)]


@dataclass(frozen=True)
class Plan:
    columns: tuple[ColumnPlan, ...]
    on_error: str  # "raise" | "skip"

    def schema(self, base: pa.Schema) -> pa.Schema:
        """``base`` (the projected stored schema) with each transformed column's new type."""
        by_name = {c.column: c for c in self.columns}
        fields = [g for f in base for g in (by_name[f.name].fields(f) if f.name in by_name else [f])]
        meta: Any = base.metadata
        return pa.schema(fields, metadata=meta)

    def row_bytes(self, base_row_bytes: int, stored: Mapping[str, int]) -> int:
        """Bytes per output row: ``base_row_bytes`` minus stored transformed columns plus outputs."""
        size = base_row_bytes
        for c in self.columns:
            if c.deferred:  # the stored bytes stay; crop (4 x int32) and flip (a bit) follow
                size += 17
                continue
            out = arrow_type(c.output)
            width = out.byte_width if not isinstance(out, pa.FixedShapeTensorType) else (
                out.value_type.byte_width * _prod(c.output.shape)
            )
            size += width - stored.get(c.column, 0)
        return max(1, size)


def _prod(shape: Sequence[int | None]) -> int:
    n = 1
    for d in shape:
        n *= int(d or 0)
    return n


def resolve_command(read: Any, registry: Registry) -> None:
    """In place: replace preset names by their steps (tickets carry explicit steps). The presets'
    steps come first, then the request's own (e.g. a trailing ``defer_decode``), so a preset's
    step indices, and hence its draws, are the same with or without trailing steps."""
    if not read.transforms:
        return
    steps: list[Any] = []
    for name in read.transforms:
        steps.extend(steps_from_dicts(registry.preset(name)))
    steps.extend(read.transform)
    del read.transforms[:]
    del read.transform[:]
    read.transform.extend(steps)


def _default_column(schema: pa.Schema, requested: Sequence[str]) -> str:
    names = list(requested) or schema.names
    if DEFAULT_COLUMN in names:
        return DEFAULT_COLUMN
    binary = [
        f.name
        for f in schema
        if f.name in names and (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))
    ]
    if len(binary) == 1:
        return binary[0]
    raise InvalidRequest(
        f"transform steps name no column and the request has no {DEFAULT_COLUMN!r} column"
        f" and {len(binary)} binary columns {binary}; give each step a 'column' (columns: {names})",
        field="transform.column",
    )


def compile_plan(schema: pa.Schema, read: Any, registry: Registry) -> Plan | None:
    """The plan of ``read``'s steps against the dataset ``schema``; None without transforms."""
    if read.transforms:
        read = _resolved_copy(read, registry)
    if not read.transform:
        return None
    requested = list(read.columns)
    by_column: dict[str, list[Step]] = {}
    for k, msg in enumerate(read.transform):
        column = msg.column or _default_column(schema, requested)
        if column not in schema.names or (requested and column not in requested):
            where = "the request's columns" if requested else "the dataset's columns"
            raise InvalidRequest(
                f"transform step {k} ({msg.name!r}) names column {column!r}, which is not among "
                f"{where}: {requested or schema.names}",
                field="transform.column",
            )
        t = registry.get(msg.name)
        params = t.bind(parse_params(msg.params_json, k, msg.name))
        by_column.setdefault(column, []).append(Step(t, params, k))
    plans = []
    for column, steps in by_column.items():
        plan = _column_plan(column, spec_of_field(schema.field(column)), steps)
        if plan.deferred:
            taken = [n for n in (crop_name(column), flip_name(column)) if n in schema.names]
            if taken:
                raise InvalidRequest(
                    f"transform {DEFER!r} on column {column!r} adds column(s) {taken}, which the dataset already "
                    "has; defer another column or read without defer_decode",
                    field=f"transform.{DEFER}",
                )
        plans.append(plan)
    return Plan(tuple(plans), "skip" if read.on_decode_error == "skip" else "raise")


def _resolved_copy(read: Any, registry: Registry) -> Any:
    copy = type(read)()
    copy.CopyFrom(read)
    resolve_command(copy, registry)
    return copy


def _column_plan(column: str, source: ColumnSpec, steps: list[Step]) -> ColumnPlan:
    spec = source
    row: list[Step] = []
    message: list[Step] = []
    deferred = steps[-1].transform.name == DEFER
    for k, step in enumerate(steps):
        t = step.transform
        if deferred and (t.takes not in ("bytes", "frame") or (t.name == DEFER and k != len(steps) - 1)):
            raise InvalidRequest(
                f"transform {t.name!r} on column {column!r} cannot come with {DEFER!r}: the trainer applies only "
                f"decode, resize, crops and flips, and {DEFER!r} must be the last step",
                field=f"transform.{DEFER}",
            )
        if t.name == DEFER and not deferred:
            raise InvalidRequest(
                f"transform {DEFER!r} on column {column!r} must be the column's last step", field=f"transform.{DEFER}"
            )
        if t.per == "row" and message:
            raise InvalidRequest(
                f"transform {t.name!r} (per row) comes after per-message transform {message[-1].transform.name!r}"
                f" on column {column!r}; per-message transforms must come last",
                field=f"transform.{t.name}",
            )
        if t.takes != "bytes" and spec.kind == "bytes":
            raise InvalidRequest(
                f"transform {t.name!r} needs decoded input, but column {column!r} holds encoded bytes "
                "there; put 'decode' first",
                field=f"transform.{t.name}",
            )
        spec = t.output(spec, step.params)
        (row if t.per == "row" else message).append(step)
    if not spec.fixed:
        raise InvalidRequest(
            f"the transforms on column {column!r} end with {spec.describe()}, a size that varies per "
            "sample; end the pipeline with a fixed size (e.g. center_crop or random_resized_crop)",
            field="transform",
        )
    return ColumnPlan(column, source, spec, tuple(row[:-1] if deferred else row), tuple(message), deferred)
