"""flightfeed's data server: Arrow Flight over sharded Arrow IPC, HDF5 and S3 (never imports torch)."""

from flightfeed.server.data.catalog import Catalog, Dataset
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.request.streaming import StreamSettings
from flightfeed.server.storage import StorageOptions, open_dataset

__all__ = [
    "Catalog",
    "Dataset",
    "EpochOrder",
    "FlightFeedServer",
    "open_dataset",
    "ServerMetrics",
    "StorageOptions",
    "StreamSettings",
]
