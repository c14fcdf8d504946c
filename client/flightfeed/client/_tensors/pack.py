"""``ReadOptions(pack=Pack(column="tokens", seq_len=L))``: LLM token corpora as fixed windows.

The data node packs (``server/data/packing.py``): an epoch's documents (one row each, a ragged
integer token column) are shuffled like rows (block shuffle + bounded window, keyed by dataset
fingerprint, seed and epoch), concatenated, and cut into windows of ``L + 1`` tokens; window ``w``
holds tokens ``[w * L, w * L + L + 1)`` of that stream, so consecutive windows share one token and
every token is the *input* of exactly one window per epoch (nanoGPT/Megatron: ``inputs =
tokens[:, :-1]``, ``targets = tokens[:, 1:]``). Each batch is

* ``batch[column]``: int64 ``(batch_size, L + 1)``;
* ``batch["position_ids"]``: int32 ``(batch_size, L + 1)``, each token's position within its
  document *inside the window*: 0 at index 0 and at every document start, then counting up; -1 on
  padding. Document boundaries inside a window are where ``position_ids == 0`` at index > 0 (the
  ``cu_seqlens`` of varlen attention; Megatron's ``reset_position_ids``).

The final partial window of an epoch is dropped (``pad_tail=False``, the default: the last
``(T - 1) % L`` inputs of the epoch's ``T`` tokens are not served; they come in another position
next epoch) or padded with ``pad_id`` (``pad_tail=True``: every token is an input exactly once).
A FlightDataset's rows are then windows: ``batch_size`` counts windows, ``len(ds)`` is the exact
number of batches of windows, ranks share the windows batch by batch (the same rules as rows), and
``state_dict()`` resumes at the next window, also against a restarted server and at another world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import MAX_SEQ_LEN

__all__ = ["Pack", "POSITION_IDS", "set_pack", "widen"]

#: the name of the position-id column of packed batches
POSITION_IDS = "position_ids"


@dataclass(frozen=True)
class Pack:
    """Serve ``column`` (one document per row, token ids in a list/large_list of integers) as
    windows of ``seq_len + 1`` tokens; see the module doc for the batch layout and the tail."""

    column: str = "tokens"
    seq_len: int = 2048
    pad_tail: bool = False
    pad_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ConfigError(f"Pack.column is {self.column!r}; name the dataset's token column, e.g. 'tokens'")
        if self.column == POSITION_IDS:
            raise ConfigError(f"Pack.column {self.column!r} clashes with the batches' {POSITION_IDS!r}; rename it")
        seq = self.seq_len
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ_LEN:
            raise ConfigError(f"Pack.seq_len is {seq!r}; it must be an integer in 1..{MAX_SEQ_LEN}")
        if not isinstance(self.pad_tail, bool):
            raise ConfigError(f"Pack.pad_tail is {self.pad_tail!r}; it must be True or False")
        pad = self.pad_id
        if isinstance(pad, bool) or not isinstance(pad, int) or not -(2**63) <= pad < 2**63:
            raise ConfigError(f"Pack.pad_id is {pad!r}; it must be an int64 token id")

    def as_dict(self) -> dict[str, Any]:
        """How a checkpoint records it."""
        return {"column": self.column, "seq_len": self.seq_len, "pad_tail": self.pad_tail, "pad_id": self.pad_id}


def set_pack(cmd: Any, pack: Pack | None, columns: list[str]) -> None:
    """Put ``pack`` into a ReadCommand (checked against the reader's ``columns``)."""
    if pack is None:
        return
    if columns not in ([], [pack.column]):
        raise ConfigError(
            f"with ReadOptions(pack=Pack(column={pack.column!r}, ...)) batches hold {pack.column!r} and "
            f"{POSITION_IDS!r}: pass columns=None or columns=[{pack.column!r}], not {columns!r}"
        )
    cmd.pack.column = pack.column
    cmd.pack.seq_len = pack.seq_len
    cmd.pack.pad_tail = pack.pad_tail
    cmd.pack.pad_id = pack.pad_id


def widen(batch: dict[str, Any], column: str) -> dict[str, Any]:
    """Tokens to int64 and position ids to int32 (the wire carries the column's own integer type
    and int16 positions: fewer bytes to receive and copy); after the device stage, so a CUDA batch
    crosses PCIe narrow and widens on the GPU. (The CPU path widens whole messages on the streams'
    threads instead: ``_packed``.)"""
    for name, dtype in ((column, torch.int64), (POSITION_IDS, torch.int32)):
        t = batch.get(name)
        if isinstance(t, torch.Tensor) and t.dtype != dtype:
            batch[name] = _cast(t, dtype)
    return batch


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32}


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """On the CPU through numpy: torch's own cast of a batch-sized tensor goes parallel (OpenMP),
    which on a busy few-core host costs milliseconds of spinning per batch (measured 6 ms vs 0.15 ms
    for 65k tokens on 2 cores)."""
    if t.device.type != "cpu":
        return t.to(dtype)
    return torch.from_numpy(t.numpy().astype(_NUMPY[dtype]))
