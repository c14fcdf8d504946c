"""What ``flightfeed convert`` reads: tabular files (HDF5, Parquet, NumPy), image folders, token
corpora and other loaders' formats.
"""
