"""``flightfeed serve NAME=URI ...``: open the datasets, serve them over Flight (plus the sidecar)
until SIGINT/SIGTERM, then shut down gracefully (in-flight streams get ``--grace`` seconds).

With no tuning flags the node uses every core it is given (``cores.available_cores``): one
serving process per 2 cores (``cluster.workers.default_workers``: one process on 1-2 cores), each
stream on its own gRPC thread with the hot stages (stored send, shuffled gather, HDF5 inflate,
image decode, block verification) in native code without the GIL, and each process's decode pool
sized to its share of the cores.

``--workers N`` starts N-1 supervised worker processes serving the same datasets on their own
ports (restarted with backoff when they die; they exit when this process dies); ``--peers`` /
``--peers-dns`` name the other data nodes. ``get_flight_info`` spreads endpoints over every live
process of every live node (``flightfeed.server.cluster``), so streams spread over the GILs and
h5py locks of all of them, and a client continues a failed stream on the next location.
"""

from flightfeed.server.serve.args import add_arguments, parse_datasets
from flightfeed.server.serve.command import run

__all__ = ["add_arguments", "parse_datasets", "run"]
