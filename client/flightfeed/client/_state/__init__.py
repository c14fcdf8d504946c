"""What a checkpoint holds and where a reader runs: the read position, the rank/world topology, fork safety."""
