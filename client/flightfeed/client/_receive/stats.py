"""Data-stall accounting: how long the consumer waited for batches, out of the time it ran.

:meth:`StallMeter.figures` gives counts (rows, bytes, batches, events, nodes) as ``int`` and
durations, rates and ratios as ``float``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

__all__ = ["StallMeter"]


@dataclass
class StallMeter:
    """``wait_s / elapsed_s`` is the data-stall ratio: 0 = the trainer never waited."""

    rows: int = 0
    bytes: int = 0
    batches: int = 0
    wait_s: float = 0.0
    rows_skipped: int = 0  # rows the server dropped (on_decode_error="skip")
    stages: dict[str, float] = field(default_factory=dict)  # seconds per pipeline stage (e.g. device)
    counts: dict[str, int] = field(  # events; moved/hedged/duplicates: work between streams (``_board``)
        default_factory=lambda: {"retries": 0, "failovers": 0, "moved": 0, "hedged": 0, "duplicates": 0}
    )
    levels: dict[str, int | float] = field(default_factory=dict)  # current values (e.g. nodes read from)
    _start: float | None = None
    _offset: float = 0.0
    _end: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> None:
        with self._lock:
            if self._start is None or self._end is not None:
                # a new iteration: keep totals, measure elapsed over active time only
                self._offset = self.elapsed_s
                self._start, self._end = time.perf_counter(), None

    def waited(self, seconds: float, rows: int, nbytes: int) -> None:
        with self._lock:
            self.wait_s += seconds
            self.rows += rows
            self.bytes += nbytes
            self.batches += 1

    def skipped(self, rows: int) -> None:
        with self._lock:
            self.rows_skipped += rows

    def spent(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage`` (part of the consumer's wait; reported as ``<stage>_s``)."""
        with self._lock:
            self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def count(self, event: str, n: int = 1) -> None:
        """Count ``n`` occurrences of ``event`` (reported under that name)."""
        with self._lock:
            self.counts[event] = self.counts.get(event, 0) + n

    def set(self, name: str, value: int | float) -> None:
        """Report ``name`` as ``value`` from now on (a level, not a count; an int stays an int)."""
        with self._lock:
            self.levels[name] = value

    def stop(self) -> None:
        with self._lock:
            if self._start is not None and self._end is None:
                self._end = time.perf_counter()

    @property
    def elapsed_s(self) -> float:
        if self._start is None:
            return 0.0
        end = self._end if self._end is not None else time.perf_counter()
        return self._offset + (end - self._start)

    def figures(self) -> dict[str, int | float]:
        """Counts as ints, durations (``*_s``), rates and ratios as floats."""
        elapsed = self.elapsed_s
        with self._lock:
            stages = dict(self.stages)
            counts = dict(self.counts)
            levels = dict(self.levels)
        return {
            "rows": int(self.rows),
            "bytes": int(self.bytes),
            "batches": int(self.batches),
            "rows_skipped": int(self.rows_skipped),
            "wait_s": self.wait_s,
            "elapsed_s": elapsed,
            "stall_ratio": self.wait_s / elapsed if elapsed > 0 else 0.0,
            "rows_per_s": self.rows / elapsed if elapsed > 0 else 0.0,
            "bytes_per_s": self.bytes / elapsed if elapsed > 0 else 0.0,
            **{f"{stage}_s": seconds for stage, seconds in stages.items()},
            **{event: int(n) for event, n in counts.items()},
            **levels,
        }
