"""Token packing: an epoch's documents as one token stream, cut into fixed windows.

For a request with ``pack`` (``feed.proto``'s ``Pack``), the rows of the request are *windows*:

1. **Documents shuffled like rows.** The document order of an epoch is the dataset's
   :class:`~flightfeed.server.data.order.EpochOrder` over documents (block permutation + bounded
   window shuffle, keyed by fingerprint, seed, epoch and the resolved block/buffer sizes), or the
   stored order without shuffle.
2. **Concatenated.** The documents' tokens in that order form the epoch's stream of ``T`` tokens.
3. **Cut into windows.** Window ``w`` holds stream tokens ``[w * L, w * L + L + 1)`` (``L`` =
   ``seq_len``): inputs ``[:, :-1]``, targets ``[:, 1:]``, consecutive windows share one token, so
   every token is the *input* of exactly one window. ``pad_tail=False`` (the default) drops the final
   partial window: ``(T - 1) // L`` windows, the last ``(T - 1) % L`` inputs of the epoch are not
   served. ``pad_tail=True`` serves ``ceil(T / L)`` windows, the last one padded with ``pad_id``
   (position id -1): every token is an input exactly once.

Windows are then partitioned over ranks, workers and streams exactly like rows (``wire.plan``):
windows are served in stream order, so a batch is ``batch_rows * L`` consecutive tokens of the
shuffled document stream.

The epoch plan (:class:`EpochPlan`) is ``perm`` (the stored document of each epoch slot: int32
below 2**31 documents, else int64) and ``ends`` (int64 cumulative token counts in epoch order):
12 bytes per document, plus the dataset's :class:`~flightfeed.server.data.token_index.TokenIndex`
(8 bytes per document). 10**7 documents: 120 MB per cached epoch plus 80 MB, whatever the token
count. At most ``_PLANS`` plans are kept (the epoch served and the next).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.token_index import TokenIndex, token_index
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.messages import MAX_SEQ_LEN

__all__ = ["PackSpec", "EpochPlan", "epoch_plan", "pack_spec", "POSITION_IDS"]

#: the name of the position-id column of packed batches
POSITION_IDS = "position_ids"
_PLANS = 2
_I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PackSpec:
    column: str
    seq_len: int
    pad_tail: bool = False
    pad_id: int = 0

    def num_windows(self, num_tokens: int) -> int:
        """Windows of an epoch of ``num_tokens`` tokens (see the module doc)."""
        if num_tokens <= 0:
            return 0
        if self.pad_tail:
            return -(-num_tokens // self.seq_len)
        return (num_tokens - 1) // self.seq_len



def pack_spec(read: Any) -> PackSpec | None:
    """The pack spec of a ReadCommand (None when it does not pack)."""
    if not read.HasField("pack"):
        return None
    p = read.pack
    return PackSpec(str(p.column), int(p.seq_len), bool(p.pad_tail), int(p.pad_id))


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's document stream (see the module doc)."""

    index: TokenIndex
    perm: npt.NDArray[np.integer]
    ends: _I64

    @property
    def num_tokens(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    @property
    def nbytes(self) -> int:
        return int(self.perm.nbytes + self.ends.nbytes)


def _document_order(order: EpochOrder) -> npt.NDArray[np.integer]:
    """The stored document of every epoch slot, one shuffle window at a time (no per-document
    Python, temporaries of one window)."""
    n = order.num_rows
    dtype: type[np.integer] = np.int32 if n < 2**31 else np.int64
    perm: npt.NDArray[np.integer] = np.arange(n, dtype=dtype)
    if not order.shuffle:
        return perm
    step = max(1, order.buffer_rows)  # one shuffle window per call
    for w, lo in enumerate(range(0, n, step)):
        perm[lo : lo + step] = order.window_rows(w)
    return perm


def _make(index: TokenIndex, order: EpochOrder) -> EpochPlan:
    perm = _document_order(order)
    lengths = np.diff(index.doc_starts)
    if len(lengths) and int(lengths.max()) < 2**31:
        lengths = lengths.astype(np.int32)  # the temporaries stay at 4 bytes per document
    ends = np.cumsum(lengths[perm], dtype=np.int64)
    del lengths
    perm.flags.writeable = False
    ends.flags.writeable = False
    return EpochPlan(index, perm, ends)


_lock = threading.Lock()
_plans: OrderedDict[tuple[Any, ...], EpochPlan] = OrderedDict()
_making: dict[tuple[Any, ...], threading.Lock] = {}


def epoch_plan(ds: Dataset, spec: PackSpec, order: EpochOrder) -> EpochPlan:
    """The (memoised) epoch plan of ``ds``'s token column under ``order``."""
    if spec.seq_len < 1 or spec.seq_len > MAX_SEQ_LEN:
        raise InvalidRequest(f"pack.seq_len is {spec.seq_len}; allowed: 1..{MAX_SEQ_LEN}", field="pack.seq_len")
    index = token_index(ds, spec.column)
    key = (
        id(index), order.fingerprint, order.seed, order.epoch, order.shuffle, order.block_rows, order.buffer_rows,
    )
    with _lock:
        hit = _plans.get(key)
        if hit is not None and hit.index is index:
            _plans.move_to_end(key)
            return hit
        making = _making.setdefault(key, threading.Lock())
    with making:  # streams of one epoch ask together: one of them makes the plan
        with _lock:
            hit = _plans.get(key)
            if hit is not None and hit.index is index:
                return hit
        plan = _make(index, order)
        with _lock:
            _plans[key] = plan
            _making.pop(key, None)
            while len(_plans) > _PLANS:
                _plans.popitem(last=False)
        return plan
