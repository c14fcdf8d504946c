"""Ragged (list / large_list) columns end to end: Arrow -> torch.nested jagged tensors (views of the
Arrow buffers) or padded tensors + NAME_lengths, in stored and shuffled order, bit-exact against the
source, with as_tuple, state_dict resume and the option checks. DataLoader workers: test_ragged_workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._device.engines import CpuEngine
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.wire.errors import ConfigError, DatasetError
from tests.client.ragged_data import NAME, ROWS, batch_of, boxes_of, check_batch, row_of, tokens_of, write_ragged

MakeDs = Callable[..., FlightDataset]


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("ragged")
    write_ragged(root)
    with running_server({NAME: str(root)}) as srv:
        yield srv


@pytest.fixture
def make_ds(ragged_server: RunningServer) -> Iterator[MakeDs]:
    made: list[FlightDataset] = []

    def make(**kwargs: Any) -> FlightDataset:
        read: dict[str, Any] = {"streams": 3, "report_interval": None, "message_rows": 64}
        read.update({k: kwargs.pop(k) for k in list(kwargs) if k in ReadOptions.__dataclass_fields__})
        ds = FlightDataset(ragged_server.location, NAME, **{"batch_size": 32, **kwargs}, options=ReadOptions(**read))
        made.append(ds)
        return ds

    yield make
    for ds in made:
        ds.close()


POLICIES = [
    ("nested", {}),
    ("padded", {"tokens": "padded", "boxes": "padded", "wide": "padded"}),
    ({"tokens": "padded", "wide": "nested"}, {"tokens": "padded"}),
]


@pytest.mark.parametrize("shuffle", [False, True], ids=["stored", "shuffled"])
@pytest.mark.parametrize(("ragged", "policy"), POLICIES, ids=["nested", "padded", "mixed"])
def test_every_value_bit_exact_in_stored_and_shuffled_order(
    make_ds: MakeDs, shuffle: bool, ragged: Any, policy: dict[str, str]
) -> None:
    ds = make_ds(shuffle=shuffle, seed=7, ragged=ragged, pad_value=7 if policy else 0)
    ds.set_epoch(1)
    seen = [i for b in ds for i in check_batch(b, policy, 7 if policy else 0)]
    assert sorted(seen) == list(range(ROWS))
    assert (seen == list(range(ROWS))) is not shuffle


def test_as_tuple_puts_lengths_after_their_padded_column(make_ds: MakeDs) -> None:
    cols = ["tokens", "index", "boxes"]
    ds = make_ds(columns=cols, shuffle=True, as_tuple=True, ragged={"tokens": "padded"})
    n = 0
    for tokens, lengths, index, boxes in ds:
        b = {"tokens": tokens, "tokens_lengths": lengths, "index": index, "boxes": boxes}
        for r, i in enumerate(index.tolist()):
            assert row_of(tokens, lengths, r).tobytes() == tokens_of(i).tobytes()
            assert row_of(boxes, None, r).tobytes() == boxes_of(i).tobytes()
        n += len(b["index"])
    assert n == ROWS


def test_state_dict_resumes_exactly_mid_epoch(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=True, seed=3)
    ds.set_epoch(2)
    it = iter(ds)
    head = [check_batch(next(it), {}) for _ in range(3)]
    state = ds.state_dict()
    tail = [check_batch(b, {}) for b in it]
    again = make_ds(shuffle=True, seed=3)
    again.load_state_dict(state)
    resumed = [check_batch(b, {}) for b in again]
    assert resumed == tail
    assert sorted(i for b in head + tail for i in b) == list(range(ROWS))


# -- conversion units ------------------------------------------------------------------------


def _buffer_range(arr: Any) -> tuple[int, int]:
    buf = arr.buffers()[1]
    return buf.address, buf.address + buf.size


def test_nested_values_are_views_of_the_arrow_buffers_of_a_sliced_batch() -> None:
    rb = batch_of(range(100, 160)).slice(17, 25)  # the list arrays' own offset is 17
    out = batch_to_torch(rb)
    for col in ("tokens", "wide"):
        arr: Any = rb.column(col)
        lo, hi = _buffer_range(arr.values)
        values = out[col].values()
        assert lo <= values.data_ptr() < hi  # no copy of the values
        first = int(arr.offsets[0].as_py())
        assert values.data_ptr() == lo + first * values.element_size()
        assert out[col].offsets().tolist() == (arr.offsets.to_numpy() - first).tolist()
        assert out[col]._max_seqlen == max(len(x) for x in arr.to_pylist())
    boxes = out["boxes"]
    assert boxes.shape[0] == 25 and boxes.shape[2] == 4
    box_column: Any = rb.column("boxes")
    lo, hi = _buffer_range(box_column.values.values)
    assert lo <= boxes.values().data_ptr() < hi
    for r, i in enumerate(range(117, 142)):
        assert boxes[r].numpy().tobytes() == boxes_of(i).tobytes()


def test_null_lists_and_null_items_fail_naming_the_column() -> None:
    lists = pa.array([[1, 2], None, [3]], pa.list_(pa.int32()))
    with pytest.raises(DatasetError, match="'tokens' has 1 null list"):
        batch_to_torch(pa.record_batch([lists], names=["tokens"]))
    items = pa.array([[1, None], [3]], pa.list_(pa.int32()))
    with pytest.raises(DatasetError, match=r"column 'tokens'.*nulls"):
        batch_to_torch(pa.record_batch([items], names=["tokens"]), "padded")


def test_lists_of_strings_and_binary_are_lists_of_lists_and_lists_of_lists_fail() -> None:
    rb = pa.record_batch(
        [
            pa.array([["a", "b"], []], pa.list_(pa.string())),
            pa.array([[b"x"], [b"", b"yz"]], pa.large_list(pa.binary())),
        ],
        names=["s", "b"],
    )
    for ragged in ("nested", "padded"):
        assert batch_to_torch(rb, ragged) == {"s": [["a", "b"], []], "b": [[b"x"], [b"", b"yz"]]}
    deep = pa.array([[[1], [2, 3]]], pa.list_(pa.list_(pa.int32())))
    with pytest.raises(DatasetError, match="list of lists"):
        batch_to_torch(pa.record_batch([deep], names=["d"]))


def test_padded_bools_floats_and_a_lengths_name_that_is_taken() -> None:
    rb = pa.record_batch(
        [pa.array([[True, False, True], [], [True]]), pa.array([[0.5], [1.5, 2.5], []], pa.list_(pa.float64()))],
        names=["flags", "score"],
    )
    out = batch_to_torch(rb, "padded", -1.5)
    assert out["flags"].dtype == torch.bool
    assert out["flags"].tolist() == [[True, False, True], [True, True, True], [True, True, True]]
    assert out["score"].tolist() == [[0.5, -1.5], [1.5, 2.5], [-1.5, -1.5]]
    assert out["score_lengths"].tolist() == [1, 2, 0]
    nested = batch_to_torch(rb)["flags"]
    assert nested.values().tolist() == [True, False, True, True]
    clash = pa.record_batch([pa.array([[1], [2, 3]]), pa.array([5, 6])], names=["x", "x_lengths"])
    with pytest.raises(ConfigError, match="'x_lengths'"):
        batch_to_torch(clash, "padded")
    assert batch_to_torch(clash)["x_lengths"].tolist() == [5, 6]  # nested: no lengths column


def test_ragged_options_are_checked_when_made(ragged_server: RunningServer) -> None:
    bad: Any
    for bad, match in (
        ("jagged", "ragged is 'jagged'"),
        ({"tokens": "dense"}, r"ragged\['tokens'\] is 'dense'"),
        ({3: "padded"}, "keys are column names"),
        (["padded"], "ragged is a list"),
    ):
        with pytest.raises(ConfigError, match=match):
            ReadOptions(ragged=bad)
    for pad in (True, "0", float("nan"), None):
        with pytest.raises(ConfigError, match="pad_value"):
            ReadOptions(pad_value=pad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not among columns"):
        FlightDataset(ragged_server.location, NAME, columns=["index"], options=ReadOptions(ragged={"tokens": "padded"}))
    with pytest.raises(ConfigError, match="moved"):
        FlightDataset(ragged_server.location, NAME, ragged="padded")  # type: ignore[call-arg]
    mapping = {"tokens": "padded"}
    opts = ReadOptions(ragged=mapping)
    mapping["tokens"] = "nested"
    assert opts.ragged == {"tokens": "padded"}  # a private copy


def test_a_mapping_naming_a_column_that_is_no_list_fails_at_the_first_batch(make_ds: MakeDs) -> None:
    with pytest.raises(ConfigError, match="'index', which is int64, not a list column"):
        next(iter(make_ds(ragged={"index": "padded"})))
    with pytest.raises(ConfigError, match="'nope', which the dataset does not have"):
        next(iter(make_ds(ragged={"nope": "padded"})))


def test_pad_value_out_of_an_integer_columns_range_fails_naming_it(make_ds: MakeDs) -> None:
    ds = make_ds(columns=["wide"], ragged="padded", pad_value=-1)
    with pytest.raises(DatasetError, match=r"'wide' holds torch.uint16.*\[0, 65535\]"):
        next(iter(ds))


def test_parquet_list_columns_are_served_too(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_batches([batch_of(range(0, 70)), batch_of(range(70, 130))]), tmp_path / "a.parquet")
    with running_server({"pq": str(tmp_path)}) as srv:
        ds = FlightDataset(srv.location, "pq", batch_size=16, seed=1, options=ReadOptions(report_interval=None))
        seen = [i for b in ds for i in check_batch(b, {})]
        ds.close()
    assert sorted(seen) == list(range(130))


@settings(max_examples=60, deadline=None)
@given(
    lists=st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=9), min_size=1, max_size=30),
    cut=st.tuples(st.integers(0, 30), st.integers(0, 30)),
    large=st.booleans(),
    pad=st.integers(-5, 5),
)
def test_any_slice_of_any_lists_round_trips_in_both_policies(
    lists: list[list[int]], cut: tuple[int, int], large: bool, pad: int
) -> None:
    typ = pa.large_list(pa.int32()) if large else pa.list_(pa.int32())
    lo = min(cut[0], len(lists))
    hi = max(lo, min(cut[1], len(lists)))
    rb = pa.record_batch([pa.array(lists, typ)], names=["t"]).slice(lo, hi - lo)
    want = lists[lo:hi]
    nested = batch_to_torch(rb)["t"]
    assert nested.offsets().tolist() == np.concatenate([[0], np.cumsum([len(x) for x in want])]).tolist()
    assert [nested[r].tolist() for r in range(len(want))] == want
    out = batch_to_torch(rb, "padded", pad)
    longest = max((len(x) for x in want), default=0)
    assert out["t"].tolist() == [x + [pad] * (longest - len(x)) for x in want]
    assert out["t_lengths"].tolist() == [len(x) for x in want]


def test_lists_of_fixed_shape_tensors_keep_their_shape() -> None:
    matrix = pa.fixed_shape_tensor(pa.float32(), [2, 2])
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 4)
    items = pa.ExtensionArray.from_storage(matrix, storage)
    column: Any = pa.ListArray.from_arrays(pa.array([0, 1, 1, 3], pa.int32()), items)
    rb = pa.record_batch([column], names=["m"]).slice(1, 2)
    nested = batch_to_torch(rb)["m"]
    assert nested.shape[0] == 2 and nested.shape[2:] == (2, 2)
    assert nested[0].shape == (0, 2, 2)
    assert nested[1].tolist() == np.arange(4, 12, dtype=np.float32).reshape(2, 2, 2).tolist()
    padded = batch_to_torch(rb, "padded", -1)
    assert padded["m"].shape == (2, 2, 2, 2) and padded["m_lengths"].tolist() == [0, 2]
    assert bool((padded["m"][0] == -1).all())


def _boxes(null_row: int | None) -> Any:
    """Four boxes of ``fixed_size_list<float32, 4>``; ``null_row`` null (its values still stored)."""
    mask = None if null_row is None else pa.array([r == null_row for r in range(4)])
    return pa.FixedSizeListArray.from_arrays(pa.array(np.arange(16, dtype=np.float32)), 4, mask=mask)


def test_null_rows_of_fixed_size_columns_fail_naming_the_column() -> None:
    """A null row of a fixed_size_list column (also a null box of list<fixed_size_list<float32, 4>>,
    a null row of a fixed-shape tensor column, a null inside a row, a null number) is refused naming
    the column, like null lists; before, the values of the other rows were reshaped
    ("shape '[4, 4]' is invalid for input of size 12")."""
    with pytest.raises(DatasetError, match=r"column 'box' of type fixed_size_list<item: float>\[4\] has 1 null row"):
        batch_to_torch(pa.record_batch([_boxes(1)], names=["box"]))
    boxes: Any = pa.ListArray.from_arrays(pa.array([0, 2, 4], pa.int32()), _boxes(2))
    for ragged in ("nested", "padded"):
        with pytest.raises(DatasetError, match=r"column 'boxes' .* has 1 null item\(s\) of type fixed_size_list"):
            batch_to_torch(pa.record_batch([boxes], names=["boxes"]), ragged)
    matrix = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 2]), _boxes(0))
    with pytest.raises(DatasetError, match=r"column 'm' .* has 1 null row"):
        batch_to_torch(pa.record_batch([matrix], names=["m"]))
    inner = pa.FixedSizeListArray.from_arrays(pa.array([1.0, None, 3.0, 4.0], pa.float32()), 2)
    with pytest.raises(DatasetError, match=r"column 'v' .* has 1 null value.* inside its rows"):
        batch_to_torch(pa.record_batch([inner], names=["v"]))
    with pytest.raises(DatasetError, match="column 'x' of type double has 1 null row"):
        batch_to_torch(pa.record_batch([pa.array([1.0, None])], names=["x"]))
    # rows after a null one, sliced off it, still convert (the slice offset is honoured)
    rest = batch_to_torch(pa.record_batch([_boxes(1).slice(2)], names=["box"]))["box"]
    assert rest.tolist() == np.arange(8, 16, dtype=np.float32).reshape(2, 4).tolist()


def test_a_served_null_box_fails_naming_the_column(tmp_path: Path) -> None:
    """End to end: a stored null row of a fixed_size_list column and a null box inside a list column
    reach the trainer as a DatasetError naming the column, on the host and the device path."""
    import pyarrow.ipc as ipc

    boxes: Any = pa.ListArray.from_arrays(pa.array([0, 2, 4], pa.int32()), _boxes(3))
    table = pa.table({"box": _boxes(1).slice(0, 2), "boxes": boxes, "id": pa.array([0, 1])})
    with ipc.new_file(str(tmp_path / "b.arrow"), table.schema) as writer:
        writer.write_table(table)
    with running_server({"b": str(tmp_path)}) as srv:
        for column, device in (("box", None), ("boxes", None), ("box", "cpu"), ("boxes", "cpu")):
            ds = FlightDataset(srv.location, "b", batch_size=2, shuffle=False, columns=[column, "id"],
                               device=device, options=ReadOptions(report_interval=None))
            if device is not None:  # the device path: the streams' ring, CPU engine
                ds._copy_engine = CpuEngine
            with pytest.raises(DatasetError, match=rf"column '{column}' .* has 1 null"):
                list(ds)
            ds.close()
