"""What the nanoGPT token file checks cost (``sources/token_checks.py``): CPU seconds on a ~1 GB
``train.bin``, with and without the checks, alternating in one run.

The checks read the last token, a fixed sample (16 runs of 4,096 tokens) and the document count
the scan finds anyway; this bench times ``nanogpt_source`` (map + checks + scan for documents) with
the checks and with them replaced by no-ops (the code before them), the checks alone, and with
``--convert`` one whole ``convert`` for scale. Writes ``bench/out/token_checks.json``.

    python -m bench.bench_token_checks [--gb 1.0] [--repeats 5] [--convert]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import load_average, machine, median, write_json
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.convert.sources import tokens_nanogpt
from flightfeed.server.tools.convert.sources.token_checks import check_layout, check_rate

EOT = 50256


def make_corpus(path: Path, tokens: int, chunk: int = 1 << 26) -> int:
    """A uint16 ``train.bin`` of about ``tokens`` GPT-2 ids, documents of lognormal length (mean
    ~660), each followed by EOT; written in chunks; returns the documents."""
    rng = np.random.default_rng(0)
    docs = 0
    with open(path, "wb") as f:
        written = 0
        while written < tokens:
            n = min(chunk, tokens - written)
            ids = rng.integers(0, EOT, size=n, dtype=np.uint16)
            lengths = np.maximum(1, rng.lognormal(mean=6.0, sigma=1.0, size=n // 200 + 1).astype(np.int64))
            ends = np.cumsum(lengths + 1) - 1
            ends = ends[ends < n]
            ids[ends] = EOT
            ids[-1] = EOT
            docs += len(ends) + (0 if len(ends) and ends[-1] == n - 1 else 1)
            ids.tofile(f)
            written += n
    return docs


def _no_check(*args: Any) -> None:
    """The code before the checks: nothing between mapping the file and scanning it."""


def cpu(fn: Callable[[], Any]) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="size of the token file in GB (uint16 tokens)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--convert", action="store_true", help="also time one whole convert (writes the output)")
    p.add_argument("--tmp", default=None)
    args = p.parse_args()
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "load_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench_token_checks_", dir=args.tmp) as tmp:
        path = Path(tmp) / "train.bin"
        docs = make_corpus(path, int(args.gb * 1e9) // 2)
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        tokens.sum(dtype=np.uint64)  # in the page cache before any timing
        result["file"] = {"bytes": path.stat().st_size, "tokens": len(tokens), "documents": docs}
        module: Any = tokens_nanogpt  # the checks as nanogpt_source finds them, swapped for no-ops
        real = (module.check_layout, module.check_rate)
        with_checks: list[float] = []
        without: list[float] = []
        alone: list[float] = []

        def source() -> None:
            tokens_nanogpt.nanogpt_source([str(path)], EOT, "uint16")

        def checks() -> None:
            check_layout(str(path), tokens, EOT)
            check_rate(str(path), len(tokens), docs, EOT, tokens.dtype)

        for _ in range(args.repeats):
            module.check_layout, module.check_rate = real
            with_checks.append(cpu(source)[0])
            module.check_layout = module.check_rate = _no_check
            without.append(cpu(source)[0])
            alone.append(cpu(checks)[0])
        module.check_layout, module.check_rate = real
        result["source_cpu_s"] = {"with_checks": with_checks, "without_checks": without, "checks_alone": alone}
        result["median_cpu_s"] = {"with_checks": median(with_checks), "without_checks": median(without),
                                  "checks_alone": median(alone)}
        result["ratio_with_over_without"] = median(with_checks) / median(without)
        if args.convert:
            out = Path(tmp) / "out"
            c, w = cpu(lambda: convert(str(path), str(out), ConvertSettings(kind="nanogpt", eot=EOT, progress=False)))
            result["convert"] = {"cpu_s": c, "wall_s": w, "cpu_s_per_gb": c / (path.stat().st_size / 1e9)}
    result["load_end"] = os.getloadavg()
    result["load_average"] = load_average()
    print(write_json("token_checks", result))
    print({k: result[k] for k in ("median_cpu_s", "ratio_with_over_without", "load_start", "load_end")})
    if "convert" in result:
        print(result["convert"])


if __name__ == "__main__":
    main()
