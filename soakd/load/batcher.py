"""Dynamic batcher: groups same-shape requests, up to ``max_batch_size``, and never lets the
oldest request wait longer than ``max_queue_delay``.

A group's deque is kept for the next group when it empties, not dropped and made anew: a new
deque's first block (528 bytes) is past pymalloc's limit and comes from glibc's ``malloc``, in the
arena of the thread that puts the request (in a closed loop, the model thread that just finished
one). One small allocation a request there moves where glibc trims the model's own heap, and a
CPU model with large activations then faults them in on every call (docs/model-threads.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable, Iterable

from soakd.request import Request

_SPARE_DEQUES = 8  # emptied deques kept (bounded: a shape mix's groups come and go)


class Batcher:
    def __init__(self, max_batch_size: int, max_queue_delay_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.max_delay = max_queue_delay_s
        self._groups: dict[Hashable, deque[Request]] = {}
        self._spare: list[deque[Request]] = []  # emptied groups' deques, for the next new group
        self._size = 0
        self._closed = False
        # Held directly (``with self._lock``, a C-level context manager); ``_cond`` waits and
        # notifies on the same lock. ``with`` on the Condition itself runs two Python-level
        # methods, per put and per take.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def __len__(self) -> int:
        return self._size

    def _new_group(self, key: Hashable) -> deque[Request]:
        """A queue for ``key`` (under the lock), a spare deque when there is one."""
        group = self._groups[key] = self._spare.pop() if self._spare else deque()
        return group

    def put(self, req: Request) -> None:
        with self._lock:
            group = self._groups.get(req.key)
            if group is None:
                group = self._new_group(req.key)
            group.append(req)
            self._size += 1
            # Wake the taker only when it has something new to decide: the queue was empty
            # (a deadline starts) or a group just filled (no reason to wait any longer).
            if self._size == 1 or len(group) == self.max_batch_size:
                self._cond.notify()

    def put_many(self, reqs: Iterable[Request]) -> None:
        with self._lock:
            for req in reqs:
                group = self._groups.get(req.key)
                if group is None:
                    group = self._new_group(req.key)
                group.append(req)
                self._size += 1
            self._cond.notify()

    def close(self) -> None:
        """Stop waiting for batches to fill: what is queued is handed out at once."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()

    def drain(self) -> list[Request]:
        """Everything still queued, removed (the end of a drain that ran out of time)."""
        with self._lock:
            left = [r for group in self._groups.values() for r in group]
            self._groups.clear()
            self._size = 0
            return left

    def take(self, timeout: float = 0.1) -> list[Request]:
        """Next batch, or ``[]`` when nothing arrived within ``timeout``."""
        with self._lock:
            if self._size >= self.max_batch_size and len(self._groups) == 1:
                # The steady state of a loaded soak with one input shape: a full batch of the only
                # group, taken without reading the clock or scanning (at batch 1 this is every take).
                key, group = next(iter(self._groups.items()))
                return self._pop(key, group, self.max_batch_size)
            give_up = time.perf_counter() + timeout
            while True:
                now = time.perf_counter()
                if self._size == 0:
                    if self._closed or now >= give_up:
                        return []
                    self._cond.wait(give_up - now)
                    continue
                oldest_key, oldest = None, None
                full_key = None
                for key, group in self._groups.items():
                    if not group:
                        continue
                    head = group[0]
                    if oldest is None or head.enqueued < oldest.enqueued:
                        oldest_key, oldest = key, head
                    if len(group) >= self.max_batch_size and (
                        full_key is None or head.enqueued < self._groups[full_key][0].enqueued
                    ):
                        full_key = key
                assert oldest is not None
                deadline = oldest.enqueued + self.max_delay
                if full_key is not None:
                    key = full_key if now < deadline else oldest_key
                elif now >= deadline or self._closed:
                    key = oldest_key
                else:
                    self._cond.wait(deadline - now)
                    continue
                group = self._groups[key]
                return self._pop(key, group, min(len(group), self.max_batch_size))

    def _pop(self, key: Hashable, group: deque[Request], n: int) -> list[Request]:
        """The first ``n`` requests of ``key``'s group, as a batch (under the lock)."""
        batch = [group.popleft()] if n == 1 else [group.popleft() for _ in range(n)]
        if not group:
            del self._groups[key]  # iterating the groups stays O(groups with requests)
            if len(self._spare) < _SPARE_DEQUES:
                self._spare.append(group)
        self._size -= n
        return batch
