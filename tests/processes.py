"""`flightfeed serve` as a real subprocess, for tests that kill, signal or restart the server."""

from __future__ import annotations

import subprocess
import sys


def start_serve(*args: str, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """Start ``flightfeed serve ARGS --port PORT --no-sidecar``; return the process and its location
    once it prints ``flight: LOCATION``."""
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", *args, "--port", str(port), "--no-sidecar"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("flight: "):
            return proc, line.split()[1]
    raise AssertionError(f"server did not start: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
