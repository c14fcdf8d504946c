"""flightfeed's PyTorch client: zero-copy batches from a flightfeed Flight server.

    from flightfeed.client import FlightDataset, ReadOptions
    ds = FlightDataset("grpc://127.0.0.1:8815", "train", batch_size=256, shuffle=True, seed=0,
                       options=ReadOptions(streams=4))   # connect=ConnectOptions(token=...)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in ds:          # dict[str, torch.Tensor]
            ...
"""

from flightfeed.client._datapipe import FlightDataPipe
from flightfeed.client._dataset import FlightDataset
from flightfeed.client._mix_plan import Mixture
from flightfeed.client._mixture import MixtureDataset
from flightfeed.client._node import FlightNode
from flightfeed.client._options import ConnectOptions, ReadOptions
from flightfeed.client._tensors.pack import Pack
from flightfeed.wire.errors import (
    ConfigError,
    DatasetNotFound,
    FlightFeedError,
    InvalidRequest,
    PermissionDenied,
    StaleState,
    StreamError,
    StreamTruncated,
    Unauthenticated,
)

__all__ = [
    "FlightDataset",
    "ConnectOptions",
    "ReadOptions",
    "Pack",
    "Mixture",
    "MixtureDataset",
    "FlightNode",
    "FlightDataPipe",
    "FlightFeedError",
    "ConfigError",
    "InvalidRequest",
    "DatasetNotFound",
    "StaleState",
    "StreamError",
    "StreamTruncated",
    "Unauthenticated",
    "PermissionDenied",
]
