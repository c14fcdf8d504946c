"""The three torch interfaces over the one pipeline: plain iteration, ``as_node()`` (torchdata
nodes, with exact resume through get_state/reset) and ``as_datapipe()``; and DataLoader workers
(spawned: gRPC is not fork-safe) splitting the streams without duplicates."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch.utils.data
import torchdata.nodes

from flightfeed.client import FlightDataPipe, FlightDataset, FlightNode
from flightfeed.wire.errors import ConfigError
from tests.support.client import ROWS, check_content, flat, indices

MakeDs = Callable[..., FlightDataset]


def test_three_interfaces_give_identical_batches(make_ds: MakeDs) -> None:
    plain = make_ds(shuffle=True, seed=5)
    plain.set_epoch(1)
    expected = indices(plain)
    assert sorted(flat(expected)) == list(range(ROWS))

    node = make_ds(shuffle=True, seed=5).as_node(initial_epoch=1)
    assert isinstance(node, torchdata.nodes.BaseNode)
    assert indices(node) == expected

    pipe = make_ds(shuffle=True, seed=5).as_datapipe()
    assert isinstance(pipe, torch.utils.data.IterDataPipe)
    assert isinstance(pipe, FlightDataPipe)
    pipe.set_epoch(1)
    got = []
    for b in pipe:
        check_content(b)
        got.append(b["index"].tolist())
    assert got == expected

    loader = torchdata.nodes.Loader(make_ds(shuffle=True, seed=5).as_node(initial_epoch=1))
    assert indices(loader) == expected


def test_node_epochs_follow_the_dataset(make_ds: MakeDs) -> None:
    """Every reset(None) after an iteration moves to the next epoch (a Loader resets per epoch)."""
    ref = make_ds(shuffle=True, seed=2)
    per_epoch = []
    for e in range(3):
        ref.set_epoch(e)
        per_epoch.append(indices(ref))
    assert per_epoch[0] != per_epoch[1]
    loader = torchdata.nodes.Loader(make_ds(shuffle=True, seed=2).as_node())
    assert [indices(loader) for _ in range(3)] == per_epoch


@pytest.mark.parametrize("stop_after", [0, 1, 5, 13])
def test_node_state_resumes_exactly(make_ds: MakeDs, stop_after: int) -> None:
    ref = make_ds(shuffle=True, seed=9)
    ref.set_epoch(4)
    expected = indices(ref)

    node = make_ds(shuffle=True, seed=9).as_node(initial_epoch=4)
    head = [next(node)["index"].tolist() for _ in range(stop_after)]
    state = json.loads(json.dumps(node.state_dict()))  # small and JSON-serialisable
    assert len(json.dumps(state)) < 2048
    node.close()

    fresh = make_ds(shuffle=True, seed=9).as_node()  # another reader, e.g. after a restart
    fresh.reset(state)
    assert head + indices(fresh) == expected


def test_loader_state_dict_resumes_exactly(make_ds: MakeDs) -> None:
    ref = make_ds(shuffle=True, seed=1)
    expected = [indices(ref)]
    ref.set_epoch(1)
    expected.append(indices(ref))

    loader = torchdata.nodes.Loader(make_ds(shuffle=True, seed=1).as_node())
    first = indices(loader)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(4)]
    state = loader.state_dict()

    resumed = torchdata.nodes.Loader(make_ds(shuffle=True, seed=1).as_node())
    resumed.load_state_dict(state)
    assert [first, head + indices(resumed)] == expected


def test_node_state_at_the_start_of_an_epoch(make_ds: MakeDs) -> None:
    """Before its first batch a node's state is "the start of epoch e", not the last epoch's end."""
    node = make_ds(shuffle=True, seed=4).as_node()
    assert len(indices(node)) > 0
    node.reset()  # epoch 1, nothing read yet
    state = node.state_dict()
    assert state["epoch"] == 1
    fresh = make_ds(shuffle=True, seed=4).as_node()
    fresh.reset(state)
    ref = make_ds(shuffle=True, seed=4)
    ref.set_epoch(1)
    assert indices(fresh) == indices(ref)


def test_bad_node_state(make_ds: MakeDs) -> None:
    node = make_ds().as_node()
    with pytest.raises(ConfigError, match="not a FlightNode state"):
        node.reset({"rows": 3})


def test_datapipe_state_is_the_dataset_state(make_ds: MakeDs) -> None:
    ref = make_ds(shuffle=True, seed=8)
    expected = indices(ref)
    pipe = make_ds(shuffle=True, seed=8).as_datapipe()
    it = iter(pipe)
    head = [next(it)["index"].tolist() for _ in range(3)]
    state = pipe.state_dict()
    del it
    other = make_ds(shuffle=True, seed=8).as_datapipe()
    other.load_state_dict(state)
    assert head + indices(other) == expected


@pytest.mark.parametrize("adapter", ["dataset", "datapipe"])
def test_dataloader_workers_deliver_every_row_once_in_canonical_order(make_ds: MakeDs, adapter: str) -> None:
    ref = make_ds(shuffle=True, seed=6, message_rows=32)
    expected = indices(ref)
    ds = make_ds(shuffle=True, seed=6, message_rows=32)
    source: torch.utils.data.Dataset[dict[str, object]] = ds if adapter == "dataset" else ds.as_datapipe()
    loader = torch.utils.data.DataLoader(source, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = indices(loader)
    assert sorted(flat(got)) == list(range(ROWS))
    assert got == expected


def test_node_and_datapipe_are_exported() -> None:
    import flightfeed.client as client

    assert {"FlightNode", "FlightDataPipe"} <= set(client.__all__)
    assert client.FlightNode is FlightNode
