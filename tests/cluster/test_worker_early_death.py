"""``serve --workers N``: a worker killed before it first serves is restarted as a later death is
(it took the whole node down: "worker process 0 exited with code -9 before serving"), and the node
prints its ``flight:`` line only once every worker serves; a worker that exits by itself before it
serves (its settings do not work) still fails the start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightfeed.server.cluster import WorkerPool
from flightfeed.wire.errors import ConfigError
from tests.cluster.conftest import action, nodes

#: a worker stand-in (a real process): the first one to run is killed by a signal, the others (and its
#: restart) serve
_DIES_ONCE = """
import os, signal, sys
marker = sys.argv[1]
try:  # created atomically: exactly one of the workers started together is the first
    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    pass
else:
    os.kill(os.getpid(), signal.SIGKILL)
print("flight: grpc://127.0.0.1:1", flush=True)
sys.stdin.read()  # until the pool closes the pipe
"""


def test_a_worker_killed_before_it_first_serves_is_restarted(tmp_path: Path) -> None:
    pool = WorkerPool([sys.executable, "-c", _DIES_ONCE, str(tmp_path / "ran")], 2, check_interval=3600,
                      backoff_s=0.05)
    try:
        pool.start(wait_s=120)  # was: ConfigError "worker process 0 exited with code -9 before serving"
        workers = pool.describe()
        assert [w["state"] for w in workers] == ["live", "live"]
        assert sorted(w["restarts"] for w in workers) == [0, 1]  # the one that ran first died and came back
        assert [w["last_error"] for w in workers if w["restarts"]] == ["exited with code -9 before serving"]
    finally:
        pool.stop(0.0)


def test_a_worker_that_exits_by_itself_before_serving_fails_the_start() -> None:
    pool = WorkerPool([sys.executable, "-c", "import sys; sys.exit(2)"], 1, check_interval=3600, backoff_s=0.05)
    try:
        with pytest.raises(ConfigError, match=r"worker process 0 exited with code 2 before serving"):
            pool.start(wait_s=120)
    finally:
        pool.stop(0.0)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _worker_of(pid: int, bound_s: float = 120.0) -> int:
    """The first worker process the coordinator ``pid`` starts, as soon as it exists (polled, with
    a generous bound: not a timing claim)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        for child in _children(pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"--exit-with-parent" in cmdline:
                return child
        time.sleep(0.005)
    raise AssertionError("the coordinator started no worker process")


def test_a_node_whose_worker_is_killed_at_start_announces_itself_once_every_worker_serves(blobs_dir: Path) -> None:
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", f"blobs={blobs_dir}", "--workers", "2", "--port", "0",
           "--no-sidecar"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with nodes() as procs:
        procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:  # the coordinator says how many processes it starts, then starts them
            if line.startswith("cores:"):
                break
        victim = _worker_of(proc.pid)
        os.kill(victim, signal.SIGKILL)  # in its first instants: long before it can serve
        location = None
        for line in proc.stdout:  # EOF (the node went down) ends the loop with no location
            if line.startswith("flight: "):
                location = line.split()[1]
                break
        assert location is not None, f"the node went down: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}"
        workers = action(location, "stats")["cluster"]["workers"]  # as it announces itself, every worker serves
        assert [w["state"] for w in workers] == ["live"]
        assert workers[0]["restarts"] == 1 and workers[0]["pid"] != victim
        assert workers[0]["last_error"] == "exited with code -9 before serving"
