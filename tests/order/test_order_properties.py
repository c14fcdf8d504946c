"""Property tests of the pure order and partition functions (no I/O)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.server.data.order import EpochOrder, default_shuffle
from flightfeed.wire.plan import Partition, ceil_div, split_streams, stream_messages

FP = "0123456789abcdef0123"


@given(
    n=st.integers(1, 3000),
    block=st.integers(1, 300),
    buffer=st.integers(1, 4000),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 5),
)
@settings(max_examples=150, deadline=None)
def test_order_is_a_permutation_and_pure(n: int, block: int, buffer: int, seed: int, epoch: int) -> None:
    order = EpochOrder(n, FP, seed, epoch, True, block, buffer)
    rows = order.rows(np.arange(n))
    assert sorted(rows.tolist()) == list(range(n))
    # random access: any subset maps consistently
    pick = np.random.default_rng(seed).permutation(n)[: max(1, n // 3)]
    assert (order.rows(pick) == rows[pick]).all()
    # message-sized slices (mostly inside one shuffle window: the one-window path) agree with
    # the whole epoch's rows (many windows: the general path)
    for lo in range(0, n, max(1, n // 7)):
        hi = min(n, lo + 64)
        assert (order.rows(np.arange(lo, hi)) == rows[lo:hi]).all()
    assert (EpochOrder(n, FP, seed, epoch, True, block, buffer).rows(np.arange(n)) == rows).all()


def test_order_changes_with_seed_epoch_fingerprint_and_not_without_shuffle() -> None:
    n = 5000
    base = EpochOrder(n, FP, 1, 0, True, 64, 1024).rows(np.arange(n))
    assert not (EpochOrder(n, FP, 2, 0, True, 64, 1024).rows(np.arange(n)) == base).all()
    assert not (EpochOrder(n, FP, 1, 1, True, 64, 1024).rows(np.arange(n)) == base).all()
    assert not (EpochOrder(n, "ffff" + FP[4:], 1, 0, True, 64, 1024).rows(np.arange(n)) == base).all()
    assert EpochOrder(n, FP, 1, 0, False).rows(np.arange(n)).tolist() == list(range(n))


def test_window_is_bounded() -> None:
    """Positions of one window draw from at most buffer_rows/block_rows + 2 blocks."""
    n, block, buffer = 10_000, 50, 1000
    order = EpochOrder(n, FP, 3, 0, True, block, buffer)
    for w in range(n // buffer):
        rows = order.rows(np.arange(w * buffer, (w + 1) * buffer))
        assert len(np.unique(rows // block)) <= buffer // block + 2


def test_default_shuffle_is_bounded_by_bytes() -> None:
    # blocks of ~8 MiB, at most 1/32 of the window; the window keeps its ~256 MiB bound
    assert default_shuffle(150_000, 10**6) == (55, 2048)
    assert default_shuffle(16_384, 10**6) == (512, 16384)
    assert default_shuffle(4096, 10**6) == (2048, 65536)
    assert default_shuffle(64, 10**6) == (2048, 65536)
    assert default_shuffle(64, 100) == (100, 100)
    for row_bytes in (1, 64, 4096, 16_384, 150_000, 1 << 20, 1 << 26):
        block, buffer = default_shuffle(row_bytes, 10**7)
        assert block * row_bytes <= 8 << 20 or block == 1
        assert buffer >= 32 * block


@given(
    n=st.integers(0, 2000),
    batch=st.integers(1, 64),
    world=st.integers(1, 9),
    drop_last=st.booleans(),
    global_start=st.integers(0, 300),
)
@settings(max_examples=300, deadline=None)
def test_partition_exactly_once(n: int, batch: int, world: int, drop_last: bool, global_start: int) -> None:
    global_start = min(global_start, n)
    parts = [Partition(n, batch, r, world, drop_last, global_start) for r in range(world)]
    per_rank = [p.positions(0, p.rows) for p in parts]
    flat = np.concatenate(per_rank)
    assert len(np.unique(flat)) == len(flat)  # disjoint
    span = n - global_start
    if drop_last:
        full = (span // batch) // world
        assert all(p.rows == full * batch for p in parts)
        assert len(flat) == full * batch * world
    else:
        assert sorted(flat.tolist()) == list(range(global_start, n))  # every row
        counts = [ceil_div(p.rows, batch) for p in parts]
        assert max(counts) - min(counts) <= 1
    for p in parts:  # runs agree with positions for any sub-range
        if p.rows:
            lo, hi = p.rows // 3, p.rows - p.rows // 4
            runs = np.concatenate([np.arange(a, a + k) for a, k in p.runs(lo, hi)] or [np.empty(0, int)])
            assert runs.tolist() == p.positions(lo, hi).tolist()


@given(
    rows=st.integers(0, 500),
    start=st.integers(0, 100),
    batch=st.integers(1, 20),
    per_msg=st.integers(1, 4),
    streams=st.integers(1, 6),
    workers=st.integers(1, 4),
)
@settings(max_examples=300, deadline=None)
def test_streams_and_workers_reassemble_the_canonical_messages(
    rows: int, start: int, batch: int, per_msg: int, streams: int, workers: int
) -> None:
    start = min(start // batch * batch, rows)
    message_rows = batch if workers > 1 else batch * per_msg
    canonical = [(lo, min(lo + message_rows, rows)) for lo in range(start, rows, message_rows)]
    # each worker reassembles its streams round-robin; the DataLoader then takes workers round-robin
    per_worker = []
    for w in range(workers):
        spans = split_streams(start, rows, message_rows, streams, w, workers)
        per_worker.append([m for _, m in stream_messages(spans)])
        assert sum(s.expected_rows for s in spans) == sum(hi - lo for lo, hi in per_worker[-1])
    merged = []
    for i in range(max((len(x) for x in per_worker), default=0)):
        merged += [x[i] for x in per_worker if i < len(x)]
    assert merged == canonical


@given(
    n=st.integers(1, 1500),
    batch=st.integers(1, 32),
    w1=st.integers(1, 6),
    w2=st.integers(1, 6),
    frac=st.floats(0, 1),
    drop_last=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_repartition_at_a_new_world_size(n: int, batch: int, w1: int, w2: int, frac: float, drop_last: bool) -> None:
    """Lockstep ranks each consumed b batches at world size w1; resuming at w2 loses and repeats nothing."""
    first = [Partition(n, batch, r, w1, drop_last) for r in range(w1)]
    b = int(min(p.rank_batches for p in first) * frac)
    consumed = np.concatenate([p.positions(0, min(p.rows, b * batch)) for p in first])
    gs = first[0].consumed_positions(b * batch)
    assert all(p.consumed_positions(b * batch) == gs for p in first)
    second = [Partition(n, batch, r, w2, drop_last, gs) for r in range(w2)]
    rest = np.concatenate([p.positions(0, p.rows) for p in second])
    total = np.concatenate([consumed, rest])
    assert len(np.unique(total)) == len(total)
    if not drop_last:
        assert sorted(total.tolist()) == list(range(n))


@given(
    n=st.integers(1, 3000),
    block=st.integers(1, 300),
    buffer=st.integers(1, 4000),
    shuffle=st.booleans(),
    lo=st.integers(0, 3000),
    length=st.integers(0, 3000),
)
@settings(max_examples=150, deadline=None)
def test_stored_runs_cover_exactly_the_rows_of_a_range(
    n: int, block: int, buffer: int, shuffle: bool, lo: int, length: int
) -> None:
    """Read-ahead fetches a window as runs of stored rows: exactly that window's rows."""
    order = EpochOrder(n, FP, 5, 1, shuffle, block, buffer)
    lo = min(lo, n)
    hi = min(n, lo + length)
    runs = order.stored_runs(lo, hi)
    fetched = [r for start, k in runs for r in range(start, start + k)]
    assert len(fetched) == len(set(fetched))
    positions = np.arange(lo, hi)
    expected = order._unblock(positions) if shuffle else positions
    assert sorted(fetched) == sorted(expected.tolist())
    # at most one run per stored block touched (the dataset's short last block, permuted into the
    # middle of a range, makes that one more than (hi - lo) // block + 2)
    touched = {r // block for r in fetched} if shuffle else {0}
    assert len(runs) <= len(touched) if hi > lo else runs == []
