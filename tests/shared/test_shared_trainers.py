"""Identical trainers over one real server: solo bytes for everyone, every message made once,
late joiners and resumed checkpoints exact, a slow trainer never holding back a fast one, the
window within its bound, ``share_window=0`` sharing nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow.flight as flight
import pytest

from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, Shuffle
from tests.shared.conftest import JOBS, Serve, counter, digests, job_messages, reader

HITS, MISSES = "flightfeed_shared_hits_total", "flightfeed_shared_misses_total"


def together(location: str, name: str, n: int, **kw: Any) -> list[list[str]]:
    """``n`` identical trainers (threads) started together; each one's batch digests."""
    out: list[list[str]] = [[] for _ in range(n)]
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def train(i: int) -> None:
        try:
            ds = reader(location, name, **kw)
            start.wait()
            out[i] = digests(ds)
            ds.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return out


@pytest.mark.parametrize("name", list(JOBS))
def test_identical_trainers_get_solo_bytes_and_each_message_is_made_once(
    serve: Serve, solo: dict[str, list[str]], name: str
) -> None:
    messages = job_messages(name)
    with serve(64 << 20) as srv:  # the window holds the whole epoch
        got = together(srv.location, name, 3)
        assert all(g == solo[name] for g in got)  # byte-identical to a solo run, batch by batch
        assert counter(srv, MISSES, name) == messages  # each message made once...
        assert counter(srv, HITS, name) == 2 * messages  # ...and served to the two others
        assert counter(srv, "flightfeed_shared_bytes_served_total", name) > 0
        # a trainer joining after the others finished (another stream count): served from the window
        late = reader(srv.location, name, streams=3)
        assert digests(late) == solo[name]
        assert counter(srv, MISSES, name) == messages and counter(srv, HITS, name) == 3 * messages


def test_moving_work_still_shares(serve: Serve, solo: dict[str, list[str]]) -> None:
    """With work free to move between streams (the default), identical trainers still get the solo
    bytes and each message is made once on a single node; a stolen run's next message may be sent
    twice (a hit more), never made twice."""
    messages = job_messages("imgs")
    with serve(64 << 20) as srv:
        got = together(srv.location, "imgs", 3, move=True)
        assert all(g == solo["imgs"] for g in got)
        assert counter(srv, MISSES, "imgs") == messages
        assert counter(srv, HITS, "imgs") >= 2 * messages


@pytest.mark.parametrize("cut", [2, 3])
def test_a_resumed_trainer_gets_the_solo_bytes(serve: Serve, solo: dict[str, list[str]], cut: int) -> None:
    """``cut`` batches read before the checkpoint: 2 = one whole message (the resumed trainer's
    messages are the window's), 3 = mid-message (its messages are cut elsewhere: made anew)."""
    messages = job_messages("imgs")
    with serve(64 << 20) as srv:
        first = reader(srv.location, "imgs")
        it = iter(first)
        head = [next(it) for _ in range(cut)]
        state = first.state_dict()
        del it
        first.close()
        other = together(srv.location, "imgs", 1)[0]  # a trainer from the start meanwhile
        resumed = reader(srv.location, "imgs", streams=1)
        resumed.load_state_dict(state)
        assert digests(head) + digests(resumed) == solo["imgs"] and other == solo["imgs"]
        if cut == 2:
            assert counter(srv, MISSES, "imgs") == messages  # everything it read was shared
        else:
            assert counter(srv, MISSES, "imgs") > messages


def test_a_slow_trainer_does_not_hold_back_a_fast_one(serve: Serve, solo: dict[str, list[str]]) -> None:
    limit = 40_000  # one message (16 x 24x24x3 images): the parked trainer falls out of the window
    with serve(limit) as srv:
        parked = threading.Event()
        resume = threading.Event()
        slow: list[Any] = []
        errors: list[BaseException] = []

        def slow_trainer() -> None:
            try:
                # window_bytes=0: at most streams x (prefetch + 1) messages fetched ahead, so the parked
                # trainer cannot hold the whole (small) epoch before the fast one starts
                for k, batch in enumerate(reader(srv.location, "imgs", window_bytes=0)):
                    slow.append(batch)
                    if k == 1:
                        parked.set()
                        assert resume.wait(timeout=300)  # a slow consumer, parked mid-epoch
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=slow_trainer)
        t.start()
        assert parked.wait(timeout=120)
        fast = digests(reader(srv.location, "imgs"))  # runs to its end while the slow one is parked
        behind = len(slow)
        resume.set()
        t.join(timeout=300)
        assert not errors, errors
        assert behind == 2 < len(solo["imgs"])  # the fast one finished while the slow one was behind
        assert fast == solo["imgs"] and digests(slow) == solo["imgs"]  # every batch exactly once, in order
        # every message made at least once; whether the slow one had to make any again depends on how
        # much of its (small) epoch gRPC's transport took in while it was parked (the flow-control
        # window grows by itself): in 1 clean run of 4 its server stream kept pace with the fast one,
        # each message was made once and hit by the other (misses == messages). Its bytes above are
        # exact either way; the window's evictions and bound are checked below
        assert counter(srv, MISSES, "imgs") >= job_messages("imgs")
        assert counter(srv, "flightfeed_shared_evictions_total") > 0
        assert srv.server.share_window.peak_bytes <= limit


def test_the_window_stays_within_its_bound(serve: Serve, solo: dict[str, list[str]]) -> None:
    limit = 60_000
    with serve(limit) as srv:
        seen: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                seen.append(counter(srv, "flightfeed_shared_window_bytes"))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            got = together(srv.location, "imgs", 3, streams=3)
            got += together(srv.location, "small", 2)
        finally:
            stop.set()
            sampler.join()
        assert got[:3] == [solo["imgs"]] * 3 and got[3:] == [solo["small"]] * 2
        assert seen and 0 < max(seen) <= limit
        assert srv.server.share_window.peak_bytes <= limit
        assert counter(srv, "flightfeed_shared_evictions_total") > 0
        assert counter(srv, "flightfeed_shared_window_limit_bytes") == limit


def test_share_window_zero_turns_sharing_off(serve: Serve, solo: dict[str, list[str]]) -> None:
    with serve(0) as srv:
        got = together(srv.location, "imgs", 2)
        assert got == [solo["imgs"]] * 2
        assert counter(srv, HITS, "imgs") == 0 and counter(srv, MISSES, "imgs") == 0
        assert counter(srv, "flightfeed_shared_window_bytes") == 0
        shared = metrics_snapshot(srv.metrics, include_prometheus=False)["shared"]
        assert shared["limit"] == 0 and shared["hits"] == 0 and shared["entries"] == 0
        # two streams decoded every image each
        decoded = counter(srv, "flightfeed_rows_decoded_total", "imgs")
        assert decoded == 2 * len(solo["imgs"]) * JOBS["imgs"]["batch_size"]


def test_trainers_per_shared_stream_in_metrics_and_stats(serve: Serve) -> None:
    with serve(64 << 20) as srv:
        server = srv.server
        cmd = ReadCommand(version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=8, streams=1,
                          num_workers=1, seed=3, message_rows=8, shuffle=Shuffle(enabled=True))
        info = server.get_flight_info(None, flight.FlightDescriptor.for_command(cmd.SerializeToString()))
        streams = [server.open_ticket(None, info.endpoints[0].ticket)[2] for _ in range(3)]  # three trainers
        firsts = [next(s) for s in streams]
        assert server.share_window.trainers() == {"small": 3}
        text = srv.metrics.prometheus_text().decode()
        assert 'flightfeed_shared_stream_trainers{dataset="small"} 3.0' in text
        shared = metrics_snapshot(srv.metrics, include_prometheus=False)["shared"]
        assert shared["trainers"] == 3 and shared["datasets"]["small"]["trainers"] == 3
        # each stream gathers its next message while this one is sent (read-ahead): count at the end
        rest = [[b for b in s] for s in streams]
        indices = [[b.column("index").to_pylist() for b in r] for r in rest]
        assert indices[0] == indices[1] == indices[2]
        made = 1 + len(rest[0])  # messages of one stream: each made once, served twice more
        made_bytes = firsts[0].nbytes + sum(b.nbytes for b in rest[0])
        text = srv.metrics.prometheus_text().decode()
        assert f'flightfeed_shared_hits_total{{dataset="small"}} {2.0 * made}' in text
        shared = metrics_snapshot(srv.metrics, include_prometheus=False)["shared"]
        assert shared["hits"] == 2 * made and shared["misses"] == made
        assert shared["bytes_served"] == 2 * made_bytes and shared["hit_ratio"] == pytest.approx(2 / 3)
        assert server.share_window.trainers() == {}  # the streams ended


VARIANTS: list[dict[str, Any]] = [
    {"epoch": 1},
    {"seed": 4},
    {"transform": [{"name": "decode"}, {"name": "random_resized_crop", "size": 24, "scale": [0.5, 1]},
                   {"name": "hflip"}]},
    {"rank": 1, "world_size": 2},
    {"columns": ["image", "index"]},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v))
def test_a_request_that_differs_in_anything_is_not_served_the_others_messages(
    serve: Serve, solo: dict[str, list[str]], variant: dict[str, Any]
) -> None:
    kw = dict(variant)
    epoch = kw.pop("epoch", 0)

    def read(location: str) -> list[str]:
        ds = reader(location, "imgs", **kw)
        ds.set_epoch(epoch)
        got = digests(ds)
        ds.close()
        return got

    with serve(0) as alone:
        want = read(alone.location)
    with serve(64 << 20) as srv:
        assert together(srv.location, "imgs", 1)[0] == solo["imgs"]  # the window holds that job's epoch
        misses = counter(srv, MISSES, "imgs")
        assert read(srv.location) == want != solo["imgs"]
        assert counter(srv, HITS, "imgs") == 0 and counter(srv, MISSES, "imgs") > misses  # made its own
