"""flightfeed's wire contract: protobuf messages, the error tree and the pure partition plan.

Shared by ``flightfeed.server`` and ``flightfeed.client``; imports neither torch nor h5py.
"""

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
from flightfeed.wire.messages import WIRE_VERSION, ClientReport, ReadCommand, Shuffle, StreamTicket
from flightfeed.wire.plan import Partition, StreamSpan, split_streams

__all__ = [
    "ClientReport",
    "ConfigError",
    "DatasetError",
    "DatasetNotFound",
    "DiskFull",
    "FlightFeedError",
    "InvalidRequest",
    "Partition",
    "PermissionDenied",
    "ReadCommand",
    "ShardError",
    "Shuffle",
    "split_streams",
    "StaleState",
    "StorageError",
    "StreamError",
    "StreamSpan",
    "StreamTicket",
    "StreamTruncated",
    "Unauthenticated",
    "WIRE_VERSION",
]
