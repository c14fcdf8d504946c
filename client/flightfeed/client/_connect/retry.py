"""The retry budget of one stream: per outage, in seconds, with capped exponential backoff.

An *outage* starts at a stream's first failure and ends when a retry delivers a message again.
Within one outage the stream tries its endpoint's locations in turn (the next location at once,
a pause only after every location failed once: ``backoff_s`` doubling up to ``backoff_cap_s``),
and gives up when the outage has lasted ``timeout_s`` seconds. ``max_attempts`` (the user's
``retries``) is a cap that respects a floor: it ends an outage after that many retries only once the
outage has lasted ``floor_s`` (5 s, or ``timeout_s`` if shorter) — a count alone, with pauses
starting at 0.05 s, would give up in 0.35 s on ``retries=3``, before a restarted node (about 1 s)
is back. A stream that survives many short outages in one epoch never runs out of budget; one
location that never comes back ends in a :class:`StreamError` naming every location tried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flightfeed.client._connect.boundary import first_line
from flightfeed.wire.errors import ConfigError

__all__ = ["RetryPolicy", "Outage", "COUNT_FLOOR_S"]

COUNT_FLOOR_S = 5.0  # a retry count never ends an outage shorter than this (a node restarts in ~1 s)


@dataclass(frozen=True)
class RetryPolicy:
    timeout_s: float = 30.0  # seconds one outage may last before the stream gives up
    max_attempts: int | None = None  # an extra cap on retries per outage (None: time only)
    backoff_s: float = 0.05  # first pause after all locations failed once
    backoff_cap_s: float = 1.0  # longest pause between rounds
    floor_s: float = COUNT_FLOOR_S  # max_attempts ends no outage shorter than min(floor_s, timeout_s)

    def __post_init__(self) -> None:
        if not self.timeout_s >= 0:
            raise ConfigError(f"retry_timeout is {self.timeout_s}; it must be >= 0 seconds (0: never retry)")
        if self.max_attempts is not None and self.max_attempts < 0:
            raise ConfigError(f"retries is {self.max_attempts}; it must be >= 0 or None (no count limit)")


@dataclass
class Outage:
    """The failures of one stream since it last made progress."""

    policy: RetryPolicy
    locations: int  # how many locations the stream can try
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)
    attempts: int = field(default=0, init=False)  # retries granted so far
    tried: list[str] = field(default_factory=list, init=False)  # locations that failed, in order
    errors: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def failed(self, location: str, error: BaseException) -> float | None:
        """Record a failure at ``location``; the pause before the next try, or None: give up."""
        if location not in self.tried:
            self.tried.append(location)
        self.errors.append(f"{location}: {first_line(error)}")
        elapsed = self.elapsed()
        left = self.policy.timeout_s - elapsed
        if left <= 0 or self._counted_out(elapsed):
            return None
        self.attempts += 1
        if self.attempts % max(1, self.locations):
            return 0.0  # another location is untried in this round: go at once
        rounds = self.attempts // max(1, self.locations)
        return float(min(self.policy.backoff_cap_s, self.policy.backoff_s * 2.0 ** (rounds - 1), left))

    def _counted_out(self, elapsed: float) -> bool:
        cap = self.policy.max_attempts
        floor = min(self.policy.floor_s, self.policy.timeout_s)
        return cap is not None and self.attempts >= cap and elapsed >= floor

    def summary(self) -> str:
        last = self.errors[-1] if self.errors else "no error"
        return (
            f"gave up after {self.attempts} retr{'y' if self.attempts == 1 else 'ies'} in "
            f"{self.elapsed():.1f}s (retry_timeout={self.policy.timeout_s:g}s); locations tried: "
            f"{', '.join(self.tried)}; last error: {last}"
        )
