"""Cache locality: two data nodes over one S3 dataset (moto in server mode on 127.0.0.1) download
each shard from S3 once between them; a shard a node does not prefer comes from its peer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.cluster import Membership
from flightfeed.server.cluster.locality import ShardRouter, rendezvous
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.storage import open_catalog
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.testing import RunningServer
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert

ROWS = 3000


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalS3]:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LocalS3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LocalS3.secret_key)
    monkeypatch.setattr(cache_module, "_SHARED", {})
    with LocalS3() as service:
        yield service


def test_rendezvous_is_stable_and_moves_only_a_leaving_nodes_shards() -> None:
    nodes = [f"grpc://10.0.0.{i}:8815" for i in range(4)]
    keys = [f"s3://b/part-{k:05d}.arrow" for k in range(400)]
    before = {k: rendezvous(k, nodes) for k in keys}
    assert len(set(before.values())) == 4  # every node prefers some shards
    after = {k: rendezvous(k, nodes[:3]) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != nodes[3])


def test_two_nodes_download_each_shard_from_s3_once(s3: LocalS3, tmp_path: Path) -> None:
    idx = np.arange(ROWS, dtype=np.int64)
    table = pa.table({"index": idx, "payload": pa.array([bytes([i % 251]) * 512 for i in idx], pa.binary())})
    pq.write_table(table, tmp_path / "src.parquet")
    bucket = s3.new_bucket()
    settings = ConvertSettings(shard_bytes=200_000, rows_per_batch=100, progress=False, storage=s3.options())
    convert(str(tmp_path / "src.parquet"), f"s3://{bucket}/conv", settings)  # a manifest: fetched on read
    with ExitStack() as stack:
        nodes: list[RunningServer] = []
        for name in ("a", "b"):
            catalog = open_catalog({"d": f"s3://{bucket}/conv"}, s3.options(tmp_path / name, s3_prefetch=False))
            stack.callback(catalog.close)
            srv = RunningServer(FlightFeedServer(catalog, "grpc://127.0.0.1:0"))
            stack.callback(srv.stop)
            nodes.append(srv)
        a, b = nodes
        shards = [s.uri for s in a.catalog.get("d").shards]
        assert len(shards) >= 4
        for me, peer in ((a, b), (b, a)):
            c = me.server.cluster
            c.membership = Membership(c.me, c.datasets, static=[peer.location])
            stack.callback(c.membership.stop)
            c.membership.check_once()
            c.locality = ShardRouter(c)
            assert c.locality.install(me.catalog) == len(shards)
        ds = FlightDataset(
            a.location,
            "d",
            columns=["index"],
            batch_size=100,
            options=ReadOptions(streams=4, message_rows=100, report_interval=None),
        )
        assert sorted(i for batch in ds for i in batch["index"].tolist()) == list(range(ROWS))
        counts = [n.server.cluster.describe()["locality"] for n in nodes]
        total = sum(s3.fs().get_file_info(u.removeprefix("s3://")).size for u in shards)
        assert sum(c["s3_fetches"] for c in counts) == len(shards)  # each shard once from S3
        assert sum(c["s3_bytes"] for c in counts) == total
        assert sum(c["peer_fetches"] for c in counts) >= 1 and all(c["peer_failures"] == 0 for c in counts)
        # a node answers only for shards of its catalog
        with pytest.raises(flight.FlightServerError, match="has no remote shard"):
            list(flight.FlightClient(a.location).do_action(
                flight.Action("shard", b'{"dataset": "d", "uri": "s3://elsewhere/x.arrow"}')))
