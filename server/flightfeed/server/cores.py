"""How many cores this server is given: the CPU affinity mask, capped by a cgroup CPU quota.

``os.cpu_count()`` counts the host's cores; a data node in a container (a Kubernetes CPU limit,
``docker run --cpus``) or under ``taskset`` is given fewer. Thread pools that should keep every
core busy (the decode pool, the read-ahead's decode threads, block verification) are sized from
:func:`available_cores`, so the default ``flightfeed serve`` uses what it is given and no more.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

__all__ = ["available_cores"]

_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"


def available_cores() -> int:
    """Cores this process may use (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError, IndexError):
        quota, period = _CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return max(1, cores)
