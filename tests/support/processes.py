"""`flightfeed serve` as a real subprocess, for tests that kill, signal or restart the server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable


def start_serve(
    *args: str, port: int = 0, preexec: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start ``flightfeed serve ARGS --port PORT --no-sidecar``; return the process and its location
    once it prints ``flight: LOCATION``. ``preexec`` runs in the child first (e.g. resource limits).
    One serving process unless ``--workers`` is given (the default follows the machine's cores:
    a test's figures must not depend on them)."""
    one = [] if "--workers" in args else ["--workers", "1"]
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", *args, *one, "--port", str(port), "--no-sidecar"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("flight: "):
            return proc, line.split()[1]
    raise AssertionError(f"server did not start: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
