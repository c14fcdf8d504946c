"""deploy/: the 3-node compose tier and the Kubernetes data tier agree with the CLI and the sidecar.

Checked offline: every command line in the files parses with the real ``flightfeed serve`` /
``flightfeed sidecar`` parsers (after expanding ``$(VAR)`` from the ConfigMap), the nodes name each
other, ports and probes match, the token reaches every process that needs it, and the disruption
budget, headless Service and Prometheus jobs select the data nodes.
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from flightfeed.server.cli import SUBCOMMANDS

yaml: Any = importlib.import_module("yaml")  # PyYAML (untyped)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NODES = ("flightfeed-1", "flightfeed-2", "flightfeed-3")


def _parse(command: str, args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"flightfeed {command}", exit_on_error=False)
    importlib.import_module(SUBCOMMANDS[command][0]).add_arguments(parser)
    try:
        return parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit) as exc:  # unknown flag or bad value
        pytest.fail(f"deploy passes arguments `flightfeed {command}` does not accept: {args} ({exc})")


def _compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    return services


def _k8s(kind: str) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("k8s/*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]
    return docs


def _token_mounts(service: dict[str, Any]) -> set[str]:
    return {v.split(":")[1] for v in service.get("volumes", []) if v.startswith("token:")}


# -- compose ----------------------------------------------------------------------------------
def test_compose_nodes_know_each_other_and_parse() -> None:
    services = _compose()
    assert set(NODES) <= set(services)
    for name in NODES:
        node = services[name]
        args = _parse("serve", list(node["command"]))
        assert args.host == "0.0.0.0"
        assert args.port == 8815
        assert args.sidecar_port == 8816
        assert args.sidecar_host == "0.0.0.0"  # reachable from Prometheus and the host
        peers = {urlparse(p).hostname: urlparse(p).port for p in args.peers.split(",")}
        assert peers == dict.fromkeys(NODES, 8815), peers
        # the token file the server reads lies in the read-only token volume
        assert Path(args.auth_token_file).parent.as_posix() in _token_mounts(node)
        assert any(v.endswith(":ro") for v in node["volumes"] if v.startswith("token:"))
        published = {p.rsplit(":", 1)[1] for p in node["ports"]}
        assert published == {"8815", "8816"}
        assert float(node["stop_grace_period"].rstrip("s")) > args.grace
        assert "/readyz" in " ".join(node["healthcheck"]["test"])
        assert node["depends_on"]["token-init"]["condition"] == "service_completed_successfully"
    host_ports = [p.split(":")[1] for n in NODES for p in services[n]["ports"]]
    assert len(host_ports) == len(set(host_ports)), "two nodes publish the same host port"
    caches = [v.split(":")[0] for n in NODES for v in services[n]["volumes"] if v.endswith(":/cache")]
    assert len(set(caches)) == len(NODES), "each node needs its own cache volume"


def test_compose_sidecar_prometheus_and_trainer_use_the_token() -> None:
    services = _compose()
    sidecar = services["sidecar"]
    assert sidecar["entrypoint"] == ["flightfeed", "sidecar"]
    args = _parse("sidecar", list(sidecar["command"]))
    assert urlparse(args.flight).hostname in NODES
    assert str(Path(args.auth_token_file).parent) in _token_mounts(sidecar)

    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "flightfeed"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{n}:8816" for n in NODES}
    credentials = Path(job["authorization"]["credentials_file"])
    assert str(credentials.parent) in _token_mounts(services["prometheus"])

    trainer = services["trainer"]
    dockerfile = (DEPLOY.parent / trainer["build"]["dockerfile"]).read_text()
    assert re.search(rf"^FROM \S+ AS {trainer['build']['target']}$", dockerfile, re.M)
    command = list(trainer["command"])
    token = Path(command[command.index("--token-file") + 1])
    assert str(token.parent) in _token_mounts(trainer)
    # every node named: the trainer survives the loss of any one, the first one included
    locations = command[command.index("--location") + 1].split(",")
    assert {urlparse(loc).hostname for loc in locations} == set(NODES)
    for node in NODES:
        assert trainer["depends_on"][node]["condition"] == "service_healthy"


def test_compose_builds_from_a_base_image_argument_and_needs_compose_v2() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    assert not re.search(r"^name:", text, re.M), "a top-level name: is refused by Compose v1; use -p"
    assert "Compose v2" in text and "Compose v2" in (DEPLOY / "README.md").read_text()
    services = _compose()
    for name, service in services.items():
        if "build" in service:
            assert service["build"]["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.11-slim}", name
    assert services["trainer"]["build"]["args"]["TORCH_INDEX_URL"].startswith("${TORCH_INDEX_URL-https://")


def test_only_the_trainer_image_has_torch_and_it_is_the_cpu_wheel() -> None:
    node = (DEPLOY / "Dockerfile").read_text()
    trainer = (DEPLOY / "trainer.Dockerfile").read_text()
    code = [line for line in node.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "torch" in line], "the node image must not install torch"
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", node, re.M)
    assert all(f == "${PYTHON_IMAGE}" for f in re.findall(r"^FROM (\S+)", node + trainer, re.M))
    assert '"torch==${TORCH_VERSION}+cpu"' in trainer  # never PyPI's CUDA build by accident
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in trainer
    assert "GPU trainer brings its own CUDA image" in trainer


def test_trainer_example_accepts_its_compose_command() -> None:
    source = (DEPLOY / "trainer_example.py").read_text()
    assert "exactly once" in source
    flags = set(re.findall(r'add_argument\("(--[a-z-]+)"', source))
    command = _compose()["trainer"]["command"]
    assert {a for a in command if a.startswith("--")} <= flags


# -- Kubernetes -------------------------------------------------------------------------------
def _expand(arg: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        assert m.group(1) in env, f"$({m.group(1)}) is not in the ConfigMap"
        return env[m.group(1)]

    return re.sub(r"\$\((\w+)\)", sub, arg)


def test_k8s_data_nodes_find_each_other_through_the_headless_service() -> None:
    (sts,) = _k8s("StatefulSet")
    (config,) = [c for c in _k8s("ConfigMap") if c["metadata"]["name"] == "flightfeed-config"]
    env = dict(config["data"])
    pod = sts["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    server, sidecar = containers["server"], containers["sidecar"]
    args = _parse("serve", [_expand(a, env) for a in server["args"]])
    assert args.no_sidecar  # the sidecar container owns 8816
    host, _, port = args.peers_dns.rpartition(":")
    headless = [s for s in _k8s("Service") if s["spec"].get("clusterIP") == "None"]
    (svc,) = [s for s in headless if s["metadata"]["name"] == sts["spec"]["serviceName"]]
    assert host.split(".")[0] == svc["metadata"]["name"]
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert int(port) == args.port
    flight_port = {p["name"]: p["containerPort"] for p in server["ports"]}["flight"]
    assert flight_port == args.port
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert sts["spec"]["replicas"] >= 3
    assert pod["spec"]["terminationGracePeriodSeconds"] > args.grace
    # the sidecar reads the local server and serves the port the probes and Prometheus use
    side = _parse("sidecar", list(sidecar["args"]))
    assert side.flight == f"grpc://127.0.0.1:{args.port}"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(side.port)
    for c in (server, sidecar):
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["readinessProbe"]["httpGet"]["port"] in (side.port, "http")
        # /readyz walks the request path within the sidecar's --timeout: the probe waits longer
        assert c["readinessProbe"]["timeoutSeconds"] > side.timeout
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]


def test_k8s_token_is_required_and_reaches_server_and_sidecar() -> None:
    (sts,) = _k8s("StatefulSet")
    (config,) = [c for c in _k8s("ConfigMap") if c["metadata"]["name"] == "flightfeed-config"]
    env = dict(config["data"])
    spec = sts["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "flightfeed-token"
    assert not volume["secret"].get("optional", False), "auth must not switch off when the Secret is missing"
    containers = {c["name"]: c for c in spec["containers"]}
    server_args = _parse("serve", [_expand(a, env) for a in containers["server"]["args"]])
    sidecar_args = _parse("sidecar", list(containers["sidecar"]["args"]))
    pairs = ((containers["server"], server_args.auth_token_file), (containers["sidecar"], sidecar_args.auth_token_file))
    for c, path in pairs:
        mounts = {m["mountPath"] for m in c["volumeMounts"] if m["name"] == volume["name"]}
        assert str(Path(path).parent) in mounts


def test_k8s_disruption_budget_and_kustomization() -> None:
    (sts,) = _k8s("StatefulSet")
    (pdb,) = _k8s("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (kustom,) = _k8s("Kustomization")
    assert set(kustom["resources"]) == {p.name for p in DEPLOY.glob("k8s/*.yaml")} - {"kustomization.yaml"}


def test_k8s_prometheus_job_sends_the_token_and_keeps_data_nodes() -> None:
    (config,) = [c for c in _k8s("ConfigMap") if c["metadata"]["name"] == "flightfeed-prometheus-scrape"]
    (job,) = yaml.safe_load(config["data"]["flightfeed-scrape.yaml"])
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"]
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert any(r["regex"] == "flightfeed;data-node" for r in keep)
    assert any(r["regex"] == "8816" for r in keep)


def test_k8s_autoscaler_follows_the_nodes_wanted_metric() -> None:
    """The HPA scales the data nodes' StatefulSet to max(flightfeed_nodes_wanted), through the
    prometheus-adapter rule shipped beside it (docs/cluster.md, how many nodes)."""
    (sts,) = _k8s("StatefulSet")
    (hpa,) = _k8s("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "StatefulSet", sts["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= sts["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    name = metric["external"]["metric"]["name"]
    # AverageValue 1: desired replicas = ceil(metric / 1) = the nodes wanted
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    (adapter,) = [c for c in _k8s("ConfigMap") if c["metadata"]["name"] == "flightfeed-prometheus-adapter"]
    (rule,) = yaml.safe_load(adapter["data"]["flightfeed-external-rules.yaml"])["externalRules"]
    assert rule["name"]["as"] == name
    assert rule["seriesQuery"].startswith("flightfeed_nodes_wanted{")
    assert rule["metricsQuery"].startswith("max(flightfeed_nodes_wanted{")  # the node holding the reports
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"
    # the scrape job labels the series with the namespace the rule selects on
    (scrape,) = [c for c in _k8s("ConfigMap") if c["metadata"]["name"] == "flightfeed-prometheus-scrape"]
    (job,) = yaml.safe_load(scrape["data"]["flightfeed-scrape.yaml"])
    assert any(r.get("target_label") == "namespace" for r in job["relabel_configs"])
    # the metric exists on a real server, and scaling down stays within the disruption budget
    from flightfeed.server.observe.metrics import ServerMetrics

    assert name in ServerMetrics().metric_names()
    (pdb,) = _k8s("PodDisruptionBudget")
    down = hpa["spec"]["behavior"]["scaleDown"]["policies"]
    assert all(p["type"] == "Pods" and p["value"] <= pdb["spec"]["maxUnavailable"] for p in down)
