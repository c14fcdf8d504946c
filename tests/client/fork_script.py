"""Run as a subprocess by test_client_workers: DataLoader workers with the ``fork`` start method.

This process must never have used Flight before it forks (the pytest process has), so the
checks run here: (1) StatefulDataLoader with fork workers resumes exactly; (2) after the parent
itself read the dataset, a fork DataLoader fails promptly with ConfigError instead of hanging.
Prints one JSON object: head, tail, resumed (index lists per batch) and error.
"""

from __future__ import annotations

import io
import json
import sys

import torch
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.wire.errors import ConfigError


def main(location: str, name: str, stop_after: int) -> None:
    options = ReadOptions(streams=3, report_interval=None, message_rows=64)
    ds = FlightDataset(location, name, batch_size=32, seed=4, options=options)
    ds.set_epoch(1)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(stop_after)]
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    tail = [b["index"].tolist() for b in it]
    del it, loader

    again = FlightDataset(location, name, batch_size=32, seed=4, options=options)
    again.set_epoch(1)
    loader = StatefulDataLoader(again, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    buf.seek(0)
    loader.load_state_dict(torch.load(buf))
    resumed = [b["index"].tolist() for b in loader]
    del loader

    next(iter(ds))  # the parent uses Flight itself: fork is no longer safe
    error = ""
    try:
        list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    except ConfigError as exc:
        error = str(exc)
    ds.close()
    print(json.dumps({"head": head, "tail": tail, "resumed": resumed, "error": error}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
