"""Where shards come from: local directories/globs, and object storage through a bounded cache."""

from flightfeed.server.storage.local import list_local_shards
from flightfeed.server.storage.resolve import StorageOptions, open_catalog, open_dataset

__all__ = ["StorageOptions", "open_dataset", "open_catalog", "list_local_shards"]
