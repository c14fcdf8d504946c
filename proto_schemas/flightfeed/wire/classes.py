"""Class names in a dataset's schema metadata: ``flightfeed.classes``, a JSON list (label ``i`` is
``classes[i]``), written by ``flightfeed convert`` for image folders; read by the client
(``ds.classes``, ``ds.info()``) and by ``flightfeed inspect``."""

from __future__ import annotations

import json

import pyarrow as pa

__all__ = ["CLASSES_KEY", "classes_of"]

CLASSES_KEY = b"flightfeed.classes"


def classes_of(schema: pa.Schema) -> list[str] | None:
    """The class names recorded in ``schema``'s metadata, or None."""
    raw = (schema.metadata or {}).get(CLASSES_KEY)
    if raw is None:
        return None
    try:
        names = json.loads(raw)
    except ValueError:
        return None
    return [str(n) for n in names] if isinstance(names, list) else None
