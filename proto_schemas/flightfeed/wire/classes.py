"""Class names in a dataset's schema metadata: ``flightfeed.classes``, a JSON list (label ``i`` is
``classes[i]``), written by ``flightfeed convert`` for image folders; read by the client
(``ds.classes``, ``ds.info()``) and by ``flightfeed inspect``. A Hugging Face ``datasets`` folder
served as it is records its ``ClassLabel`` names in the ``huggingface`` metadata instead: the names
of the ``label`` column (or of the only ClassLabel) are its classes."""

from __future__ import annotations

import json

import pyarrow as pa

__all__ = ["CLASSES_KEY", "classes_of"]

CLASSES_KEY = b"flightfeed.classes"
HF_KEY = b"huggingface"


def classes_of(schema: pa.Schema) -> list[str] | None:
    """The class names recorded in ``schema``'s metadata, or None."""
    raw = (schema.metadata or {}).get(CLASSES_KEY)
    if raw is None:
        return _hf_classes((schema.metadata or {}).get(HF_KEY))
    try:
        names = json.loads(raw)
    except ValueError:
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def _hf_classes(raw: bytes | None) -> list[str] | None:
    if raw is None:
        return None
    try:
        features = json.loads(raw).get("info", {}).get("features", {})
        labels = {k: f["names"] for k, f in features.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"}
    except (ValueError, AttributeError, KeyError, TypeError):
        return None
    names = labels.get("label") if "label" in labels else next(iter(labels.values())) if len(labels) == 1 else None
    return [str(n) for n in names] if isinstance(names, list) else None
