#!/usr/bin/env python3
# A floor tool of docs/wire-views.md ("Ragged columns"), beside flight_views.py: not linted or
# type-checked, so that its figures stay comparable run to run.
"""The floor of a shuffled *ragged* Flight stream: what a bare pyarrow Flight server and client pay
per GB for rows of variable length (log-normal, mean ``MEAN_BYTES``), uint8 values, when

(1) ``stored``: consecutive rows are sent as a ``large_list<uint8>`` slice of the mapped file
    (offsets and values: no user-space copy), and the client keeps them as they land;
(2) ``copied``: shuffled rows are gathered by Arrow ``take`` into a fresh list per message (one
    copy on the server, as flightfeed's gather did before docs/wire-views.md; Arrow's list
    ``take`` indexes every value), and the client keeps them as they land;
(2b) ``joined``: the same copy made row by row (``bytes.join`` of the rows' slices: one memcpy a
    row), and the client keeps them as they land;
(3) ``views``: shuffled rows are sent as a ``binary_view`` column whose data buffers are slices of
    the mapped values (one per row, no copy on the server); the client needs the rows as one
    contiguous list (a tensor of values and offsets: ``torch.nested``, or the padded copy), so it
    makes that list with one Arrow cast (one copy on the client: rows whose length is not a
    multiple of 8 bytes do not lie back to back in the received body, the IPC writer pads every
    buffer to 8 bytes).

It reports the server's and the client's CPU per GB and their sum, and how many messages had their
rows back to back in the client's body. The question it answers: does moving the ragged rows'
copy from the data node to the trainer's node pay, at which row sizes?

Usage: python flight_ragged_views.py [MEAN_BYTES] [--rounds N] [--gib G]
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flight_views import Server  # noqa: E402  (the same bare server: a generator per ticket)


def source(path: str, mean: int, gib: float) -> tuple[pa.Buffer, np.ndarray]:
    rng = np.random.default_rng(1)
    total = int(gib * (1 << 30))
    lengths = np.maximum(1, rng.lognormal(np.log(mean) - 0.5, 1.0, int(2 * total / mean)).astype(np.int64))
    lengths = lengths[: int(np.searchsorted(lengths.cumsum(), total)) + 1]
    offsets = np.concatenate(([0], lengths.cumsum())).astype(np.int64)
    size = int(offsets[-1])
    if not os.path.exists(path) or os.path.getsize(path) != size:
        with open(path, "wb") as f:
            for s in range(0, size, 64 << 20):
                f.write(rng.integers(0, 255, min(64 << 20, size - s), dtype=np.uint8).tobytes())
    return pa.memory_map(path).read_buffer(), offsets


def modes(values: pa.Buffer, offsets: np.ndarray, per_msg: int, perm: np.ndarray):
    rows = len(offsets) - 1
    whole = pa.LargeListArray.from_arrays(pa.array(offsets), pa.Array.from_buffers(pa.uint8(), len(values), [None, values]))
    flat = np.frombuffer(values, dtype=np.uint8)

    def stored():
        for s in range(0, rows, per_msg):
            yield pa.record_batch([whole.slice(s, min(per_msg, rows - s))], ["x"])

    def copied():
        for s in range(0, rows, per_msg):
            yield pa.record_batch([pc.take(whole, pa.array(perm[s:s + per_msg]))], ["x"])

    def joined():
        mv = memoryview(values)
        for s in range(0, rows, per_msg):
            idx = perm[s:s + per_msg]
            lo, hi = offsets[idx], offsets[idx + 1]
            out = pa.py_buffer(b"".join(map(mv.__getitem__, map(slice, lo.tolist(), hi.tolist()))))
            offs = np.concatenate(([0], (hi - lo).cumsum()))
            arr = pa.LargeListArray.from_arrays(pa.array(offs), pa.Array.from_buffers(pa.uint8(), len(out), [None, out]))
            yield pa.record_batch([arr], ["x"])

    def views():
        for s in range(0, rows, per_msg):
            idx = perm[s:s + per_msg]
            n = len(idx)
            lo, ln = offsets[idx], offsets[idx + 1] - offsets[idx]
            v = np.zeros((n, 4), dtype=np.int32)  # length, prefix (or inline bytes), buffer index, offset
            v[:, 0] = ln
            heads = np.zeros((n, 4), dtype=np.uint8)
            for k in range(4):
                ok = ln > k
                heads[ok, k] = flat[lo[ok] + k]
            v[:, 1] = heads.view(np.int32).ravel()
            v[:, 2] = np.arange(n, dtype=np.int32)
            # (rows of at most 12 bytes would be inlined; the mean sizes measured here have none to speak of)
            bufs = [None, pa.py_buffer(v)] + [values.slice(int(a), int(b)) for a, b in zip(lo, ln)]
            yield pa.record_batch([pa.Array.from_buffers(pa.binary_view(), n, bufs)], ["x"])

    return {"stored": stored, "copied": copied, "joined": joined, "views": views}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mean", nargs="?", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    path = a.path or os.path.join(tempfile.gettempdir(), f"flight_ragged_{a.mean}_{a.gib}.bin")
    values, offsets = source(path, a.mean, a.gib)
    rows = len(offsets) - 1
    per_msg = max(1, (4 << 20) // a.mean)
    perm = np.random.default_rng(0).permutation(rows)
    if a.serve:
        s = Server(modes(values, offsets, per_msg, perm), location="grpc://127.0.0.1:0")
        print(s.port, flush=True)
        s.serve()
        return
    p = subprocess.Popen([sys.executable, __file__, str(a.mean), "--gib", str(a.gib), "--serve", "--path", path],
                         stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        tck = os.sysconf("SC_CLK_TCK")

        def server_cpu() -> float:
            with open(f"/proc/{p.pid}/stat") as f:
                v = f.read().rsplit(")", 1)[1].split()
            return (int(v[11]) + int(v[12])) / tck

        def client_cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        c = fl.connect(f"grpc://127.0.0.1:{port}")
        res: dict[str, list[tuple[float, float, float]]] = {}
        together = [0, 0]
        for _ in range(a.rounds):
            for m in ("stored", "copied", "joined", "views"):
                s0, c0, t0 = server_cpu(), client_cpu(), time.perf_counter()
                nbytes = 0
                for chunk in c.do_get(fl.Ticket(m.encode())):
                    col = chunk.data.column(0)
                    if m == "views":
                        if together[1] < 64:
                            addrs = [b.address for b in col.buffers()[2:]]
                            lens = np.asarray(col.buffers()[1]).view(np.int32).reshape(-1, 4)[:, 0]
                            together[1] += 1
                            together[0] += all(addrs[i + 1] - addrs[i] == lens[i] for i in range(len(addrs) - 1))
                        col = col.cast(pa.large_binary())  # the rows as one contiguous list (one copy)
                        nbytes += len(col.buffers()[2])
                    else:
                        nbytes += len(col.values)
                dt = time.perf_counter() - t0
                gb = nbytes / 1e9
                res.setdefault(m, []).append((gb / dt, (server_cpu() - s0) / gb, (client_cpu() - c0) / gb))
        med = {m: [float(np.median([r[k] for r in v])) for k in range(3)] for m, v in res.items()}
        print(f"ragged rows, mean {a.mean} B (log-normal), {rows} rows, {per_msg} rows a message, {a.rounds} rounds; "
              f"load {os.getloadavg()[0]:.1f}")
        for m, (gbs, scpu, ccpu) in med.items():
            st = med["stored"]
            print(f"{m:7s} {gbs:6.2f} GB/s  server {scpu:.3f} s/GB ({scpu / st[1]:.2f}x stored)"
                  f"  client {ccpu:.3f} s/GB ({ccpu / st[2]:.2f}x stored)  both {scpu + ccpu:.3f} s/GB")
        print(f"views: rows back to back in the client's body in {together[0]} of {together[1]} messages")
    finally:
        p.terminate()
        p.wait(10)


if __name__ == "__main__":
    main()
