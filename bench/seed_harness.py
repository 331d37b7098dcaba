"""The seed article's LocalInferenceBenchmarker, kept as written (modulo formatting), as the baseline.

It measures closed loop only, on one pre-made tensor, without queue or pre/post stages, and keeps
every sample in a list. soakd's benchmarks run it side by side on the same model.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


class LocalInferenceBenchmarker:
    def __init__(
        self,
        model_fn: Callable[[torch.Tensor], Any],
        input_shape: tuple[int, ...],
        warmup_runs: int = 50,
        device: str = "cuda",
    ) -> None:
        self.model_fn = model_fn
        self.input_shape = input_shape
        self.warmup_runs = warmup_runs
        self.device = device
        self.dummy_input = torch.randn(*self.input_shape).to(self.device)

    def _do_warmup(self) -> None:
        with torch.no_grad():
            for _ in range(self.warmup_runs):
                _ = self.model_fn(self.dummy_input)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def run_stress_test(
        self, concurrency_levels: list[int], requests_per_thread: int = 100
    ) -> dict[int, dict[str, float]]:
        self._do_warmup()
        results = {}
        for concurrency in concurrency_levels:
            latency_records: list[float] = []
            threads = []
            q: queue.Queue[torch.Tensor] = queue.Queue()
            total_requests = concurrency * requests_per_thread
            for _ in range(total_requests):
                q.put(self.dummy_input)

            def worker() -> None:
                while not q.empty():
                    try:
                        inp = q.get_nowait()
                    except queue.Empty:
                        break
                    start_t = time.perf_counter()
                    with torch.no_grad():
                        _ = self.model_fn(inp)
                    if self.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    end_t = time.perf_counter()
                    latency_records.append((end_t - start_t) * 1000.0)
                    q.task_done()

            start_wall_time = time.perf_counter()
            for _ in range(concurrency):
                t = threading.Thread(target=worker)
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            total_wall_time = time.perf_counter() - start_wall_time
            latencies = np.array(latency_records)
            results[concurrency] = {
                "qps": round(total_requests / total_wall_time, 2),
                "mean_ms": round(float(np.mean(latencies)), 2),
                "p50_ms": round(float(np.percentile(latencies, 50)), 2),
                "p99_ms": round(float(np.percentile(latencies, 99)), 2),
                "max_ms": round(float(np.max(latencies)), 2),
            }
        return results
