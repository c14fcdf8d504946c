"""Range reads of remote shards into a block cache (docs/remote-reads.md)."""
