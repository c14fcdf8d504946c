"""Sliding-window throughput: rows and bytes per second over the last few seconds, per dataset.

:class:`RateWindow` keeps one small slot per second (rows, bytes and the streams active, per
key). Recording a batch is a lock, a clock read and two additions, so the Flight service can
call it for every RecordBatch without slowing the stream. Rates are computed when asked
(the sidecar's ``/stats`` and ``/metrics``), never on the streaming path.

Per-stream throughput is the bytes of the window divided by the stream-seconds during which
streams were sending: for four streams sending together at 1 GB/s in all, it reads 0.25 GB/s.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Rates", "RateWindow"]


@dataclass(frozen=True)
class Rates:
    """Throughput over the window; ``stream_bytes_per_s`` is per sending stream (0 when idle)."""

    rows_per_s: float = 0.0
    bytes_per_s: float = 0.0
    stream_bytes_per_s: float = 0.0


@dataclass
class _Slot:
    index: int
    #: key -> [rows, bytes, most streams active during the slot]
    keys: dict[str, list[float]] = field(default_factory=dict)
    streams_max: int = 0
    streams_end: int = 0


class RateWindow:
    """Per-key rows/bytes in one-second slots; rates over the last ``window_s`` seconds.

    ``history_s`` seconds of slots are kept for :meth:`history` (the dashboard's chart).
    """

    def __init__(
        self,
        window_s: float = 10.0,
        *,
        slot_s: float = 1.0,
        history_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slot_s <= 0 or window_s < slot_s or history_s < window_s:
            raise ValueError("need 0 < slot_s <= window_s <= history_s")
        self.window_s = float(window_s)
        self.slot_s = float(slot_s)
        self._window_slots = max(1, round(window_s / slot_s))
        self._keep = max(self._window_slots, round(history_s / slot_s)) + 1
        self._clock = clock
        self._t0 = clock()
        self._wall0 = time.time() - self._t0
        self._slots: deque[_Slot] = deque()
        self._active: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- recording (hot path) -----------------------------------------------------------------
    def _slot(self, now: float) -> _Slot:
        index = int(now // self.slot_s)
        slots = self._slots
        if not slots or slots[-1].index != index:
            end = slots[-1].streams_end if slots else sum(self._active.values())
            slots.append(_Slot(index, streams_max=end, streams_end=end))
            while len(slots) > self._keep:
                slots.popleft()
        return slots[-1]

    def add(self, key: str, rows: int, nbytes: int) -> None:
        """Count one batch of ``rows`` rows and ``nbytes`` bytes sent for ``key``."""
        with self._lock:
            slot = self._slot(self._clock())
            entry = slot.keys.get(key)
            if entry is None:
                entry = slot.keys[key] = [0.0, 0.0, float(self._active.get(key, 0))]
            entry[0] += rows
            entry[1] += nbytes

    def streams(self, key: str, delta: int) -> None:
        """A stream of ``key`` started (+1) or finished (-1)."""
        with self._lock:
            active = max(0, self._active.get(key, 0) + delta)
            self._active[key] = active
            slot = self._slot(self._clock())
            entry = slot.keys.get(key)
            if entry is None:
                entry = slot.keys[key] = [0.0, 0.0, 0.0]
            entry[2] = max(entry[2], float(active))
            total = sum(self._active.values())
            slot.streams_end = total
            slot.streams_max = max(slot.streams_max, total)

    # -- reading ----------------------------------------------------------------------------------
    def active(self) -> dict[str, int]:
        with self._lock:
            return dict(self._active)

    def rates(self) -> tuple[Rates, dict[str, Rates]]:
        """``(all keys together, per key)`` over the last ``window_s`` seconds."""
        with self._lock:
            now = self._clock()
            now_index = int(now // self.slot_s)
            first = now_index - self._window_slots + 1
            # the window, clipped to the uptime but never shorter than one slot (no start-up spikes)
            span = max(now - max(first * self.slot_s, self._t0), self.slot_s)
            sums: dict[str, list[float]] = {}
            for slot in self._slots:
                if slot.index < first:
                    continue
                begin = max(slot.index * self.slot_s, self._t0)
                length = max(min((slot.index + 1) * self.slot_s, now) - begin, 0.0)
                for key, (rows, nbytes, streams) in slot.keys.items():
                    acc = sums.setdefault(key, [0.0, 0.0, 0.0])
                    acc[0] += rows
                    acc[1] += nbytes
                    if nbytes > 0:
                        acc[2] += length * max(streams, 1.0)
        per_key = {key: _rates(acc, span) for key, acc in sums.items()}
        total = [sum(a[i] for a in sums.values()) for i in range(3)]
        return _rates(total, span), per_key

    def history(self) -> list[dict[str, float]]:
        """One point per finished slot of the kept history: wall time, rows/s, bytes/s, streams."""
        with self._lock:
            now_index = int(self._clock() // self.slot_s)
            first = max(now_index - self._keep + 1, int(self._t0 // self.slot_s))
            by_index = {s.index: s for s in self._slots}
            points: list[dict[str, float]] = []
            streams = 0
            for index in range(first, now_index):
                slot = by_index.get(index)
                rows = nbytes = 0.0
                if slot is not None:
                    rows = sum(v[0] for v in slot.keys.values())
                    nbytes = sum(v[1] for v in slot.keys.values())
                    streams = slot.streams_max
                points.append(
                    {
                        "t": round(self._wall0 + index * self.slot_s, 3),
                        "rows_per_s": rows / self.slot_s,
                        "bytes_per_s": nbytes / self.slot_s,
                        "streams": float(streams),
                    }
                )
                if slot is not None:
                    streams = slot.streams_end
            return points


def _rates(acc: list[float], span: float) -> Rates:
    rows, nbytes, stream_seconds = acc
    per_stream = nbytes / stream_seconds if stream_seconds > 0 else 0.0
    return Rates(rows / span, nbytes / span, per_stream)
