"""deploy/: the YAML and JSON parse, and every metric they name exists in ServerMetrics."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.sidecar import create_app
from flightfeed.server.sidecar.sources import SIDECAR_METRICS, LocalSource

yaml: Any = importlib.import_module("yaml")  # PyYAML (untyped)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\bflightfeed_[a-z0-9_]+")


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _yaml_docs() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted([DEPLOY / "compose.yaml", *DEPLOY.glob("k8s/*.yaml")]):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path, doc))
    return docs


def _known_metrics() -> set[str]:
    return ServerMetrics().metric_names() | set(SIDECAR_METRICS)


def _routes() -> set[str]:
    app = create_app(LocalSource(ServerMetrics()))
    return {getattr(route, "path", "") for route in app.routes}


def test_every_yaml_file_parses() -> None:
    docs = _yaml_docs()
    kinds = {doc.get("kind") for _, doc in docs}
    assert {"ConfigMap", "Service", "StatefulSet", "Kustomization"} <= kinds
    assert any(path.name == "compose.yaml" for path, _ in docs)


def test_grafana_dashboard_names_only_real_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "flightfeed.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [str(v.get("definition", "")) for v in dashboard["templating"]["list"]]
    named = {m for e in exprs for m in METRIC.findall(e)}
    assert named, "the dashboard names no flightfeed metric"
    assert named <= _known_metrics(), sorted(named - _known_metrics())
    # the panels the issue asks for
    joined = "\n".join(exprs)
    for needle in (
        "rate(flightfeed_rows_sent_total",
        "rate(flightfeed_bytes_sent_total",
        "flightfeed_streams_active",
        "flightfeed_cache_hits_total",
        "flightfeed_client_stall_ratio",
        "histogram_quantile(0.99, sum by (le) (rate(flightfeed_storage_read_seconds_bucket",
    ):
        assert needle in joined, needle
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_yaml_files_name_only_real_metrics() -> None:
    named = {m for _, doc in _yaml_docs() for s in _strings(doc) for m in METRIC.findall(s)}
    assert named <= _known_metrics(), sorted(named - _known_metrics())


def test_deploy_readme_names_only_real_metrics() -> None:
    metrics = ServerMetrics()
    families = {family.name for family in metrics.registry.collect()}
    named = set(METRIC.findall((DEPLOY / "README.md").read_text()))
    known = _known_metrics() | families
    assert named <= known, sorted(named - known)


def test_compose_wires_server_sidecar_and_s3() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"s3", "flightfeed-1", "sidecar"} <= set(services)
    assert services["s3"]["image"].startswith("motoserver/moto")
    sidecar = services["sidecar"]
    assert sidecar["entrypoint"] == ["flightfeed", "sidecar"]
    assert sidecar["command"][:2] == ["--flight", "grpc://flightfeed-1:8815"]
    checks = " ".join(" ".join(services[s]["healthcheck"]["test"]) for s in ("flightfeed-1", "sidecar"))
    assert "/readyz" in checks
    assert "/healthz" in checks
    assert services["flightfeed-1"]["environment"]["AWS_EC2_METADATA_DISABLED"] == "true"


def test_k8s_pod_runs_the_sidecar_next_to_the_server() -> None:
    (sts,) = [doc for _, doc in _yaml_docs() if doc.get("kind") == "StatefulSet"]
    pod = sts["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8816"
    assert annotations["prometheus.io/path"] == "/metrics"
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    server, sidecar = containers["server"], containers["sidecar"]
    assert "--no-sidecar" in server["args"]  # the sidecar container owns 8816
    assert sidecar["command"] == ["flightfeed", "sidecar"]
    assert sidecar["args"][:2] == ["--flight", "grpc://127.0.0.1:8815"]
    routes = _routes()
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for container in containers.values():
        assert container["resources"]["requests"]
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe].get("httpGet")
            if get is not None:
                assert get["path"] in routes
    envs = {ref["configMapRef"]["name"] for ref in server["envFrom"] if "configMapRef" in ref}
    (configmap,) = [
        doc for _, doc in _yaml_docs() if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] in envs
    ]
    assert configmap["metadata"]["name"] in envs
    for arg in server["args"]:
        for var in re.findall(r"\$\((\w+)\)", arg):
            assert var in configmap["data"], var


def test_dockerfile_runs_the_server_as_a_user() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M)
    assert "[server,hdf5,s3]" in text
    assert re.search(r"^EXPOSE 8815 8816$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["flightfeed", "serve"\]$', text, re.M)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user
    assert not user[-1].startswith(("root", "0"))


@pytest.mark.parametrize("path", ["/metrics", "/stats", "/healthz", "/readyz", "/"])
def test_app_serves_the_design_routes(path: str) -> None:
    assert path in _routes()
