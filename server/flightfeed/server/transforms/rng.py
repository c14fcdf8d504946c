"""Deterministic randomness for transforms (docs/design.md §4 invariant 6).

Every random draw of a transform step is a pure function of (dataset fingerprint, seed, epoch,
STORED row index, step index): never of the stream, worker, node or position in a message. So a
sample gets the same augmentation whatever the number of streams, workers or data nodes, a new
one each epoch, and a resumed epoch is byte-identical.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.random.bit_generator import ISeedSequence

__all__ = ["DrawKey", "row_generator", "philox_key"]

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
    """The generator for step ``step`` of stored row ``row``: Philox keyed by
    ``numpy.random.SeedSequence([fingerprint word, seed, epoch, row, step])``, the same state
    bit for bit, with the key derived by :func:`philox_key` (about 10 us a row and step instead
    of numpy's 75 us, GIL held: that was a tenth of a JPEG row's decode + augment)."""
    entropy = (key.fingerprint_word, key.seed & _MASK64, key.epoch & _MASK64, row & _MASK64, step & _MASK64)
    keyed: Any = _Keyed(philox_key(entropy))  # any ISeedSequence (the stubs name only SeedSequence)
    return np.random.Generator(np.random.Philox(keyed))


# -- numpy's SeedSequence, for the two 64-bit words of a Philox key ----------------------------
# numpy.random.SeedSequence (O'Neill's seed_seq_fe, pool of 4 uint32 words) builds Python objects
# per word; the same arithmetic on Python ints, with the mixing of the first 4 words (the
# DrawKey's, when its entropy fills them) memoised. ``tests/transforms/test_transform_ops.py``
# checks it against numpy.
_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4
_HASH_A = [_INIT_A]  # the hash constant before each hashmix: INIT_A * MULT_A**k (mod 2**32)
for _ in range(128):
    _HASH_A.append(_HASH_A[-1] * _MULT_A & _M32)


class _Keyed(ISeedSequence):
    """A seed sequence whose Philox state was derived already (numpy's BitGenerator takes any
    ``ISeedSequence``; a ``SeedSequence`` would mix the entropy again)."""

    __slots__ = ("_key",)

    def __init__(self, key: npt.NDArray[np.uint64]) -> None:
        self._key = key

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> npt.NDArray[np.uint64]:
        if n_words != 2 or np.dtype(dtype) != np.uint64:  # what Philox asks for; nothing else is
            raise ValueError(f"a Philox key is 2 uint64 words, not {n_words} of {dtype}")
        return self._key


def _hashmix(value: int, k: int) -> int:
    value = ((value ^ _HASH_A[k]) * _HASH_A[k + 1]) & _M32
    return value ^ (value >> 16)


def _mix(x: int, y: int) -> int:
    r = (_MIX_L * x - _MIX_R * y) & _M32
    return r ^ (r >> 16)


def _words(values: tuple[int, ...]) -> list[int]:
    """numpy's ``_coerce_to_uint32_array`` of a sequence of non-negative ints: each value as its
    32-bit words, least significant first (0 is one word)."""
    out: list[int] = []
    for v in values:
        if v < 0:
            raise ValueError("seed entropy must be non-negative")
        out.append(v & _M32)
        v >>= 32
        while v:
            out.append(v & _M32)
            v >>= 32
    return out


@lru_cache(maxsize=4096)
def _mixed_pool(first: tuple[int, ...]) -> tuple[int, ...]:
    """The pool after mixing the first ``_POOL`` entropy words (zeros past the end): 16 hashmixes."""
    mixer = [_hashmix(first[i] if i < len(first) else 0, i) for i in range(_POOL)]
    k = _POOL
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                mixer[dst] = _mix(mixer[dst], _hashmix(mixer[src], k))
                k += 1
    return tuple(mixer)


def philox_key(entropy: tuple[int, ...]) -> npt.NDArray[np.uint64]:
    """``SeedSequence(list(entropy)).generate_state(2, np.uint64)``, computed on Python ints."""
    words = _words(entropy)
    mixer = list(_mixed_pool(tuple(words[:_POOL])))
    k = _POOL * _POOL
    if k + _POOL * (len(words) - _POOL) >= len(_HASH_A):
        raise ValueError("too much seed entropy for philox_key")
    hash_a = _HASH_A
    for w in words[_POOL:]:
        for dst in range(_POOL):  # mixer[dst] = _mix(mixer[dst], _hashmix(w, k)), inlined
            v = ((w ^ hash_a[k]) * hash_a[k + 1]) & _M32
            r = (_MIX_L * mixer[dst] - _MIX_R * (v ^ (v >> 16))) & _M32
            mixer[dst] = r ^ (r >> 16)
            k += 1
    out = []
    h = _INIT_B
    for i in range(4):  # 4 uint32 words = 2 uint64, little-endian pairs
        v = mixer[i % _POOL] ^ h
        h = h * _MULT_B & _M32
        v = v * h & _M32
        out.append(v ^ (v >> 16))
    return np.array([out[0] | out[1] << 32, out[2] | out[3] << 32], dtype=np.uint64)
