"""Run as a subprocess by test_client_epoch_start: StatefulDataLoader with persistent ``fork``
workers over several epochs, checkpointed at the start of epoch 1 and after its first batch.

(The pytest process has used Flight, so fork workers must come from a fresh process: this one.)
Batches of 32 rows in messages of 64 rows (``message_rows``), 2 workers. Prints one JSON object:
``epoch0`` (the index lists of epoch 0's batches), and per checkpoint (``"0"``, ``"1"``: batches
read in epoch 1 before it): ``head``, ``tail`` (the rest of epoch 1 in that run), ``resumed`` (what
a new loader restored from the checkpoint delivers) and ``epochs`` (each worker's checkpointed epoch);
``next``: epoch 2 read by a new loader restored from a checkpoint taken after epoch 1's last batch.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from flightfeed.client import FlightDataset, ReadOptions


def loader_of(location: str, name: str) -> tuple[FlightDataset, StatefulDataLoader]:
    options = ReadOptions(streams=3, report_interval=None, message_rows=64)
    ds = FlightDataset(location, name, batch_size=32, seed=4, options=options)
    loader = StatefulDataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork", persistent_workers=True, timeout=60
    )
    return ds, loader


def indices(batches: Any) -> list[list[int]]:
    return [b["index"].tolist() for b in batches]


def main(location: str, name: str) -> None:
    out: dict[str, Any] = {}
    for cut in (0, 1):
        ds, loader = loader_of(location, name)
        ds.set_epoch(0)
        out["epoch0"] = indices(loader)
        ds.set_epoch(1)
        it = iter(loader)
        head = indices(next(it) for _ in range(cut))
        state = loader.state_dict()
        buf = io.BytesIO()
        torch.save(state, buf)
        tail = indices(it)
        del it, loader

        _, loader = loader_of(location, name)
        buf.seek(0)
        loader.load_state_dict(torch.load(buf))
        resumed = indices(loader)
        del loader
        workers = state["_snapshot"]["_worker_snapshots"]
        epochs = [workers[w]["dataset_state"]["epoch"] for w in sorted(workers)]
        out[str(cut)] = {"head": head, "tail": tail, "resumed": resumed, "epochs": epochs}

    # a checkpoint after epoch 1's last batch, then the next epoch: set_epoch(2) must win over the
    # workers' checkpoint of the ended epoch 1 (it replayed epoch 1)
    ds, loader = loader_of(location, name)
    ds.set_epoch(1)
    indices(loader)
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    del loader
    again, loader = loader_of(location, name)
    buf.seek(0)
    loader.load_state_dict(torch.load(buf))
    again.set_epoch(2)
    out["next"] = indices(loader)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
