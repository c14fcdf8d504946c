"""``Pack(targets="shifted")`` on the CPU path: a message's inputs and targets as views of one flat
int64 array, written by the copy that widens the wire's narrow tokens.

Consecutive windows of the epoch's stream share one token (``data/packing`` on the server: window
``w`` is stream tokens ``[w * L, w * L + L + 1)``). A *chain* is a run of rows in which every
window's last token is the next one's first; it is stored once, as its ``n * L + 1`` tokens, so that

* its inputs ``tokens[:, :-1]`` are the ``(n, L)`` view from the chain's first token, and
* its targets ``tokens[:, 1:]`` the ``(n, L)`` view one token on,

both contiguous. The chains of a message lie one after another in one flat array of ``rows * L +
chains`` tokens: a message of one rank (``world_size=1``) is one chain; a rank of several takes every
``world_size``-th global batch, so its message holds one chain per batch, and its batches are still
views. A batch that crosses chains (a message whose batches do not line up with its runs) is joined
by one ``torch.cat`` per name. Chains are found from the values alone (a row's last token equal to
the next row's first), so a chance equality only joins two rows whose shared token is the same:
the views are right whatever the message holds.

The copy writes ``rows * L + chains`` int64 tokens, fewer than the default layout's ``rows * (L +
1)``; ``bench/bench_shifted_targets.py --micro`` measures it beside the default layout and a loop's
``.contiguous()`` (docs/design.md §7 keeps the default layout).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["Chains", "chain_rows", "chain_tensors", "chain_views"]

#: ``(shape, dtype) -> array``: a fresh array or one reused from ``_tensors.packed.Buffers``
Empty = Callable[[tuple[int, int], type[np.generic]], npt.NDArray[Any]]


def _seams(parts: list[npt.NDArray[Any]]) -> npt.NDArray[np.int64]:
    """The first row of every chain of the rows of ``parts`` (0 first; empty without rows)."""
    if not parts:
        return np.zeros(0, np.int64)
    last = np.concatenate([p[:, -1] for p in parts])
    first = np.concatenate([p[:, 0] for p in parts])
    breaks = np.flatnonzero(last[:-1] != first[1:]) + 1
    seams: npt.NDArray[np.int64] = np.r_[np.int64(0), breaks.astype(np.int64)]
    return seams


def chain_rows(parts: list[npt.NDArray[Any]], rows: int, empty: Empty) -> tuple[npt.NDArray[np.int64], tuple[int, ...]]:
    """The windows of ``parts`` (narrow ``(n, L + 1)`` arrays, ``rows`` in all) widened into one flat
    int64 array of chains, and the first row of each chain (see the module doc)."""
    step = (parts[0].shape[1] - 1) if parts else 0
    seams = _seams(parts)
    flat = empty((1, rows * step + len(seams)), np.int64)[0]
    ends = np.r_[seams[1:], np.int64(rows)]
    at = 0  # the first row of the part, in the message
    for part in parts:
        n = len(part)
        if n:
            k0 = int(np.searchsorted(seams, at, side="right")) - 1
            k1 = int(np.searchsorted(seams, at + n - 1, side="right")) - 1
            _copy_pieces(flat, part, at, step, seams, ends, k0, k1)
            done = np.arange(k0, k1 + 1)
            done = done[ends[done] <= at + n]  # chains that end in this part: their last token
            flat[ends[done] * step + done] = part[ends[done] - at - 1, -1]
        at += n
    return flat, tuple(int(s) for s in seams)


def _copy_pieces(
    flat: npt.NDArray[np.int64], part: npt.NDArray[Any], at: int, step: int,
    seams: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], k0: int, k1: int,
) -> None:
    """The inputs of ``part``'s rows (message rows ``at ..``), chains ``k0..k1``, into ``flat``.
    Whole chains of one length between the first and the last (a rank's batches) go in one strided
    copy; the others one copy each."""
    def one(k: int) -> None:
        lo, hi = max(int(seams[k]), at), min(int(ends[k]), at + len(part))
        np.copyto(flat[lo * step + k : hi * step + k].reshape(hi - lo, step), part[lo - at : hi - at, :-1],
                  casting="unsafe")

    one(k0)
    if k1 == k0:
        return
    inner = np.arange(k0 + 1, k1)
    m = int(ends[k0 + 1] - seams[k0 + 1]) if len(inner) else 0
    if len(inner) > 1 and bool((ends[inner] - seams[inner] == m).all()):
        first = int(seams[k0 + 1])
        dst = np.lib.stride_tricks.as_strided(
            flat[first * step + k0 + 1 :], shape=(len(inner), m, step),
            strides=((m * step + 1) * flat.itemsize, step * flat.itemsize, flat.itemsize),
        )
        src = part[first - at : first - at + len(inner) * m].reshape(len(inner), m, step + 1)[:, :, :-1]
        np.copyto(dst, src, casting="unsafe")
    else:
        for k in inner.tolist():
            one(k)
    one(k1)


Chains = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def chain_tensors(flat: torch.Tensor, seams: tuple[int, ...], rows: int, step: int) -> Chains:
    """Each chain's inputs and targets, ``(n, L)`` views of ``flat`` (made once per message, on the
    lane's thread, so that cutting a batch is a row slice, as for the default layout)."""
    out = []
    for k, first in enumerate(seams):
        n = (seams[k + 1] if k + 1 < len(seams) else rows) - first
        a = first * step + k
        out.append((flat[a : a + n * step].view(n, step), flat[a + 1 : a + 1 + n * step].view(n, step)))
    return tuple(out)


def chain_views(chains: Chains, seams: tuple[int, ...], lo: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, ``(n, L)`` each, of message rows ``[lo, lo + n)``: row slices of one
    chain's views, joined when the rows cross chains."""
    k = bisect.bisect_right(seams, lo) - 1 if len(seams) > 1 else 0
    inputs, targets = chains[k]
    r = lo - seams[k]
    if r == 0 and n == len(inputs):  # a whole chain (a rank of several: each batch is one)
        return inputs, targets
    if r + n <= len(inputs):
        return inputs[r : r + n], targets[r : r + n]
    parts_in, parts_tg = [], []
    while n > 0:
        inputs, targets = chains[k]
        take = min(n, len(inputs) - r)
        parts_in.append(inputs[r : r + take])
        parts_tg.append(targets[r : r + take])
        n, k, r = n - take, k + 1, 0
    return torch.cat(parts_in), torch.cat(parts_tg)
