"""Cluster proofs that cannot be relayed, reflected or replayed (docs/operations.md): real nodes on
127.0.0.1 holding the cluster key, and a rogue without it that serves altered rows (its
``index`` values are shifted by ``FOREIGN``) and answers ``health`` by passing the challenge on
with the data token every trainer holds. Each case reads an epoch through a member and counts
the rows that came from the rogue: there must be none."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pytest

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from flightfeed.server.cluster import Membership
from flightfeed.server.cluster.credential import ClusterKey
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.testing import RunningServer
from tests.cluster.conftest import BLOB_BYTES, BLOB_ROWS, join, member_node

TOKEN = "data-token-trainers-hold"
FOREIGN = 1_000_000


class Clock:
    """Wall time the test moves by hand (no sleeping for a window to pass)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def rogue_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The members' shards byte for byte in size and layout (so the same fingerprint: a rogue
    may claim any), with every ``index`` value shifted by FOREIGN."""
    root = tmp_path_factory.mktemp("rogue")
    schema = pa.schema([("index", pa.int64()), ("blob", pa.list_(pa.uint8(), BLOB_BYTES))])
    per, batch = BLOB_ROWS // 3, 250
    for s in range(3):
        with ipc.new_file(str(root / f"part-{s:03d}.arrow"), schema) as w:
            for start in range(s * per, (s + 1) * per, batch):
                idx = np.arange(start, start + batch, dtype=np.int64)
                values = np.repeat((idx % 251).astype(np.uint8), BLOB_BYTES)
                blob = pa.FixedSizeListArray.from_arrays(pa.array(values), BLOB_BYTES)
                w.write_batch(pa.record_batch([pa.array(idx + FOREIGN), blob], schema=schema))
    return root


def call_health(target: str, body: bytes) -> bytes:
    """A health action with the data token (what any trainer may send)."""
    client = flight.FlightClient(target)
    try:
        headers: Any = [(b"authorization", f"Bearer {TOKEN}".encode())]
        options = flight.FlightCallOptions(headers=headers)
        return b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("health", body), options))
    finally:
        client.close()


def relaying(rogue: RunningServer, target: Callable[[], str], rewrite: bool = False) -> None:
    """Make ``rogue`` answer every health challenge with ``target``'s answer to it (optionally
    renaming the prover in the challenge to the node it is passed to)."""

    def health(body: bytes) -> bytes:
        if rewrite and body[:1] == b"{":
            doc = json.loads(body)
            doc["to"] = target()
            body = json.dumps(doc).encode()
        return call_health(target(), body)

    rogue.server.cluster.health = health  # type: ignore[method-assign]


def keyed(secret: str, clock: Clock) -> ClusterKey:
    return ClusterKey(secret, clock=clock)


def foreign_rows(location: str) -> int:
    """Rows of one shuffled epoch read through ``location`` that the members do not serve
    (checked complete: every member row exactly once otherwise)."""
    ds = FlightDataset(
        location,
        "blobs",
        columns=["index"],
        batch_size=250,
        options=ReadOptions(streams=6, message_rows=500, report_interval=None),
        connect=ConnectOptions(token=TOKEN),
    )
    rows = [i for batch in ds for i in batch["index"].tolist()]
    foreign = sum(1 for i in rows if i >= FOREIGN)
    if not foreign:
        assert sorted(rows) == list(range(BLOB_ROWS))
    return foreign


def states(m: Membership) -> dict[str, str]:
    return {p["location"]: p["state"] for p in m.describe()}


def check(*members: Membership, rounds: int = 3) -> None:
    for _ in range(rounds):
        for m in members:
            m.check_once()


@pytest.fixture
def tier(blobs_dir: Path) -> Iterator[Callable[..., RunningServer]]:
    """Starts in-process nodes (members serve ``blobs_dir``) that all stop at the end."""
    with ExitStack() as stack:

        def start(root: Path = blobs_dir, address: str = "grpc://127.0.0.1:0") -> RunningServer:
            return stack.enter_context(member_node(root, address, auth_token=TOKEN))

        yield start


@pytest.mark.parametrize("rewrite", [False, True], ids=["verbatim", "renamed"])
def test_a_stale_peer_entry_relaying_to_a_member_is_down(
    tier: Callable[..., RunningServer], rogue_dir: Path, rewrite: bool
) -> None:
    clock = Clock()
    a, b, rogue = tier(), tier(), tier(rogue_dir)
    relaying(rogue, lambda: b.location, rewrite)
    ma = join(a, static=[b.location, rogue.location], token=TOKEN, key=keyed("cluster", clock))
    mb = join(b, static=[a.location], token=TOKEN, key=keyed("cluster", clock))
    check(ma, mb)
    assert foreign_rows(a.location) == 0 and foreign_rows(b.location) == 0
    assert states(ma) == {b.location: "live", rogue.location: "down"}
    assert "did not prove it belongs" in {p["location"]: p for p in ma.describe()}[rogue.location]["error"]
    assert rogue.location not in states(mb)  # b never heard of it from a (gossip names only live peers)
    assert metrics_snapshot(rogue.metrics)["totals"]["rows"] == 0


def test_a_member_gone_and_replaced_by_a_relaying_rogue_on_its_address_goes_down(
    tier: Callable[..., RunningServer], rogue_dir: Path
) -> None:
    """The stale peer: b was live at its address; a rogue takes the address and relays to c."""
    clock = Clock()
    a, b, c = tier(), tier(), tier()
    ma = join(a, static=[b.location, c.location], token=TOKEN, key=keyed("cluster", clock))
    mb = join(b, static=[a.location], token=TOKEN, key=keyed("cluster", clock))
    mc = join(c, static=[a.location], token=TOKEN, key=keyed("cluster", clock))
    check(ma, mb, mc)
    assert states(ma) == {b.location: "live", c.location: "live"}
    where = b.location
    mb.stop()
    b.stop()
    rogue = tier(rogue_dir, where)
    relaying(rogue, lambda: c.location)
    clock.now += 5
    check(ma, mc)
    assert foreign_rows(a.location) == 0 and foreign_rows(c.location) == 0
    assert states(ma)[where] == "down"
    assert where not in {loc for loc, s in states(mc).items() if s == "live"}


def test_a_captured_challenge_replayed_later_teaches_nothing(
    tier: Callable[..., RunningServer], rogue_dir: Path
) -> None:
    """b's challenge to a, captured; b leaves; the body is sent again at once (its nonce was
    used) and 60 s later (out of the window) by a client with the data token, while a rogue on
    b's old address relays to c."""
    clock = Clock()
    a, b, c = tier(), tier(), tier()
    captured: list[bytes] = []
    answer = a.server.cluster.health

    def recording(body: bytes) -> bytes:
        captured.append(body)
        return answer(body)

    a.server.cluster.health = recording  # type: ignore[method-assign]
    ma = join(a, static=[c.location], token=TOKEN, key=keyed("cluster", clock), forget_s=0.0)
    mb = join(b, static=[a.location], token=TOKEN, key=keyed("cluster", clock))
    mc = join(c, static=[a.location], token=TOKEN, key=keyed("cluster", clock))
    mb.check_once()  # b proves itself to a: a learns b
    check(ma, mc)
    assert states(ma) == {b.location: "live", c.location: "live"}
    challenge = next(body for body in captured if json.loads(body).get("node") == b.location)
    where = b.location
    mb.stop()
    b.stop()
    clock.now += 1
    check(ma)  # b is down, and forgotten (forget_s=0)
    assert states(ma) == {c.location: "live"}
    rogue = tier(rogue_dir, where)
    relaying(rogue, lambda: c.location)
    for advance in (0.0, 60.0):
        clock.now += advance
        call_health(a.location, challenge)
        check(ma, mc)
        assert foreign_rows(a.location) == 0, f"replayed after {advance:g} s"
        assert states(ma) == {c.location: "live"}, f"replayed after {advance:g} s"
    assert metrics_snapshot(rogue.metrics)["totals"]["rows"] == 0


def test_a_challenge_reflected_to_its_sender_is_not_taken_as_its_own_address(
    tier: Callable[..., RunningServer], rogue_dir: Path
) -> None:
    """A wildcard-bound node learns the address it is reached under from an answer of its own:
    a peer entry passing the node's challenge back to it must not become that address."""
    clock = Clock()
    a, b, rogue = tier(), tier(), tier(rogue_dir)
    a.server.cluster.location = a.location.replace("127.0.0.1", "0.0.0.0")  # as if bound to 0.0.0.0
    relaying(rogue, lambda: a.location)
    ma = join(a, static=[b.location, rogue.location], token=TOKEN, key=keyed("cluster", clock))
    mb = join(b, static=[a.location], token=TOKEN, key=keyed("cluster", clock))
    check(ma, mb)
    assert foreign_rows(b.location) == 0 and foreign_rows(a.location) == 0
    # a learns its true address from b (b's peers): that one is its own, the rogue's is not
    assert states(ma) == {b.location: "live", rogue.location: "down", a.location: "self"}
    assert a.server.cluster.entry() == a.location
    assert metrics_snapshot(rogue.metrics)["totals"]["rows"] == 0


def test_a_member_whose_token_was_rotated_out_cannot_stay_by_relaying(
    tier: Callable[..., RunningServer], rogue_dir: Path
) -> None:
    """The cluster moved to a new key; m still holds the old one, stays in a's --peers, checks a
    with old proofs and passes a's challenges on to c."""
    clock = Clock()
    a, c, m = tier(), tier(), tier(rogue_dir)
    ma = join(a, static=[c.location, m.location], token=TOKEN, key=keyed("rotated", clock))
    mc = join(c, static=[a.location], token=TOKEN, key=keyed("rotated", clock))
    mm = join(m, static=[a.location, c.location], token=TOKEN, key=keyed("the-old-one", clock))
    relaying(m, lambda: c.location)
    check(ma, mc, mm)
    assert foreign_rows(a.location) == 0 and foreign_rows(c.location) == 0
    assert states(ma) == {c.location: "live", m.location: "down"}
    assert m.location not in states(mc)
    assert metrics_snapshot(m.metrics)["totals"]["rows"] == 0


def test_an_answer_is_accepted_once_and_only_for_the_location_dialled() -> None:
    clock = Clock()
    verifier, prover = keyed("k", clock), keyed("k", clock)
    me: dict[str, Any] = {"id": "v", "node": "grpc://127.0.0.1:1111"}
    mine = "grpc://127.0.0.1:2222"

    def owns(loc: str) -> bool:
        return loc == mine

    request = verifier.sign_request(me, to=mine)
    assert prover.admits(request, owns)
    assert not prover.admits(request, owns)  # the same nonce again: a replay
    answer = prover.sign_answer(request, {"id": "p"})
    assert verifier.proves(request, answer)
    assert not verifier.proves(request, answer)  # spent
    relayed = verifier.sign_request(me, to="grpc://127.0.0.1:3333")
    assert not prover.admits(relayed, owns)  # names another node
    renamed = {**relayed, "to": mine}
    assert not prover.admits(renamed, owns)  # the proof covers ``to``
    late = verifier.sign_request(me, to=mine)
    clock.now += 60
    assert not prover.admits(late, owns)  # out of the window
    forged = keyed("guess", clock).sign_request(me, to=mine)
    assert not prover.admits(forged, owns)
    # an answer for another verifier's nonce, or naming another prover, is refused
    other = keyed("k", clock)
    theirs = other.sign_request(me, to=mine)
    assert prover.admits(theirs, owns)
    ours = verifier.sign_request(me, to="grpc://127.0.0.1:4444")
    assert not verifier.proves(ours, prover.sign_answer(theirs, {"id": "p"}))
