"""The retry budget of one stream: per outage, in seconds, with capped exponential backoff.

An *outage* starts at a stream's first failure and ends when a retry delivers a message again.
Within one outage the stream tries its endpoint's locations in turn (the next location at once,
a pause only after every location failed once: ``backoff_s`` doubling up to ``backoff_cap_s``),
and gives up when the outage has lasted ``timeout_s`` seconds (or, if ``max_attempts`` is set,
after that many retries). A stream that survives many short outages in one epoch therefore never
runs out of budget; one location that never comes back ends in a :class:`StreamError` naming
every location tried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from flightfeed.client._boundary import retryable, translate
from flightfeed.wire.errors import ConfigError, StreamError

__all__ = ["RetryPolicy", "Outage", "retrying", "split_locations"]

T = TypeVar("T")


def split_locations(location: str) -> list[str]:
    """``"grpc://a:8815,grpc://b:8815"`` -> its entries (a client may name several data nodes)."""
    out = [part.strip() for part in location.split(",") if part.strip()]
    if not out:
        raise ConfigError(f"location {location!r}: expected grpc://HOST:PORT (or several, comma-separated)")
    return out


@dataclass(frozen=True)
class RetryPolicy:
    timeout_s: float = 30.0  # seconds one outage may last before the stream gives up
    max_attempts: int | None = None  # an extra cap on retries per outage (None: time only)
    backoff_s: float = 0.05  # first pause after all locations failed once
    backoff_cap_s: float = 1.0  # longest pause between rounds

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
        self.errors.append(f"{location}: {_first_line(error)}")
        left = self.policy.timeout_s - self.elapsed()
        if left <= 0 or (self.policy.max_attempts is not None and self.attempts >= self.policy.max_attempts):
            return None
        self.attempts += 1
        if self.attempts % max(1, self.locations):
            return 0.0  # another location is untried in this round: go at once
        rounds = self.attempts // max(1, self.locations)
        return float(min(self.policy.backoff_cap_s, self.policy.backoff_s * 2.0 ** (rounds - 1), left))

    def summary(self) -> str:
        last = self.errors[-1] if self.errors else "no error"
        return (
            f"gave up after {self.attempts} retr{'y' if self.attempts == 1 else 'ies'} in "
            f"{self.elapsed():.1f}s (retry_timeout={self.policy.timeout_s:g}s); locations tried: "
            f"{', '.join(self.tried)}; last error: {last}"
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def retrying(
    call: Callable[[str], T],
    locations: Sequence[str],
    policy: RetryPolicy,
    *,
    what: str,
    on_retry: Callable[[str, str], None] | None = None,
) -> T:
    """``call(location)`` over ``locations`` in turn within one outage's budget (for calls that
    are not streams, e.g. ``get_flight_info``); errors that are not worth retrying pass through."""
    outage: Outage | None = None
    at = 0
    while True:
        location = locations[at]
        try:
            return call(location)
        except Exception as exc:
            err = translate(exc)
            if not retryable(err):
                if err is exc:
                    raise
                raise err from exc
            outage = outage or Outage(policy, len(locations))
            pause = outage.failed(location, err)
            if pause is None:
                raise StreamError(f"{what}: {outage.summary()}") from exc
            at = (at + 1) % len(locations)
            if on_retry is not None:
                on_retry(location, locations[at])
            time.sleep(pause)
