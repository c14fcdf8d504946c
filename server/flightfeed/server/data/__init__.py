"""The data model: datasets and the order of their rows.

``catalog`` holds each served dataset (shards, the global row index ``[0, N)``, fingerprint,
the decoded-chunk LRU); ``order`` is the pure, seeded function from (fingerprint, seed, epoch,
shuffle settings) to the epoch's sequence of stored rows; ``readahead`` reads the blocks that
order will need next, ahead of the streams.
"""

__all__: list[str] = []
