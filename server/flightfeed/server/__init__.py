"""flightfeed's data server: Arrow Flight over sharded Arrow IPC, HDF5 and S3 (never imports torch)."""

from flightfeed.server.catalog import Catalog, Dataset
from flightfeed.server.metrics import ServerMetrics
from flightfeed.server.order import EpochOrder
from flightfeed.server.service import FlightFeedServer
from flightfeed.server.storage import StorageOptions, open_dataset
from flightfeed.server.streaming import StreamSettings

__all__ = [
    "FlightFeedServer",
    "Catalog",
    "Dataset",
    "EpochOrder",
    "ServerMetrics",
    "StorageOptions",
    "StreamSettings",
    "open_dataset",
]
