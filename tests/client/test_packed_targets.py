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
from tests.token_corpus import write_token_corpus

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


def test_a_message_is_widened_into_shifted_inputs_and_targets_from_sliced_parts() -> None:
    tokens = np.arange(9 * WIDTH, dtype=np.uint16)
    positions = (np.arange(9 * WIDTH) % 7 - 1).astype(np.int16)
    whole = pa.record_batch({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), WIDTH),
        "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(positions), WIDTH),
    })
    parts = [whole.slice(0, 4), whole.slice(4, 5)]  # the second part starts at a list offset
    msg = widen_message(parts, "tokens", shifted=True)
    wide = tokens.astype(np.int64).reshape(9, WIDTH)
    assert msg.targets is not None
    np.testing.assert_array_equal(msg.tokens.numpy(), wide[:, :-1])
    np.testing.assert_array_equal(msg.targets.numpy(), wide[:, 1:])
    np.testing.assert_array_equal(msg.positions.numpy(), positions.astype(np.int32).reshape(9, WIDTH)[:, :-1])
    assert msg.held_bytes == 9 * (WIDTH - 1) * (8 + 8 + 4)
    other = widen_message([whole.slice(0, 2)], "tokens", shifted=True)
    (_, joined, _), = packed_batches(iter([other, msg]), 11, "tokens")  # a batch spanning two messages
    assert set(joined) == {"inputs", "targets", "position_ids"}
    assert torch.equal(joined["targets"], torch.cat([other.targets, msg.targets]))  # type: ignore[list-item]


def _wide(batch: pa.RecordBatch) -> np.ndarray:
    """The batch's windows as int64 ``(rows, L + 1)``."""
    column: Any = batch.column("tokens")
    return np.asarray(column.values).astype(np.int64).reshape(batch.num_rows, -1)


def _windows(first: int, rows: int, step: int = WIDTH - 1) -> pa.RecordBatch:
    """``rows`` consecutive windows of a stream ``first, first + 1, ...``: each shares its last token
    with the next one's first, as the server cuts them."""
    starts = first + np.arange(rows)[:, None] * step
    tokens = (starts + np.arange(step + 1)).astype(np.uint16).ravel()
    positions = np.tile(np.arange(step + 1, dtype=np.int16), rows)
    return pa.record_batch({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), step + 1),
        "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(positions), step + 1),
    })


def test_consecutive_windows_share_one_array_and_runs_of_two_ranks_get_two() -> None:
    """One run of windows (one rank's message): inputs and targets are views of one array of
    ``rows * L + 1`` tokens (targets one token on), still contiguous; a message of two runs that do
    not join (another rank's windows between them) gets two arrays; the values are the same."""
    whole = _windows(100, 9)
    msg = widen_message([whole.slice(0, 4), whole.slice(4, 5)], "tokens", shifted=True)
    assert msg.targets is not None
    wide = _wide(whole)
    np.testing.assert_array_equal(msg.tokens.numpy(), wide[:, :-1])
    np.testing.assert_array_equal(msg.targets.numpy(), wide[:, 1:])
    assert msg.tokens.is_contiguous() and msg.targets.is_contiguous()
    assert msg.targets.data_ptr() == msg.tokens.data_ptr() + 8  # one array, one token on
    assert msg.held_bytes == (9 * (WIDTH - 1) + 1) * 8 + 9 * (WIDTH - 1) * 4
    runs = widen_message([_windows(100, 3), _windows(200, 3)], "tokens", shifted=True)
    assert runs.targets is not None and runs.targets.untyped_storage().data_ptr() != runs.tokens.data_ptr()
    both = np.concatenate([_wide(_windows(100, 3)), _wide(_windows(200, 3))])
    np.testing.assert_array_equal(runs.tokens.numpy(), both[:, :-1])
    np.testing.assert_array_equal(runs.targets.numpy(), both[:, 1:])
    assert runs.held_bytes == 6 * (WIDTH - 1) * (8 + 8 + 4)


def test_two_ranks_read_the_same_shifted_windows(server: RunningServer) -> None:
    """Ranks' messages hold runs of batches that do not join: the two-array copy, same values."""
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
