"""Weighted mixtures (``FlightDataset(location, Mixture({...}))``): exact weights per schedule block,
deterministic per (seed, epoch), exactly once within each source per pass, exact ``len``, exact
resume (JSON checkpoint, also after a source started its next pass and at another world size),
per-source counts in ``stats()``; packed tokens and image rows alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flightfeed.client import ConfigError, FlightDataset, Mixture, MixtureDataset, Pack, ReadOptions, StaleState
from flightfeed.client._mix_plan import BLOCK, source_steps
from flightfeed.server.testing import running_server
from tests.support.datasets import write_dataset
from tests.support.token_corpus import STRIDE, doc_tokens, write_token_corpus

SEQ = 8
SOURCES = {"web": (0, [[120]]), "code": (10_000, [[40]]), "books": (20_000, [[12]])}
WEIGHTS = {"web": 0.7, "code": 0.2, "books": 0.1}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for k, (name, (base, shards)) in enumerate(SOURCES.items()):
        out[name] = write_token_corpus(root / name, shards, seed=k, max_len=30, base=base)
    out["_root"] = np.asarray([str(root)])
    return out


@pytest.fixture(scope="module")
def server(corpora: dict[str, np.ndarray]) -> Iterator[Any]:
    root = Path(str(corpora["_root"][0]))
    with running_server({n: str(root / n) for n in SOURCES}) as srv:
        yield srv


def _mix(location: str, mixture: Mixture, rank: int = 0, world: int = 1, seed: int = 3) -> FlightDataset:
    opts = ReadOptions(pack=Pack(seq_len=SEQ, pad_tail=True, pad_id=-1), report_interval=None, streams=2)
    return FlightDataset(location, mixture, batch_size=2, seed=seed, rank=rank, world_size=world, options=opts)


def _source_of(batch: dict[str, Any]) -> str:
    first = int(batch["tokens"][0][0])
    doc = first // STRIDE
    return "books" if doc >= 20_000 else "code" if doc >= 10_000 else "web"


def _arrays(batches: list[dict[str, Any]]) -> list[np.ndarray]:
    return [b["tokens"].numpy().copy() for b in batches]


def test_schedule_has_exact_weights_per_block_and_is_pure() -> None:
    mix = Mixture(WEIGHTS)
    steps = source_steps(mix, 7, 0, 0, 2 * BLOCK)
    for b in range(2):
        counts = np.bincount(steps[b * BLOCK : (b + 1) * BLOCK], minlength=3).tolist()
        assert counts == [2867, 819, 410]  # 70/20/10 of 4,096, largest remainders
    np.testing.assert_array_equal(source_steps(mix, 7, 0, 1000, 5000), steps[1000:5000])  # random access
    assert not np.array_equal(source_steps(mix, 7, 1, 0, BLOCK), steps[:BLOCK])  # a new order each epoch
    assert not np.array_equal(source_steps(mix, 8, 0, 0, BLOCK), steps[:BLOCK])


def test_epoch_until_a_source_each_pass_exactly_once(server: Any, corpora: dict[str, np.ndarray]) -> None:
    ds = _mix(server.location, Mixture(WEIGHTS, until="web"))
    assert isinstance(ds, FlightDataset) and isinstance(ds, MixtureDataset)
    batches = list(ds)
    assert len(ds) == len(batches)
    by_source: dict[str, list[np.ndarray]] = {n: [] for n in SOURCES}
    for b in batches:
        by_source[_source_of(b)].append(b["tokens"].numpy())
    stats = ds.stats()
    for name, (base, _) in SOURCES.items():
        assert stats[f"{name}.batches"] == len(by_source[name])
        lengths = corpora[name]
        expected = np.sort(np.concatenate([doc_tokens(base + d, int(n)) for d, n in enumerate(lengths)]))
        per_pass = -(-len(expected) // SEQ)  # windows of one pass (pad_tail)
        windows = np.concatenate(by_source[name])
        passes = [windows[k : k + per_pass] for k in range(0, len(windows), per_pass)]
        full = [p for p in passes if len(p) == per_pass]
        assert len(full) == len(windows) // per_pass and int(stats[f"{name}.passes"]) == len(passes)
        for p in full:  # every token of the source an input exactly once per pass
            inputs = p[:, :-1].ravel()
            np.testing.assert_array_equal(np.sort(inputs[inputs != -1]), expected)
        if name == "books":
            assert len(full) >= 2 and not np.array_equal(full[0], full[1])  # each pass its own order
    assert stats["web.passes"] == 1 and len(np.concatenate(by_source["web"])) == -(-int(corpora["web"].sum()) // SEQ)


def test_deterministic_and_epochs_differ(server: Any) -> None:
    mix = Mixture(WEIGHTS)
    a = _arrays(list(_mix(server.location, mix)))
    b = _arrays(list(_mix(server.location, mix)))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    other = _mix(server.location, mix)
    other.set_epoch(1)
    c = _arrays(list(other))
    assert len(c) != len(a) or not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("mixture", [Mixture(WEIGHTS, until="web"), Mixture(WEIGHTS, batches=150), Mixture(WEIGHTS)])
def test_resume_is_exact(server: Any, mixture: Mixture) -> None:
    full = _arrays(list(_mix(server.location, mixture)))
    ds = _mix(server.location, mixture)
    assert len(ds) == len(full)
    it: Any = iter(ds)
    # books (12 documents) has started a later pass by step 97 in until="web" and batches=150
    head = min(97, len(full) // 2)
    for _ in range(head):
        next(it)
    state = json.loads(json.dumps(ds.state_dict()))
    it.close()
    again = _mix(server.location, mixture)
    again.load_state_dict(state)
    assert len(again) == len(full)
    rest = _arrays(list(again))
    assert len(rest) == len(full) - head
    assert all(np.array_equal(x, y) for x, y in zip(rest, full[head:], strict=True))
    with pytest.raises(StaleState, match="another mixture"):
        _mix(server.location, Mixture({"web": 0.5, "code": 0.5})).load_state_dict(state)


def test_resume_from_two_ranks_at_three(server: Any) -> None:
    mixture = Mixture(WEIGHTS, batches=40)

    def reader(rank: int, world: int) -> FlightDataset:
        opts = ReadOptions(pack=Pack(seq_len=SEQ), report_interval=None, streams=2)
        return FlightDataset(server.location, mixture, batch_size=2, seed=3, rank=rank, world_size=world,
                             drop_last=True, options=opts)

    states, head = [], []
    for r in range(2):
        ds = reader(r, 2)
        it: Any = iter(ds)
        head.append([next(it) for _ in range(15)])
        states.append(ds.state_dict())
        it.close()
    rest = []
    for r in range(3):
        ds = reader(r, 3)
        ds.load_state_dict(states[r % 2])  # every rank's checkpoint says the same consumed prefix
        rest.append(list(ds))
    assert [len(x) for x in rest] == [25, 25, 25]

    def in_global_order(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return [per_rank[r][i] for i in range(len(per_rank[0])) for r in range(len(per_rank))]

    mixed = in_global_order(head) + in_global_order(rest)
    for name in ("web", "code"):  # both stay within their first pass: one source's windows, in order
        got = np.concatenate([b["tokens"].numpy() for b in mixed if _source_of(b) == name])
        alone = FlightDataset(server.location, name, batch_size=2, seed=3,
                              options=ReadOptions(pack=Pack(seq_len=SEQ), report_interval=None))
        want = np.concatenate([b["tokens"].numpy() for b in alone])  # the source's epoch 0 = pass 0 of epoch 0
        np.testing.assert_array_equal(got, want[: len(got)])


def test_image_rows_mix_by_budget(tmp_path: Path) -> None:
    write_dataset(tmp_path / "a", [[50]])
    write_dataset(tmp_path / "b", [[30]])
    with running_server({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}) as srv:
        ds = FlightDataset(srv.location, Mixture({"a": 1, "b": 1}, batches=20), batch_size=5, seed=1,
                           options=ReadOptions(report_interval=None))
        batches = list(ds)
        assert len(ds) == len(batches) == 20
        stats = ds.stats()
        assert all(type(stats[f"{n}.{c}"]) is int for n in "ab" for c in ("batches", "rows", "passes"))
        assert type(stats["rows"]) is int and type(stats["stall_ratio"]) is float
        assert stats["a.batches"] + stats["b.batches"] == 20
        assert stats["a.rows"] + stats["b.rows"] == 100
        assert all(b["image"].shape[1:] == (4, 4, 3) for b in batches)
        # which source: "a" and "b" rows carry the same index column, so tell them apart by position
        ref = FlightDataset(srv.location, Mixture({"a": 1, "b": 1}, batches=20), batch_size=5, seed=1,
                            options=ReadOptions(report_interval=None))
        steps = source_steps(ref.mixture, 1, 0, 0, 20).tolist()  # type: ignore[attr-defined]
        for k, (name, rows) in enumerate([("a", 50), ("b", 30)]):
            seen = [i for s, b in zip(steps, batches, strict=True) if s == k for i in b["index"].tolist()]
            assert len(seen) == stats[f"{name}.rows"]
            for lo in range(0, len(seen), rows):  # each pass: every row once (the last may be partial)
                chunk = seen[lo : lo + rows]
                assert len(set(chunk)) == len(chunk) and set(chunk) <= set(range(rows))
                if len(chunk) == rows:
                    assert sorted(chunk) == list(range(rows))


def test_refusals() -> None:
    with pytest.raises(ConfigError, match="weight"):
        Mixture({"a": 0})
    with pytest.raises(ConfigError, match="until"):
        Mixture({"a": 1}, until="b")
    with pytest.raises(ConfigError, match="not both"):
        Mixture({"a": 1}, until="a", batches=3)


@pytest.mark.parametrize("mixture", [Mixture(WEIGHTS), Mixture(WEIGHTS, until="web")])
@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_ends_the_epoch_at_the_same_step(server: Any, mixture: Mixture, world: int) -> None:
    """Lockstep ranks (DDP) must agree on the epoch's length: a rank that holds one batch more of
    the ending source than another used to run on alone for many steps (the others waited in
    their collectives); now all end where the rank with the fewest batches of it runs out."""
    got, lens = [], []
    with pytest.raises(ConfigError, match="no single class list"):  # not a KeyError
        _ = _mix(server.location, mixture).classes
    for r in range(world):
        ds = _mix(server.location, mixture, rank=r, world=world)
        ds.set_epoch(1)
        lens.append(len(ds))
        assert ds.position == 0
        got.append(list(ds))
        assert ds.position == len(got[-1])  # as for one dataset (it raised AttributeError)
    assert [len(b) for b in got] == lens == [lens[0]] * world
    # the ranks read the same source at every step, and no window twice
    assert all(len({_source_of(got[r][i]) for r in range(world)}) == 1 for i in range(lens[0]))
    windows = [tuple(w) for per_rank in got for b in per_rank for w in b["tokens"].tolist()]
    if mixture.until is None:  # no source starts a second pass
        assert len(windows) == len(set(windows))
