"""A transform step's ``params_json``, parsed with bounds: a request cannot make the server recurse.

``json.loads`` recurses once per nesting level, so a body nested a few thousand levels deep
raised ``RecursionError`` (an internal error) instead of a refusal. The nesting depth is counted
first, in one pass over the text, and anything deeper than :data:`MAX_DEPTH` (or longer than
:data:`MAX_CHARS`, or not JSON) is an ``InvalidRequest`` naming the step.
"""

from __future__ import annotations

import json
from typing import Any

from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.json_depth import MAX_PARAMS_DEPTH, json_depth

__all__ = ["parse_params", "MAX_DEPTH", "MAX_CHARS"]

MAX_DEPTH = MAX_PARAMS_DEPTH
MAX_CHARS = 64 << 10
_FIELD = "transform.params_json"


def parse_params(text: str, step: int, name: str) -> Any:
    """The parameters of transform step ``step`` (``name``); {} for an empty text."""
    if not text:
        return {}
    where = f"transform step {step} ({name!r}): params_json"
    if len(text) > MAX_CHARS:
        raise InvalidRequest(f"{where} has {len(text)} characters, more than {MAX_CHARS}", field=_FIELD)
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        raise InvalidRequest(
            f"{where} is nested {depth} levels deep, more than {MAX_DEPTH}; parameters are a flat JSON object",
            field=_FIELD,
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"{where} is not JSON ({exc})", field=_FIELD) from None
