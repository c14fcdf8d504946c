"""moto in server mode as a subprocess on 127.0.0.1, for benchmarks only (never the tests).

``python bench/floors/moto_ranges.py [--ranges-by-seek]`` prints ``PORT <n>`` once it listens.

Stock moto answers a ranged GET by copying the whole object and slicing it (``FakeKey.value``),
under the key's lock: its cost grows with the object's size, and concurrent GETs of one object
run one after the other. With ``--ranges-by-seek`` (label every figure "moto, ranges served by
seek") a ranged GET reads only its range from the object's buffer (seek + read): a GET's cost no
longer depends on the object's size, closer to a store's pace (docs/remote-reads.md, "Pace").
This patch exists for ``bench/remote_first_batch.py``; tests always use stock moto (``LocalS3``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import Any


class _Ranged:
    """The bytes of a moto key as ``_handle_range_header`` uses them (``len`` and one slice),
    read by seek from the key's buffer instead of copied whole."""

    def __init__(self, key: Any) -> None:
        self._key = key

    def __len__(self) -> int:
        return int(self._key.size)

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(len(self))
        with self._key.lock:
            self._key._value_buffer.seek(start)
            return bytes(self._key._value_buffer.read(stop - start))


def _patch_ranges() -> None:
    from moto.s3 import responses

    original = responses.S3Response.get_object

    def get_object(self: Any) -> Any:
        if not self.headers.get("range"):
            return original(self)
        key, not_modified = self._get_key()
        if not_modified or self.headers.get("x-amz-checksum-mode") == "ENABLED":
            return original(self)
        headers = self._get_cors_headers_other()
        headers.update(key.response_dict)
        headers.update(key.metadata)
        headers.update({"Accept-Ranges": "bytes"})
        return 200, headers, _Ranged(key)

    responses.S3Response.get_object = get_object


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranges-by-seek", action="store_true", help="bench only: serve ranged GETs by seek + read")
    args = parser.parse_args()
    if args.ranges_by_seek:
        _patch_ranges()
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(f"PORT {server.get_host_and_port()[1]}", flush=True)
    threading.Event().wait() if sys.stdin is None else sys.stdin.read()  # until the parent closes stdin
    server.stop()


if __name__ == "__main__":
    main()
