"""Host to GPU: copy engines, the pinned staging ring and the mover that stages each message."""
