"""Shared jobs as the operator sees them: the dashboard's table, the Grafana board, and the
``--workers`` sidecar merging every process's window figures."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.sidecar.aggregate import merge_prometheus, merge_stats
from flightfeed.server.sidecar.app import dashboard_html

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMES = (
    "flightfeed_shared_hits_total", "flightfeed_shared_misses_total", "flightfeed_shared_bytes_served_total",
    "flightfeed_shared_window_bytes", "flightfeed_shared_stream_trainers",
)


def test_the_registry_exposes_the_shared_metrics() -> None:
    names = ServerMetrics().metric_names()
    assert set(NAMES) | {"flightfeed_shared_waits_total", "flightfeed_shared_evictions_total",
                         "flightfeed_shared_window_limit_bytes"} <= names


def test_the_dashboard_has_a_shared_jobs_table() -> None:
    html = dashboard_html()
    for element in ('id="shared"', 'id="shared-caption"', 'data-testid="shared"'):
        assert element in html
    for field in ("s.shared", "x.hits", "x.misses", "x.hit_ratio", "x.bytes_served", "x.trainers", "sh.limit"):
        assert field in html, field


def test_the_grafana_board_shows_the_shared_metrics() -> None:
    board = json.loads((DEPLOY / "grafana" / "flightfeed.json").read_text())
    exprs = "\n".join(t["expr"] for panel in board["panels"] for t in panel["targets"])
    for name in NAMES:
        assert name in exprs, name


def _shared(hits: int, misses: int, trainers: int, nbytes: int) -> dict[str, object]:
    per = {"hits": hits, "misses": misses, "waits": 1, "bytes_served": 10 * hits, "trainers": trainers,
           "hit_ratio": hits / (hits + misses)}
    return {"limit": 100, "bytes": nbytes, "evictions": 2, "entries": 3, "hits": hits, "misses": misses, "waits": 1,
            "bytes_served": 10 * hits, "trainers": trainers, "hit_ratio": per["hit_ratio"], "datasets": {"d": per}}


def test_workers_window_figures_are_merged() -> None:
    mine = {"totals": {}, "datasets": [], "shared": _shared(6, 2, 4, 50)}
    merged = merge_stats(mine, [{"datasets": [], "shared": _shared(3, 1, 2, 30)}])["shared"]
    assert merged["hits"] == 9 and merged["misses"] == 3 and merged["limit"] == 200 and merged["bytes"] == 80
    assert merged["trainers"] == 4 and merged["hit_ratio"] == 0.75  # the largest; recomputed
    d = merged["datasets"]["d"]
    assert d["hits"] == 9 and d["bytes_served"] == 90 and d["trainers"] == 4 and d["hit_ratio"] == 0.75
    text = (
        "# HELP flightfeed_shared_stream_trainers T\n# TYPE flightfeed_shared_stream_trainers gauge\n"
        'flightfeed_shared_stream_trainers{dataset="d"} 4.0\n'
        "# HELP flightfeed_shared_window_bytes W\n# TYPE flightfeed_shared_window_bytes gauge\n"
        "flightfeed_shared_window_bytes 50.0\n"
    )
    other = text.replace(" 4.0", " 2.0").replace(" 50.0", " 30.0")
    samples = {s.name: s.value for f in text_string_to_metric_families(merge_prometheus([text, other]))
               for s in f.samples}
    assert samples == {"flightfeed_shared_stream_trainers": 4.0, "flightfeed_shared_window_bytes": 80.0}
