"""The in-process model as a target: a PyTorch callable on a device, run on its own threads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from soakd.allocator import CpuFaults, FaultRates
from soakd.errors import ModelLoadError
from soakd.targets.base import WarmupResult
from soakd.targets.staging import StagingBuffers
from soakd.targets.workers import WorkerThreads

log = logging.getLogger("soakd.target")
T = TypeVar("T")


def thread_budget(instances: int, cores: int) -> int:
    """Intra-op threads per model instance: the cores shared out, not K instances each claiming
    all of them (K OpenMP teams of ``cores`` threads would oversubscribe the host)."""
    return max(1, cores // max(1, instances))


@dataclass(frozen=True)
class OfflineProbe:
    """The model alone, as ``measure_offline`` timed it on the model threads."""

    rps: float  # requests per second over all instances (0 when a call failed)
    faults: FaultRates | None  # the process's page faults per call (None: no call succeeded)


class LocalModelTarget:
    """``fn`` on ``device``, called by ``instances`` worker threads (Triton's instance group).

    Each worker sets its own intra-op thread count (its share of ``cpu_threads``, default: what
    torch would use now) before its first call: under OpenMP ``torch.set_num_threads`` is per
    calling thread and every thread that runs a parallel op keeps a team of its own, so the
    setting must be made on the thread that runs the model (docs/model-threads.md).
    """

    stages = ("queue", "inference")
    batches: Literal[True] = True

    def __init__(
        self,
        fn: Callable[[torch.Tensor], Any],
        device: torch.device,
        *,
        spec: str = "",
        instances: int = 1,
        cpu_threads: int | None = None,
    ) -> None:
        self.fn = fn
        self.device = device
        self.spec = spec
        self.workers = max(1, instances)
        self._cuda = device.type == "cuda"
        budget = torch.get_num_threads() if cpu_threads is None else cpu_threads
        self.threads_per_worker = thread_budget(self.workers, budget)
        per = self.threads_per_worker
        self._threads = WorkerThreads(self.workers, "soakd-model", lambda i: torch.set_num_threads(per))
        # One set of reused batch buffers per worker: a buffer is refilled only by its own thread,
        # after that thread's previous call returned (targets/staging.py).
        self._staging = [StagingBuffers(device) for _ in range(self.workers)]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._threads.start()

    def serve(self, loop: Callable[[int], None]) -> None:
        self._threads.serve(_in_inference_mode(loop))

    def dead(self) -> BaseException | None:
        return self._threads.died

    def join(self, timeout: float) -> bool:
        return self._threads.join(timeout)

    def close(self) -> None:
        self._threads.close()

    # ------------------------------------------------------------------ calls (on worker threads)

    def assemble(self, worker: int, tensors: Sequence[torch.Tensor], pad: bool) -> torch.Tensor:
        """A batch from requests' tensors, in worker ``worker``'s reused buffer (on the device),
        right-padded with 0 to the longest sequence when ``pad``; not a fresh tensor per batch."""
        staging = self._staging[worker]
        return staging.collate(tensors) if pad else staging.stack(tensors)

    def hold_pool(self, inputs: Sequence[Any]) -> None:
        """The request source's pooled inputs, before serving: what ``assemble`` makes of each
        is made once (staging.py). Not while the workers assemble."""
        for staging in self._staging:
            staging.hold_pool(inputs)

    def run_batch(self, x: torch.Tensor) -> Any:
        """One call of the model on ``x``, already on its device: assemble's batches are, and
        warm-up and the probe move theirs once (a per-call ``.to`` is a dispatch of a few us, and
        the model's own offline loop keeps its input on the device too). Called on the worker
        threads only, inside the ``inference_mode`` their job entered (``_in_inference_mode``)."""
        out = self.fn(x)
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return out

    def warm_up(self, inputs: Sequence[torch.Tensor], runs: int, max_batch: int, stop: threading.Event) -> WarmupResult:
        """``runs`` calls on every worker, cycling the inputs at batch 1 and ``max_batch``.

        A model that fails every call is a setup error (ModelLoadError: exit 2, with its own
        message and the shape it was given); one that fails now and then is warmed up anyway and
        its failures are counted."""
        batches = [b.to(self.device) for b in _warmup_batches(inputs, max_batch)]
        t0 = time.perf_counter()

        def one(worker: int) -> WarmupResult:
            res = WarmupResult()
            last: tuple[BaseException, tuple[int, ...]] | None = None
            for k in range(max(runs, 1)):
                if stop.is_set():
                    res.stopped = True
                    break
                x = batches[k % len(batches)]
                start = time.perf_counter()
                try:
                    self.run_batch(x)
                except BaseException as exc:  # SystemExit from user code too: counted, not fatal
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    res.failures += 1
                    kind = type(exc).__name__
                    res.failure_kinds[kind] = res.failure_kinds.get(kind, 0) + 1
                    if last is None:  # the first failure: batch 1, the plainest case to read
                        last = (exc, tuple(x.shape))
                res.calls += 1
                if k == 0:
                    res.first_seconds = time.perf_counter() - start
            if res.calls and res.failures == res.calls and last is not None:
                error, shape = last
                raise ModelLoadError(
                    f"{self.spec or 'the model'} failed all {res.calls} warm-up calls; given input shape "
                    f"{'x'.join(map(str, shape[1:]))} at batch {shape[0]} it raised {type(error).__name__}: "
                    f"{_one_line(error)} (check --input-shapes / input.shapes)"
                )
            return res

        results = self._threads.call_all(_in_inference_mode(one))
        total = WarmupResult(
            first_seconds=results[0].first_seconds,
            total_seconds=time.perf_counter() - t0,
            calls=sum(r.calls for r in results),
            failures=sum(r.failures for r in results),
            stopped=any(r.stopped for r in results),
        )
        for r in results:
            for kind, n in r.failure_kinds.items():
                total.failure_kinds[kind] = total.failure_kinds.get(kind, 0) + n
        if total.failures:
            log.warning(
                "warm-up: %d of %d calls failed (%s); the model is flaky, the soak goes on",
                total.failures,
                total.calls,
                ", ".join(f"{k} x{n}" for k, n in total.failure_kinds.items()),
            )
        return total

    def measure_offline(self, x: torch.Tensor, seconds: float, max_calls: int, stop: threading.Event) -> OfflineProbe:
        """The model alone at this batch: every worker calls it back to back on the same input for
        ``seconds`` or ``max_calls`` calls, whichever comes first (a test model that changes its
        behaviour after N calls sees a bounded number). The process's page faults and kernel time
        over the probe come with it (soakd's other threads are idle then; the intra-op threads
        count): a CPU model whose allocations come back from the kernel on every call is bound by
        the allocator, which no harness setting changes (docs/model-threads.md)."""
        batch = x.shape[0]
        x = x.to(self.device)

        def probe(worker: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            calls = 0
            while not stop.is_set():
                try:
                    self.run_batch(x)
                except Exception:
                    return 0.0, 0
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds or calls >= max_calls:
                    return calls * batch / elapsed, calls
            return 0.0, 0

        before = CpuFaults.now()
        results = self._threads.call_all(_in_inference_mode(probe))
        after = CpuFaults.now()
        rps, calls = float(sum(r[0] for r in results)), sum(r[1] for r in results)
        if calls == 0 or rps == 0:
            return OfflineProbe(rps, None)
        return OfflineProbe(rps, before.per_call(after, calls))


def _in_inference_mode(job: Callable[[int], T]) -> Callable[[int], T]:
    """``job`` run inside ``torch.inference_mode()`` on its worker thread, entered once for the
    whole job rather than around each call: after a call of a few milliseconds the context
    manager's Python runs on cold caches, and entering it per call took 1.4% of an eager model's
    time at batch 1 (py-spy, docs/model-threads.md), where a model's own offline loop enters it
    once. Batch buffers are made outside it (targets/staging.py)."""

    def run(worker: int) -> T:
        with torch.inference_mode():
            return job(worker)

    return run


def _warmup_batches(inputs: Sequence[torch.Tensor], max_batch: int) -> list[torch.Tensor]:
    """Each input at batch 1, then each at ``max_batch``; made once and reused, as a server would."""
    ones = [t.unsqueeze(0).contiguous() for t in inputs]
    fulls = [t.unsqueeze(0).expand(max_batch, *t.shape).contiguous() for t in inputs] if max_batch > 1 else []
    return ones + fulls


def _one_line(exc: BaseException) -> str:
    """The model's own words in one line. TorchScript wraps them under a first line of its own
    ("The following operation failed in the TorchScript interpreter.") and a traceback: the
    last line is the model's error."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    scripted = lines[0].startswith("The following operation failed in the TorchScript interpreter")
    return (lines[-1] if scripted else lines[0])[:300]
