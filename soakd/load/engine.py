"""The engine: draws requests, batches them, hands each batch to the target, times each stage.

Threads: the target's workers run the model loop (batcher -> target -> completion); the
executor decides how load arrives (closed loop: completions resend; open loop: its own
arrivals thread). Completion bookkeeping (``_done``, closed-loop resending) takes one short
lock per batch; the open-loop sender alone writes ``_sent``. With real samples
(``load/stages.py``) a preprocess pool sits before the batcher and one postprocess thread after
the target; that thread then does the completing in the worker's place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from soakd.config import Config
from soakd.load.batcher import Batcher
from soakd.load.executors import Executor, executor_for
from soakd.load.record import RequestRecorder
from soakd.load.replay import replay_executor
from soakd.load.stages import BAD_INPUT_KEY, PostprocessThread, PreprocessPool
from soakd.request import Inlet, Request
from soakd.targets.base import AnyTarget, RequestTarget
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.histogram import HistSnapshot
from soakd.workload.sources import RequestSource

if TYPE_CHECKING:  # torch is imported where a model runs in process: a served target needs none
    import torch

log = logging.getLogger("soakd.engine")


@dataclass
class EngineStats:
    """A consistent read of the engine's state for status lines, /status and the summary."""

    elapsed: float
    completed: dict[str, int]
    stages: dict[str, HistSnapshot]
    lag: HistSnapshot
    inflight: int
    queued: int
    model_seconds: float = 0.0  # inside the target's run_batch, summed over workers
    overhead_seconds: float = 0.0  # the workers' own per-batch work around it (collate, completion)
    batches: int = 0  # model batches formed (soakd_batch_size_count)


def _is_oom(exc: BaseException) -> bool:
    import torch  # in-process only: a served target's soak never loads torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


class Engine:
    def __init__(
        self,
        target: AnyTarget,
        source: RequestSource,
        cfg: Config,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.source = source
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        # A replayed trace is an open loop of its own (load/replay.py); else the rate or concurrency.
        self.executor: Executor = (
            executor_for(cfg.load) if cfg.load.replay is None else replay_executor(cfg.load, source)
        )
        self.recorder: RequestRecorder | None = None  # --record-requests: one append per request
        self.batcher = Batcher(cfg.batcher.max_batch_size, cfg.batcher.max_queue_delay_ms / 1e3)
        self.stop_event = threading.Event()  # no new requests
        self._leave = False  # worker loops: leave now (a plain flag: read once per batch)
        self._sent = 0  # written by the sending thread only (closed loop: under _complete_lock)
        self._done = 0  # written under _complete_lock (workers, or the postprocess thread)
        self._complete_lock = threading.Lock()
        self._hist = {s: metrics.request_duration.labels(s) for s in ("e2e", "queue", "inference")}
        self._lag = metrics.schedule_lag.labels("")
        # Read at scrape time: set on completions only, these gauges stood still while a stopped
        # server let requests pile up, the moment they are for. No cost per request either.
        metrics.inflight.set_function(lambda: self.inflight)
        metrics.queue_depth.set_function(lambda: len(self.batcher))
        self._count = metrics.requests.add  # by outcome: the one count, /metrics and the summary alike
        self._errors_logged: set[str] = set()
        # Per worker: seconds inside the target, seconds of the loop's own work around it.
        workers = target.workers if target.batches else 1
        self._model_s = [0.0] * workers
        self._overhead_s = [0.0] * workers
        self.started_at = 0.0
        self.last_completion = 0.0
        self.last_progress = time.monotonic()  # for the watchdog: the last batch that finished
        # Optional per-batch hook (size, dispatch time, end time, outcome), e.g. OTLP batch spans;
        # None when unused so the hot path pays one comparison.
        self.batch_hook: Callable[[int, float, float, str], None] | None = None
        self._init_request_path()

    # ------------------------------------------------------------------ request path

    def _init_request_path(self) -> None:
        """Preprocess pool, padding and postprocess thread, each None when unused: the synthetic
        path (pre-made tensors, no postprocess) pays one attribute test per batch for them."""
        inp = self.cfg.input
        # Where new requests go: the batcher, or straight to a target whose server batches.
        self._inlet: Inlet = self.batcher if self.target.batches else _Submit(self.target)
        if self.target.batches:
            self.target.hold_pool(self.source.pooled())
        self.preprocess_pool: PreprocessPool | None = None
        self.postprocess: PostprocessThread | None = None
        self._shapes_seen: set[tuple[int, ...]] = set()
        self._keys_seen: set[object] = set()  # unpadded batch keys whose shape is counted
        self._pad = inp.pad
        if self.source.preprocess is not None:
            self._hist["preprocess"] = self.metrics.request_duration.labels("preprocess")
            self.preprocess_pool = PreprocessPool(
                inp.preprocess_workers,
                self.source.preprocess,
                self._inlet,
                self._hist["preprocess"],
                self.metrics.preprocess_busy,
                self.clock,
                bad_log=self.source.bad_log,  # the source's: named once per run
            )
            self._inlet = self.preprocess_pool
        post = inp.postprocess
        if post == "auto":
            post = "auto" if self.preprocess_pool is not None else "none"  # auto: with real samples only
        if post != "none":
            from soakd.workload.postprocess import postprocessor  # torch's: in-process outputs only

            self._hist["postprocess"] = self.metrics.request_duration.labels("postprocess")
            self.postprocess = PostprocessThread(
                postprocessor(post),
                self._complete,
                self._hist["postprocess"],
                on_error=self._log_error_once,
                clock=self.clock,
            )

    def _see_shape(self, x: torch.Tensor) -> None:
        shape = x.shape[1:]  # a torch.Size: a tuple, hashed and compared as one
        if shape not in self._shapes_seen:  # new shapes drive allocator growth: count them
            self._shapes_seen.add(tuple(shape))
            self.metrics.distinct_shapes.set(len(self._shapes_seen))

    def _see_key(self, key: object, x: torch.Tensor) -> None:
        """A batch whose key is new (or any padded batch): count its shape. Unpadded, a key stands
        for one row shape (the batcher groups by it), so the model loop looks at ``x.shape``,
        which builds a torch.Size, only here. Padded batches share one key."""
        self._see_shape(x)
        if not self._pad:
            self._keys_seen.add(key)

    @property
    def shapes_seen(self) -> int:
        return len(self._shapes_seen)

    # ------------------------------------------------------------------ load control (phases)

    @property
    def open_loop(self) -> bool:
        return self.executor.open_loop

    def set_concurrency(self, n: int) -> None:
        self.executor.set_load(n)

    def set_rate(self, rps: float) -> None:
        self.executor.set_load(rps)

    @property
    def target_load(self) -> float:
        return self.executor.target_load

    # ------------------------------------------------------------------ lifecycle

    @property
    def exhausted(self) -> bool:
        """The arrivals ended on their own (a trace replayed once): the run ends with them."""
        return self.executor.exhausted

    def start(self) -> None:
        self.started_at = self.last_completion = self.clock()
        if self.recorder is not None:
            self.recorder.origin = self.started_at
        for stage in (self.preprocess_pool, self.postprocess):
            if stage is not None:
                stage.start()
        if self.target.batches:
            self.target.start()
            self.target.serve(self._model_loop)
        else:
            self.target.start(self._request_done)
        self.executor.start(self)

    def stop(self, drain_timeout: float | None = None) -> bool:
        """Stop sending, let in-flight requests finish (up to ``drain_timeout``); True if drained.
        What is still queued then never reached the model: it is counted as dropped."""
        timeout = self.cfg.load.drain_timeout if drain_timeout is None else drain_timeout
        self.stop_event.set()
        self.executor.stop()
        self.batcher.close()
        deadline = time.monotonic() + timeout
        while self.inflight > 0 and time.monotonic() < deadline:
            if self.target.dead() is not None:
                break
            time.sleep(0.005)
        drained = self.inflight == 0
        self._leave = True
        self.target.join(max(0.0, deadline - time.monotonic()) + 0.5)
        for stage in (self.preprocess_pool, self.postprocess):
            if stage is not None:
                stage.close()
        left = len(self.batcher.drain()) if not drained else 0
        if left:
            self._count("dropped", left)
            with self._complete_lock:
                self._done += left
        return drained

    @property
    def inflight(self) -> int:
        return self._sent - self._done

    # ------------------------------------------------------------------ sending (the executor's Sender)

    def make(self, intended: float, now: float) -> Request:
        key, tensor = self.source.next()
        return Request(intended, now, key, tensor)

    def send(self, reqs: list[Request]) -> None:
        self._sent += len(reqs)
        if len(reqs) == 1:
            self._inlet.put(reqs[0])
        else:
            self._inlet.put_many(reqs)

    def observe_lag(self, lags: list[float], dropped: int) -> None:
        if lags:
            self._lag.observe_many(lags)
        if dropped:
            self._count("dropped", dropped)

    def reject(self, n: int) -> None:
        if n:
            self._count("bad_input", n)

    # ------------------------------------------------------------------ worker loop

    def _request_done(self, req: Request, t_sent: float, t_end: float, outcome: str) -> None:
        """A request target finished one request: its wait for a connection is the queue stage."""
        self._complete([req], t_sent, t_end, outcome)

    def _model_loop(self, worker: int) -> None:
        timeout = self.cfg.batcher.inference_timeout
        target = self.target
        if not target.batches:  # a request target runs no batch loop (see _request_done)
            return
        import torch  # in-process only: a served target's soak never loads torch

        pad, post, clock = self.cfg.input.pad, self.postprocess, self.clock
        keys_seen = self._keys_seen
        model_s, overhead_s = self._model_s, self._overhead_s
        cuda_oom_reset = self.cfg.batcher.empty_cache_on_oom and torch.cuda.is_available()
        while not self._leave:
            batch = self.batcher.take(0.05)
            if not batch:
                continue
            t_dispatch = clock()
            if batch[0].key is BAD_INPUT_KEY:  # samples that failed preprocessing: no model call
                if post is not None:
                    post.put(batch, None, t_dispatch, t_dispatch, "bad_input")
                else:
                    self._complete(batch, t_dispatch, t_dispatch, "bad_input")
                continue
            outcome = "ok"
            out = None
            t_call = t_dispatch
            try:
                x = target.assemble(worker, [batch[0].tensor] if len(batch) == 1 else [r.tensor for r in batch], pad)
                if pad or batch[0].key not in keys_seen:
                    self._see_key(batch[0].key, x)
                t_call = clock()
                out = target.run_batch(x)
            except BaseException as exc:  # user code, SystemExit included: the soak goes on, counted
                if isinstance(exc, KeyboardInterrupt):
                    raise
                outcome = "oom" if _is_oom(exc) else "error"
                self._log_error_once(exc)
                if outcome == "oom" and cuda_oom_reset:
                    torch.cuda.empty_cache()  # hand cached blocks back so the next batch can fit
            t_end = clock()
            if outcome == "ok" and timeout is not None and t_end - t_dispatch > timeout:
                outcome = "timeout"
            if post is not None:  # it completes the batch once the responses are encoded
                post.put(batch, out, t_dispatch, t_end, outcome)
            else:
                self._complete(batch, t_dispatch, t_end, outcome)
            out = None  # do not hold the output (device memory) while the next batch runs
            t_next = clock()
            model_s[worker] += t_end - t_call
            overhead_s[worker] += (t_call - t_dispatch) + (t_next - t_end)

    def _complete(
        self, batch: list[Request], t_dispatch: float, t_end: float, outcome: str, t_done: float | None = None
    ) -> None:
        """``t_end``: inference ended; ``t_done``: postprocess ended (e2e runs until then)."""
        n = len(batch)
        # Latency is recorded for requests that got an answer (ok, or too late); errors fail fast
        # and would flatter the percentiles.
        if outcome in ("ok", "timeout"):
            hist = self._hist
            t_last = t_end if t_done is None else t_done
            if n == 1:  # batch 1, where soakd's cost per request is largest against the model's: no lists
                r = batch[0]
                hist["queue"].observe(t_dispatch - r.enqueued)
                hist["e2e"].observe(t_last - r.intended)
                hist["inference"].observe(t_end - t_dispatch)
            else:
                hist["queue"].observe_many([t_dispatch - r.enqueued for r in batch])
                hist["e2e"].observe_many([t_last - r.intended for r in batch])
                hist["inference"].observe_n(t_end - t_dispatch, n)
        if self.batch_hook is not None:
            self.batch_hook(n, t_dispatch, t_end, outcome)
        if self.recorder is not None:
            self.recorder.add(batch, outcome, t_end if t_done is None else t_done)
        self._count(outcome, n)
        self.last_completion = t_end if t_done is None else t_done
        self.last_progress = time.monotonic()
        with self._complete_lock:  # several workers may complete at once
            if self.target.batches and outcome != "bad_input":  # rejected samples formed no model batch
                self.metrics.batch_size.count(n)
            # Closed loop: what finished, plus or minus a new target (once stopped, nothing: the
            # executor keeps its own flag, so no Event is read here per batch).
            self.executor.replace(self, n)
            self._done += n

    def _log_error_once(self, exc: BaseException) -> None:
        kind = type(exc).__name__
        if kind not in self._errors_logged:
            self._errors_logged.add(kind)
            log.error("model raised %s: %s (further %s errors are counted, not logged)", kind, exc, kind)

    # ------------------------------------------------------------------ reading

    def stats(self) -> EngineStats:
        counts = self.metrics.requests.counts()
        end = self.last_completion if self.stop_event.is_set() else self.clock()
        return EngineStats(
            elapsed=max(1e-9, end - self.started_at),
            completed=counts,
            stages={s: h.snapshot() for s, h in self._hist.items()},
            lag=self._lag.snapshot(),
            inflight=self.inflight,
            queued=len(self.batcher),
            model_seconds=sum(self._model_s),
            overhead_seconds=sum(self._overhead_s),
            batches=self.metrics.batch_size.total(),
        )

    def batch_size_summary(self) -> dict[str, float]:
        by_size = self.metrics.batch_size.by_size()
        total = sum(by_size.values())
        if total == 0:
            return {"batches": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
        counts = np.zeros(max(by_size) + 1, dtype=np.int64)
        for size, n in by_size.items():
            counts[size] = n
        sizes = np.arange(len(counts))
        cum = np.cumsum(counts)
        return {
            "batches": total,
            "mean": float((sizes * counts).sum() / total),
            "p50": float(np.searchsorted(cum, 0.5 * total)),
            "p99": float(np.searchsorted(cum, 0.99 * total)),
            "max": float(sizes[counts > 0].max()),
        }


class _Submit:
    """The inlet of a target whose server batches: requests go straight to its client."""

    def __init__(self, target: RequestTarget) -> None:
        self._target = target

    def put(self, req: Request) -> None:
        self._target.submit([req])

    def put_many(self, reqs: list[Request]) -> None:
        self._target.submit(reqs)
