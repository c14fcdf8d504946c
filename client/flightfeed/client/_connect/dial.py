"""Ask the tier: a call (``get_flight_info``, dataset info) sent to the first member that answers.

Members are tried in :meth:`Members.order` (live ones first, failed ones last). A member that
fails moves to the end until it answers again. What happens when none answers depends on whether
any of them ever answered in this process:

* **never** (a wrong host or port, no server started, a typo in the scheme): a configuration
  error, raised at once with each location's error and what to check — no 30-second silent wait;
* **before** (a server that went away: a restart, a node lost): an outage, retried over the
  members within the per-outage budget of :class:`ConnectOptions` (``retry_timeout``), with one
  log line when the retries begin and one when a member answers again.

A member that does not answer within :data:`HEDGE_AFTER_S` (a node that died without closing its
connections: its address no longer answers at all, so the call waits for its timeout) gets company:
the same call goes to the next member too, and the first answer wins (a hedged request, as in
"The Tail at Scale"); the slow call finishes in the background and its result is dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from flightfeed.client._connect.boundary import first_line, reached_server, retryable, translate
from flightfeed.client._connect.members import Members
from flightfeed.client._connect.retry import Outage, RetryPolicy
from flightfeed.wire.errors import ConfigError, StreamError, Unauthenticated

__all__ = ["first_answer", "never_answered", "with_token_hint", "HEDGE_AFTER_S"]

log = logging.getLogger("flightfeed.client")
T = TypeVar("T")

#: seconds a member may take to answer before the call also goes to the next one
HEDGE_AFTER_S = 1.0

TOKEN_HINT = "pass the server's token with FlightDataset(..., connect=ConnectOptions(token=...))"
#: the server's own hint (server/guards/auth.py), which :data:`TOKEN_HINT` replaces on the trainer
SERVER_TOKEN_HINT = "pass the server's token to the client"


def with_token_hint(err: Unauthenticated) -> Unauthenticated:
    """``err`` saying where a trainer passes the token: the server's generic hint replaced by
    :data:`TOKEN_HINT` (said once), or :data:`TOKEN_HINT` appended (docs/errors.md)."""
    text = str(err)
    if "connect=ConnectOptions" in text:
        return err
    if text.endswith(SERVER_TOKEN_HINT):
        return Unauthenticated(text[: -len(SERVER_TOKEN_HINT)] + TOKEN_HINT)
    return Unauthenticated(f"{text}; {TOKEN_HINT}")


def never_answered(what: str, errors: dict[str, str]) -> ConfigError:
    """The error for a call whose locations never answered in this process."""
    tried = "; ".join(f"{loc}: {err}" for loc, err in errors.items())
    several = len(errors) > 1
    return ConfigError(
        f"{what}: no flightfeed server answered at {', '.join(errors)} ({tried}). Check that "
        f"{'a server is' if several else 'the server is'} running there (`flightfeed serve` prints its "
        "'flight:' location), that the location starts with grpc:// (grpc+tls:// with TLS) and that host "
        "and port are right. Retries (retry_timeout) are only for servers that answered before and went away."
    )


def first_answer(
    call: Callable[[str], T],
    members: Members,
    policy: RetryPolicy,
    *,
    what: str,
    on_retry: Callable[[str, str], None] | None = None,
) -> T:
    """``call(location)`` on the first member that answers (see the module doc)."""
    order = members.order()
    outage: Outage | None = None
    errors: dict[str, str] = {}
    waiting = False  # the retries' first pause was logged
    at = 0
    while True:
        location = order[at]
        try:
            answered, out = _hedged(call, location, [m for m in order[at + 1 :] + order[:at] if m != location], members)
        except Exception as exc:
            err = translate(exc)
            if reached_server(err):
                members.heard(location)
            if not retryable(err):
                if isinstance(err, Unauthenticated):
                    err = with_token_hint(err)
                if err is exc:
                    raise
                raise err from exc
            members.failed(location)
            errors.setdefault(location, first_line(exc.__cause__ or err))
            if len(errors) == len(order) and not any(members.ever_answered(m) for m in order):
                raise never_answered(what, errors) from exc
            outage = outage or Outage(policy, len(order))
            pause = outage.failed(location, err)
            if pause is None:
                raise StreamError(f"{what}: {outage.summary()}") from exc
            if pause and not waiting:  # every member failed once: the wait begins
                waiting = True
                log.warning(
                    "%s: no member answered (%s); retrying over %s for up to %gs (retry_timeout)",
                    what, "; ".join(f"{k}: {v}" for k, v in errors.items()), ", ".join(order), policy.timeout_s,
                )
            at = (at + 1) % len(order)
            if on_retry is not None:
                on_retry(location, order[at])
            time.sleep(pause)
        else:
            members.answered(answered)
            if waiting and outage is not None:
                log.warning("%s: %s answered after %.1fs", what, answered, outage.elapsed())
            return out


def _hedged(call: Callable[[str], T], first: str, others: Sequence[str], members: Members) -> tuple[str, T]:
    """``call(first)``; each :data:`HEDGE_AFTER_S` without an answer, ``call`` on the next of
    ``others`` too. The first success wins: ``(its location, its result)``; when every call
    started failed, ``first``'s error."""
    answers: queue.Queue[tuple[str, bool, object]] = queue.Queue()

    def attempt(location: str) -> None:
        try:
            answers.put((location, True, call(location)))
        except Exception as exc:  # handed to the caller's thread
            answers.put((location, False, exc))

    started = [first]
    threading.Thread(target=attempt, args=(first,), daemon=True, name="flightfeed-dial").start()
    backups = [m for m in others if members.ever_answered(m)]  # never a location that never answered
    first_error: BaseException | None = None
    done = 0
    while True:
        wait = HEDGE_AFTER_S if backups and first_error is None else None
        try:
            location, ok, value = answers.get(timeout=wait)
        except queue.Empty:
            backup = backups.pop(0)
            started.append(backup)
            log.info("%s has not answered in %gs; asking %s too", first, HEDGE_AFTER_S, backup)
            threading.Thread(target=attempt, args=(backup,), daemon=True, name="flightfeed-dial").start()
            continue
        done += 1
        if ok:
            if location != first and first_error is None:
                members.failed(first)  # it did not answer while another did: asked last until it answers
            return location, value  # type: ignore[return-value]
        assert isinstance(value, BaseException)
        if location == first:
            first_error = value
        elif isinstance(value, Exception) and retryable(translate(value)):
            members.failed(location)
        if first_error is not None and done == len(started):
            raise first_error
