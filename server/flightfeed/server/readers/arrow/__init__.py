"""Arrow IPC shards: memory-mapped files, footers and metadata, small shards, and the lease watch on mapped files."""
