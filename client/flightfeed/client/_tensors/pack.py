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
With ``Pack(targets="shifted")`` a batch holds the window's inputs and next-token targets instead,
each contiguous and ``(batch_size, L)``, made in the copy that widens the tokens anyway (see
:class:`Pack`).
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

__all__ = ["Pack", "POSITION_IDS", "INPUTS", "TARGETS", "TARGET_LAYOUTS", "set_pack", "widen"]

#: the name of the position-id column of packed batches
POSITION_IDS = "position_ids"
#: ``Pack(targets="shifted")``: the batch's names of the window's inputs and next-token targets
INPUTS = "inputs"
TARGETS = "targets"
#: what ``Pack.targets`` may be
TARGET_LAYOUTS = (None, "shifted")


@dataclass(frozen=True)
class Pack:
    """Serve ``column`` (one document per row, token ids in a list/large_list of integers) as
    windows of ``seq_len + 1`` tokens; see the module doc for the order and the tail.

    ``targets=None`` (the default): a batch is ``{column: int64 (B, L + 1), "position_ids": int32
    (B, L + 1)}`` (docs/design.md §7). Inputs and targets are ``tokens[:, :-1]`` and
    ``tokens[:, 1:]``, views that are *not* contiguous (``targets.view(-1)`` fails).

    ``targets="shifted"``: a batch is ``{"inputs": int64 (B, L), "targets": int64 (B, L),
    "position_ids": int32 (B, L)}``, each contiguous, made in the copy that widens the wire's
    narrow tokens anyway (no ``.contiguous()`` in the training loop):

    * ``inputs`` = ``tokens[:, :-1]``: what Megatron's GPT dataset calls ``tokens`` and nanoGPT's
      ``get_batch`` calls ``x``;
    * ``targets`` = ``tokens[:, 1:]``, already shifted (``targets[b, i]`` is the token after
      ``inputs[b, i]``): Megatron's ``labels``, nanoGPT's ``y``; ``F.cross_entropy(logits.view(-1,
      V), targets.view(-1))``. Hugging Face causal LMs shift ``labels`` themselves: do not pass
      ``targets`` as ``labels`` (it would be shifted twice); pass ``labels=inputs`` (the window's last
      target goes unused) or read the default layout and pass ``tokens`` as both;
    * ``position_ids``: those of the inputs (0 where a document starts, -1 on padding).

    With ``ReadOptions(as_tuple=True)`` a shifted batch is the tuple ``(inputs, targets)``:
    ``for x, y in ds``.

    With ``pad_tail=True`` padded targets are ``pad_id``: ``pad_id=-100`` is what
    ``F.cross_entropy`` ignores by default. ``targets`` is not part of a checkpoint: the windows and
    their order are the same either way, so a checkpoint resumes with either layout."""

    column: str = "tokens"
    seq_len: int = 2048
    pad_tail: bool = False
    pad_id: int = 0
    targets: str | None = None

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
        if self.targets not in TARGET_LAYOUTS:
            raise ConfigError(
                f"Pack.targets is {self.targets!r}; use None (batches hold {self.column!r}, int64 (B, seq_len + 1)) "
                f"or 'shifted' (batches hold {INPUTS!r} and {TARGETS!r}, each int64 (B, seq_len), contiguous)"
            )

    def as_dict(self) -> dict[str, Any]:
        """How a checkpoint records it (not ``targets``: a layout of the same windows)."""
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


def widen(batch: dict[str, Any], pack: Pack) -> dict[str, Any]:
    """Tokens to int64 and position ids to int32 (the wire carries the column's own integer type
    and int16 positions: fewer bytes to receive and copy); after the device stage, so a CUDA batch
    crosses PCIe narrow and widens on the GPU. With ``targets="shifted"`` that widening copy makes
    the contiguous ``inputs``, ``targets`` and ``position_ids`` ``(B, L)`` instead. (The CPU path
    widens whole messages on the streams' threads instead: ``_tensors/packed``.)"""
    if pack.targets == "shifted":
        tokens, positions = batch.pop(pack.column, None), batch.pop(POSITION_IDS, None)
        if isinstance(tokens, torch.Tensor):
            batch[INPUTS] = _cast(tokens[:, :-1], torch.int64)
            batch[TARGETS] = _cast(tokens[:, 1:], torch.int64)
        if isinstance(positions, torch.Tensor):
            batch[POSITION_IDS] = _cast(positions[:, :-1], torch.int32)
        return batch
    for name, dtype in ((pack.column, torch.int64), (POSITION_IDS, torch.int32)):
        t = batch.get(name)
        if isinstance(t, torch.Tensor) and t.dtype != dtype:
            batch[name] = _cast(t, dtype)
    return batch


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32}


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a contiguous tensor of ``dtype`` (a copy unless it is one already). On the CPU
    through numpy: torch's own cast of a batch-sized tensor goes parallel (OpenMP), which on a busy
    few-core host costs milliseconds of spinning per batch (measured 6 ms vs 0.15 ms for 65k tokens
    on 2 cores)."""
    if t.device.type != "cpu":
        out = t.to(dtype)
        return out if out.is_contiguous() else out.contiguous()
    if t.dtype == dtype and t.is_contiguous():
        return t
    wide = np.empty(tuple(t.shape), _NUMPY[dtype])
    np.copyto(wide, t.numpy(), casting="unsafe")
    return torch.from_numpy(wide)
