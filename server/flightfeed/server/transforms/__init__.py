"""Server-side transforms: decode and seeded augmentation on the data node (docs/images.md).

Modules: ``registry`` (named steps, parameters, custom transforms), ``defaults`` (the
process-wide registry and its API: ``register_transform``, entry points), ``spec``
(shapes known before streaming), ``ops`` (the built-ins), ``frame`` (lazy geometry, one
decode+resample per sample), ``rng`` (draws keyed by fingerprint, seed, epoch, stored row, step),
``pipeline`` (validation, presets, output schema), ``execute`` (the decode pool), ``presets``.
"""

from flightfeed.server.transforms.defaults import default_registry, load_entry_points, register_transform
from flightfeed.server.transforms.execute import SKIP_KEY, Transformer, read_ahead, run_row
from flightfeed.server.transforms.pipeline import ColumnPlan, Plan, compile_plan, resolve_command, steps_from_dicts
from flightfeed.server.transforms.registry import ENTRY_POINT_GROUP, Param, Registry, Transform
from flightfeed.server.transforms.rng import DrawKey, row_generator
from flightfeed.server.transforms.spec import ColumnSpec

__all__ = [
    "SKIP_KEY",
    "Transformer",
    "run_row",
    "read_ahead",
    "ColumnPlan",
    "Plan",
    "compile_plan",
    "resolve_command",
    "steps_from_dicts",
    "ENTRY_POINT_GROUP",
    "Param",
    "Registry",
    "Transform",
    "default_registry",
    "load_entry_points",
    "register_transform",
    "DrawKey",
    "row_generator",
    "ColumnSpec",
]
