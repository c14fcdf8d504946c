"""``flightfeed convert --from webdataset|lmdb|tfrecord`` throughput against a plain sequential read
of the same source by its own library, data in the page cache.

Each source holds ``--samples`` records of an incompressible ``--bytes``-byte payload (JPEG-sized)
plus an integer label, written by the real library (``webdataset.TarWriter``, ``lmdb`` +
``msgpack`` in the recipe's layout, the ``tfrecord`` package). Per format, alternating
``--repeats`` times in one run:

- the library's own sequential read: ``tarfile`` member iteration reading every member (and
  ``webdataset``'s pipeline without decoding); an LMDB cursor over every value (and the same plus
  ``msgpack.unpackb``); the ``tfrecord`` package's framing iterator (and its Example loader);
- ``convert(SRC, DST)`` into a fresh local directory (the whole pipeline: read, record batches,
  ``.arrow`` shards, footer check, sha256 + block checksums, manifest), one thread (``convert``,
  the default) and with sha256 on a second thread (``convert 2 threads``, ``--hash-thread``).

Reports MB/s of source payload (median and best of the repeats), CPU seconds per GB (this
process, all its threads), the ratio of the medians convert / plain read (target >= 0.8) and of
the best runs (the default one-thread convert's best over each read's best), the 2- vs 1-thread convert speedup, and the
load average. It also measures, in the same run, what any convert must pay per GB whatever the
source: the output side alone (``writer_floor``: ready record batches through ``ShardWriter``),
and its two irreducible parts: writing the bytes to a file (``file_write``) and sha256 over them
(``sha256``, one stream per shard: it cannot be split over cores). Writes
bench/out/convert_formats.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, write_json
from flightfeed.server.tools.convert import ConvertSettings, convert


def payloads(samples: int, size: int) -> list[bytes]:
    rng = os.urandom
    return [rng(size) for _ in range(samples)]


def make_webdataset(root: Path, data: list[bytes], shards: int) -> Path:
    import webdataset as wds

    src = root / "wds"
    src.mkdir()
    per = -(-len(data) // shards)
    for s in range(shards):
        with wds.TarWriter(str(src / f"train-{s:06d}.tar")) as sink:
            for i in range(s * per, min(len(data), (s + 1) * per)):
                sink.write({"__key__": f"{i:08d}", "jpg": data[i], "cls": i % 1000})
    return src


def make_lmdb(root: Path, data: list[bytes]) -> Path:
    import lmdb
    import msgpack

    src = root / "lmdb"
    env = lmdb.open(str(src), map_size=4 * sum(map(len, data)) + (64 << 20))
    with env.begin(write=True) as txn:
        for i, payload in enumerate(data):
            txn.put(str(i).encode(), msgpack.packb((payload, i % 1000), use_bin_type=True))
        txn.put(b"__len__", msgpack.packb(len(data)))
    env.close()
    return src


def make_tfrecord(root: Path, data: list[bytes], shards: int) -> Path:
    from tfrecord import TFRecordWriter

    src = root / "tfr"
    src.mkdir()
    per = -(-len(data) // shards)
    for s in range(shards):
        writer = TFRecordWriter(str(src / f"train-{s:05d}.tfrecord"))
        for i in range(s * per, min(len(data), (s + 1) * per)):
            writer.write({"image": (data[i], "byte"), "label": (i % 1000, "int")})
        writer.close()
    return src


# -- the plain reads -----------------------------------------------------------------------------
def read_tarfile(src: Path) -> int:
    total = 0
    for path in sorted(src.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar:
                f = tar.extractfile(member)
                if f is not None:
                    total += len(f.read())
    return total


def read_webdataset(src: Path) -> int:
    import webdataset as wds

    urls = [str(p) for p in sorted(src.glob("*.tar"))]
    total = 0
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        total += len(sample["jpg"])
    return total


def read_lmdb_cursor(src: Path) -> int:
    import lmdb

    env = lmdb.open(str(src), readonly=True, lock=False)
    total = 0
    with env.begin() as txn:
        for _, value in txn.cursor():
            total += len(value)
    env.close()
    return total


def read_lmdb_msgpack(src: Path) -> int:
    import lmdb
    import msgpack

    env = lmdb.open(str(src), readonly=True, lock=False)
    total = 0
    with env.begin() as txn:
        for key, value in txn.cursor():
            if not key.startswith(b"__"):
                total += len(msgpack.unpackb(value)[0])
    env.close()
    return total


def read_tfrecord_frames(src: Path) -> int:
    from tfrecord.reader import tfrecord_iterator

    total = 0
    for path in sorted(src.glob("*.tfrecord")):
        for record in tfrecord_iterator(str(path)):
            total += len(record)
    return total


def read_tfrecord_examples(src: Path) -> int:
    from tfrecord.reader import tfrecord_loader

    total = 0
    for path in sorted(src.glob("*.tfrecord")):
        for example in tfrecord_loader(str(path), None, {"image": "byte", "label": "int"}):
            total += len(example["image"])
    return total


def floors(data: list[bytes], directory: Path) -> dict[str, float]:
    """CPU s/GB and wall s/GB of writing the payload to a file, and of sha256 over it."""
    import hashlib

    gb = sum(map(len, data)) / 1e9
    blob = b"".join(data)
    out: dict[str, float] = {}
    path = directory / "floor.bin"
    cpu, wall = time.process_time(), time.perf_counter()
    with open(path, "wb") as f:
        f.write(blob)
    out["file_write_cpu_s_per_gb"] = (time.process_time() - cpu) / gb
    out["file_write_wall_s_per_gb"] = (time.perf_counter() - wall) / gb
    path.unlink()
    cpu, wall = time.process_time(), time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    out["sha256_cpu_s_per_gb"] = (time.process_time() - cpu) / gb
    out["sha256_wall_s_per_gb"] = (time.perf_counter() - wall) / gb
    return out


def writer_floor(data: list[bytes], directory: Path) -> float:
    """The output side alone: the same payload as ready record batches through ``ShardWriter``
    (IPC write, footer check, sha256 and block checksums): what any source's convert pays."""
    from flightfeed.server.tools.convert.writer import ShardWriter

    schema = pa.schema([pa.field("image", pa.binary()), pa.field("label", pa.int64())])  # type: ignore[arg-type]
    rows = max(1, (8 << 20) // max(1, len(data[0])))
    batches = [
        pa.RecordBatch.from_arrays([pa.array(data[i : i + rows], pa.binary()),
                                    pa.array(range(i, min(i + rows, len(data))), pa.int64())], schema=schema)
        for i in range(0, len(data), rows)
    ]
    directory.mkdir()
    cpu = time.process_time()
    writer = ShardWriter(str(directory), schema, shard_bytes=512 * 10**6)
    for batch in batches:
        writer.write(batch)
    writer.close()
    seconds = time.process_time() - cpu
    shutil.rmtree(directory)
    return seconds / (sum(map(len, data)) / 1e9)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = payloads(args.samples, args.bytes)
    payload_gb = sum(map(len, data)) / 1e9
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-convert-", dir=args.tmp) as tmp:
        root = Path(tmp)
        floor = round(median([writer_floor(data, root / f"floor-{k}") for k in range(args.repeats)]), 2)
        print("writer floor (output side alone):", floor, "CPU s/GB", flush=True)
        parts = [floors(data, root) for _ in range(args.repeats)]
        floor_parts = {key: round(median([p[key] for p in parts]), 3) for key in parts[0]}
        print("floors:", floor_parts, flush=True)
        sources = {
            "webdataset": (make_webdataset(root, data, args.shards), {"tarfile": read_tarfile,
                                                                       "webdataset": read_webdataset}),
            "lmdb": (make_lmdb(root, data), {"cursor": read_lmdb_cursor, "cursor+msgpack": read_lmdb_msgpack}),
            "tfrecord": (make_tfrecord(root, data, args.shards), {"tfrecord framing": read_tfrecord_frames,
                                                                    "tfrecord examples": read_tfrecord_examples}),
        }
        del data
        for kind, (src, reads) in sources.items():
            if args.only and kind not in args.only:
                continue
            for read in reads.values():
                read(src)  # warm the page cache
            times: dict[str, list[tuple[float, float]]] = {
                name: [] for name in [*reads, "convert", "convert 2 threads"]
            }
            for _ in range(args.repeats):
                for name, read in reads.items():
                    times[name].append(timed(functools.partial(read, src)))
                for name, background in (("convert", False), ("convert 2 threads", True)):
                    dst = root / f"out-{kind}"
                    settings = ConvertSettings(kind=kind, progress=False, background_hash=background)  # type: ignore[arg-type]
                    times[name].append(timed(functools.partial(convert, str(src), str(dst), settings)))
                    shutil.rmtree(dst)
            figures: dict[str, Any] = {
                name: {
                    "mb_s": round(payload_gb * 1e3 / median([w for w, _ in runs]), 1),
                    "mb_s_best": round(payload_gb * 1e3 / min(w for w, _ in runs), 1),
                    "cpu_s_per_gb": round(median([c for _, c in runs]) / payload_gb, 2),
                }
                for name, runs in times.items()
            }
            first = next(iter(reads))
            figures["ratio_convert_over_" + first.replace(" ", "_")] = round(
                figures["convert"]["mb_s"] / figures[first]["mb_s"], 3)
            for name in list(reads)[1:]:
                figures["ratio_convert_over_" + name.replace(" ", "_").replace("+", "_")] = round(
                    figures["convert"]["mb_s"] / figures[name]["mb_s"], 3)
            # the fastest of the repeats, both sides alike: on a shared VM, the least disturbed runs
            figures["ratio_best_convert_over_each_read"] = {
                name: round(figures["convert"]["mb_s_best"] / figures[name]["mb_s_best"], 3) for name in reads
            }
            figures["speedup_2_over_1_thread"] = round(
                figures["convert 2 threads"]["mb_s"] / figures["convert"]["mb_s"], 3)
            results[kind] = figures
            print(kind, figures, "load", os.getloadavg(), flush=True)
    return {
        "machine": machine(),
        "load_average": os.getloadavg(),
        "samples": args.samples,
        "payload_bytes": args.bytes,
        "payload_gb": round(payload_gb, 3),
        "repeats": args.repeats,
        "results": results,
        "writer_floor_cpu_s_per_gb": floor,
        "floors": floor_parts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=110_000, help="payload bytes per sample (default: a JPEG's)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=("webdataset", "lmdb", "tfrecord"))
    parser.add_argument("--tmp", default=None, help="where sources and outputs go (default: the system's temp dir)")
    out = run(parser.parse_args())
    print(write_json("convert_formats", out))


if __name__ == "__main__":
    main()
