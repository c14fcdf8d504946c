"""How a request names server-side transforms (shared by client and server).

``transform`` as a user gives it: ``None``, a preset name (``"imagenet_train"``) or a list of
steps ``[{"name": "decode"}, {"name": "random_resized_crop", "size": 224}, ...]`` (an optional
``"column"`` key picks the column; the rest are the step's parameters, sent as JSON). The server
validates every name and parameter before a stream starts. No code travels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.messages import DECODE_ERROR_POLICIES, TransformStep

__all__ = ["TransformSpec", "steps_from_dicts", "set_transform", "defer_decode", "SKIP_INFO_KEY", "DEFER_DECODE"]

TransformSpec = str | Sequence[Mapping[str, Any]] | None
#: in-memory schema-metadata key of a RecordBatch that lost rows: its SkipInfo (positions, skipped)
SKIP_INFO_KEY = b"flightfeed.skip"
#: the last step that makes the node send bytes + crop + flip instead of pixels (the trainer decodes)
DEFER_DECODE = "defer_decode"


def steps_from_dicts(steps: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``[{"name": ..., "column": ..., **params}]`` -> TransformStep messages."""
    out = []
    for k, step in enumerate(steps):
        if not isinstance(step, Mapping) or not isinstance(step.get("name"), str):
            raise InvalidRequest(
                f"transform step {k} is {step!r}; expected a dict with a 'name' (and parameters)",
                field="transform",
            )
        params = {key: v for key, v in step.items() if key not in ("name", "column")}
        try:
            params_json = json.dumps(params)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(
                f"transform step {k} ({step['name']!r}): parameters must be JSON values ({exc})",
                field="transform.params",
            ) from None
        out.append(TransformStep(name=step["name"], column=str(step.get("column") or ""), params_json=params_json))
    return out


def set_transform(cmd: Any, transform: TransformSpec, on_decode_error: str = "raise") -> None:
    """Fill a ReadCommand's transform fields from the user's ``transform`` value."""
    if on_decode_error not in DECODE_ERROR_POLICIES or not on_decode_error:
        raise InvalidRequest(
            f"on_decode_error is {on_decode_error!r}; allowed: 'raise' or 'skip'", field="on_decode_error"
        )
    cmd.on_decode_error = on_decode_error
    del cmd.transforms[:]
    del cmd.transform[:]
    if transform is None:
        return
    if isinstance(transform, str):
        cmd.transforms.append(transform)
        return
    if not isinstance(transform, Sequence):
        raise InvalidRequest(
            f"transform is {transform!r}; allowed: None, a preset name (e.g. 'imagenet_train') or a list "
            "of {'name': ..., **params} steps",
            field="transform",
        )
    cmd.transform.extend(steps_from_dicts(cast(Sequence[Mapping[str, Any]], transform)))


def defer_decode(cmd: Any) -> None:
    """Append ``defer_decode`` to a ReadCommand whose transform decodes: the node then sends the
    encoded bytes plus each sample's crop box and flip (the same draws) and the trainer decodes."""
    if not (cmd.transforms or cmd.transform):
        raise InvalidRequest(
            "decode on the trainer needs a transform that decodes (e.g. transform='imagenet_train')",
            field="transform",
        )
    cmd.transform.append(TransformStep(name=DEFER_DECODE))
