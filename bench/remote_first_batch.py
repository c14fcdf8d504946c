"""The first batch of a cold shuffled epoch over one large remote ``.arrow`` shard, and its floor
(``bench_remote_ranges.py --first-batch MB``; docs/remote-reads.md, "The first batch").

Against moto in server mode as a subprocess on loopback (``bench/floors/moto_ranges.py``), twice:
"stock moto" (every ranged GET copies the whole object, GETs of one object run one at a time) and
"moto, ranges served by seek" (a bench-only patch: a GET reads only its range). For each, in the
same run: moto's cost of one GET on that object (1 MiB, 8 MiB and 32 MiB ranges, and 16 parallel
1 MiB GETs), then a server (``--s3-reads ranges``, the dataset's ``manifest.json`` giving the
record batch rows, as ``flightfeed convert`` writes it) and the torch client: seconds from the
request to the first batch, the ranged GETs (and bytes) sent before it, and the GETs that the
first message cannot avoid -- the file's index (footer and head) and the coalesced GETs of the first
shuffle window's record batches (the first message mixes rows of all of them). The floor is those
GETs at moto's measured pace.
"""

from __future__ import annotations

import hashlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from bench.common import load_average
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.storage.ranges.source import RangeSettings, RangeSource
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3

_MOTO = Path(__file__).resolve().parent / "floors" / "moto_ranges.py"


class MotoProcess(LocalS3):
    """``LocalS3``'s clients against moto in a subprocess (``floors/moto_ranges.py``)."""

    def __init__(self, *, by_seek: bool) -> None:  # (no in-process server)
        self.by_seek = by_seek
        self.endpoint = ""
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> MotoProcess:
        cmd = [sys.executable, str(_MOTO), *(["--ranges-by-seek"] if self.by_seek else [])]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().split()
        if line[:1] != ["PORT"]:
            raise RuntimeError(f"moto did not start: {line}")
        self.endpoint = f"http://127.0.0.1:{line[1]}"
        return self

    def stop(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=30)


def get_costs(fs: pafs.FileSystem, path: str, size: int, repeats: int = 3) -> dict[str, float]:
    """Seconds per ranged GET of this object on this moto (medians), sizes as the server sends them."""
    f = fs.open_input_file(path)
    out: dict[str, float] = {}
    for name, n in (("get_1mib_s", 1 << 20), ("get_8mib_s", 8 << 20), ("get_32mib_s", 32 << 20)):
        times = []
        for k in range(repeats):
            at = (k * 37 << 20) % max(1, size - n)
            t0 = time.perf_counter()
            f.read_at(n, at)  # type: ignore[call-arg]  # (stubs lack the arguments)
            times.append(time.perf_counter() - t0)
        out[name] = round(statistics.median(times), 4)
    t0 = time.perf_counter()
    def one(k: int) -> None:
        f.read_at(1 << 20, (k * 11 << 20) % (size - (1 << 20)))  # type: ignore[call-arg]

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(16)))
    out["get_16x1mib_parallel_s"] = round(time.perf_counter() - t0, 4)
    f.close()
    return out


def _manifest(local: Path, name: str) -> Manifest:
    path = local / name
    with ipc.open_file(str(path)) as r:
        rows = tuple(r.get_batch(k).num_rows for k in range(r.num_record_batches))
        schema = r.schema
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return Manifest(schema, [ManifestShard(name, sum(rows), path.stat().st_size, sha, rows)])


@contextmanager
def _get_log() -> Iterator[list[tuple[float, int]]]:
    """(end time, bytes) of every ranged GET the server sends meanwhile (bench instrumentation)."""
    log: list[tuple[float, int]] = []
    original = RangeSource._get

    def logged(self: RangeSource, span: tuple[int, int], blocks: int, *, verify: bool = True) -> pa.Buffer:
        buf = original(self, span, blocks, verify=verify)
        log.append((time.perf_counter(), span[1] - span[0]))
        return buf

    RangeSource._get = logged  # type: ignore[method-assign]
    try:
        yield log
    finally:
        RangeSource._get = original  # type: ignore[method-assign]


def _first(location: str) -> tuple[float, FlightDataset]:
    ds = FlightDataset(location, "fb", batch_size=256, shuffle=True, seed=1,
                       options=ReadOptions(streams=2, report_interval=None))
    t0 = time.perf_counter()
    it = iter(ds)
    next(it)
    seconds = time.perf_counter() - t0
    for _ in it:  # the rest of the epoch: every block fetched (the warm epoch reads none)
        pass
    return seconds, ds


def upload(s3: LocalS3, local: Path) -> tuple[str, str, int]:
    """The file under ``local`` and its manifest in a new bucket: (dataset URI, object, file bytes)."""
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/fb")
    (name,) = [p.name for p in local.iterdir() if p.suffix == ".arrow"]
    with s3.fs().open_output_stream(f"{bucket}/fb/{MANIFEST_NAME}") as f:
        f.write(_manifest(local, name).to_json().encode())
    return f"s3://{bucket}/fb", f"{bucket}/fb/{name}", (local / name).stat().st_size


def first_batch(
    s3: LocalS3, tmp: Path, where: tuple[str, str, int], label: str, gap: int, run: int = 0
) -> dict[str, Any]:
    """The cold first batch with ``RangeSettings.kept_gap_bytes`` ``gap`` of the dataset ``where`` (``upload``), and
    its floor (see the module docstring)."""
    uri, obj, size = where
    costs = get_costs(s3.fs(), obj, size)
    cache_module._SHARED.clear()
    metrics = ServerMetrics()
    storage = s3.options(tmp / f"cache-fb-{label}-{gap}-{run}", cache_size=2 * size, metrics=metrics, s3_reads="ranges",
                         ranges=RangeSettings(kept_gap_bytes=gap))
    load = load_average()
    with _get_log() as gets, running_server({"fb": uri}, storage=storage, metrics=metrics) as server:
        t0 = time.perf_counter()
        seconds, _ = _first(server.location)
        before = [n for t, n in gets if t <= t0 + seconds]
        epoch_gets = len(gets)
        warm, _ = _first(server.location)
    # moto's GET cost on this object: a + b * bytes, from the 1 MiB and 32 MiB GETs measured above
    b = (costs["get_32mib_s"] - costs["get_1mib_s"]) / (31 << 20)
    a = costs["get_1mib_s"] - b * (1 << 20)
    floor = sum(a + b * n for n in before)
    return {
        "moto": "moto, ranges served by seek" if label == "seek" else "stock moto", "file_bytes": size,
        "kept_gap_bytes": gap, "costs": costs, "first_batch_s": round(seconds, 3),
        "gets_before_first": len(before), "bytes_before_first": sum(before), "epoch_gets": epoch_gets,
        "warm_first_batch_s": round(warm, 3), "get_floor_s": round(floor, 3),
        "floor_s": round(floor + warm, 3), "load_average": [round(load, 2), round(load_average(), 2)],
    }
