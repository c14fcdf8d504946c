"""Block verification runs in parallel: threads verifying different blocks of one shard hash at
the same time, a block two threads want is hashed once, and a bad block fails every reader."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flightfeed.server.readers.blocks import BlockCheck, BlockSums, hash_block
from flightfeed.wire.errors import ShardError

SIZE = 4096


def _check(data: bytes, read: Any) -> BlockCheck:
    hashes = tuple(hash_block(data[i : i + SIZE]) for i in range(0, len(data), SIZE))
    return BlockCheck(BlockSums(SIZE, hashes), len(data), read, "part-0.arrow")


def _run(*targets: Any) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_different_blocks_of_one_shard_are_hashed_at_once() -> None:
    data = bytes(range(256)) * (3 * SIZE // 256)
    both_reading = threading.Barrier(2, timeout=20)  # broken if the hashes run one after another

    def read(lo: int, hi: int) -> bytes:
        if lo < 2 * SIZE:
            both_reading.wait()
        return data[lo:hi]

    check = _check(data, read)
    errors = _run(lambda: check.ensure(0, 10), lambda: check.ensure(SIZE, SIZE + 10))
    assert not errors, errors
    assert check.verified == 2


def test_a_block_wanted_by_two_threads_is_hashed_once() -> None:
    data = b"x" * (2 * SIZE)
    started, release = threading.Event(), threading.Event()
    reads: list[int] = []

    def read(lo: int, hi: int) -> bytes:
        reads.append(lo)
        started.set()
        release.wait(20)
        return data[lo:hi]

    check = _check(data, read)
    first = threading.Thread(target=check.ensure, args=(0, 10))
    first.start()
    assert started.wait(20)
    waiter = threading.Thread(target=check.ensure, args=(5, 20))
    waiter.start()
    release.set()
    first.join()
    waiter.join()
    assert reads == [0]
    check.ensure_all()
    assert check.complete and check.verified == 2


def test_a_bad_block_fails_every_thread_that_needs_it() -> None:
    data = bytearray(b"y" * (2 * SIZE))
    check = _check(bytes(data), lambda lo, hi: bytes(data[lo:hi]))
    data[SIZE + 3] ^= 0xFF
    errors = _run(*[lambda: check.ensure(SIZE, SIZE + 1)] * 4)
    assert len(errors) == 4 and all(isinstance(e, ShardError) for e in errors)
    check.ensure(0, 1)  # the good block still serves
    with pytest.raises(ShardError, match="block 1"):
        check.ensure_all()


def test_whole_shard_hashes_run_in_parallel(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards without block checksums are hashed whole, several at once (``verify_now`` and the
    lazy background hashes): two hashes must be in progress together for either to finish."""
    from flightfeed.server.storage import open_dataset, verify
    from flightfeed.server.storage.cache.files import sha256_file
    from flightfeed.server.storage.verify import ShardVerifier
    from tests.support.datasets import write_dataset

    write_dataset(tmp_path, [[10], [10]])
    ds = open_dataset("two", str(tmp_path))
    paths = sorted(str(p) for p in tmp_path.glob("*.arrow"))
    both = threading.Barrier(2, timeout=20)  # broken if the shards are hashed one after another

    def hashed(path: str) -> str:
        both.wait()
        return sha256_file(path)

    monkeypatch.setattr(verify, "sha256_file", hashed)
    expected = {i: (p, sha256_file(p)) for i, p in enumerate(paths)}
    verifier = ShardVerifier(ds, expected, None)
    verifier.max_threads = 2
    verifier.verify_now()
    assert verifier.verified == {0, 1}
    ds.close()


def test_a_waiter_hashes_the_block_itself_when_the_other_hash_fails() -> None:
    """A thread that needs a block another thread is hashing waits for it (on the check's one
    condition); when that hash fails (the file went away under it), the waiter wakes and hashes
    the block itself."""
    data = b"z" * (2 * SIZE)
    started, fail, waiting = threading.Event(), threading.Event(), threading.Event()
    reads: list[int] = []

    def read(lo: int, hi: int) -> bytes:
        reads.append(lo)
        if len(reads) == 1:
            started.set()
            assert fail.wait(20)
            raise OSError("the file was closed")
        return data[lo:hi]

    check = _check(data, read)
    wait = check._done.wait

    def announced_wait(timeout: float | None = None) -> bool:
        waiting.set()
        return wait(timeout)

    check._done.wait = announced_wait  # type: ignore[method-assign]
    first_errors: list[BaseException] = []
    first = threading.Thread(target=lambda: first_errors.extend(_run(lambda: check.ensure(0, 10))))
    first.start()
    assert started.wait(20)
    waiter_errors: list[BaseException] = []
    waiter = threading.Thread(target=lambda: waiter_errors.extend(_run(lambda: check.ensure(5, 20))))
    waiter.start()
    assert waiting.wait(20)  # the waiter is blocked on the block the first thread is hashing
    fail.set()
    first.join()
    waiter.join()
    assert [type(e) for e in first_errors] == [OSError] and not waiter_errors
    assert reads == [0, 0] and check.verified == 1
