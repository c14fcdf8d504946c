"""Run as a subprocess by test_ragged_workers: nested/padded ragged batches through fork workers.

This process must not have used Flight before it forks (the pytest process has). A
StatefulDataLoader with two ``fork`` workers reads a few batches, checkpoints, reads the rest; a
second loader resumes from the checkpoint. Every batch's values are checked against the source
here. Prints one JSON object: head, tail, resumed (index lists per batch).
"""

from __future__ import annotations

import io
import json
import sys

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from flightfeed.client import FlightDataset, ReadOptions
from tests.client.ragged_data import check_batch

POLICY = {"boxes": "padded"}


def _loader(location: str, name: str) -> StatefulDataLoader:
    options = ReadOptions(streams=3, report_interval=None, message_rows=64, ragged=POLICY)
    ds = FlightDataset(location, name, batch_size=32, seed=4, options=options)
    ds.set_epoch(1)
    return StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)


def main(location: str, name: str, stop_after: int) -> None:
    loader = _loader(location, name)
    it = iter(loader)
    head = [check_batch(next(it), POLICY) for _ in range(stop_after)]
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    tail = [check_batch(b, POLICY) for b in it]
    del it, loader
    again = _loader(location, name)
    buf.seek(0)
    again.load_state_dict(torch.load(buf))
    resumed = [check_batch(b, POLICY) for b in again]
    print(json.dumps({"head": head, "tail": tail, "resumed": resumed}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
