"""Streams to messages in canonical order: lanes, the board, claims, runs, assembly, skips and the stall meter."""
