"""Packaging and boundaries: generated protobuf code is current, the wheel imports on its own,
the server never imports torch, the client never imports h5py or FastAPI."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto_schemas"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_generated_protobuf_code_is_current(tmp_path: Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    assert protoc.main([*args, "flightfeed/wire/feed.proto"]) == 0
    for name in ("feed_pb2.py", "feed_pb2.pyi"):
        fresh = (tmp_path / "flightfeed/wire" / name).read_text()
        committed = (PROTO_DIR / "flightfeed/wire" / name).read_text()
        assert fresh == committed, (
            f"proto_schemas/flightfeed/wire/{name} is stale: regenerate with "
            "`cd proto_schemas && python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. "
            "flightfeed/wire/feed.proto`"
        )


def test_server_never_imports_torch() -> None:
    code = (
        "import sys, flightfeed.server, flightfeed.server.cli, flightfeed.server.serve, "
        "flightfeed.server.sidecar, flightfeed.server.tools.inspect, flightfeed.server.tools.convert\n"
        "bad = [m for m in ('torch',) if m in sys.modules]\nassert not bad, bad"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_client_never_imports_h5py_or_fastapi() -> None:
    code = (
        "import sys, flightfeed.client, flightfeed.client._cli.demo, flightfeed.client._cli.bench\n"
        "bad = [m for m in ('h5py', 'fastapi', 'uvicorn') if m in sys.modules]\nassert not bad, bad"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_cli_help_lists_every_subcommand() -> None:
    result = subprocess.run(["flightfeed", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for name in ("serve", "demo", "convert", "inspect", "bench", "sidecar"):
        assert name in result.stdout
    bad = subprocess.run(["flightfeed", "serve", "no-equals-sign"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected NAME=URI" in bad.stderr


@pytest.mark.slow
def test_built_wheel_imports_without_the_source_tree(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("flightfeed-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for must in (
        "flightfeed/server/request/service.py",
        "flightfeed/client/_dataset.py",
        "flightfeed/wire/feed_pb2.py",
        "flightfeed/server/sidecar/dashboard.html",
    ):
        assert must in names, must
    assert not any(n.startswith("flightfeed/__init__") for n in names), "flightfeed must stay a namespace"
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    code = (
        "import sys\n"
        f"src = {[str(ROOT / d) for d in ('server', 'client', 'proto_schemas')]!r}\n"
        "sys.path = [p for p in sys.path if p.rstrip('/') not in src]\n"
        f"sys.path.insert(0, {str(target)!r})\n"
        "import flightfeed.server, flightfeed.client, flightfeed.wire\n"
        "for m in (flightfeed.server, flightfeed.client, flightfeed.wire):\n"
        f"    assert m.__file__.startswith({str(target)!r}), m.__file__\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
