"""The pipeline stages around the model: a preprocess worker pool before the batcher and a
postprocess thread after the model, each timing its own stage.

Preprocess time counts from when a request is sent until its tensor is ready for the
batcher, so waiting for a free worker is part of it: a CPU-bound pipeline shows up here (and
in the pool's busy ratio), not as a mysteriously slow model. Postprocess time counts from the
end of inference until the batch's responses are encoded, and e2e runs until then too.

There is one postprocess thread: it lets the model thread move on to the next batch, and it
is the only thread that completes requests while it runs, which keeps the engine's ``_done``
counter single-writer.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from soakd.request import Inlet, Request
from soakd.telemetry.histogram import LogHistogram
from soakd.workload.samples import BadSampleLog

if TYPE_CHECKING:
    import torch

# Batch key of requests whose sample could not be preprocessed: they still travel through the
# batcher so that the model thread completes them (and, in closed loop, replaces them).
BAD_INPUT_KEY = object()
BUSY_INTERVAL_S = 1.0


class PreprocessPool:
    """``workers`` threads that turn raw samples into tensors and hand them to the batcher.

    Threads, not processes: Pillow's decode and resize and numpy release the GIL, and a Python
    server that pre-processes in threads is what this measures.
    """

    def __init__(
        self,
        workers: int,
        preprocess: Callable[[Any], tuple[Any, torch.Tensor]],
        batcher: Inlet,
        hist: LogHistogram,
        busy_gauge: Any,
        clock: Callable[[], float] = time.perf_counter,
        bad_log: Callable[[Any, Exception], None] | None = None,
    ) -> None:
        self.workers = workers
        self._preprocess = preprocess
        self._batcher = batcher
        self._hist = hist
        self._gauge = busy_gauge
        self._clock = clock
        self._queue: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        # Per-worker busy seconds and the start of the task in progress (0: idle); each slot
        # is written by its own worker only.
        self._busy = [0.0] * workers
        self._since = [0.0] * workers
        self._log_bad = bad_log or BadSampleLog()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"soakd-preprocess-{i}", daemon=True)
            for i in range(workers)
        ]
        monitor = threading.Thread(target=self._monitor, name="soakd-preprocess-busy", daemon=True)
        self._threads.append(monitor)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        for _ in range(self.workers):
            self._queue.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=2.0)

    def put(self, req: Request) -> None:
        self._queue.put(req)

    def put_many(self, reqs: list[Request]) -> None:
        for req in reqs:
            self._queue.put(req)

    def busy_seconds(self) -> float:
        """Worker-seconds spent preprocessing so far (the task in progress included)."""
        now = self._clock()
        return sum(self._busy) + sum(now - s for s in list(self._since) if s)

    def _work(self, slot: int) -> None:
        clock, pre, batcher, hist = self._clock, self._preprocess, self._batcher, self._hist
        while True:
            req = self._queue.get()
            if req is None:
                return
            t0 = clock()
            self._since[slot] = t0
            # A preprocess source hands out the raw sample in the tensor slot; it becomes the payload.
            req.payload, req.tensor = req.tensor, None
            try:
                req.key, req.tensor = pre(req.payload)
            except Exception as exc:  # BadInput, or a decoder tripping on odd data: never kill the worker
                req.key = BAD_INPUT_KEY
                self._log_bad(req.payload, exc)
            t1 = clock()
            self._busy[slot] += t1 - t0
            self._since[slot] = 0.0
            req.pre_s = t1 - req.sent
            req.enqueued = t1
            if req.key is not BAD_INPUT_KEY:
                hist.observe(req.pre_s)
            batcher.put(req)

    def _monitor(self) -> None:
        prev_t, prev_busy = self._clock(), self.busy_seconds()
        while not self._stop.wait(BUSY_INTERVAL_S):
            now, busy = self._clock(), self.busy_seconds()
            ratio = (busy - prev_busy) / max(1e-9, (now - prev_t) * self.workers)
            self._gauge.set(min(1.0, max(0.0, ratio)))  # a task ending mid-read can blur one edge
            prev_t, prev_busy = now, busy


_Finished = tuple[list[Request], Any, float, float, str]  # batch, output, dispatch, end, outcome
Completion = Callable[[list[Request], float, float, str, float], None]


class PostprocessThread:
    """Post-processes finished batches in order, then completes their requests."""

    def __init__(
        self,
        postprocess: Callable[[Any, int], list[bytes]],
        complete: Completion,
        hist: LogHistogram,
        on_error: Callable[[BaseException], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._postprocess = postprocess
        self._complete = complete
        self._hist = hist
        self._on_error = on_error
        self._clock = clock
        self._queue: queue.SimpleQueue[_Finished | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="soakd-postprocess", daemon=True)
        self.response_bytes = 0  # written by this thread only

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def put(self, batch: list[Request], output: Any, t_dispatch: float, t_end: float, outcome: str) -> None:
        self._queue.put((batch, output, t_dispatch, t_end, outcome))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, output, t_dispatch, t_end, outcome = item
            del item
            if outcome == "ok":
                try:
                    responses = self._postprocess(output, len(batch))
                    self.response_bytes += sum(len(r) for r in responses)
                except Exception as exc:  # the soak goes on; the outcome says what happened
                    outcome = "error"
                    self._on_error(exc)
            del output  # release the model's output (device memory) before the next batch
            t_done = self._clock()
            if outcome == "ok":
                self._hist.observe_many(np.full(len(batch), t_done - t_end))
            self._complete(batch, t_dispatch, t_end, outcome, t_done)
