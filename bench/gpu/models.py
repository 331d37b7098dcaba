"""Models for bench/gpu/check.py, loaded by ``soakd run`` as ``python:bench.gpu.models:FACTORY``.

* ``planted_oom``: the builtin ConvNet that, every ``every``-th call after ``after``, asks the
  caching allocator for ``factor`` times the device's memory: a real cudaMalloc failure, so
  torch frees its cache, retries, raises ``torch.OutOfMemoryError`` and counts ``num_ooms``.
* ``fixture_recorder``: the builtin ConvNet that records the allocator's ``memory_stats()`` and
  the NVML answers inside a real ``soakd run`` at three moments (before the first inference,
  after the warm-up, under load), and a ``memory_snapshot()`` under load (issue #18, step 3).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

from bench.gpu import record as gpu_record
from soakd.models.builtin import ConvNet


class PlantedOom(nn.Module):
    def __init__(self, every: int = 25, after: int = 20, factor: float = 2.0) -> None:
        super().__init__()
        self.net = ConvNet()
        self.every, self.after, self.factor = every, after, factor
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.is_cuda and self.calls > self.after and self.calls % self.every == 0:
            total = torch.cuda.get_device_properties(x.device).total_memory
            torch.empty(int(total * self.factor), dtype=torch.uint8, device=x.device)  # raises
        return self.net(x)  # type: ignore[no-any-return]


def planted_oom(every: int = 25, after: int = 20, factor: float = 2.0) -> nn.Module:
    return PlantedOom(every, after, factor)


class FixtureRecorder(nn.Module):
    def __init__(self, out: str, warmup: int, load_after_s: float = 3.0) -> None:
        super().__init__()
        self.net = ConvNet()
        self.out = Path(out)
        self.warmup, self.load_after_s = warmup, load_after_s
        self.calls = 0
        self.warm_at: float | None = None
        self.recorded: set[str] = set()

    def _record(self, moment: str, device: torch.device) -> None:
        torch.cuda.synchronize(device)
        stats = dict(torch.cuda.memory_stats(device))
        gpu_record.write_json(self.out / gpu_record.STATS_AT[moment], stats)
        self.recorded.add(moment)
        if moment != "load":
            return
        try:
            snap = torch.cuda.memory_snapshot(include_traces=False)  # type: ignore[no-untyped-call,unused-ignore]
        except TypeError:  # torch < 2.11 (include_traces arrived in 2.11)
            snap = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call,unused-ignore]
        gpu_record.write_json(self.out / gpu_record.SNAPSHOT, gpu_record.snapshot_segments(snap))
        import pynvml

        pynvml.nvmlInit()
        try:
            answers = gpu_record.record_nvml(pynvml, os.getpid())
        finally:
            pynvml.nvmlShutdown()
        answers["_recorded"] = {
            "moment": "under load, inside soakd run, in the model's forward()",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "torch_device_name": torch.cuda.get_device_name(device),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        gpu_record.write_json(self.out / gpu_record.NVML, answers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.is_cuda and self.calls == 1:
            self._record("idle", x.device)  # model loaded, nothing run yet
        y: torch.Tensor = self.net(x)
        if x.is_cuda and self.calls == self.warmup:
            self._record("warm", x.device)
            self.warm_at = time.monotonic()
        elif (
            x.is_cuda
            and self.warm_at is not None
            and "load" not in self.recorded
            and time.monotonic() - self.warm_at >= self.load_after_s
        ):
            self._record("load", x.device)  # this batch's input and output still held
        return y


def fixture_recorder(out: str, warmup: int, load_after_s: float = 3.0) -> nn.Module:
    return FixtureRecorder(out, warmup, load_after_s)
