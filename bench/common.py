"""Shared helpers of the benchmark scripts: image-like datasets, servers in subprocesses, JSON out.

Scripts import this as ``bench.common`` (they put the repository root on ``sys.path`` first, so
``python bench/<script>.py`` works from anywhere).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = [
    "FLOOR_TOOL",
    "OUT",
    "ROOT",
    "ServerProcess",
    "flightfeed_server",
    "image_dataset",
    "load_average",
    "machine",
    "median",
    "process_tree_cpu_s",
    "raw_flight_server",
    "views_floor",
    "write_json",
]

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
READY = "flight: "


# -- data -----------------------------------------------------------------------------------------
def image_dataset(
    root: Path, rows: int, *, shape: Sequence[int] = (224, 224, 3), shards: int = 8, chunk_rows: int = 256
) -> Path:
    """``shards`` .arrow files of ``rows`` image-like rows in total (uint8 ``arrow.fixed_shape_tensor``
    ``image``, int64 ``label`` and ``index``), record batches of ``chunk_rows``. Reused when a
    previous call wrote the same layout into ``root``."""
    layout = {"rows": rows, "shape": list(shape), "shards": shards, "chunk_rows": chunk_rows, "v": 1}
    stamp = root / "layout.json"
    if stamp.exists() and json.loads(stamp.read_text()) == layout:
        return root
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*.arrow"):
        old.unlink()
    width = int(np.prod(shape))
    tensor = pa.fixed_shape_tensor(pa.uint8(), list(shape))
    schema = pa.schema([("image", tensor), ("label", pa.int64()), ("index", pa.int64())])
    rng = np.random.default_rng(0)
    per = -(-rows // shards)
    row = 0
    for s in range(shards):
        n_shard = min(per, rows - row)
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), schema) as writer:
            for lo in range(0, n_shard, chunk_rows):
                n = min(chunk_rows, n_shard - lo)
                flat = pa.array(rng.integers(0, 256, n * width, dtype=np.uint8))
                pixels = pa.FixedSizeListArray.from_arrays(flat, width)
                index = np.arange(row + lo, row + lo + n, dtype=np.int64)
                writer.write_batch(
                    pa.record_batch(
                        [
                            pa.ExtensionArray.from_storage(tensor, pixels),
                            pa.array(index % 1000),
                            pa.array(index),
                        ],
                        schema=schema,
                    )
                )
        row += n_shard
    stamp.write_text(json.dumps(layout))
    return root


# -- servers in subprocesses ------------------------------------------------------------------------
class ServerProcess:
    """A server subprocess that printed ``flight: grpc://...`` when ready."""

    def __init__(
        self, cmd: list[str], *, timeout: float = 120.0, preexec: Callable[[], None] | None = None
    ) -> None:
        self.cmd = cmd
        # stderr to a file: a pipe nobody reads could fill up and block the server
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in stop())
        #: stdout lines printed before the ready line
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=ROOT, env=_child_env(),
            preexec_fn=preexec,
        )
        self.location = self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            seen.append(line)
            self.lines.append(line)
            if line.startswith(READY):
                return line[len(READY) :].strip()
        self.stop()
        self._stderr.seek(0)
        err = self._stderr.read()
        raise RuntimeError(f"server {' '.join(self.cmd)} did not start:\n{''.join(seen)}{err}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    return env


@contextlib.contextmanager
def flightfeed_server(
    datasets: dict[str, Path] | dict[str, str],
    *extra: str,
    preexec: Callable[[], None] | None = None,
    timeout: float = 120.0,
) -> Iterator[ServerProcess]:
    """``python -m flightfeed.server serve NAME=DIR --port 0 --no-sidecar`` in a subprocess
    (``preexec`` runs in the child before it starts, e.g. to set resource limits)."""
    args = [f"{name}={path}" for name, path in datasets.items()]
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", *args, "--port", "0", "--no-sidecar", *extra]
    server = ServerProcess(cmd, preexec=preexec, timeout=timeout)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def raw_flight_server(directory: Path, message_rows: int) -> Iterator[ServerProcess]:
    """The minimal pyarrow Flight server of ``bench/raw_flight.py`` in a subprocess."""
    script = ROOT / "bench" / "raw_flight.py"
    server = ServerProcess([sys.executable, str(script), str(directory), "--message-rows", str(message_rows)])
    try:
        yield server
    finally:
        server.stop()


# -- CPU accounting -------------------------------------------------------------------------------
def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and every live descendant (``serve --workers``
    children, their children, ...), plus the CPU of descendants that already exited and were
    waited for (Linux ``/proc``: ``cutime``/``cstime``). A bench that counted only ``pid`` made N
    worker processes look as cheap as one; take the difference of two calls around the work."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        parent[int(entry.name)] = int(fields[1])
        # utime + stime + cutime + cstime (children reaped by this process)
        ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])
    tree = {pid}
    grew = True
    while grew:
        grew = False
        for child, ppid in parent.items():
            if ppid in tree and child not in tree:
                tree.add(child)
                grew = True
    return sum(ticks.get(p, 0) for p in tree) / tick


def load_average() -> float:
    """The 1-minute load average (the machine is shared: every figure is recorded beside it)."""
    return os.getloadavg()[0]


# -- results --------------------------------------------------------------------------------------
def drain(reader: Any, each: Callable[[pa.RecordBatch], None] | None = None) -> int:
    """Read a Flight stream (``do_get``'s reader) to its end, handing each RecordBatch to ``each``:
    the bytes received."""
    n = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return n
        if chunk.data is not None:
            n += chunk.data.nbytes
            if each is not None:
                each(chunk.data)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def machine() -> dict[str, Any]:
    """Where the figures come from."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
                break
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "ram_gb": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
    }
    with contextlib.suppress(ImportError):
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    return info


def write_json(name: str, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


#: the floor tool (docs/wire-views.md): a bare pyarrow Flight server's cost per GB for stored
#: slices, a copying gather and ``binary_view`` slices of a mapped file
FLOOR_TOOL = ROOT / "bench" / "floors" / "flight_views.py"


def views_floor(row_bytes: int, gib: float, rounds: int) -> dict[str, Any]:
    """``bench/floors/flight_views.py ROW_BYTES`` run now (docs/wire-views.md): its printed
    figures per mode (stored slices, a numpy copy, ``binary_view`` slices) and its output."""
    if not FLOOR_TOOL.exists():
        return {"missing": str(FLOOR_TOOL)}
    out = subprocess.run(
        [sys.executable, str(FLOOR_TOOL), str(row_bytes), "--gib", str(gib), "--rounds", str(rounds)],
        capture_output=True, text=True, timeout=900, check=False,
    ).stdout
    figures: dict[str, Any] = {"output": out}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("stored", "copied", "views") and "GB/s" in line:
            figures[parts[0]] = {
                "gb_per_s": float(parts[1]), "server_cpu_s_per_gb": float(parts[4]),
                "client_cpu_s_per_gb": float(parts[line.split().index("client") + 1]),
            }
    return figures
