"""Membership a client cannot write (docs/operations.md): real nodes on 127.0.0.1; a rogue node
serving the very same data (same fingerprints) is the worst case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest

from flightfeed.server.cluster import Membership
from flightfeed.server.cluster.credential import ClusterKey, read_cluster_key
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.wire.errors import ConfigError
from tests.cluster.conftest import join, member_node
from tests.cluster.test_membership import first_locations

TOKEN = "data-token-trainers-hold"


def rogue_health(target: str, rogue: str, token: str | None = None, **extra: Any) -> None:
    """What the probe did: a client's health action naming another server."""
    headers: Any = [(b"authorization", f"Bearer {token}".encode())] if token else []
    body = json.dumps({"detail": True, "id": "x", "node": rogue, **extra}).encode()
    client = flight.FlightClient(target)
    try:
        list(client.do_action(flight.Action("health", body), flight.FlightCallOptions(headers=headers)))
    finally:
        client.close()


def states(m: Membership) -> dict[str, str]:
    return {p["location"]: p["state"] for p in m.describe()}


def test_a_clients_health_action_never_adds_a_peer(blobs_dir: Path) -> None:
    with member_node(blobs_dir) as a, member_node(blobs_dir) as b, member_node(blobs_dir) as rogue:
        ma, mb = join(a, static=[b.location]), join(b, static=[a.location])
        rogue_health(a.location, rogue.location)  # used to make it a live peer within 3 s
        for _ in range(3):
            ma.check_once()
            mb.check_once()
        assert states(ma) == {b.location: "live"} and states(mb) == {a.location: "live"}
        assert rogue.location not in {loc for eps in first_locations(a.location) for loc in eps}
        assert metrics_snapshot(rogue.metrics)["totals"]["rows"] == 0


def test_a_trainer_with_the_data_token_cannot_write_membership(blobs_dir: Path) -> None:
    key = ClusterKey("cluster-secret-of-the-nodes")
    with (
        member_node(blobs_dir, auth_token=TOKEN) as a,
        member_node(blobs_dir, auth_token=TOKEN) as b,
        member_node(blobs_dir, auth_token=TOKEN) as rogue,
    ):
        ma = join(a, static=[b.location], token=TOKEN, key=key)
        join(b, static=[a.location], token=TOKEN, key=key)
        rogue_health(a.location, rogue.location, token=TOKEN)
        forged = ClusterKey("a-guess").sign_request({"id": "x", "node": rogue.location}, to=a.location)
        rogue_health(a.location, rogue.location, token=TOKEN, **{k: forged[k] for k in ("to", "ts", "nonce", "proof")})
        ma.check_once()
        assert states(ma) == {b.location: "live"}


def test_a_peer_that_cannot_prove_the_credential_is_not_live(blobs_dir: Path) -> None:
    """Fingerprints are not proof: a listed node without the secret serves the same data, and
    still is never offered."""
    with member_node(blobs_dir) as a, member_node(blobs_dir) as other, member_node(blobs_dir) as b:
        ma = join(a, static=[other.location, b.location], key=ClusterKey("cluster-secret"))
        join(other, static=[a.location], key=ClusterKey("another-secret"))
        join(b, static=[a.location], key=ClusterKey("cluster-secret"))
        ma.check_once()
        peers = {p["location"]: p for p in ma.describe()}
        assert peers[b.location]["state"] == "live"
        assert peers[other.location]["state"] == "down"
        assert "did not prove it belongs to this cluster" in peers[other.location]["error"]
        assert {eps[0] for eps in first_locations(a.location)} == {a.location, b.location}


def test_nodes_holding_the_credential_still_join_by_gossip(blobs_dir: Path) -> None:
    key = ClusterKey("cluster-secret")
    with member_node(blobs_dir) as a, member_node(blobs_dir) as b, member_node(blobs_dir) as c:
        ma, mb = join(a, static=[b.location], key=key), join(b, static=[a.location], key=key)
        mc = join(c, static=[a.location], key=key)  # c knows only a
        mc.check_once()  # c checks a, proving the credential: a learns c
        assert states(ma) == {b.location: "unknown", c.location: "unknown"}
        ma.check_once()
        assert states(ma) == {b.location: "live", c.location: "live"}
        mb.check_once()  # b learns c from a's (proven) answer...
        mb.check_once()  # ...and checks it
        assert states(mb) == {a.location: "live", c.location: "live"}
        assert {eps[0] for eps in first_locations(b.location, streams=6)} == {a.location, b.location, c.location}


def test_without_a_credential_nothing_is_learned_even_from_nodes(blobs_dir: Path) -> None:
    with member_node(blobs_dir) as a, member_node(blobs_dir) as c:
        ma, mc = join(a), join(c, static=[a.location])
        mc.check_once()
        ma.check_once()
        assert states(ma) == {}  # the operator's list (empty) is the membership
        assert states(mc) == {a.location: "live"}


def test_the_cluster_token_must_differ_from_the_data_token(tmp_path: Path) -> None:
    path = tmp_path / "cluster-token"
    path.write_text(TOKEN + "\n")
    with pytest.raises(ConfigError, match=r"same token as --auth-token-file"):
        read_cluster_key(str(path), TOKEN)
    assert read_cluster_key(str(path), "another") is not None
