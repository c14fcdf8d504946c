"""S3 through ``pyarrow.fs.S3FileSystem``: client set-up, error translation, whole-object
downloads (one sized read, or parallel large ranged reads) and uploads, with retries.

Small ranged reads against S3 cost ~100-200 ms each, and an unsized ``open_input_stream().read()``
reads in 256 KiB requests; so objects are always fetched with sized reads of ``part_size`` bytes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from flightfeed.wire.errors import ConfigError, StorageError

__all__ = ["s3_filesystem", "split_s3_uri", "download", "upload", "translate", "with_retries"]

T = TypeVar("T")

_MISSING_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist")
_DENIED = (
    "ACCESS_DENIED",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "HTTP response code: 403",
)
_MISSING_KEY = ("NO_SUCH_KEY", "NoSuchKey", "Path does not exist")


def s3_filesystem(
    *,
    endpoint: str | None = None,
    region: str | None = None,
    scheme: str = "https",
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
    allow_bucket_creation: bool = False,
) -> pafs.S3FileSystem:
    """An S3 client. ``endpoint`` may carry a scheme (``http://127.0.0.1:9000``), which wins over
    ``scheme``. Without keys the AWS default chain (variables, profile, ...) is used."""
    override = None
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"{scheme}://{endpoint}")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"--s3-endpoint {endpoint!r} must look like http(s)://host:port")
        override, scheme = parts.netloc, parts.scheme
    if (access_key is None) != (secret_key is None):
        raise ConfigError(
            "S3 credentials need both an access key and a secret key (or neither): set both "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither to use a profile or the machine's role"
        )
    try:
        return pafs.S3FileSystem(
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            region=region or ("us-east-1" if override else None),
            scheme="http" if scheme == "http" else "https",
            endpoint_override=override,
            connect_timeout=10,
            request_timeout=120,
            allow_bucket_creation=allow_bucket_creation,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot set up the S3 client: {exc}") from None


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> ``("bucket", "bucket/prefix")`` (the pyarrow path)."""
    if not uri.startswith("s3://"):
        raise ConfigError(f"{uri}: not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"{uri}: no bucket in the URI (expected s3://bucket/prefix)")
    key = key.strip("/")
    return bucket, f"{bucket}/{key}" if key else bucket


def translate(exc: OSError, uri: str) -> StorageError | None:
    """A clear StorageError for a permanent failure (missing bucket/key, denied), None if transient."""
    text = str(exc)
    bucket = uri[len("s3://") :].split("/", 1)[0] if uri.startswith("s3://") else uri
    if any(s in text for s in _MISSING_BUCKET):
        return StorageError(f"{uri}: bucket {bucket!r} does not exist (check the URI and --s3-endpoint/--s3-region)")
    if any(s in text for s in _DENIED):
        return StorageError(
            f"{uri}: access denied by the S3 service; check the credentials (AWS_ACCESS_KEY_ID/"
            f"AWS_SECRET_ACCESS_KEY or profile) and the bucket policy. ({text.splitlines()[0][:200]})"
        )
    if isinstance(exc, FileNotFoundError) or any(s in text for s in _MISSING_KEY):
        return StorageError(f"{uri}: no such object or prefix")
    return None


def with_retries(call: Callable[[], T], uri: str, *, retries: int = 4, backoff_s: float = 0.25) -> T:
    """``call()``, retried with exponential backoff and jitter on transient S3 errors."""
    for attempt in range(retries + 1):
        try:
            return call()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # the local disk is full: not an S3 failure, and retrying does not make room
            permanent = translate(exc, uri)
            if permanent is not None:
                raise permanent from None
            if attempt == retries:
                raise StorageError(f"{uri}: S3 request failed after {retries + 1} attempts: {exc}") from None
        time.sleep(backoff_s * (2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def download(
    fs: pafs.FileSystem, path: str, size: int, dest: str, *, part_size: int = 64 << 20, parallel: int = 8
) -> str:
    """Write the whole object ``path`` (``size`` bytes) to the local file ``dest``; its sha256.

    Objects up to ``part_size`` take one sized GET; larger ones ``part_size`` ranged GETs,
    ``parallel`` at a time, written and hashed in order as they arrive.
    """
    source = fs.open_input_file(path)
    digest = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            if size <= part_size:
                data = source.read_buffer(size)
                if data.size != size:
                    raise OSError(f"short read: {data.size} of {size} bytes")
                digest.update(memoryview(data))
                out.write(memoryview(data))
                return digest.hexdigest()

            def part(offset: int) -> bytes:
                want = min(part_size, size - offset)
                data = source.read_at(want, offset)  # type: ignore[call-arg]  # (stubs lack the arguments)
                if len(data) != want:
                    raise OSError(f"short read at offset {offset}: {len(data)} of {want} bytes")
                return data

            offsets = list(range(0, size, part_size))
            window = max(1, parallel)
            with ThreadPoolExecutor(max_workers=window, thread_name_prefix="s3-get") as pool:
                pending = {i: pool.submit(part, o) for i, o in enumerate(offsets[:window])}
                for i in range(len(offsets)):
                    chunk = pending.pop(i).result()
                    if i + window < len(offsets):
                        pending[i + window] = pool.submit(part, offsets[i + window])
                    digest.update(chunk)
                    out.write(chunk)
        return digest.hexdigest()
    finally:
        source.close()


def upload(fs: pafs.FileSystem, src: str, path: str, *, piece: int = 16 << 20) -> None:
    """Copy the local file ``src`` to the object ``path`` (multipart upload by pyarrow)."""
    with open(src, "rb") as f, fs.open_output_stream(path, compression=None) as out:  # not by suffix: .gz stays
        while data := f.read(piece):
            out.write(data)
    info = fs.get_file_info(path)
    if info.size != os.path.getsize(src):
        raise OSError(f"upload of {src} to {path} is incomplete: {info.size} bytes stored")
