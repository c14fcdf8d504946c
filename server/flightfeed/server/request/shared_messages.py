"""Concurrent streams that need the same shuffled message share one gathered copy.

Many clients reading the same epoch with the same settings (hyper-parameter sweeps, several jobs
on one dataset, a benchmark) ask for identical shuffled messages at about the same time; each
gather is a fresh copy of the rows. :class:`SharedMessages` remembers every message it made for
as long as some stream still holds it (weak references: nothing outlives its last reader) and
hands the same RecordBatch to any stream that asks for the same rows meanwhile. The key is
everything that decides a message's content: dataset and fingerprint, columns, seed, epoch,
shuffle and partition settings, and the message's rank-local row range.

:func:`last_was_shared` tells the bytes-in-flight budget (same thread, right after producing a
message) that the message it just got was already counted by the stream that made it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa

__all__ = ["SharedMessages", "SHARED", "last_was_shared", "message_key"]

_local = threading.local()


def last_was_shared() -> bool:
    """Whether the last message this thread got from :meth:`SharedMessages.get` already existed
    (and resets the flag)."""
    hit = bool(getattr(_local, "hit", False))
    _local.hit = False
    return hit


def message_key(ds: Any, read: Any, columns: list[str], lo: int, hi: int) -> tuple[Hashable, ...]:
    """Everything that decides the content of the shuffled message of rank-local rows [lo, hi)."""
    shuffle = read.shuffle
    return (
        ds.name, ds.fingerprint, ds.num_rows, tuple(columns), int(read.seed), int(read.epoch),
        bool(shuffle.enabled), int(shuffle.block_rows), int(shuffle.buffer_rows), int(read.batch_rows),
        int(read.rank), int(read.world_size), bool(read.drop_last), int(read.global_start), lo, hi,
    )


class SharedMessages:
    """Messages alive in some stream, by key (weak: dropped with their last holder)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alive: weakref.WeakValueDictionary[Hashable, pa.RecordBatch] = weakref.WeakValueDictionary()
        self.made = 0
        self.shared = 0

    def get(self, key: Hashable, make: Callable[[], pa.RecordBatch]) -> pa.RecordBatch:
        with self._lock:
            batch = self._alive.get(key)
        if batch is not None:
            self.shared += 1
            _local.hit = True
            return batch
        batch = make()  # two streams may both make it at the same moment: correct, just not shared
        with self._lock:
            self._alive.setdefault(key, batch)
        self.made += 1
        _local.hit = False
        return batch

    def __len__(self) -> int:
        with self._lock:
            return len(self._alive)


#: the process's registry (keys name the dataset and its fingerprint: one registry serves all)
SHARED = SharedMessages()
