"""How deeply a JSON text nests, counted without recursion (``json.loads`` recurses per level, so
a request nested thousands of levels deep must be refused before it is parsed)."""

from __future__ import annotations

__all__ = ["json_depth", "MAX_PARAMS_DEPTH"]

#: transform parameters are flat objects of numbers, strings and short lists
MAX_PARAMS_DEPTH = 32


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text`` (strings skipped), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
