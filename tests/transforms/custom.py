"""A custom transform package as an operator would ship it (loaded through an entry point)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from flightfeed.server.transforms import Param, Transform

CALLS: list[int] = []


def invert(row: np.ndarray, params: Mapping[str, Any], rng: Any) -> np.ndarray:
    return np.asarray(params["top"] - row, dtype=row.dtype)


def count_messages(batch: np.ndarray, params: Mapping[str, Any], key: Any) -> np.ndarray:
    CALLS.append(len(batch))
    return batch


def transforms() -> list[Transform]:
    return [
        Transform("invert", invert, (Param("top", int, 255, low=0, high=255),)),
        Transform("count_messages", count_messages, per="message"),
    ]
