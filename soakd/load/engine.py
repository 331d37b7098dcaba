"""The engine: sends requests (closed or open loop), batches them, runs the model, times each stage.

Threads: one model thread (batcher -> model -> completion; the GPU serialises batches anyway),
and, in open loop, one arrivals thread. Counters that cross threads are each written by one
thread only (``_sent`` by the sender, ``_done`` by the model thread), so the hot path takes no
lock of its own beyond the batcher's.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from soakd.config import Config
from soakd.load.arrivals import schedule
from soakd.load.batcher import Batcher
from soakd.load.request import Request
from soakd.telemetry.catalogue import OUTCOMES, Metrics
from soakd.telemetry.histogram import HistSnapshot

log = logging.getLogger("soakd.engine")

# Open loop needs the arrivals thread to get the GIL back promptly after its sleep; the
# default 5 ms switch interval would put up to 5 ms of lag on every send.
_OPEN_LOOP_SWITCH_INTERVAL = 0.0005


class Source(Protocol):
    def next(self) -> tuple[Any, Any]: ...


@dataclass
class EngineStats:
    """A consistent read of the engine's state for status lines, /status and the summary."""

    elapsed: float
    completed: dict[str, int]
    stages: dict[str, HistSnapshot]
    lag: HistSnapshot
    inflight: int
    queued: int


def _is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


class Engine:
    def __init__(
        self,
        fn: Callable[[torch.Tensor], Any],
        device: torch.device,
        source: Source,
        cfg: Config,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.fn = fn
        self.device = device
        self.source = source
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.batcher = Batcher(cfg.batcher.max_batch_size, cfg.batcher.max_queue_delay_ms / 1e3)
        self.stop_event = threading.Event()  # no new requests
        self._abort = threading.Event()  # model thread: leave now
        self._sent = 0  # written by the sending thread only
        self._done = 0  # written by the model thread only
        self._dropped = 0
        self._batch_counts = np.zeros(cfg.batcher.max_batch_size + 1, dtype=np.int64)
        self._hist = {s: metrics.request_duration.labels(s) for s in ("e2e", "queue", "inference")}
        self._lag = metrics.schedule_lag.labels("")
        self._outcome = {o: metrics.requests.labels(o) for o in OUTCOMES}
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._counts_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._errors_logged: set[str] = set()
        self.started_at = 0.0
        self.last_completion = 0.0
        self._old_switch = sys.getswitchinterval()
        self.last_progress = time.monotonic()  # for the watchdog: the last batch that finished
        # Optional per-batch hook (size, dispatch time, end time, outcome), e.g. OTLP batch spans;
        # None when unused so the hot path pays one comparison.
        self.batch_hook: Callable[[int, float, float, str], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def open_loop(self) -> bool:
        return self.cfg.load.rate is not None

    def start(self) -> None:
        self.started_at = self.last_completion = self.clock()
        model = threading.Thread(target=self._model_loop, name="soakd-model", daemon=True)
        self._threads.append(model)
        if self.open_loop:
            sys.setswitchinterval(_OPEN_LOOP_SWITCH_INTERVAL)
            self._threads.append(threading.Thread(target=self._arrivals_loop, name="soakd-arrivals", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self, drain_timeout: float | None = None) -> bool:
        """Stop sending, let in-flight requests finish (up to ``drain_timeout``); True if drained."""
        timeout = self.cfg.load.drain_timeout if drain_timeout is None else drain_timeout
        self.stop_event.set()
        for t in self._threads:
            if t.name == "soakd-arrivals":
                t.join()
        self.batcher.close()
        deadline = time.monotonic() + timeout
        while self.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        drained = self.inflight == 0
        self._abort.set()
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
        sys.setswitchinterval(self._old_switch)
        return drained

    @property
    def inflight(self) -> int:
        return self._sent - self._done

    # ------------------------------------------------------------------ sending

    def _new_requests(self, n: int, intended: float | None = None) -> list[Request]:
        now = self.clock()
        out = []
        for _ in range(n):
            key, tensor = self.source.next()
            out.append(Request(now if intended is None else intended, now, key, tensor))
        return out

    def _arrivals_loop(self) -> None:
        ld = self.cfg.load
        assert ld.rate is not None
        times = schedule(self.started_at, ld.rate, ld.arrival, ld.burstiness, ld.seed)
        cap = ld.max_inflight
        next_t = next(times)
        lags: list[float] = []
        dropped = 0
        last_flush = self.clock()
        source, clock, batcher = self.source, self.clock, self.batcher
        while not self.stop_event.is_set():
            now = clock()
            if next_t > now:
                wait = next_t - now
                time.sleep(wait if wait < 0.05 else 0.05)
                continue
            due: list[Request] = []
            while next_t <= now:
                lags.append(now - next_t)
                if self._sent + len(due) - self._done >= cap:
                    dropped += 1
                else:
                    key, tensor = source.next()
                    due.append(Request(next_t, now, key, tensor))
                next_t = next(times)
            if due:
                self._sent += len(due)
                if len(due) == 1:
                    batcher.put(due[0])
                else:
                    batcher.put_many(due)
            if len(lags) >= 256 or now - last_flush > 0.1:
                self._lag.observe_many(lags)
                lags = []
                if dropped:
                    self._count("dropped", dropped)
                    dropped = 0
                last_flush = now
        self._lag.observe_many(lags)
        if dropped:
            self._count("dropped", dropped)

    # ------------------------------------------------------------------ model thread

    def _model_loop(self) -> None:
        if not self.open_loop:
            assert self.cfg.load.concurrency is not None
            reqs = self._new_requests(self.cfg.load.concurrency)
            self._sent += len(reqs)
            self.batcher.put_many(reqs)
        device, cuda = self.device, self.device.type == "cuda"
        timeout = self.cfg.batcher.inference_timeout
        while not self._abort.is_set():
            batch = self.batcher.take(0.05)
            if not batch:
                continue
            t_dispatch = self.clock()
            outcome = "ok"
            try:
                if len(batch) == 1:
                    x = batch[0].tensor.unsqueeze(0)
                else:
                    x = torch.stack([r.tensor for r in batch])
                x = x.to(device, non_blocking=True)
                with torch.inference_mode():
                    self.fn(x)
                if cuda:
                    torch.cuda.synchronize(device)
            except Exception as exc:  # the soak goes on; the outcome says what happened
                outcome = "oom" if _is_oom(exc) else "error"
                self._log_error_once(exc)
            t_end = self.clock()
            if outcome == "ok" and timeout is not None and t_end - t_dispatch > timeout:
                outcome = "timeout"
            self._complete(batch, t_dispatch, t_end, outcome)

    def _complete(self, batch: list[Request], t_dispatch: float, t_end: float, outcome: str) -> None:
        n = len(batch)
        # Latency is recorded for requests that got an answer (ok, or too late); errors fail fast
        # and would flatter the percentiles.
        if outcome in ("ok", "timeout"):
            self._hist["queue"].observe_many([t_dispatch - r.enqueued for r in batch])
            self._hist["e2e"].observe_many([t_end - r.intended for r in batch])
            self._hist["inference"].observe_many(np.full(n, t_end - t_dispatch))
        self.metrics.batch_size.observe(n)
        if self.batch_hook is not None:
            self.batch_hook(n, t_dispatch, t_end, outcome)
        self._batch_counts[n] += 1
        self._count(outcome, n)
        self.last_completion = t_end
        self.last_progress = time.monotonic()
        if not self.open_loop and not self.stop_event.is_set():
            reqs = self._new_requests(n)
            self._sent += n
            self.batcher.put_many(reqs)
        self._done += n
        self.metrics.queue_depth.set(len(self.batcher))
        self.metrics.inflight.set(self._sent - self._done)

    def _count(self, outcome: str, n: int) -> None:
        self._outcome[outcome].inc(n)
        with self._counts_lock:
            self._counts[outcome] += n

    def _log_error_once(self, exc: BaseException) -> None:
        kind = type(exc).__name__
        if kind not in self._errors_logged:
            self._errors_logged.add(kind)
            log.error("model raised %s: %s (further %s errors are counted, not logged)", kind, exc, kind)

    # ------------------------------------------------------------------ reading

    def stats(self) -> EngineStats:
        with self._counts_lock:
            counts = dict(self._counts)
        end = self.last_completion if self.stop_event.is_set() else self.clock()
        return EngineStats(
            elapsed=max(1e-9, end - self.started_at),
            completed=counts,
            stages={s: h.snapshot() for s, h in self._hist.items()},
            lag=self._lag.snapshot(),
            inflight=self.inflight,
            queued=len(self.batcher),
        )

    def batch_size_summary(self) -> dict[str, float]:
        counts = self._batch_counts.copy()
        total = int(counts.sum())
        if total == 0:
            return {"batches": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
        sizes = np.arange(len(counts))
        cum = np.cumsum(counts)
        return {
            "batches": total,
            "mean": float((sizes * counts).sum() / total),
            "p50": float(np.searchsorted(cum, 0.5 * total)),
            "p99": float(np.searchsorted(cum, 0.99 * total)),
            "max": float(sizes[counts > 0].max()),
        }
