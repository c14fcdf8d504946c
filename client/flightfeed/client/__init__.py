"""flightfeed's PyTorch client: zero-copy batches from a flightfeed Flight server.

    from flightfeed.client import FlightDataset, ReadOptions
    ds = FlightDataset("grpc://127.0.0.1:8815", "train", batch_size=256, shuffle=True, seed=0,
                       options=ReadOptions(streams=4))   # connect=ConnectOptions(token=...)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in ds:          # dict[str, torch.Tensor]
            ...

Every error a trainer can receive is exported here (the tree: ``flightfeed.wire.errors``);
``except FlightFeedError`` catches them all.
"""

from flightfeed.client._adapters import FlightDataPipe, FlightNode
from flightfeed.client._dataset import FlightDataset
from flightfeed.client._mix_plan import Mixture
from flightfeed.client._mixture import MixtureDataset
from flightfeed.client._options import ConnectOptions, ReadOptions
from flightfeed.client._tensors.pack import Pack
from flightfeed.wire.errors import (
    ConfigError,
    DatasetError,
    DatasetNotFound,
    DiskFull,
    FlightFeedError,
    InvalidRequest,
    PermissionDenied,
    ShardError,
    StaleState,
    StorageError,
    StreamError,
    StreamTruncated,
    Unauthenticated,
)

__all__ = [
    "ConfigError",
    "ConnectOptions",
    "DatasetError",
    "DatasetNotFound",
    "DiskFull",
    "FlightDataPipe",
    "FlightDataset",
    "FlightFeedError",
    "FlightNode",
    "InvalidRequest",
    "Mixture",
    "MixtureDataset",
    "Pack",
    "PermissionDenied",
    "ReadOptions",
    "ShardError",
    "StaleState",
    "StorageError",
    "StreamError",
    "StreamTruncated",
    "Unauthenticated",
]
