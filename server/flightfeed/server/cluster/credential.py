"""The cluster credential: how data nodes prove to each other that they belong.

Membership is written only by the operator (``--peers``, ``--peers-dns``) or by nodes that hold
the cluster credential (``--cluster-token-file``), a secret shared by the data nodes and distinct
from the trainers' data token. The secret itself never travels. When node V (the verifier)
checks the node it dials at location P (the prover):

- V's ``health`` request carries a fresh random ``nonce`` that V chose and keeps outstanding,
  V's own location (``node``), the location it dialled (``to``: P), V's clock (``ts``) and an
  HMAC-SHA256 of all of it under the secret (``proof``);
- P answers with a proof only to a request it *admits*: its proof holds, ``to`` is one of P's
  own locations (``identity.OwnLocations``: a relay or a reflection names another node), ``ts``
  is within ``window_s`` of P's clock and its nonce was not seen before (a captured request
  is accepted once, and never after the window);
- P's answer carries ``nonce``, ``verifier`` (V's location), ``prover`` (the location V dialled)
  and P's clock, all under an HMAC of the secret; V accepts it only while the nonce is
  outstanding (once: it is then spent) and only when ``prover`` is the location V dialled.

So a non-member forwarding V's challenge to a real member (a relay), back to V (a reflection), or
replaying a captured body gets no answer V accepts; and a node that proved itself to one member
is live on another only once it proved itself to that one too (gossip names candidates, the
receiver checks them). Without a credential, nothing is learned from anyone: the peers are
exactly the operator's lists. Members' clocks must agree within ``window_s`` (30 s; NTP).

What the proofs do not cover: someone able to rewrite traffic between two nodes (a
man-in-the-middle) can still serve other bytes; against that, serve over TLS (``grpc+tls``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import normalize_token, read_token_file

__all__ = ["ClusterKey", "NotAMember", "read_cluster_key", "WINDOW_S"]

#: how far a request's clock may be from the receiver's, and how long a challenge stays open
WINDOW_S = 30.0
_MAX_SEEN = 100_000  # nonces remembered (only requests with a valid proof are remembered)


class NotAMember(Exception):
    """A peer answered without a valid proof of the cluster credential."""


class ClusterKey:
    """Signs and checks the proofs of one cluster secret (see the module docstring); ``clock``
    (wall seconds) is injectable for tests."""

    def __init__(self, secret: str, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time) -> None:
        self._key = normalize_token(secret, "the cluster token").encode()
        self.window_s, self.clock = window_s, clock
        self._lock = threading.Lock()
        self._outstanding: dict[str, tuple[str, float]] = {}  # nonce -> (location dialled, issued)
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonces admitted -> when

    # -- the verifier: challenge, then check the answer -------------------------------------
    def sign_request(self, fields: dict[str, Any], to: str) -> dict[str, Any]:
        """``fields`` (this node's ``id`` and ``node``) as a health detail request to the node
        dialled at ``to``, with a fresh outstanding nonce and its proof."""
        nonce = secrets.token_hex(16)
        now = self.clock()
        request = {"detail": True, **fields, "to": to, "ts": now, "nonce": nonce}
        request.pop("proof", None)
        with self._lock:
            self._expire(now)
            self._outstanding[nonce] = (to, now)
        return {**request, "proof": self._mac("request", request)}

    def proves(self, request: dict[str, Any], answer: Any) -> bool:
        """Whether ``answer`` proves that the node dialled for ``request`` holds the secret: its
        proof holds, it echoes this node's outstanding nonce (spent now: accepted once), names
        the location dialled as the prover and this node as the verifier."""
        nonce = request.get("nonce")
        with self._lock:
            self._expire(self.clock())
            pending = self._outstanding.pop(nonce, None) if isinstance(nonce, str) else None
        if pending is None or not isinstance(answer, dict) or not isinstance(answer.get("proof"), str):
            return False
        unsigned = {k: v for k, v in answer.items() if k != "proof"}
        if not hmac.compare_digest(answer["proof"], self._mac("answer", unsigned)):
            return False
        return (
            unsigned.get("nonce") == nonce
            and unsigned.get("prover") == pending[0] == request.get("to")
            and unsigned.get("verifier") == request.get("node")
        )

    def forget(self, request: dict[str, Any]) -> None:
        """Close ``request``'s challenge (no answer came)."""
        with self._lock:
            self._outstanding.pop(str(request.get("nonce")), None)

    # -- the prover: admit the request, sign the answer --------------------------------------
    def admits(self, request: Any, owns: Callable[[str], bool]) -> bool:
        """Whether a received health request is a member's fresh challenge to this node: its
        proof holds, ``to`` is one of this process's locations (``owns``), its clock is within
        the window and its nonce is new (remembered from now on: a replay is refused)."""
        if not isinstance(request, dict) or not isinstance(request.get("proof"), str):
            return False
        unsigned = {k: v for k, v in request.items() if k != "proof"}
        if not hmac.compare_digest(request["proof"], self._mac("request", unsigned)):
            return False
        nonce, ts, to = unsigned.get("nonce"), unsigned.get("ts"), unsigned.get("to")
        now = self.clock()
        if not isinstance(nonce, str) or not isinstance(ts, (int, float)) or abs(now - ts) > self.window_s:
            return False
        if not isinstance(to, str) or not owns(to):
            return False
        with self._lock:
            self._expire(now)
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            while len(self._seen) > _MAX_SEEN:
                self._seen.popitem(last=False)
        return True

    def sign_answer(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        """``answer`` to an admitted ``request``, bound to its nonce, both locations and this
        node's clock."""
        bound = {
            **answer,
            "nonce": request.get("nonce"),
            "verifier": request.get("node"),
            "prover": request.get("to"),
            "ts": self.clock(),
        }
        bound.pop("proof", None)
        return {**bound, "proof": self._mac("answer", bound)}

    def same_as(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(self._key, token.encode())

    # -- internals --------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        """(Under the lock.) Drop challenges and remembered nonces older than two windows (a
        request that old is refused by its clock anyway)."""
        horizon = now - 2 * self.window_s
        while self._seen:
            nonce, when = next(iter(self._seen.items()))
            if when >= horizon:
                break
            self._seen.popitem(last=False)
        for nonce in [n for n, (_, issued) in self._outstanding.items() if issued < horizon]:
            del self._outstanding[nonce]

    def _mac(self, kind: str, doc: dict[str, Any]) -> str:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
        return hmac.new(self._key, f"flightfeed-cluster/{kind}\n{text}".encode(), hashlib.sha256).hexdigest()


def read_cluster_key(path: str, data_token: str | None) -> ClusterKey:
    """The key in ``--cluster-token-file PATH``; refused when it equals the trainers' data token
    (a trainer would then be able to write membership)."""
    key = ClusterKey(read_token_file(path, "--cluster-token-file"))
    if key.same_as(data_token):
        raise ConfigError(
            f"--cluster-token-file {path} holds the same token as --auth-token-file: trainers hold the data "
            "token, and only data nodes may change membership; give the nodes a secret of their own "
            "(e.g. `openssl rand -hex 32`)"
        )
    return key
