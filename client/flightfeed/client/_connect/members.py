"""The data nodes a reader knows: the locations it was given, those the tier told it about, and
which of them answered.

A ``FlightDataset`` starts from its ``location`` (one or several comma-separated entries, checked
here when the dataset is made) and learns the tier's other members from the locations of every
FlightInfo's endpoints. ``order()`` lists members for the next ``get_flight_info``: those that did
not fail first (given ones before learned ones), then those that failed, longest-failed first. So a
trainer pointed at one node survives that node's loss at its next epoch (another remembered member
answers), and a dead member costs nothing per epoch (it is tried only when every other one failed)
until it answers again.

Which locations ever answered is also kept per process: a location that never answered in this
process is a configuration error, not an outage (see :mod:`._dial`). So are the tiers' members: what
one reader learned from a FlightInfo serves every reader of that tier in the process (a *val*
dataset made with the one address a script was given, after that node died, asks the members the
*train* dataset learned instead of retrying the dead address until its retry budget ends).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from flightfeed.wire.errors import ConfigError

__all__ = ["Members", "parse_location", "split_locations", "answered_here", "tier_members"]

SCHEMES = ("grpc", "grpc+tcp", "grpc+tls", "grpc+unix")
_ANSWERED: set[str] = set()  # locations that answered a call in this process (any reader)
_ANSWERED_LOCK = threading.Lock()
_TIERS: dict[str, list[str]] = {}  # location -> the members of its tier seen in this process (one list per tier)
_TIER_FAILED: dict[str, float] = {}  # tier members a reader of this process saw fail (monotonic time)
_TIER_ANSWERED: dict[str, float] = {}  # when a location last answered a reader of this process
_TIERS_LOCK = threading.Lock()


def parse_location(entry: str) -> str:
    """``entry`` if it is a Flight location a client can dial, else a ConfigError saying how to write it."""
    hint = "write it as grpc://HOST:PORT (grpc+tls://HOST:PORT with TLS), e.g. grpc://127.0.0.1:8815"
    if "://" not in entry:
        raise ConfigError(f"location {entry!r} has no scheme: {hint} (here: 'grpc://{entry}')")
    parts = urlsplit(entry)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"location {entry!r}: the scheme {parts.scheme!r} is not a Flight one; {hint}")
    if parts.scheme == "grpc+unix":
        if not parts.path:
            raise ConfigError(f"location {entry!r} names no socket: write grpc+unix:///path/to/socket")
        return entry
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"location {entry!r}: the port is not a number in 1..65535; {hint}") from None
    if not parts.hostname or port is None or not 0 < port < 65536:
        raise ConfigError(f"location {entry!r} needs a host and a port; {hint}")
    return entry


def split_locations(location: str) -> list[str]:
    """``"grpc://a:8815,grpc://b:8815"`` -> its entries, each checked (a client may name several nodes)."""
    if not isinstance(location, str):
        raise ConfigError(f"location is a {type(location).__name__}; pass a string such as 'grpc://HOST:8815'")
    out = [part.strip() for part in location.split(",") if part.strip()]
    if not out:
        raise ConfigError(f"location {location!r}: expected grpc://HOST:PORT (or several, comma-separated)")
    return [parse_location(entry) for entry in dict.fromkeys(out)]


def answered_here(location: str) -> bool:
    """Whether ``location`` answered a call in this process."""
    with _ANSWERED_LOCK:
        return location in _ANSWERED


def _register_tier(locations: Iterable[str]) -> None:
    """``locations`` belong to one tier (a FlightInfo named them): merge what this process knows."""
    with _TIERS_LOCK:
        merged = list(dict.fromkeys(locations))
        for loc in list(merged):
            merged.extend(m for m in _TIERS.get(loc, ()) if m not in merged)
        for loc in merged:
            _TIERS[loc] = merged


def tier_members(locations: Iterable[str]) -> list[str]:
    """The members this process learned for the tiers of ``locations`` (any reader's FlightInfos)."""
    out: list[str] = []
    with _TIERS_LOCK:
        for loc in locations:
            out.extend(m for m in _TIERS.get(loc, ()) if m not in out)
    return out


class Members:
    """The locations of one reader's tier, in the order to try them (thread-safe, picklable)."""

    def __init__(self, location: str) -> None:
        self.given = split_locations(location)
        self._known: list[str] = list(self.given)  # given first, then learned, in the order seen
        self._failed: dict[str, float] = {}  # location -> when it last failed (monotonic)
        self._dropped: set[str] = set()  # failed locations a later FlightInfo no longer listed
        self._answered: set[str] = set()  # answered this reader (travels to DataLoader workers)
        self._joined = False  # a FlightInfo listed the tier for this reader: it shares the tier's failures
        self._lock = threading.Lock()

    def order(self) -> list[str]:
        """Members to try: those that did not fail, then the failed ones (longest-failed first)."""
        self._adopt()
        with self._lock:
            ok = [m for m in self._known if m not in self._failed]
            return ok + sorted(self._failed, key=self._failed.__getitem__)

    def listed(self, locations: Iterable[str]) -> None:
        """A FlightInfo named ``locations`` (every live node of the tier). A failed member it no
        longer names was dropped by the tier; one that the tier names again after dropping it was
        seen back by the tier's health probes, so it is no longer held back here."""
        named = list(dict.fromkeys(locations))
        self.learn(named)
        if named:
            _register_tier([*self.given, *named])  # the tier's members serve every reader of it in this process
            self._joined = True
        self._adopt()
        back = []
        with self._lock:
            for loc in list(self._failed):
                if loc not in named:
                    self._dropped.add(loc)
                elif loc in self._dropped:
                    del self._failed[loc]
                    self._dropped.discard(loc)
                    back.append(loc)
        with _TIERS_LOCK:
            for loc in back:
                _TIER_FAILED.pop(loc, None)

    def prefer(self, locations: Iterable[str]) -> list[str]:
        """``locations`` (an endpoint's, first choice first) with the members that failed moved to
        the end, longest-failed first: a stream does not start on a node this reader saw die
        while the tier still lists it (membership lags a death by a probe round or two)."""
        self._adopt()
        with self._lock:
            given = list(dict.fromkeys(locations))
            ok = [m for m in given if m not in self._failed]
            return ok + sorted((m for m in given if m in self._failed), key=self._failed.__getitem__)

    def known(self) -> list[str]:
        self._adopt()
        with self._lock:
            return list(self._known)

    def learn(self, locations: Iterable[str]) -> None:
        """Remember members the tier named (endpoint locations); entries that do not parse are ignored."""
        for loc in locations:
            try:
                parse_location(loc)
            except ConfigError:
                continue
            with self._lock:
                if loc not in self._known:
                    self._known.append(loc)

    def _adopt(self) -> None:
        """Learn the members other readers of this process learned for the tier of a given location
        (after the given ones, which keep their place); once this reader is part of the tier (a
        FlightInfo listed it), also the members they saw fail (so the rank that did not see a node
        die does not ask it first either)."""
        self.learn(tier_members(self.given))
        if not self._joined:
            return
        with _TIERS_LOCK:
            shared, back = dict(_TIER_FAILED), dict(_TIER_ANSWERED)
        with self._lock:
            for loc, when in shared.items():
                if loc in self._known and loc not in self._failed:
                    self._failed[loc] = when
            for loc, when in list(self._failed.items()):
                if back.get(loc, when) > when:  # it answered another reader since
                    del self._failed[loc]
                    self._dropped.discard(loc)

    def suspect(self, location: str) -> bool:
        """Whether ``location`` failed (here or, for a reader of a tier, in another reader of it)
        and has not answered since."""
        self._adopt()
        with self._lock:
            return location in self._failed

    def answered(self, location: str) -> None:
        """``location`` served a call: it is live again."""
        self.heard(location)
        with self._lock:
            self._failed.pop(location, None)
            self._dropped.discard(location)
        with _TIERS_LOCK:
            _TIER_FAILED.pop(location, None)
            _TIER_ANSWERED[location] = time.monotonic()

    def heard(self, location: str) -> None:
        """``location`` answered (maybe with an error): it is a server, so it counts as reachable."""
        with self._lock:
            self._answered.add(location)
        with _ANSWERED_LOCK:
            _ANSWERED.add(location)

    def failed(self, location: str) -> None:
        """A call to ``location`` failed: try it last until it answers again."""
        with self._lock:
            if location not in self._known:
                self._known.append(location)
            self._failed[location] = time.monotonic()
            self._dropped.discard(location)
            shared = self._joined
        if shared:
            with _TIERS_LOCK:
                _TIER_FAILED[location] = time.monotonic()

    def ever_answered(self, location: str) -> bool:
        """Whether ``location`` answered this reader or anyone in this process."""
        with self._lock:
            if location in self._answered:
                return True
        return answered_here(location)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = {**self.__dict__, "_known": list(self._known), "_answered": set(self._answered)}
        del state["_lock"]
        state["_failed"] = {}  # failure times are this process's clock
        state["_dropped"] = set()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
