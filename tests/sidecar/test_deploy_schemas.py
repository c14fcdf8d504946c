"""deploy/k8s/: every manifest is valid against the Kubernetes API schemas, offline
(kubernetes-validate bundles them; no control plane runs here), beside the semantic checks of
test_sidecar_deploy.py; the tenants component (docs/security.md) patches the StatefulSet into a
valid one, and its example Secret holds a tenants file the server reads."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flightfeed.server.guards.tenants.tenants_file import Secrets, parse_tenants

yaml: Any = importlib.import_module("yaml")  # PyYAML (untyped)
kubernetes_validate: Any = importlib.import_module("kubernetes_validate")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
VERSION = "1.32"  # the Kubernetes API the manifests are written for
NOT_API = ("Kustomization", "Component")  # kustomize's own files


def _docs() -> list[tuple[str, Any]]:
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") not in NOT_API:
                out.append((str(path.relative_to(K8S)), doc))
    return out


def test_the_manifests_are_found() -> None:
    kinds = {doc["kind"] for _, doc in _docs()}
    assert {"StatefulSet", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Secret"} <= kinds


@pytest.mark.parametrize(("name", "doc"), _docs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_k8s_manifest_is_valid_against_the_api_schemas(name: str, doc: Any) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)  # raises ValidationError naming the field


def _patched_statefulset() -> Any:
    (statefulset,) = [d for _, d in _docs() if d["kind"] == "StatefulSet"]
    patch = yaml.safe_load((K8S / "tenants" / "statefulset-tenants.yaml").read_text())
    for op in patch:  # JSON 6902 "add" at ".../-" (append), the only operation the component uses
        assert op["op"] == "add" and op["path"].endswith("/-")
        node = statefulset
        for part in op["path"].strip("/").split("/")[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node.append(op["value"])
    return statefulset


def test_the_tenants_component_gives_a_valid_statefulset_serving_tenants() -> None:
    patched = _patched_statefulset()
    kubernetes_validate.validate(patched, VERSION, strict=True)
    server = patched["spec"]["template"]["spec"]["containers"][0]
    args = server["args"]
    assert args[args.index("--tenants") + 1] == "/etc/flightfeed/tenants/tenants.toml"
    assert "--auth-token-file" in args  # the operator token stays (the node's own calls, /metrics)
    assert {"name": "tenants", "mountPath": "/etc/flightfeed/tenants", "readOnly": True} in server["volumeMounts"]
    sidecar = patched["spec"]["template"]["spec"]["containers"][1]
    assert sidecar["args"][sidecar["args"].index("--tenants") + 1] == "/etc/flightfeed/tenants/tenants.toml"
    assert "--auth-token-file" in sidecar["args"]
    volumes = {v["name"]: v for v in patched["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tenants"]["secret"]["secretName"] == "flightfeed-tenants"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (its kustomize renders it)")
def test_kustomize_renders_the_base_with_the_tenants_component(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(K8S, overlay)
    (overlay / "kustomization.yaml").write_text(f"resources: [{rel}]\ncomponents: [{rel}/tenants]\n")
    out = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)
    (statefulset,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert "--tenants" in statefulset["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_example_secret_holds_a_tenants_file_the_server_reads() -> None:
    (secret,) = [d for _, d in _docs() if d["kind"] == "Secret"]
    parsed = parse_tenants(secret["stringData"]["tenants.toml"].encode(), "example", Secrets(lambda p: b""))
    assert not parsed.plain  # hashed tokens only: a Secret mount is read-only
    vision = parsed.table.identify(b"vision-example")
    assert vision is not None and vision[0].name == "vision" and vision[0].weight == 3.0
