"""The engine: sends requests (closed or open loop), batches them, runs the model, times each stage.

Threads: ``batcher.instances`` model threads (batcher -> model -> completion; one by default,
since a GPU serialises batches anyway), and, in open loop, one arrivals thread. Completion
bookkeeping (``_done``, and closed-loop resending) takes one short lock per batch; the open-loop
sender alone writes ``_sent``. With real samples (``load/stages.py``) a preprocess pool
sits before the batcher and one postprocess thread after the model; that thread then does the
completing (and, in closed loop, the resending) in the model thread's place.
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
from soakd.load.arrivals import gaps
from soakd.load.batcher import Batcher
from soakd.load.request import Request
from soakd.load.stages import BAD_INPUT_KEY, PostprocessThread, PreprocessPool, pad_collate
from soakd.telemetry.catalogue import OUTCOMES, Metrics
from soakd.telemetry.histogram import HistSnapshot
from soakd.workload.postprocess import postprocessor

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
        self._sent = 0  # written by the sending thread only (closed loop: under _complete_lock)
        self._done = 0  # written under _complete_lock (model instances, or the postprocess thread)
        self._complete_lock = threading.Lock()
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
        # Target load, changed while running by phases (ramp, probes): read once per completion
        # (closed loop) or per arrival (open loop), written by one scheduler thread.
        self._target = cfg.load.concurrency or 0
        self._rate = cfg.load.rate or 0.0
        # Optional per-batch hook (size, dispatch time, end time, outcome), e.g. OTLP batch spans;
        # None when unused so the hot path pays one comparison.
        self.batch_hook: Callable[[int, float, float, str], None] | None = None
        self._init_request_path()

    # ------------------------------------------------------------------ request path (issue #5)

    def _init_request_path(self) -> None:
        """Preprocess pool, padding and postprocess thread, each None when unused: the synthetic
        path (pre-made tensors, no postprocess) pays one attribute test per batch for them."""
        inp = self.cfg.input
        self._inlet: Batcher | PreprocessPool = self.batcher  # where new requests go
        self.preprocess_pool: PreprocessPool | None = None
        self.postprocess: PostprocessThread | None = None
        self._collate: Callable[[list[Request]], torch.Tensor] | None = pad_collate if inp.pad else None
        self._shapes_seen: set[tuple[int, ...]] = set()
        if getattr(self.source, "needs_preprocess", False):
            self._hist["preprocess"] = self.metrics.request_duration.labels("preprocess")
            self.preprocess_pool = PreprocessPool(
                inp.preprocess_workers, self.source.preprocess, self.batcher,  # type: ignore[attr-defined]
                self._hist["preprocess"], self.metrics.preprocess_busy, self.clock,
                bad_log=getattr(self.source, "bad_log", None),  # the source's: named once per run
            )
            self._inlet = self.preprocess_pool
        post = inp.postprocess
        if post == "auto":
            post = "auto" if self.preprocess_pool is not None else "none"  # auto: with real samples only
        if post != "none":
            self._hist["postprocess"] = self.metrics.request_duration.labels("postprocess")
            self.postprocess = PostprocessThread(
                postprocessor(post), self._complete, self._hist["postprocess"],
                on_error=self._log_error_once, clock=self.clock,
            )

    def _start_request_path(self) -> None:
        for stage in (self.preprocess_pool, self.postprocess):
            if stage is not None:
                stage.start()

    def _close_request_path(self) -> None:
        for stage in (self.preprocess_pool, self.postprocess):
            if stage is not None:
                stage.close()

    def _see_shape(self, x: torch.Tensor) -> None:
        shape = tuple(x.shape[1:])
        if shape not in self._shapes_seen:  # new shapes drive allocator growth: count them
            self._shapes_seen.add(shape)
            self.metrics.distinct_shapes.set(len(self._shapes_seen))

    @property
    def shapes_seen(self) -> int:
        return len(self._shapes_seen)

    # ------------------------------------------------------------------ lifecycle

    @property
    def open_loop(self) -> bool:
        return self.cfg.load.rate is not None

    def set_concurrency(self, n: int) -> None:
        """Closed loop: requests to keep in flight. Raising it sends more at the next completion;
        lowering it lets completions go without a replacement until the count is down to ``n``."""
        self._target = max(1, int(n))

    def set_rate(self, rps: float) -> None:
        """Open loop: the arrivals thread spaces its next arrivals at this rate."""
        if rps <= 0:
            raise ValueError(f"rate must be > 0, got {rps}")
        self._rate = float(rps)

    @property
    def target_load(self) -> float:
        return self._rate if self.open_loop else float(self._target)

    def start(self) -> None:
        self.started_at = self.last_completion = self.clock()
        # Model instances: each thread takes its own batches (torch releases the GIL while it
        # computes); on a CPU several instances can beat one big batch, as in Triton's instance groups.
        for i in range(self.cfg.batcher.instances):
            self._threads.append(threading.Thread(target=self._model_loop, name=f"soakd-model-{i}", daemon=True))
        if self.open_loop:
            sys.setswitchinterval(_OPEN_LOOP_SWITCH_INTERVAL)
            self._threads.append(threading.Thread(target=self._arrivals_loop, name="soakd-arrivals", daemon=True))
        self._start_request_path()
        if not self.open_loop:
            reqs = self._new_requests(self._target)
            self._sent += len(reqs)
            self._inlet.put_many(reqs)
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
        self._close_request_path()
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
        # Gaps of a rate-1 process divided by the current rate: intended times stay anchored to the
        # start (never to when the last request went out), and set_rate() takes effect at once.
        unit = gaps(1.0, ld.arrival, ld.burstiness, ld.seed)
        cap = ld.max_inflight
        next_t = self.started_at + next(unit) / self._rate
        lags: list[float] = []
        dropped = 0
        last_flush = self.clock()
        source, clock, batcher = self.source, self.clock, self._inlet
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
                next_t += next(unit) / self._rate
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
        device, cuda = self.device, self.device.type == "cuda"
        timeout = self.cfg.batcher.inference_timeout
        collate, post = self._collate, self.postprocess
        while not self._abort.is_set():
            batch = self.batcher.take(0.05)
            if not batch:
                continue
            t_dispatch = self.clock()
            if batch[0].key is BAD_INPUT_KEY:  # samples that failed preprocessing: no model call
                if post is not None:
                    post.put(batch, None, t_dispatch, t_dispatch, "bad_input")
                else:
                    self._complete(batch, t_dispatch, t_dispatch, "bad_input")
                continue
            outcome = "ok"
            out = None
            try:
                if collate is not None:
                    x = collate(batch)
                elif len(batch) == 1:
                    x = batch[0].tensor.unsqueeze(0)
                else:
                    x = torch.stack([r.tensor for r in batch])
                self._see_shape(x)
                x = x.to(device, non_blocking=True)
                with torch.inference_mode():
                    out = self.fn(x)
                if cuda:
                    torch.cuda.synchronize(device)
            except Exception as exc:  # the soak goes on; the outcome says what happened
                outcome = "oom" if _is_oom(exc) else "error"
                self._log_error_once(exc)
                if outcome == "oom" and cuda and self.cfg.batcher.empty_cache_on_oom:
                    torch.cuda.empty_cache()  # hand cached blocks back so the next batch can fit
            t_end = self.clock()
            if outcome == "ok" and timeout is not None and t_end - t_dispatch > timeout:
                outcome = "timeout"
            if post is not None:  # it completes the batch once the responses are encoded
                post.put(batch, out, t_dispatch, t_end, outcome)
            else:
                self._complete(batch, t_dispatch, t_end, outcome)
            out = None  # do not hold the output (device memory) while the next batch runs

    def _complete(
        self, batch: list[Request], t_dispatch: float, t_end: float, outcome: str, t_done: float | None = None
    ) -> None:
        """``t_end``: inference ended; ``t_done``: postprocess ended (e2e runs until then)."""
        n = len(batch)
        # Latency is recorded for requests that got an answer (ok, or too late); errors fail fast
        # and would flatter the percentiles.
        if outcome in ("ok", "timeout"):
            self._hist["queue"].observe_many([t_dispatch - r.enqueued for r in batch])
            t_last = t_end if t_done is None else t_done
            self._hist["e2e"].observe_many([t_last - r.intended for r in batch])
            self._hist["inference"].observe_many(np.full(n, t_end - t_dispatch))
        if outcome != "bad_input":  # rejected samples never formed a model batch
            self.metrics.batch_size.observe(n)
        if self.batch_hook is not None:
            self.batch_hook(n, t_dispatch, t_end, outcome)
        self._count(outcome, n)
        self.last_completion = t_end if t_done is None else t_done
        self.last_progress = time.monotonic()
        with self._complete_lock:  # several model instances may complete at once
            if outcome != "bad_input":
                self._batch_counts[n] += 1
            if not self.open_loop and not self.stop_event.is_set():
                # Replace what finished, plus or minus any change of the target (set_concurrency).
                k = max(0, self._target - (self._sent - self._done - n))
                if k:
                    reqs = self._new_requests(k)
                    self._sent += k
                    self._inlet.put_many(reqs)
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
