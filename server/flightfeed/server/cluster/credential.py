"""The cluster credential: how data nodes prove to each other that they belong.

Membership is written only by the operator (``--peers``, ``--peers-dns``) or by nodes that hold
the cluster credential (``--cluster-token-file``), a secret shared by the data nodes and distinct
from the trainers' data token. The secret itself never travels: a node's ``health`` request
carries a fresh nonce and an HMAC-SHA256 of the request under the secret (so the node it checks
may learn it), and the answer carries an HMAC of the answer and that nonce (so a node that
does not hold the secret is never taken as live, whatever fingerprints it claims). Without a
credential, nothing is learned from anyone: the peers are exactly the operator's lists.

What the proofs do not cover: someone able to rewrite traffic between two nodes (a
man-in-the-middle) can still serve other bytes; against that, serve over TLS (``grpc+tls``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import normalize_token, read_token_file

__all__ = ["ClusterKey", "NotAMember", "read_cluster_key"]


class NotAMember(Exception):
    """A peer answered without a valid proof of the cluster credential."""


class ClusterKey:
    """Signs and checks the proofs of one cluster secret (see the module docstring)."""

    def __init__(self, secret: str) -> None:
        self._key = normalize_token(secret, "the cluster token").encode()

    # -- requests (the node that checks) ---------------------------------------------------
    def sign_request(self, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` as a health detail request with a fresh nonce and its proof."""
        request = {"detail": True, **fields, "nonce": secrets.token_hex(16)}
        request.pop("proof", None)
        return {**request, "proof": self._mac("request", request)}

    def admits(self, request: Any) -> bool:
        """Whether a received health request carries a valid proof (its caller holds the secret)."""
        if not isinstance(request, dict) or not isinstance(request.get("proof"), str):
            return False
        unsigned = {k: v for k, v in request.items() if k != "proof"}
        return hmac.compare_digest(request["proof"], self._mac("request", unsigned))

    # -- answers (the node that is checked) ------------------------------------------------
    def sign_answer(self, request: Any, answer: dict[str, Any]) -> dict[str, Any]:
        """``answer`` with a proof bound to the request's nonce (unchanged when it sent none)."""
        nonce = request.get("nonce") if isinstance(request, dict) else None
        if not isinstance(nonce, str):
            return answer
        return {**answer, "proof": self._mac("answer", {**answer, "nonce": nonce})}

    def proves(self, request: dict[str, Any], answer: Any) -> bool:
        """Whether ``answer`` carries a valid proof for ``request`` (the peer holds the secret)."""
        if not isinstance(answer, dict) or not isinstance(answer.get("proof"), str):
            return False
        unsigned = {k: v for k, v in answer.items() if k != "proof"}
        expected = self._mac("answer", {**unsigned, "nonce": request.get("nonce")})
        return hmac.compare_digest(answer["proof"], expected)

    def same_as(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(self._key, token.encode())

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
