"""The two groups of settings a job rarely changes: ``ConnectOptions`` and ``ReadOptions``.

``FlightDataset`` keeps what a user sets per job flat (columns, batch size, shuffle and seed,
rank/world size, drop_last, device, transform). How to reach the server and how long to keep
trying go into ``connect=ConnectOptions(...)``; stream and tuning knobs into
``options=ReadOptions(...)``. Both are frozen and check their values when made, so a bad value
fails where it is written. The constructor's former flat keywords are refused with a
:class:`ConfigError` naming their new place (:func:`refuse_moved`).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import pyarrow.flight as flight

from flightfeed.client._connect.retry import RetryPolicy
from flightfeed.client._images.normalize import NormalizeSpec, normalize_option
from flightfeed.client._tensors.pack import Pack
from flightfeed.client._tensors.ragged import RaggedSpec, check_ragged
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import DECODE_ERROR_POLICIES
from flightfeed.wire.tokens import normalize_token

#: ``ReadOptions.decode_on``: who decodes the images of a decoding transform
DECODE_ON = ("server", "trainer")

__all__ = ["ConnectOptions", "ReadOptions", "MOVED", "DECODE_ON", "refuse_moved", "checked_settings"]

_COMPRESSIONS = (None, "lz4", "zstd")


def _count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} is {value!r}; it must be an integer >= {least}")


def _seconds(name: str, value: object, *, allow_none: bool, least: float = 0.0, strict: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= least if strict else value < least):  # type: ignore[operator]
        bound = f"> {least:g}" if strict else f">= {least:g}"
        tail = " or None" if allow_none else ""
        raise ConfigError(f"{name} is {value!r}; it must be a number of seconds {bound}{tail}")


@dataclass(frozen=True)
class ConnectOptions:
    """How to reach the data nodes and how long to keep trying when they go away.

    ``token``: bearer token (the server's ``--auth-token-file``; surrounding whitespace is stripped,
    an empty one refused). ``tls_root_certs``: PEM of the CA for ``grpc+tls://`` locations.
    ``timeout``: per-call timeout in seconds (None: no limit). ``retry_timeout``: seconds one
    *outage* may last (from a failure until a retry delivers data again; 0: never retry) — the
    budget that counts. ``retries``: an optional cap on the retries of one outage that never ends an
    outage shorter than 5 s (``COUNT_FLOOR_S``; a restarted node is back in about 1 s), or than
    ``retry_timeout`` if that is shorter (None: time only). Only servers that answered before get
    retries: a location that never answered in this process fails at once with a ConfigError.
    """

    token: str | None = None
    tls_root_certs: bytes | None = None
    timeout: float | None = None
    retries: int | None = None
    retry_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.token is not None:  # strip a trailing newline; refuse empty or non-header text
            object.__setattr__(self, "token", normalize_token(self.token, "token="))
        if self.tls_root_certs is not None and not isinstance(self.tls_root_certs, bytes):
            raise ConfigError(
                f"tls_root_certs is a {type(self.tls_root_certs).__name__}; pass the CA's PEM as bytes "
                "(e.g. Path('ca.pem').read_bytes())"
            )
        _seconds("timeout", self.timeout, allow_none=True, strict=True)
        if self.retries is not None:
            _count("retries", self.retries, 0)
        _seconds("retry_timeout", self.retry_timeout, allow_none=False)

    def call_options(self) -> flight.FlightCallOptions:
        headers: Any = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else None
        return flight.FlightCallOptions(timeout=self.timeout, headers=headers)

    def policy(self) -> RetryPolicy:
        """The per-outage retry budget these options describe."""
        return RetryPolicy(timeout_s=float(self.retry_timeout), max_attempts=self.retries)

    def __repr__(self) -> str:  # never print the token
        token = None if self.token is None else "***"
        certs = None if self.tls_root_certs is None else f"<{len(self.tls_root_certs)} bytes>"
        return (
            f"ConnectOptions(token={token}, tls_root_certs={certs}, timeout={self.timeout}, "
            f"retries={self.retries}, retry_timeout={self.retry_timeout})"
        )


@dataclass(frozen=True)
class ReadOptions:
    """Stream and tuning knobs of a ``FlightDataset`` (the defaults suit most jobs).

    ``streams``: parallel Flight streams, each on its own connection and thread. ``prefetch``:
    messages buffered per stream. ``message_rows``: rows per Flight message (0: the server's
    choice, whole batches filling about its ``--message-size``, 16 MiB; under DataLoader workers
    always one batch, which keeps the batches in order); messages are what streams
    and data nodes share out, so fewer, larger messages spread a small epoch over fewer streams and
    nodes. ``block_rows`` / ``buffer_rows``:
    the shuffle's block and window sizes (0: the server's defaults, sized by the dataset's whole row, so
    the order is the same whatever ``columns`` are read). ``compression``: ``"lz4"``,
    ``"zstd"`` or None (IPC compression; slower on fast networks). ``on_decode_error``: ``"raise"``
    or ``"skip"`` (rows whose bytes do not decode are dropped). ``report_interval``: seconds between
    stall/throughput reports to the server (None or 0: never). ``normalize``: None (uint8 as
    sent), True (torchvision's ImageNet mean/std) or ``(mean, std)``: the image column becomes
    float32 ``(B, C, H, W)`` on the dataset's device, after the copy. ``decode_on``: ``"server"``
    (the data node decodes) or ``"trainer"`` (the node sends JPEG bytes + seeded crop/flip; the
    trainer decodes with nvJPEG through torchvision). ``as_tuple``: yield each batch
    as a tuple of tensors in the order of the dataset's ``columns=[...]`` (``for images, target in
    loader``) instead of a dict. ``window_bytes``: how far the streams may fetch ahead of the
    consumer, in bytes of received messages (None: ``streams x (prefetch + 1)`` messages of 16 MiB;
    never fewer than ``streams x (prefetch + 1)`` messages; 0: exactly that many messages).
    Streams pull runs of messages inside this window, so a slow data node gets less work.
    ``hedge``: a message that lags on a slow node is requested again from another node, the first
    copy wins (``stats()`` counts ``moved``, ``hedged`` and ``duplicates``). ``move``: False keeps
    every message on the stream (and node) the plan put it on, as streams worked before work could
    move: the job then runs at its slowest node's pace, but each message is requested exactly once
    and always from the same place (what a sweep sharing one decode per message counts on).
    ``ragged``: what ``list``/``large_list`` columns become: ``"nested"`` (default: a
    ``torch.nested`` jagged tensor whose values are a view of the Arrow buffer), ``"padded"``
    (``(rows, longest, *inner)`` filled with ``pad_value``, plus an int64 column ``NAME_lengths``)
    or a ``{column: policy}`` mapping (columns not named are ``"nested"``); see ``_ragged``.
    ``pack``: ``Pack(column="tokens", seq_len=L)`` serves a document dataset's token column as fixed
    windows: batches ``{column: int64 (B, L + 1), "position_ids": int32 (B, L + 1)}``, or with
    ``Pack(targets="shifted")`` contiguous ``{"inputs", "targets", "position_ids"}``, each ``(B, L)``
    (``_tensors/pack``).
    ``with_index``: each batch also holds ``row_index``, an int64 tensor of every row's global stored
    row index (shards sorted by path, rows in file order: the row ``flightfeed inspect`` and h5py
    number), in the batch's order whatever the shuffle, streams, workers or resume; with
    ``as_tuple=True`` it is the tuple's last element.
    """

    streams: int = 4
    prefetch: int = 1
    message_rows: int = 0
    block_rows: int = 0
    buffer_rows: int = 0
    compression: str | None = None
    on_decode_error: str = "raise"
    report_interval: float | None = 5.0
    normalize: NormalizeSpec = None
    decode_on: str = "server"
    as_tuple: bool = False
    window_bytes: int | None = None
    hedge: bool = True
    move: bool = True
    ragged: RaggedSpec = "nested"
    pad_value: float = 0
    pack: Pack | None = None
    with_index: bool = False

    def __post_init__(self) -> None:
        check_ragged(self.ragged, self.pad_value)
        if not isinstance(self.ragged, str):  # a private copy: a caller's later edits change nothing
            object.__setattr__(self, "ragged", dict(self.ragged))
        _count("streams", self.streams, 1)
        _count("prefetch", self.prefetch, 1)
        for name in ("message_rows", "block_rows", "buffer_rows"):
            _count(name, getattr(self, name), 0)
        if self.compression not in _COMPRESSIONS:
            raise ConfigError(f"compression is {self.compression!r}; use 'lz4', 'zstd' or None")
        if self.on_decode_error not in DECODE_ERROR_POLICIES or not self.on_decode_error:
            raise ConfigError(f"on_decode_error is {self.on_decode_error!r}; allowed: 'raise' or 'skip'")
        _seconds("report_interval", self.report_interval, allow_none=True)
        normalize_option(self.normalize)  # a clear error now rather than at the first batch
        if self.window_bytes is not None:
            _count("window_bytes", self.window_bytes, 0)
        for flag in ("hedge", "move", "with_index"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} is {getattr(self, flag)!r}; it must be True or False")
        if self.with_index and self.pack is not None:
            raise ConfigError("with_index=True and pack: a packed window is cut across documents, not a stored row")
        if self.decode_on not in DECODE_ON:
            raise ConfigError(
                f"decode_on is {self.decode_on!r}; allowed: 'server' (the data node decodes) or 'trainer'"
            )
        if not isinstance(self.as_tuple, bool):
            raise ConfigError(f"as_tuple is {self.as_tuple!r}; it must be True or False")
        if self.pack is not None and not isinstance(self.pack, Pack):
            raise ConfigError(f"pack is a {type(self.pack).__name__}; pass pack=Pack(column=..., seq_len=...)")


def checked_settings(
    batch_size: object, seed: object, columns: list[str], connect: object, options: object
) -> tuple[ConnectOptions, ReadOptions]:
    """Check a FlightDataset's per-job numbers and option groups; the groups, defaults filled in."""
    _count("batch_size", batch_size, 1)
    _count("seed", seed, 0)
    if connect is not None and not isinstance(connect, ConnectOptions):
        raise ConfigError(f"connect is a {type(connect).__name__}; pass connect=ConnectOptions(...)")
    if options is not None and not isinstance(options, ReadOptions):
        raise ConfigError(f"options is a {type(options).__name__}; pass options=ReadOptions(...)")
    read = options if options is not None else ReadOptions()
    check_ragged(read.ragged, read.pad_value, columns)
    shifted = read.pack is not None and read.pack.targets == "shifted"  # the tuple is (inputs, targets)
    if read.as_tuple and not columns and not shifted:
        raise ConfigError(
            "ReadOptions(as_tuple=True) yields the columns in the order of columns=[...]: name them, "
            "e.g. FlightDataset(..., columns=['image', 'label'], options=ReadOptions(as_tuple=True))"
        )
    return (connect if connect is not None else ConnectOptions()), read


# the constructor's former flat keywords -> where they live now
MOVED = {
    **{name: "options=ReadOptions" for name in ReadOptions.__dataclass_fields__},
    **{name: "connect=ConnectOptions" for name in ConnectOptions.__dataclass_fields__},
}
_SECRET = ("token", "tls_root_certs")

P = ParamSpec("P")
S = TypeVar("S")


def _moved_message(name: str, value: object) -> str:
    shown = "..." if name in _SECRET else repr(value)
    return f"{name}= moved: pass {MOVED[name]}({name}={shown})"


def refuse_moved(
    *, positional: tuple[str, ...]
) -> Callable[[Callable[Concatenate[S, P], None]], Callable[Concatenate[S, P], None]]:
    """Wrap a constructor so the former flat keywords fail with a ConfigError naming their new place,
    and so do positional arguments after ``positional`` (the parameters after them are keyword-only:
    the error names them); the signature shown by ``help()`` and checked by mypy stays the new one."""

    def decorate(init: Callable[Concatenate[S, P], None]) -> Callable[Concatenate[S, P], None]:
        keyword_only = [
            p.name for p in inspect.signature(init).parameters.values() if p.kind is p.KEYWORD_ONLY
        ]

        @functools.wraps(init)
        def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> None:
            if len(args) > len(positional):
                extra = keyword_only[: len(args) - len(positional)]
                shown = ", ".join(f"{n}=..." for n in extra) or "the rest"
                raise ConfigError(
                    f"{type(self).__name__} takes {' and '.join(positional)} by position and every other "
                    f"argument by keyword; {len(args)} were given by position: pass {shown} as keywords"
                )
            moved = [name for name in kwargs if name in MOVED]
            if moved:
                raise ConfigError(
                    f"{type(self).__name__}: " + "; ".join(_moved_message(n, kwargs[n]) for n in moved)
                )
            init(self, *args, **kwargs)

        return wrapper

    return decorate
