"""``Pack(targets="shifted")``: contiguous, already-shifted ``inputs`` / ``targets`` (and the inputs'
``position_ids``), each ``(B, L)``, made in the copy that widens the tokens: the same values as
``tokens[:, :-1]`` / ``tokens[:, 1:]`` of the default layout, on the CPU path (whole messages on the
lanes' threads, batches spanning messages joined) and the device path (CPU engine), and nanoGPT's
``get_batch`` written over it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from flightfeed.client import ConfigError, FlightDataset, Pack, ReadOptions
from flightfeed.client._device.engines import CpuEngine
from flightfeed.client._tensors.packed import packed_batches, widen_message
from flightfeed.server.testing import RunningServer, running_server
from tests.support.token_corpus import write_token_corpus

SEQ = 16
WIDTH = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("tok")
    write_token_corpus(root, [[40, 25], [7], [60, 1, 30]], seed=3, max_len=45, value_type=pa.uint16())
    with running_server({"tok": str(root), "train": str(root), "val": str(root)}) as srv:
        yield srv


def _reader(server: RunningServer, targets: str | None, device: str | None = None, **kw: Any) -> FlightDataset:
    pack = Pack(column="tokens", seq_len=SEQ, pad_tail=True, pad_id=kw.pop("pad_id", -100), targets=targets)
    opts = ReadOptions(pack=pack, report_interval=None, streams=kw.pop("streams", 3), **kw)
    ds = FlightDataset(server.location, "tok", batch_size=3, seed=1, device=device, options=opts)
    if device is not None:
        ds._copy_engine = CpuEngine
    return ds


def _check_shifted(default: list[dict[str, torch.Tensor]], shifted: list[dict[str, torch.Tensor]]) -> None:
    assert len(shifted) == len(default) > 0
    for a, b in zip(default, shifted, strict=True):
        assert set(b) == {"inputs", "targets", "position_ids"}
        rows = a["tokens"].shape[0]
        for name, dtype in (("inputs", torch.int64), ("targets", torch.int64), ("position_ids", torch.int32)):
            assert b[name].dtype == dtype and b[name].shape == (rows, SEQ) and b[name].is_contiguous(), name
        assert torch.equal(b["inputs"], a["tokens"][:, :-1])
        assert torch.equal(b["targets"], a["tokens"][:, 1:])
        assert torch.equal(b["position_ids"], a["position_ids"][:, :-1])
        assert b["targets"].view(-1).shape == (rows * SEQ,)  # what nanoGPT's loss does


def _read(ds: FlightDataset) -> list[dict[str, torch.Tensor]]:
    try:
        return [{k: v.clone() for k, v in b.items()} for b in ds]
    finally:
        ds.close()


def _wide(batch: pa.RecordBatch) -> np.ndarray:
    """The batch's windows as int64 ``(rows, L + 1)``."""
    column: Any = batch.column("tokens")
    return np.asarray(column.values).astype(np.int64).reshape(batch.num_rows, -1)


def _windows(first: int, rows: int, step: int = WIDTH - 1) -> pa.RecordBatch:
    """``rows`` consecutive windows of a stream ``first, first + 1, ...``: each shares its last token
    with the next one's first, as the server cuts them."""
    starts = first + np.arange(rows)[:, None] * step
    tokens = (starts + np.arange(step + 1)).astype(np.uint16).ravel()
    positions = (np.arange(rows * (step + 1)) % 7 - 1).astype(np.int16)
    return pa.record_batch({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), step + 1),
        "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(positions), step + 1),
    })


def _check_views(msg: Any, wide: np.ndarray, positions: np.ndarray, lo: int, n: int) -> dict[str, torch.Tensor]:
    got: dict[str, torch.Tensor] = msg.views(lo, n, "tokens")
    assert set(got) == {"inputs", "targets", "position_ids"}
    assert all(t.is_contiguous() and t.shape == (n, WIDTH - 1) for t in got.values())
    np.testing.assert_array_equal(got["inputs"].numpy(), wide[lo : lo + n, :-1])
    np.testing.assert_array_equal(got["targets"].numpy(), wide[lo : lo + n, 1:])
    np.testing.assert_array_equal(got["position_ids"].numpy(), positions[lo : lo + n, :-1])
    return got


def test_one_run_of_windows_is_one_chain_and_its_batches_are_views() -> None:
    """One rank's message (consecutive windows, sliced parts): inputs and targets are views of one
    flat array of ``rows * L + 1`` tokens, targets one token on, contiguous, for any rows."""
    whole = _windows(100, 9)
    msg = widen_message([whole.slice(0, 4), whole.slice(4, 5)], "tokens", shifted=True)
    wide, positions = _wide(whole), (np.arange(9 * WIDTH) % 7 - 1).reshape(9, WIDTH)
    assert msg.seams == (0,) and msg.rows == 9
    assert msg.held_bytes == (9 * (WIDTH - 1) + 1) * 8 + 9 * (WIDTH - 1) * 4  # fewer than (L + 1) per row
    for lo, n in ((0, 9), (2, 3), (8, 1)):
        got = _check_views(msg, wide, positions, lo, n)
        assert got["targets"].data_ptr() == got["inputs"].data_ptr() + 8  # one array, one token on
        assert msg.tokens.data_ptr() <= got["inputs"].data_ptr() < msg.tokens.data_ptr() + msg.tokens.nbytes


def test_runs_of_two_ranks_are_chains_of_their_own() -> None:
    """A rank of two takes every other global batch: runs that do not join are chains of their own
    (``rows * L + chains`` tokens); a batch within a chain is views, one across chains is joined;
    any slicing of the message into parts gives the same values; arbitrary windows (no two join)
    still come out right."""
    runs = [_windows(100, 3), _windows(200, 3), _windows(300, 2)]
    table = pa.Table.from_batches(runs)
    wide = np.concatenate([_wide(b) for b in runs])
    positions = np.concatenate([(np.arange(b.num_rows * WIDTH) % 7 - 1).reshape(-1, WIDTH) for b in runs])
    for cut in ([8], [1, 7], [4, 4], [3, 3, 2], [2, 5, 1]):
        parts, at = [], 0
        for n in cut:
            parts.append(table.slice(at, n).combine_chunks().to_batches()[0])
            at += n
        msg = widen_message(parts, "tokens", shifted=True)
        assert msg.seams == (0, 3, 6), cut
        assert msg.held_bytes == (8 * (WIDTH - 1) + 3) * 8 + 8 * (WIDTH - 1) * 4
        views = _check_views(msg, wide, positions, 3, 3)  # the second run: views
        assert views["targets"].data_ptr() == views["inputs"].data_ptr() + 8
        for lo, n in ((0, 8), (2, 3), (5, 3), (0, 1), (7, 1)):
            _check_views(msg, wide, positions, lo, n)
    loose = pa.record_batch({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6 * WIDTH, dtype=np.uint16)), WIDTH),
        "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(6 * WIDTH, np.int16)), WIDTH),
    })
    msg = widen_message([loose], "tokens", shifted=True)
    assert msg.seams == tuple(range(6))
    _check_views(msg, _wide(loose), np.zeros((6, WIDTH), np.int32), 0, 6)


def test_a_batch_spanning_two_messages_is_joined() -> None:
    whole = _windows(100, 9)
    first = widen_message([whole.slice(0, 2)], "tokens", shifted=True)
    second = widen_message([whole.slice(2, 7)], "tokens", shifted=True)
    (_, joined, _), = packed_batches(iter([first, second]), 9, "tokens")
    wide = _wide(whole)
    assert torch.equal(joined["inputs"], torch.from_numpy(wide[:, :-1]))
    assert torch.equal(joined["targets"], torch.from_numpy(wide[:, 1:]))


def test_two_ranks_read_the_same_shifted_windows(server: RunningServer) -> None:
    """Ranks' messages hold runs of batches that do not join: chains of their own, same values."""
    def make(targets: str | None, rank: int) -> FlightDataset:
        pack = Pack(column="tokens", seq_len=SEQ, targets=targets)
        return FlightDataset(server.location, "tok", batch_size=3, seed=1, rank=rank, world_size=2,
                             options=ReadOptions(pack=pack, report_interval=None, message_rows=6))

    for rank in (0, 1):
        _check_shifted(_read(make(None, rank)), _read(make("shifted", rank)))


def test_shifted_batches_on_the_cpu_path(server: RunningServer) -> None:
    """Messages of 6 windows on 3 streams, batches of 3: row views of the widened messages."""
    default = _read(_reader(server, None, message_rows=6))
    shifted = _read(_reader(server, "shifted", message_rows=6))
    _check_shifted(default, shifted)
    last = shifted[-1]
    padded = last["position_ids"] == -1
    assert padded.any() and (last["inputs"][padded] == -100).all()  # pad_id=-100: cross_entropy's ignore_index


def test_shifted_batches_on_the_device_path(server: RunningServer) -> None:
    default = _read(_reader(server, None))
    device = _reader(server, "shifted", "cpu")
    try:
        shifted = [{k: v.clone() for k, v in b.items()} for b in device]
        ring = device._devices[0].ring
        assert ring is not None and ring.staged > 0
    finally:
        device.close()
    _check_shifted(default, shifted)


def test_targets_is_checked_and_a_checkpoint_resumes_with_either_layout(server: RunningServer) -> None:
    with pytest.raises(ConfigError, match=r"Pack.targets is 'next'; use None .* or 'shifted'"):
        Pack(targets="next")
    whole = _read(_reader(server, None))
    writer = _reader(server, None)
    it = iter(writer)
    head = [next(it)["tokens"].clone() for _ in range(2)]
    state = json.loads(json.dumps(writer.state_dict()))
    del it
    writer.close()
    resumed = _reader(server, "shifted")
    resumed.load_state_dict(state)
    rest = _read(resumed)
    assert len(head) + len(rest) == len(whole)
    _check_shifted(whole[2:], rest)


def test_nanogpt_get_batch(server: RunningServer) -> None:
    """nanoGPT's ``get_batch`` (train.py) over a packed read, as the docs give it: ``x``/``y`` are
    ``inputs``/``targets``, contiguous, so ``y.view(-1)`` works; epochs roll over."""
    location, batch_size, block_size, device = server.location, 4, SEQ, "cpu"
    # --- the snippet ---------------------------------------------------------------------------
    from flightfeed.client import FlightDataset, Pack, ReadOptions

    def reader(split: str) -> FlightDataset:
        pack = Pack(column="tokens", seq_len=block_size, targets="shifted")
        return FlightDataset(location, split, batch_size=batch_size, seed=1337, shuffle=split == "train",
                             options=ReadOptions(pack=pack))

    data = {split: reader(split) for split in ("train", "val")}
    batches = {split: iter(ds) for split, ds in data.items()}

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            b = next(batches[split])
        except StopIteration:  # a new epoch: a new order, every token an input once per epoch
            data[split].set_epoch(data[split].epoch + 1)
            batches[split] = iter(data[split])
            b = next(batches[split])
        x, y = b["inputs"], b["targets"]  # int64 (batch_size, block_size) each, contiguous
        if device.startswith("cuda"):
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y
    # -------------------------------------------------------------------------------------------
    steps = len(data["train"]) + 3  # into the second epoch
    for split in ("train", "train", "val"):
        for _ in range(steps):
            x, y = get_batch(split)
            assert x.shape[1] == y.shape[1] == block_size and x.is_contiguous() and y.is_contiguous()
            assert y.view(-1).numel() == x.numel()
            assert torch.equal(x[:, 1:], y[:, :-1])  # within a window, y is x shifted by one
    assert data["train"].epoch == 2 and data["val"].epoch == 1
    for ds in data.values():
        ds.close()


def test_as_tuple_yields_inputs_and_targets(server: RunningServer) -> None:
    """``ReadOptions(as_tuple=True)`` with shifted targets: ``for x, y in ds`` (it raised KeyError
    'tokens' with columns=['tokens'], and columns=None was refused)."""
    shifted = _read(_reader(server, "shifted"))
    for columns in (None, ["tokens"]):
        pack = Pack(column="tokens", seq_len=SEQ, pad_tail=True, pad_id=-100, targets="shifted")
        ds = FlightDataset(server.location, "tok", batch_size=3, seed=1, columns=columns,
                           options=ReadOptions(pack=pack, report_interval=None, as_tuple=True))
        try:
            pairs = [(x.clone(), y.clone()) for x, y in ds]
        finally:
            ds.close()
        assert len(pairs) == len(shifted)
        for (x, y), b in zip(pairs, shifted, strict=True):
            assert torch.equal(x, b["inputs"]) and torch.equal(y, b["targets"])
