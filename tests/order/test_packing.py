"""Token packing (``ReadOptions(pack=Pack(...))``): windows of a shuffled, concatenated document
stream, every token the input of exactly one window per epoch over 1, 3 and 8 ranks, exact resume
(also after a server restart and from 2 to 3 ranks). Checked against the token ids themselves
(``tests/support/token_corpus.py``: an id names its document and place) and a loop-based reference."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from flightfeed.client import ConfigError, FlightDataset, InvalidRequest, Pack, ReadOptions
from flightfeed.server.data.catalog import Catalog
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.packing import PackSpec, epoch_plan
from flightfeed.server.data.token_index import token_index
from flightfeed.server.storage.resolve import open_catalog
from flightfeed.server.testing import running_server
from flightfeed.wire.errors import DatasetError
from tests.support.token_corpus import STRIDE, doc_tokens, reference_positions, write_token_corpus

SEQ = 16
BATCH = 3
SHARDS = [[40, 25], [7], [60, 1, 30]]  # uneven chunks and shards: documents cross no chunk, windows do


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("tokens")
    lengths = write_token_corpus(root, SHARDS, seed=3, max_len=45)
    return root, lengths


@pytest.fixture(scope="module")
def server(corpus: tuple[Path, np.ndarray]) -> Iterator[Any]:
    with running_server({"tok": str(corpus[0])}) as srv:
        yield srv


def _reader(location: str, rank: int = 0, world: int = 1, *, pad: bool = True, **kw: Any) -> FlightDataset:
    opts = ReadOptions(pack=Pack(column="tokens", seq_len=SEQ, pad_tail=pad, pad_id=-7), report_interval=None,
                       streams=kw.pop("streams", 2))
    return FlightDataset(location, "tok", batch_size=BATCH, rank=rank, world_size=world, options=opts, **kw)


def _global_windows(per_rank: list[list[dict[str, Any]]]) -> tuple[np.ndarray, np.ndarray]:
    """Windows of all ranks in epoch order (global batch g is rank g % W's batch g // W)."""
    world = len(per_rank)
    tokens, positions = [], []
    for g in range(sum(len(b) for b in per_rank)):
        batch = per_rank[g % world][g // world]
        tokens.append(batch["tokens"].numpy())
        positions.append(batch["position_ids"].numpy())
    return np.concatenate(tokens), np.concatenate(positions)


def _read_ranks(location: str, world: int, **kw: Any) -> list[list[dict[str, Any]]]:
    out = []
    for r in range(world):
        ds = _reader(location, r, world, **kw)
        batches = [{k: v.clone() for k, v in b.items()} for b in ds]
        assert len(ds) == len(batches)
        assert all(b["tokens"].dtype == torch.int64 and b["tokens"].shape[1] == SEQ + 1 for b in batches)
        assert all(b["position_ids"].dtype == torch.int32 for b in batches)
        out.append(batches)
    return out


def _stream(windows: np.ndarray) -> np.ndarray:
    """The token stream the windows cut: inputs of every window, then the last window's last token."""
    assert (windows[:-1, -1] == windows[1:, 0]).all(), "consecutive windows share one token"
    stream: np.ndarray = np.r_[windows[:, :-1].ravel(), windows[-1, -1]]
    return stream


def _check_whole_documents(stream: np.ndarray, lengths: np.ndarray) -> list[int]:
    """The stream is whole documents back to back; returns the document order."""
    starts = np.flatnonzero(stream % STRIDE == 0)
    docs: list[int] = (stream[starts] // STRIDE).tolist()
    assert starts[0] == 0
    pieces = np.split(stream, starts[1:])
    for d, piece in zip(docs, pieces, strict=True):
        np.testing.assert_array_equal(piece, doc_tokens(d, int(lengths[d])))
    return docs


def _check_positions(windows: np.ndarray, positions: np.ndarray, pad_id: int = -7) -> None:
    for w, p in zip(windows, positions, strict=True):
        real = w != pad_id
        np.testing.assert_array_equal(p[~real], -1)
        np.testing.assert_array_equal(p[real], reference_positions(w[real]))


@pytest.mark.parametrize("world", [1, 3, 8])
def test_every_token_is_an_input_exactly_once(server: Any, corpus: tuple[Path, np.ndarray], world: int) -> None:
    _, lengths = corpus
    total = int(lengths.sum())
    windows, positions = _global_windows(_read_ranks(server.location, world, seed=5))
    assert len(windows) == -(-total // SEQ)  # pad_tail: ceil(T / L) windows
    inputs = windows[:, :-1].ravel()
    real = inputs[inputs != -7]
    assert len(real) == total  # every token an input once ...
    np.testing.assert_array_equal(np.sort(real), np.sort(np.concatenate([doc_tokens(d, int(n)) for d, n in
                                                                          enumerate(lengths)])))
    stream = _stream(windows)
    order = _check_whole_documents(stream[stream != -7], lengths)  # ... as whole documents
    assert sorted(order) == [d for d in range(len(lengths)) if lengths[d]]
    assert order != sorted(order)  # shuffled
    _check_positions(windows, positions)
    single, _ = _global_windows(_read_ranks(server.location, 1, seed=5)) if world > 1 else (windows, None)
    np.testing.assert_array_equal(windows, single)  # the epoch's windows do not depend on the world size


def test_stored_order_and_dropped_tail(server: Any, corpus: tuple[Path, np.ndarray]) -> None:
    _, lengths = corpus
    total = int(lengths.sum())
    windows, positions = _global_windows(_read_ranks(server.location, 1, pad=False, shuffle=False))
    assert len(windows) == (total - 1) // SEQ  # the final partial window is dropped
    expected = np.concatenate([doc_tokens(d, int(n)) for d, n in enumerate(lengths)])  # stored order
    np.testing.assert_array_equal(_stream(windows), expected[: len(windows) * SEQ + 1])
    _check_positions(windows, positions)


def test_order_is_a_pure_function_of_seed_and_epoch(server: Any) -> None:
    def epoch_windows(seed: int, epoch: int) -> np.ndarray:
        ds = _reader(server.location, seed=seed, streams=3)
        ds.set_epoch(epoch)
        return np.concatenate([b["tokens"].numpy() for b in ds])

    a = epoch_windows(1, 0)
    np.testing.assert_array_equal(a, epoch_windows(1, 0))
    assert not np.array_equal(a, epoch_windows(1, 1))
    assert not np.array_equal(a, epoch_windows(2, 0))


def _rest(ds: FlightDataset) -> list[np.ndarray]:
    return [np.concatenate([b["tokens"].numpy(), b["position_ids"].numpy().astype(np.int64)], axis=1) for b in ds]


def test_resume_mid_epoch_is_byte_identical_also_after_a_restart(
    server: Any, corpus: tuple[Path, np.ndarray]
) -> None:
    full = _rest(_reader(server.location, seed=9))
    ds = _reader(server.location, seed=9)
    it: Any = iter(ds)
    for _ in range(7):
        next(it)
    state = ds.state_dict()
    it.close()
    resumed = _reader(server.location, seed=9)
    resumed.load_state_dict(state)
    assert len(resumed) == len(full)
    rest = _rest(resumed)
    assert len(rest) == len(full) - 7
    for a, b in zip(rest, full[7:], strict=True):
        np.testing.assert_array_equal(a, b)
    with running_server({"tok": str(corpus[0])}) as again:  # a fresh process's epoch plan, same windows
        other = _reader(again.location, seed=9)
        other.load_state_dict(state)
        for a, b in zip(_rest(other), full[7:], strict=True):
            np.testing.assert_array_equal(a, b)


def test_resume_from_two_ranks_at_three(server: Any) -> None:
    full, _ = _global_windows(_read_ranks(server.location, 1, seed=4))
    consumed = 4  # batches per rank before the checkpoint (lockstep)
    states, first = [], []
    for r in range(2):
        ds = _reader(server.location, r, 2, seed=4)
        it: Any = iter(ds)
        first.append([next(it) for _ in range(consumed)])
        states.append(ds.state_dict())
        it.close()
    prefix, _ = _global_windows(first)
    later = []
    for r in range(3):
        ds = _reader(server.location, r, 3, seed=4)
        ds.load_state_dict(states[0])  # every rank's state says the same consumed prefix
        later.append(list(ds))
    rest, _ = _global_windows(later)
    np.testing.assert_array_equal(np.concatenate([prefix, rest]), full)


def test_token_types_and_large_lists(tmp_path: Path) -> None:
    cases = [
        ("list", pa.uint16(), 0), ("large_list", pa.int64(), 0), ("list", pa.uint32(), 0), ("list", pa.uint16(), -1)
    ]
    for k, (ltype, vtype, pad) in enumerate(cases):  # pad -1: no uint16 holds it (int64 on the wire)
        root = tmp_path / f"c{k}"
        lengths = write_token_corpus(root, [[5, 9], [13]], seed=k, max_len=60, list_type=ltype, value_type=vtype)
        # uint16: ids stay below 2**16 (27 documents x STRIDE)
        expected = np.concatenate([doc_tokens(d, int(n)) for d, n in enumerate(lengths)])
        with running_server({"tok": str(root)}) as srv:
            ds = FlightDataset(srv.location, "tok", batch_size=2, shuffle=False,
                               options=ReadOptions(pack=Pack(seq_len=7, pad_tail=True, pad_id=pad),
                                                   report_interval=None))
            batches = list(ds)
        assert all(b["tokens"].dtype == torch.int64 and b["position_ids"].dtype == torch.int32 for b in batches)
        windows = np.concatenate([b["tokens"].numpy() for b in batches])
        stream = _stream(windows)
        np.testing.assert_array_equal(stream[: len(expected)], expected)
        assert len(stream) > len(expected) and (stream[len(expected):] == pad).all()


def test_refusals(server: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="seq_len"):
        Pack(seq_len=0)
    with pytest.raises(ConfigError, match="columns"):
        FlightDataset(server.location, "tok", columns=["doc"], options=ReadOptions(pack=Pack()))
    ds = FlightDataset(server.location, "tok", options=ReadOptions(pack=Pack(column="doc"), report_interval=None))
    with pytest.raises(InvalidRequest, match="list or large_list of integers"):
        next(iter(ds))


def test_plan_memory_is_bytes_per_document(corpus: tuple[Path, np.ndarray]) -> None:
    catalog: Catalog = open_catalog({"tok": str(corpus[0])})
    try:
        ds = catalog.get("tok")
        index = token_index(ds, "tokens")
        plan = epoch_plan(ds, PackSpec("tokens", SEQ), EpochOrder(ds.num_rows, ds.fingerprint, 0, 0, True, 4, 32))
        docs = ds.num_rows
        assert index.nbytes == 8 * (docs + 1) + 8 * (ds.num_chunks + 1)
        assert plan.nbytes == 12 * docs  # int32 document ids + int64 cumulative ends
        assert plan.num_tokens == int(corpus[1].sum())
        assert sorted(plan.perm.tolist()) == list(range(docs))
    finally:
        catalog.close()


def test_dataloader_workers_resume_exactly(server: Any) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def rows(batches: Any) -> list[bytes]:
        return [w.numpy().tobytes() for b in batches for w in b["tokens"]]

    single = rows(_reader(server.location, seed=6))
    loader = StatefulDataLoader(_reader(server.location, seed=6), batch_size=None, num_workers=2,
                                multiprocessing_context="spawn", timeout=120)
    it = iter(loader)
    head = rows(next(it) for _ in range(5))
    state = loader.state_dict()
    tail = rows(it)
    assert head + tail == single  # workers' batches in the canonical order: every window once
    del it
    again = StatefulDataLoader(_reader(server.location, seed=6), batch_size=None, num_workers=2,
                               multiprocessing_context="spawn", timeout=120)
    again.load_state_dict(state)
    assert rows(again) == tail


def test_len_of_a_packed_read_before_fork_workers_keeps_them_working(server: Any) -> None:
    """``len(ds)`` of a packed read counts the epoch's windows, which the server's tickets carry; in
    a process that never used Flight it is asked by the helper process (as an unpacked read's is),
    so ``fork``-started DataLoader workers still work after it (asked directly, it left gRPC in the
    parent and every worker refused to start)."""
    root = Path(__file__).resolve().parents[2]
    script = f"""
import torch.utils.data
from flightfeed.client import FlightDataset, Pack, ReadOptions
from flightfeed.client._state.fork import grpc_used
opts = ReadOptions(pack=Pack(column="tokens", seq_len={SEQ}), report_interval=None, streams=2)
ds = FlightDataset({server.location!r}, "tok", batch_size={BATCH}, seed=2, options=opts)
batches = len(ds)
assert not grpc_used(), "len() used gRPC in the parent"
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)
got = [b["tokens"].shape[0] for b in loader]
assert len(got) == batches, (len(got), batches)
print("ok", batches, sum(got))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    direct = _reader(server.location, seed=2, pad=False)
    assert done.stdout.split()[1:] == [str(len(direct)), str(sum(len(b["tokens"]) for b in direct))]


def test_a_corpus_shorter_than_one_window_is_refused_not_an_empty_epoch(tmp_path: Path) -> None:
    """Without pad_tail, a corpus of fewer than seq_len + 1 tokens has no window: the read fails
    naming the fix instead of yielding an epoch of no batches (a training loop ends at once)."""
    import pyarrow.ipc as ipc

    table = pa.table({"tokens": pa.array([[5, 6, 7], [8], [9, 10]], pa.list_(pa.uint16()))})
    with ipc.new_file(str(tmp_path / "t.arrow"), table.schema) as writer:
        writer.write_table(table)
    with running_server({"tok": str(tmp_path)}) as srv:
        opts = ReadOptions(pack=Pack(column="tokens", seq_len=SEQ), report_interval=None)
        ds = FlightDataset(srv.location, "tok", batch_size=BATCH, shuffle=False, options=opts)
        with pytest.raises(InvalidRequest, match=r"holds 6 token\(s\) in 'tokens', fewer than one window .*pad_tail"):
            list(ds)
        opts = ReadOptions(pack=Pack(column="tokens", seq_len=SEQ, pad_tail=True), report_interval=None)
        ds = FlightDataset(srv.location, "tok", batch_size=BATCH, shuffle=False, options=opts)
        (batch,) = list(ds)
        assert batch["tokens"][0, :6].tolist() == [5, 6, 7, 8, 9, 10] and len(ds) == 1


def test_null_documents_are_refused_naming_the_column(tmp_path: Path) -> None:
    """A null row of the token column (a null list: a null document) is refused, naming the column,
    in stored and shuffled order, as the same column read as rows is; it served the values its
    offsets span (666, 667 here) before."""
    import pyarrow.ipc as ipc

    values = pa.array([1, 2, 3, 666, 667, 7, 8, 9, 10, 11, 12], pa.int32())
    tokens = pa.ListArray.from_arrays(pa.array([0, 3, 5, 9, 11], pa.int32()), values,
                                      mask=pa.array([False, True, False, False]))
    table = pa.table({"tokens": tokens})
    with ipc.new_file(str(tmp_path / "t.arrow"), table.schema) as writer:
        writer.write_table(table)
    with running_server({"tok": str(tmp_path)}) as srv:
        for shuffle in (False, True):
            opts = ReadOptions(pack=Pack(column="tokens", seq_len=2), report_interval=None)
            ds = FlightDataset(srv.location, "tok", batch_size=2, shuffle=shuffle, options=opts)
            with pytest.raises(DatasetError, match=r"column 'tokens' has 1 null list\(s\) \(null documents\) "
                                                   r"in chunk 0 .*store empty lists instead"):
                list(ds)
        plain = ReadOptions(report_interval=None)
        rows = FlightDataset(srv.location, "tok", batch_size=2, shuffle=False, options=plain)
        with pytest.raises(DatasetError, match=r"column 'tokens' has 1 null list\(s\) in this batch"):
            list(rows)
