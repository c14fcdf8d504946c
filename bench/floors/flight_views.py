#!/usr/bin/env python3
# The floor tool of docs/wire-views.md and docs/design.md §8, kept exactly as measured there (not
# linted or type-checked: its figures must stay comparable with the recorded floors).
"""The floor of a shuffled Flight stream: what a bare pyarrow Flight server pays per GB to send
(1) consecutive rows of a mapped file (what a stored read sends: slices, no user-space copy),
(2) shuffled rows gathered by one numpy copy into a fresh buffer per message, and
(3) shuffled rows sent as an Arrow `binary_view` column whose data buffers are slices of the
mapped file (one buffer per row: no user-space copy on the server),
and whether, in case (3), the rows land back to back in the client's received body (so a client
can view a fixed-width column of a shuffled message as one tensor without copying).

Usage: python flight_views.py [ROW_BYTES] [--rounds N] [--gib G]
Prints, per mode, the median over rounds of GB/s, server CPU s/GB and client CPU s/GB, and the
ratios to the stored mode. Run it beside a flightfeed bench in the same run to compare.
A measuring tool, not a part of the product. It keeps its source file (--gib of random rows) in the
temp folder for the next run; delete `flight_views_*.bin` there when done.
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
import pyarrow.flight as fl


def source(path: str, row: int, rows: int) -> pa.Buffer:
    if not os.path.exists(path) or os.path.getsize(path) != row * rows:
        with open(path, "wb") as f:
            step = max(1, (64 << 20) // row)
            rng = np.random.default_rng(1)
            for s in range(0, rows, step):
                f.write(rng.integers(0, 255, min(step, rows - s) * row, dtype=np.uint8).tobytes())
    return pa.memory_map(path).read_buffer()


def modes(src: pa.Buffer, row: int, rows: int, per_msg: int, perm: np.ndarray):
    flat = np.frombuffer(src, dtype=np.uint8)

    def stored():
        for s in range(0, rows, per_msg):
            n = min(per_msg, rows - s)
            yield pa.record_batch([pa.Array.from_buffers(pa.binary(row), n, [None, src.slice(s * row, n * row)])], ["x"])

    def copied():
        block = flat.reshape(rows, row)
        for s in range(0, rows, per_msg):
            idx = perm[s:s + per_msg]
            out = np.empty((len(idx), row), dtype=np.uint8)
            np.take(block, idx, axis=0, out=out, mode="clip")  # mode="raise" would buffer the result first
            yield pa.record_batch([pa.Array.from_buffers(pa.binary(row), len(idx), [None, pa.py_buffer(out)])], ["x"])

    def views():
        for s in range(0, rows, per_msg):
            idx = perm[s:s + per_msg]
            n = len(idx)
            v = np.zeros((n, 4), dtype=np.int32)  # length, 4-byte prefix, buffer index, offset
            v[:, 0] = row
            v[:, 1] = flat.reshape(rows, row)[idx, :4].copy().view(np.int32).ravel()
            v[:, 2] = np.arange(n, dtype=np.int32)
            bufs = [None, pa.py_buffer(v)] + [src.slice(int(i) * row, row) for i in idx]
            yield pa.record_batch([pa.Array.from_buffers(pa.binary_view(), n, bufs)], ["x"])

    return {"stored": stored, "copied": copied, "views": views}


class Server(fl.FlightServerBase):
    def __init__(self, table, **kw):
        super().__init__(**kw)
        self.table = table

    def do_get(self, context, ticket):
        gen = self.table[ticket.ticket.decode()]
        first = next(gen())
        return fl.GeneratorStream(first.schema, gen())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("row", nargs="?", type=int, default=150_528)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    row = a.row
    rows = int(a.gib * (1 << 30)) // row
    per_msg = max(1, (4 << 20) // row)
    path = a.path or os.path.join(tempfile.gettempdir(), f"flight_views_{row}_{rows}.bin")
    src = source(path, row, rows)
    perm = np.random.default_rng(0).permutation(rows)
    if a.serve:
        s = Server(modes(src, row, rows, per_msg, perm), location="grpc://127.0.0.1:0")
        print(s.port, flush=True)
        s.serve()
        return
    p = subprocess.Popen([sys.executable, __file__, str(row), "--gib", str(a.gib), "--serve", "--path", path],
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
            for m in ("stored", "copied", "views"):
                s0, c0, t0 = server_cpu(), client_cpu(), time.perf_counter()
                nbytes = 0
                for chunk in c.do_get(fl.Ticket(m.encode())):
                    col = chunk.data.column(0)
                    nbytes += len(col) * row
                    if m == "views" and together[1] < 64:
                        addrs = [b.address for b in col.buffers()[2:]]
                        together[1] += 1
                        together[0] += all(addrs[i + 1] - addrs[i] in (row, -(-row // 8) * 8, -(-row // 64) * 64)
                                           for i in range(len(addrs) - 1))
                dt = time.perf_counter() - t0
                gb = nbytes / 1e9
                res.setdefault(m, []).append((gb / dt, (server_cpu() - s0) / gb, (client_cpu() - c0) / gb))
        med = {m: [float(np.median([r[k] for r in v])) for k in range(3)] for m, v in res.items()}
        print(f"row {row} B, {rows} rows, {per_msg} rows a message, {a.rounds} rounds; load {os.getloadavg()[0]:.1f}")
        for m, (gbs, scpu, ccpu) in med.items():
            print(f"{m:7s} {gbs:6.2f} GB/s  server {scpu:.3f} s/GB ({scpu / med['stored'][1]:.2f}x stored)"
                  f"  client {ccpu:.3f} s/GB ({ccpu / med['stored'][2]:.2f}x stored)")
        print(f"views: rows back to back in the client's body in {together[0]} of {together[1]} messages")
    finally:
        p.terminate()
        p.wait(10)


if __name__ == "__main__":
    main()
