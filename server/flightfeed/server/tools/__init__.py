"""Operator tools around the server: ``convert`` (HDF5, Parquet, NumPy and image folders into
sharded ``.arrow`` with a manifest) and ``inspect`` (schema, rows, shards, bytes of a local
dataset, an S3 prefix or a running server)."""

__all__: list[str] = []
