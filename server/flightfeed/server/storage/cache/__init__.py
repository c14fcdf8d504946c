"""The node's shard cache: one byte budget per node across processes, claims, eviction, fill and disk accounting."""
