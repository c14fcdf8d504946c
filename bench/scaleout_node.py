"""One data node of ``bench_scaleout.py``: ``flightfeed serve`` plus a benchmark-only transform.

``bench_sleep`` sleeps ``ms`` milliseconds per message while holding a per-process lock: each node
can make one message at a time, a per-message cost that needs no CPU (so 1-4 nodes can be
compared on 2 cores) and each node limited to its own share of work. It is registered here, only
in the benchmark's node processes, through the transform registry's programmatic API.

    python bench/scaleout_node.py NAME=DIR [flightfeed serve flags...]
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from flightfeed.server.cli import main
from flightfeed.server.transforms import Param, register_transform

_ONE_AT_A_TIME = threading.Lock()


def bench_sleep(batch: Any, params: Mapping[str, Any], key: Any) -> Any:
    with _ONE_AT_A_TIME:
        time.sleep(float(params["ms"]) / 1000.0)
    return batch


register_transform(
    "bench_sleep", bench_sleep, per="message", params=[Param("ms", float, 10.0, low=0.0, high=10_000.0)]
)

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
