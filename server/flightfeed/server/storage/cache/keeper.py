"""The shard cache's keeper thread: what one process does for the others sharing the directory.

Every ``KEEP_EVERY_S`` it (``ShardCache._keep``):

- follows the other processes' evictions and replacements through the journal, closing this
  process's readers of those entries (so their maps, and the space, go);
- closes this process's idle readers of files another process asks for (its claim's ``wants``:
  it needs the room, and a mapped file is never evicted, ``cache_room``);
- republishes this process's claim when it changed (a mapping went, a download failed), so the
  others see the room it gave back.

The thread holds only a weak reference to its cache and ends with it (``close`` or garbage).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["KEEP_EVERY_S", "start_keeper"]

#: how often a process follows the others and republishes its claim
KEEP_EVERY_S = 0.05


class _Kept(Protocol):
    _room: threading.Condition

    def _keep(self) -> list[Callable[[], None]]: ...


def start_keeper(cache: _Kept) -> threading.Event:
    """Start ``cache``'s keeper thread; set the returned event to stop it."""
    stop = threading.Event()
    threading.Thread(
        target=_run, args=(weakref.ref(cache), stop), name="flightfeed-cache-keeper", daemon=True
    ).start()
    return stop


def _run(ref: weakref.ref[_Kept], stop: threading.Event) -> None:
    while not stop.wait(KEEP_EVERY_S):
        cache = ref()
        if cache is None:
            return
        with contextlib.suppress(Exception):  # a directory removed under it (tests, an operator)
            callbacks = cache._keep()
            for callback in callbacks:  # without the cache's lock
                callback()
            if callbacks:  # readers closed: the maps of those with nothing in flight went now
                cache._keep()  # (told at once, not a period later)
                with cache._room:
                    cache._room.notify_all()
        del cache
