"""Worker threads that own every call into a model: warm-up, the offline probe and the soak.

A model warmed up on one thread and run on another can run at half speed on a CPU (with
OpenMP, each calling thread gets its own team of intra-op workers, and the teams fight over
the cores), so the target keeps its threads for the whole run and hands them jobs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger("soakd.target")

T = TypeVar("T")
_POLL_S = 0.1  # the caller wakes this often while it waits, so SIGTERM handlers run promptly

Job = tuple[Callable[[int], Any], "Future[Any]", bool]  # (fn, its future, is it the served loop)


class WorkerThreads:
    """``n`` daemon threads, each running the jobs handed to it in order. ``init(i)`` runs first
    on thread ``i`` (thread-local settings such as torch's intra-op thread count)."""

    def __init__(self, n: int, name: str, init: Callable[[int], None] | None = None) -> None:
        self.n = max(1, n)
        self.name = name
        self.init = init
        self._queues: list[queue.SimpleQueue[Job | None]] = [queue.SimpleQueue() for _ in range(self.n)]
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"{name}-{i}", daemon=True) for i in range(self.n)
        ]
        self._served: list[Future[Any]] = []
        self._started = False
        self.died: BaseException | None = None

    def start(self) -> None:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def submit_all(self, fn: Callable[[int], T], *, served: bool = False) -> list[Future[T]]:
        self.start()
        futures: list[Future[T]] = []
        for q in self._queues:
            fut: Future[T] = Future()
            q.put((fn, fut, served))
            futures.append(fut)
        return futures

    def call_all(self, fn: Callable[[int], T]) -> list[T]:
        """``fn(i)`` on every thread; waits in short steps (signal handlers keep running on the
        main thread) and re-raises the first error."""
        futures = self.submit_all(fn)
        for fut in futures:
            while True:
                try:
                    fut.result(timeout=_POLL_S)
                    break
                except TimeoutError:
                    continue
                except BaseException:
                    break
        return [fut.result() for fut in futures]

    def serve(self, loop: Callable[[int], None]) -> None:
        self._served = self.submit_all(loop, served=True)

    def join(self, timeout: float) -> bool:
        """Wait for the served loops to return (or fail); True when all have."""
        deadline = time.monotonic() + timeout
        for fut in self._served:
            try:
                fut.exception(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False
        return True

    def close(self, timeout: float = 5.0) -> None:
        for q in self._queues:
            q.put(None)
        # Wait for idle threads to leave torch: one still tearing down its OpenMP pool when the
        # interpreter exits aborts the process ("terminate called without an active exception").
        deadline = time.monotonic() + timeout  # one budget: a hung model must not hold the exit for long
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def _work(self, i: int) -> None:
        if self.init is not None:
            self.init(i)
        q = self._queues[i]
        while True:
            job = q.get()
            if job is None:
                return
            fn, fut, served = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(i))
            except BaseException as exc:  # incl. SystemExit from user code: the caller decides
                fut.set_exception(exc)
                if served:
                    self.died = exc
                    log.error("%s-%d ended: %s: %s", self.name, i, type(exc).__name__, exc)
