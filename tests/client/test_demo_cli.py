"""``flightfeed demo`` prints no address that is already dead: its server stops when the demo ends,
so the addresses appear only with ``--keep-serving``, while they answer (docs/client.md, the demo)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pyarrow.flight as flight

DEMO = [sys.executable, "-m", "flightfeed.server", "demo", "--rows", "256", "--size", "8", "--shards", "2",
        "--batch-size", "64"]


def test_the_demo_prints_no_address_of_its_stopped_server(tmp_path: Path) -> None:
    done = subprocess.run([*DEMO, "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "every row exactly once" in done.stdout
    assert "grpc://" not in done.stdout and "http://" not in done.stdout, done.stdout
    assert "--keep-serving" in done.stdout  # says how to keep it up


def test_keep_serving_prints_live_addresses_until_ctrl_c(tmp_path: Path) -> None:
    # its own process group, so a failed test takes the demo's server down with it
    proc = subprocess.Popen([*DEMO, "--data-dir", str(tmp_path), "--keep-serving"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    errors: list[str] = []  # read as it comes: a pipe nobody reads fills and stops the demo
    assert proc.stderr is not None
    threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True).start()
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "serving until Ctrl-C" in line:
                break
        (shown,) = [line for line in lines if "grpc://" in line]
        assert "every row exactly once" in "".join(lines[: lines.index(shown)])  # printed after the epoch
        location = shown.split()[1]
        dashboard = shown.split("dashboard: ")[1].split()[0]
        client = flight.FlightClient(location)
        assert [f.descriptor.path for f in client.list_flights()] == [[b"demo"]]  # the address answers
        client.close()
        assert httpx.get(dashboard, timeout=30).status_code == 200
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(timeout=60) == 0, "".join(errors)
        except subprocess.TimeoutExpired:
            raise AssertionError("the demo did not stop on SIGINT; its stderr: " + "".join(errors)) from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the demo's server, if the demo left it
