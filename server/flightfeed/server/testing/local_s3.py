"""An S3-compatible service on loopback for tests, benchmarks and demos: moto in server mode
(``moto[server]``, a dev dependency) on ``127.0.0.1`` with an OS-chosen port.

pyarrow's S3 client is not boto, so in-process moto mocks do not intercept it; a real server
does. Clients made here always carry explicit keys and region, so they never look up instance
credentials. (Callers should still set ``AWS_EC2_METADATA_DISABLED=true`` for any other client.)
moto serves correctness, not speed: every ranged GET copies the whole object.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow.fs as pafs

from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.storage.s3_client import s3_filesystem

__all__ = ["LocalS3"]


#: the moto server of a separate process: its port on the first line, then it runs until its stdin closes
_CHILD = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(host, port, flush=True)
sys.stdin.read()
server.stop()
"""


class LocalS3:
    """``with LocalS3() as s3:`` a moto S3 server on 127.0.0.1; ``s3.endpoint`` is its URL.

    By default moto runs in a process of its own, as a store does. ``in_process=True`` runs it on a
    thread of this process instead (benchmarks that put objects into moto's backend directly or
    read its request log). In-process, moto's request threads share this process's garbage
    collector: a collection on one of them can wait for a lock that a reader holds while it waits
    for that very request (h5py's global lock, held while HDF5 reads a remote file's metadata
    through ``storage/ranges``), a deadlock no real store can cause.
    """

    access_key = "flightfeed-local"
    secret_key = "flightfeed-local-secret"
    region = "us-east-1"

    def __init__(self, *, in_process: bool = False) -> None:
        self.in_process = in_process
        self._server: Any = None
        self._child: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def start(self) -> LocalS3:
        if self.in_process:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._server.start()
            host, port = self._server.get_host_and_port()
        else:
            self._child = subprocess.Popen(
                [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            assert self._child.stdout is not None
            line = self._child.stdout.readline().split()
            if len(line) != 2:
                self.stop()
                raise RuntimeError("moto did not start (is moto[server] installed?)")
            host, port = line[0], int(line[1])
        if host != "127.0.0.1":
            self.stop()
            raise RuntimeError(f"moto listens on {host}, not loopback")
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        child, self._child = self._child, None
        if child is not None:
            try:
                assert child.stdin is not None
                child.stdin.close()  # it stops its server and exits
                child.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()
            finally:
                if child.stdout is not None:
                    child.stdout.close()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- clients ----------------------------------------------------------------------------
    def fs(self) -> pafs.S3FileSystem:
        return s3_filesystem(
            endpoint=self.endpoint,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
            allow_bucket_creation=True,
        )

    def options(self, cache_dir: str | Path | None = None, **changes: Any) -> StorageOptions:
        """StorageOptions that reach this service (plus any field ``changes``)."""
        base = StorageOptions(
            s3_endpoint=self.endpoint,
            s3_region=self.region,
            s3_access_key=self.access_key,
            s3_secret_key=self.secret_key,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
        return replace(base, **changes)

    def new_bucket(self, prefix: str = "b") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.fs().create_dir(name)
        return name

    def upload_dir(self, local: str | Path, uri: str) -> None:
        """Copy every file under ``local`` to ``uri`` (``s3://bucket/prefix``), keeping relative paths."""
        from flightfeed.server.storage.s3_client import upload

        fs = self.fs()
        root = uri[len("s3://") :].rstrip("/")
        base = Path(local)
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            upload(fs, str(path), f"{root}/{path.relative_to(base).as_posix()}")
