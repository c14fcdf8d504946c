"""Where shards come from: local directories/globs, and object storage through a bounded cache.

``resolve`` turns a URI into a dataset (``local`` or ``s3``), with settings in ``options`` (built
from the command line by ``cli_options``); ``cache``/``cache_files`` keep remote shards on local
disk within ``--cache-size``; ``manifest`` and ``verify`` check shards against ``manifest.json``.
"""

from flightfeed.server.storage.local import list_local_shards
from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.storage.resolve import open_catalog, open_dataset

__all__ = ["StorageOptions", "open_dataset", "open_catalog", "list_local_shards"]
