"""HDF5 filters this build cannot run: found at start-up, named with where they come from.

A chunked dataset lists its filter pipeline in its creation properties; HDF5 only looks for the
filter's code when a chunk is read. A file compressed with a filter this process lacks (PyTables'
LZO, id 305, is the common one: no plugin package ships it) would pass start-up and fail every
read. :func:`missing_filters` asks HDF5 (``h5z.filter_avail``, after ``hdf5plugin`` registered its
filters) for each filter of a dataset, so the reader refuses such a dataset when it opens, naming
the filter, its id and what provides it.
"""

from __future__ import annotations

import h5py
import hdf5plugin  # noqa: F401  (registers its filters with HDF5 before they are looked up)

__all__ = ["missing_filters", "FILTER_SOURCES"]

#: registered HDF5 filter ids -> (name, what provides it)
FILTER_SOURCES: dict[int, tuple[str, str]] = {
    4: ("szip", "HDF5 built with libaec/szip (h5py's wheels include it)"),
    305: (
        "LZO",
        "PyTables' own LZO filter (PyTables built with liblzo2; no HDF5 plugin package ships it): rewrite the "
        "file with another compressor where PyTables has LZO, e.g. `ptrepack --complib zlib --complevel 5 "
        "in.h5:/ out.h5:/`",
    ),
    307: ("bzip2", "the hdf5plugin package (BZip2), or PyTables"),
    32000: ("lzf", "h5py"),
    32001: ("blosc", "the hdf5plugin package (flightfeed's hdf5 extra), or PyTables"),
    32004: ("lz4", "the hdf5plugin package (flightfeed's hdf5 extra)"),
    32008: ("bitshuffle", "the hdf5plugin package (flightfeed's hdf5 extra)"),
    32013: ("zfp", "the hdf5plugin package (flightfeed's hdf5 extra)"),
    32015: ("zstd", "the hdf5plugin package (flightfeed's hdf5 extra)"),
    32017: ("sz", "the hdf5plugin package (flightfeed's hdf5 extra)"),
    32024: ("sz3", "the hdf5plugin package (flightfeed's hdf5 extra)"),
    32026: ("blosc2", "the hdf5plugin package (flightfeed's hdf5 extra), or PyTables >= 3.8"),
}
_REGISTRY = "https://github.com/HDFGroup/hdf5_plugins/blob/master/docs/RegisteredFilterPlugins.md"


def missing_filters(ds: h5py.Dataset) -> list[str]:
    """One sentence per filter of ``ds``'s pipeline that HDF5 cannot run in this process."""
    plist = ds.id.get_create_plist()
    out = []
    for i in range(plist.get_nfilters()):
        code, _flags, _values, label = plist.get_filter(i)
        code = int(code)
        if h5py.h5z.filter_avail(code):
            continue
        name, source = FILTER_SOURCES.get(code, (None, None))
        stored = label.decode("ascii", "replace") if isinstance(label, bytes) else str(label)
        shown = name or stored or "unknown"
        where = source or (
            f"an HDF5 filter plugin registered as id {code} (see {_REGISTRY}); install it and point "
            "HDF5_PLUGIN_PATH at it"
        )
        out.append(
            f"compressed with the HDF5 filter {shown!r} (id {code}), which this build lacks; it comes from {where}"
        )
    return out
