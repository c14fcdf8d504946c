"""Deterministic randomness for transforms (DESIGN.md §4 invariant 6).

Every random draw of a transform step is a pure function of (dataset fingerprint, seed, epoch,
STORED row index, step index): never of the stream, worker, node or position in a message. So a
sample gets the same augmentation whatever the number of streams, workers or data nodes, a new
one each epoch, and a resumed epoch is byte-identical.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["DrawKey", "row_generator"]

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class DrawKey:
    """What a message's draws are keyed by, besides the stored row and the step index."""

    fingerprint: str
    seed: int
    epoch: int

    @cached_property
    def fingerprint_word(self) -> int:
        digest = hashlib.blake2b(self.fingerprint.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")


def row_generator(key: DrawKey, row: int, step: int) -> np.random.Generator:
    """The generator for step ``step`` of stored row ``row`` (Philox keyed by a SeedSequence)."""
    entropy = [key.fingerprint_word, key.seed & _MASK64, key.epoch & _MASK64, row & _MASK64, step & _MASK64]
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(entropy)))
