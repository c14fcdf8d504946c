"""The regrouped constructor (docs/client.md, settings): per-job settings flat, ``connect=ConnectOptions(...)`` and
``options=ReadOptions(...)``; the former flat keywords refused with a ConfigError naming their new place."""

from __future__ import annotations

import inspect
import pickle
import pydoc
import re
from typing import Any

import pytest

import flightfeed.client
from flightfeed.client import ConfigError, ConnectOptions, FlightDataset, ReadOptions

LOCATION = "grpc://127.0.0.1:1"  # never dialled: construction does not connect

FLAT = [
    "self", "location", "name", "columns", "batch_size", "shuffle", "seed", "rank", "world_size",
    "drop_last", "device", "transform", "connect", "options",
]


def test_the_signature_is_the_designed_one() -> None:
    params = inspect.signature(FlightDataset.__init__).parameters
    assert list(params) == FLAT
    kinds = {n: p.kind for n, p in params.items()}
    assert [n for n, k in kinds.items() if k is inspect.Parameter.POSITIONAL_OR_KEYWORD] == ["self", "location", "name"]
    assert all(kinds[n] is inspect.Parameter.KEYWORD_ONLY for n in FLAT[3:])
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    assert defaults == {
        "columns": None, "batch_size": 256, "shuffle": True, "seed": 0, "rank": None, "world_size": None,
        "drop_last": False, "device": None, "transform": None, "connect": None, "options": None,
    }
    read = {n: f.default for n, f in ReadOptions.__dataclass_fields__.items()}
    assert read == {
        "streams": 4, "prefetch": 1, "message_rows": 0, "block_rows": 0, "buffer_rows": 0, "compression": None,
        "on_decode_error": "raise", "report_interval": 5.0,
        # later knobs live in ReadOptions (docs/design.md §2)
        "normalize": None, "decode_on": "server", "as_tuple": False,
        "window_bytes": None, "hedge": True, "move": True,  # fetch ahead, hedging, moving work (docs/cluster.md)
        "ragged": "nested", "pad_value": 0,  # list columns (docs/tokens.md)
        "pack": None,  # token windows (docs/tokens.md)
        "with_index": False,  # the row_index column (docs/client.md)
    }
    conn = {n: f.default for n, f in ConnectOptions.__dataclass_fields__.items()}
    assert conn == {"token": None, "tls_root_certs": None, "timeout": None, "retries": None, "retry_timeout": 30.0}
    assert {"ConnectOptions", "ReadOptions"} <= set(flightfeed.client.__all__)


def test_inspect_and_help_show_the_parameters_not_args_kwargs() -> None:
    shown = inspect.signature(FlightDataset)
    assert list(shown.parameters) == FLAT[1:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(shown.parameters.values())[2:])
    assert shown.return_annotation is inspect.Signature.empty
    text = pydoc.render_doc(FlightDataset, renderer=pydoc.TextDoc())
    assert "FlightDataset(location" in text and "*, columns" in text
    assert "FlightDataset(*args, **kwargs)" not in text


@pytest.mark.parametrize("cls", [FlightDataset, flightfeed.client.MixtureDataset])
def test_positional_arguments_after_name_say_to_pass_keywords(cls: Any) -> None:
    name: Any = "train" if cls is FlightDataset else flightfeed.client.Mixture({"a": 0.5, "b": 0.5})
    with pytest.raises(ConfigError, match=re.escape("pass columns=..., batch_size=... as keywords")):
        cls(LOCATION, name, ["x"], 32)
    ds = cls(LOCATION, name, columns=["x"], batch_size=32)  # the keywords work
    assert ds.batch_size == 32



@pytest.mark.parametrize(
    ("keyword", "value", "place"),
    [
        ("streams", 8, "options=ReadOptions(streams=8)"),
        ("prefetch", 2, "options=ReadOptions(prefetch=2)"),
        ("message_rows", 64, "options=ReadOptions(message_rows=64)"),
        ("block_rows", 8, "options=ReadOptions(block_rows=8)"),
        ("buffer_rows", 64, "options=ReadOptions(buffer_rows=64)"),
        ("compression", "lz4", "options=ReadOptions(compression='lz4')"),
        ("on_decode_error", "skip", "options=ReadOptions(on_decode_error='skip')"),
        ("report_interval", None, "options=ReadOptions(report_interval=None)"),
        ("token", "s3cret", "connect=ConnectOptions(token=...)"),
        ("tls_root_certs", b"PEM", "connect=ConnectOptions(tls_root_certs=...)"),
        ("timeout", 5.0, "connect=ConnectOptions(timeout=5.0)"),
        ("retries", 3, "connect=ConnectOptions(retries=3)"),
        ("retry_timeout", 10.0, "connect=ConnectOptions(retry_timeout=10.0)"),
    ],
)
def test_every_former_flat_keyword_names_its_new_place(keyword: str, value: Any, place: str) -> None:
    kwargs: dict[str, Any] = {keyword: value}
    with pytest.raises(ConfigError, match=rf"{keyword}= moved: pass {re.escape(place)}") as info:
        FlightDataset(LOCATION, "d", **kwargs)
    assert "s3cret" not in str(info.value)  # a token is never echoed


def test_several_moved_keywords_are_named_together() -> None:
    with pytest.raises(ConfigError, match=r"streams= moved.*token= moved") as info:
        FlightDataset(LOCATION, "d", streams=2, token="x")  # type: ignore[call-arg]
    assert "ReadOptions(streams=2)" in str(info.value) and "ConnectOptions(token=...)" in str(info.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ReadOptions(streams=0), r"streams is 0; it must be an integer >= 1"),
        (lambda: ReadOptions(streams=True), r"streams is True; it must be an integer"),
        (lambda: ReadOptions(prefetch=0), r"prefetch is 0"),
        (lambda: ReadOptions(message_rows=-1), r"message_rows is -1; it must be an integer >= 0"),
        (lambda: ReadOptions(block_rows=1.5), r"block_rows is 1.5"),  # type: ignore[arg-type]
        (lambda: ReadOptions(buffer_rows=-8), r"buffer_rows is -8"),
        (lambda: ReadOptions(compression="gzip"), r"compression is 'gzip'; use 'lz4', 'zstd' or None"),
        (lambda: ReadOptions(on_decode_error="ignore"), r"on_decode_error is 'ignore'; allowed: 'raise' or 'skip'"),
        (lambda: ReadOptions(report_interval=-1.0), r"report_interval is -1.0; it must be a number of seconds"),
        (lambda: ReadOptions(window_bytes=-1), r"window_bytes is -1; it must be an integer >= 0"),
        (lambda: ReadOptions(hedge="yes"), r"hedge is 'yes'; it must be True or False"),  # type: ignore[arg-type]
        (lambda: ReadOptions(as_tuple="yes"), r"as_tuple is 'yes'; it must be True or False"),  # type: ignore[arg-type]
        (lambda: FlightDataset(LOCATION, "d", options=ReadOptions(as_tuple=True)), r"as_tuple=True\) yields the col"),
        (lambda: ConnectOptions(token="  "), r"token="),
        (lambda: ConnectOptions(tls_root_certs="PEM"), r"tls_root_certs is a str; pass the CA's PEM as bytes"),  # type: ignore[arg-type]
        (lambda: ConnectOptions(timeout=0), r"timeout is 0; it must be a number of seconds > 0 or None"),
        (lambda: ConnectOptions(retries=-1), r"retries is -1; it must be an integer >= 0"),
        (lambda: ConnectOptions(retry_timeout=float("nan")), r"retry_timeout is nan"),
        (lambda: ConnectOptions(retry_timeout=None), r"retry_timeout is None"),  # type: ignore[arg-type]
        (lambda: FlightDataset(LOCATION, "d", options={"streams": 2}), r"options is a dict; pass options=ReadOptions"),  # type: ignore[arg-type]
        (lambda: FlightDataset(LOCATION, "d", connect=ReadOptions()), r"connect is a ReadOptions; pass connect="),  # type: ignore[arg-type]
        (lambda: FlightDataset(LOCATION, "d", batch_size=0), r"batch_size is 0; it must be an integer >= 1"),
    ],
)
def test_bad_values_fail_where_they_are_written(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_options_are_frozen_kept_and_pickled_with_the_dataset() -> None:
    read = ReadOptions(streams=2, message_rows=64, report_interval=None)
    conn = ConnectOptions(token="s3cret\n", retry_timeout=5.0)
    assert conn.token == "s3cret"  # the trailing newline of a token file is stripped
    assert "s3cret" not in repr(conn)
    with pytest.raises(AttributeError):
        read.streams = 3  # type: ignore[misc]
    ds = FlightDataset(LOCATION, "d", batch_size=16, connect=conn, options=read)
    assert ds.options is read and ds.connect is conn
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.options == read and copy.connect == conn
    assert conn.policy().timeout_s == 5.0 and conn.policy().max_attempts is None
