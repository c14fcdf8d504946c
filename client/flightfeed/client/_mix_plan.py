"""``Mixture``: several named datasets read as one, with weights; the pure schedule behind it.

The schedule says which source each batch of an epoch comes from: a pure function of (seed,
epoch, step). Steps are cut into blocks of ``BLOCK`` batches; in every block each source gets its
weight's share of the batches *exactly* (largest remainders, ties to the earlier source), in an
order shuffled by ``(seed, epoch, block)``. So 70/20/10 weights give 70/20/10 batches in every
block of 4,096, any step is found without replaying earlier ones, and every rank (which shares the
seed) reads the same source at the same step (lockstep data parallelism stays balanced).

An epoch of a mixture (``Mixture``'s ``until`` / ``batches``):

* ``until=None`` (default): the epoch ends at the first step whose source has no batch left in its
  pass: no source repeats within an epoch (choose weights near the sources' sizes to use them all);
* ``until="web"``: the epoch ends when source ``web`` has none left; the other sources start their
  next pass when they run out (each pass its own order, exactly once within the pass);
* ``batches=N``: a sample budget: the epoch is ``N`` batches, every source starts its next pass
  when it runs out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from flightfeed.wire.errors import ConfigError

__all__ = ["Mixture", "BLOCK", "source_steps", "epoch_length", "source_epoch", "PASSES"]

#: batches per schedule block (every block holds each source's exact share)
BLOCK = 4096
#: a source's epoch for pass ``p`` of mixture epoch ``e`` is ``e * PASSES + p``
PASSES = 1 << 20


@dataclass(frozen=True)
class Mixture:
    """Named datasets with weights, e.g. ``Mixture({"web": 0.7, "code": 0.2, "books": 0.1})``; the
    epoch ends as ``until`` / ``batches`` say (module doc). Pass it as ``FlightDataset``'s ``name``."""

    weights: Mapping[str, float]
    until: str | None = None
    batches: int | None = None
    names: tuple[str, ...] = field(init=False)
    shares: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ConfigError(f"Mixture weights are {self.weights!r}; pass {{'dataset': weight, ...}}")
        for name, w in self.weights.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"Mixture: source name {name!r} is not a dataset name")
            ok = isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w > 0
            if not ok:
                raise ConfigError(f"Mixture: weight of {name!r} is {w!r}; weights must be finite numbers > 0")
        if self.until is not None and self.until not in self.weights:
            raise ConfigError(f"Mixture: until={self.until!r} is not one of the sources {list(self.weights)}")
        if self.batches is not None:
            if isinstance(self.batches, bool) or not isinstance(self.batches, int) or self.batches < 1:
                raise ConfigError(f"Mixture: batches is {self.batches!r}; it must be an integer >= 1")
            if self.until is not None:
                raise ConfigError("Mixture: give until= or batches=, not both (they both say when an epoch ends)")
        names = tuple(self.weights)
        total = float(sum(self.weights.values()))
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "shares", tuple(float(self.weights[n]) / total for n in names))

    def as_dict(self) -> dict[str, object]:
        """How a checkpoint records it."""
        weights = {n: float(self.weights[n]) for n in self.names}
        return {"weights": weights, "until": self.until, "batches": self.batches}

    def ends_with(self, source: int) -> bool:
        """Whether source ``source`` running out ends the epoch (rather than starting its next pass)."""
        if self.batches is not None:
            return False
        return self.until is None or self.names[source] == self.until


def _counts(shares: tuple[float, ...]) -> npt.NDArray[np.int64]:
    """Batches per source in one block: largest remainders of ``BLOCK * share``."""
    exact = np.asarray(shares, dtype=np.float64) * BLOCK
    counts: npt.NDArray[np.int64] = np.floor(exact).astype(np.int64)
    left = BLOCK - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:left]] += 1
    return counts


@lru_cache(maxsize=16)
def _block(shares: tuple[float, ...], seed: int, epoch: int, block: int) -> npt.NDArray[np.int16]:
    base = np.repeat(np.arange(len(shares), dtype=np.int16), _counts(shares))
    words = [seed & 0xFFFFFFFF, seed >> 32, epoch & 0xFFFFFFFF, epoch >> 32, block & 0xFFFFFFFF, block >> 32, 0x313D]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
    rng.shuffle(base)
    base.flags.writeable = False
    return base


def source_steps(mix: Mixture, seed: int, epoch: int, lo: int, hi: int) -> npt.NDArray[np.int16]:
    """The source of every step ``[lo, hi)`` of epoch ``epoch``."""
    parts = []
    step = lo
    while step < hi:
        b, off = divmod(step, BLOCK)
        take = min(BLOCK - off, hi - step)
        parts.append(_block(mix.shares, seed, epoch, b)[off : off + take])
        step += take
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int16)


def epoch_length(mix: Mixture, seed: int, epoch: int, per_pass: list[int], limit: int = 1 << 40) -> int:
    """Steps of epoch ``epoch`` when source ``s`` yields ``per_pass[s]`` batches in its first pass
    (the epoch ends at the first step that finds an ending source empty)."""
    if mix.batches is not None:
        return mix.batches
    ending = [s for s in range(len(mix.names)) if mix.ends_with(s)]
    seen = np.zeros(len(mix.names), dtype=np.int64)
    step = 0
    while step < limit:
        block = source_steps(mix, seed, epoch, step, step + BLOCK)
        ends = []
        for s in ending:
            hits = np.flatnonzero(block == s)
            need = per_pass[s] - int(seen[s])  # this source's batches still to come
            if need < len(hits):
                ends.append(int(hits[need]))  # the step that finds it empty
        if ends:
            return step + min(ends)
        seen += np.bincount(block, minlength=len(mix.names))
        step += BLOCK
    raise ConfigError("Mixture: the epoch does not end within 2**40 batches")


def source_epoch(epoch: int, passes: int) -> int:
    """The epoch a source reads in its pass ``passes`` of mixture epoch ``epoch``."""
    if passes >= PASSES:
        raise ConfigError(f"Mixture: a source started {passes} passes in one epoch; the limit is {PASSES}")
    return epoch * PASSES + passes
