"""HDF5 (and netCDF-4) files as datasets: layout, members, columns, chunk maps, filters and type mapping."""
