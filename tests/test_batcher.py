"""The dynamic batcher: full batches under load, the delay bound when idle, one shape per batch."""

from __future__ import annotations

import threading
import time

from soakd.load.batcher import Batcher
from soakd.request import Request


def req(key: object, t: float | None = None) -> Request:
    now = time.perf_counter() if t is None else t
    return Request(now, now, key, None)


def test_full_batch_goes_without_waiting_for_the_delay() -> None:
    """Under load a full batch is handed out at once, even with a long queue delay configured."""
    b = Batcher(max_batch_size=8, max_queue_delay_s=10.0)
    b.put_many([req("a") for _ in range(20)])
    t0 = time.perf_counter()
    sizes = [len(b.take()) for _ in range(2)]
    assert sizes == [8, 8]
    assert time.perf_counter() - t0 < 1.0
    assert len(b) == 4


def test_lone_request_waits_no_longer_than_the_delay() -> None:
    """An idle batcher sends a partial batch once the oldest request has waited max_queue_delay."""
    b = Batcher(max_batch_size=8, max_queue_delay_s=0.05)
    r = req("a")
    b.put(r)
    batch = b.take(timeout=5.0)
    waited = time.perf_counter() - r.enqueued
    assert batch == [r]
    assert 0.05 <= waited < 1.0


def test_zero_delay_sends_immediately() -> None:
    """With no queue delay, whatever is queued goes out as one batch right away."""
    b = Batcher(max_batch_size=8, max_queue_delay_s=0.0)
    b.put_many([req("a") for _ in range(3)])
    assert len(b.take(timeout=5.0)) == 3


def test_batches_hold_one_shape_and_oldest_goes_first() -> None:
    """Requests of different shapes never share a batch; the group with the oldest request goes first."""
    b = Batcher(max_batch_size=4, max_queue_delay_s=0.0)
    t = time.perf_counter()
    small, large = (3, 96, 96), (3, 224, 224)
    b.put_many([req(small, t), req(large, t + 1e-3), req(small, t + 2e-3), req(large, t + 3e-3)])
    first, second = b.take(), b.take()
    assert {r.key for r in first} == {small} and len(first) == 2
    assert {r.key for r in second} == {large} and len(second) == 2


def test_an_emptied_group_queue_is_reused() -> None:
    """A group that empties and comes back gets its old deque again: a new one's first block is a
    glibc malloc on the putting thread (the model thread, in a closed loop), once per request at batch 1."""
    b = Batcher(max_batch_size=1, max_queue_delay_s=0.0)
    b.put(req("a"))
    group = b._groups["a"]
    for _ in range(3):
        assert len(b.take(timeout=1.0)) == 1 and "a" not in b._groups
        b.put(req("a"))
        assert b._groups["a"] is group
    b.put_many([req(k) for k in range(20)])  # many groups: only a few deques are kept when they empty
    while b.take(timeout=0.01):
        pass
    assert len(b._spare) <= 8


def test_arrival_wakes_a_waiting_taker() -> None:
    """A taker blocked on an empty queue gets a request put by another thread."""
    b = Batcher(max_batch_size=2, max_queue_delay_s=0.0)
    got: list[list[Request]] = []
    t = threading.Thread(target=lambda: got.append(b.take(timeout=5.0)))
    t.start()
    time.sleep(0.05)
    b.put(req("a"))
    t.join(5.0)
    assert got and len(got[0]) == 1


def test_close_flushes_partial_batches() -> None:
    """On shutdown, queued requests are handed out without waiting for the delay."""
    b = Batcher(max_batch_size=8, max_queue_delay_s=30.0)
    b.put_many([req("a"), req("a")])
    b.close()
    assert len(b.take(timeout=1.0)) == 2
    assert b.take(timeout=1.0) == []
