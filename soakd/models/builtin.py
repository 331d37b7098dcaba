"""Builtin models: the demo ConvNet, a no-op that measures the harness, and test doubles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from soakd.models.boxes import Detector
from soakd.models.leaky import FragmentCuda, LeakCuda, LeakHost
from soakd.models.seeded import seed_weights


class ConvNet(nn.Module):
    """The seed article's example: conv 3->64, ReLU, global pool, linear to 10 classes."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Flatten(),
            nn.Linear(64, num_classes),
        )
        seed_weights(self)  # the same weights every run: a stable fingerprint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


class Noop(nn.Module):
    """Returns its input: what is left of a run's cost is the harness itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Sleep(nn.Module):
    """Sleeps ``batch_ms`` + ``item_ms`` per item; every ``stall_every``-th batch also stalls
    ``stall_ms``. A stand-in for a model with a known cost and known hiccups."""

    def __init__(self, batch_ms: float = 1.0, item_ms: float = 0.0, stall_every: int = 0, stall_ms: float = 0.0):
        super().__init__()
        self.batch_s = batch_ms / 1e3
        self.item_s = item_ms / 1e3
        self.stall_every = stall_every
        self.stall_s = stall_ms / 1e3
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        delay = self.batch_s + self.item_s * x.shape[0]
        if self.stall_every and self.calls % self.stall_every == 0:
            delay += self.stall_s
        if delay > 0:
            time.sleep(delay)
        return x.mean(dim=tuple(range(1, x.dim()))) if x.dim() > 1 else x


class Flaky(nn.Module):
    """After ``after`` good calls (the warmup runs), raises RuntimeError on every
    ``error_every``-th call and torch.OutOfMemoryError on every ``oom_every``-th (0: never);
    otherwise returns its input. A test double for faults."""

    def __init__(self, error_every: int = 7, oom_every: int = 11, after: int = 50) -> None:
        super().__init__()
        self.error_every = error_every
        self.oom_every = oom_every
        self.after = after
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= self.after:
            return x
        if self.oom_every and self.calls % self.oom_every == 0:
            raise torch.OutOfMemoryError(f"CUDA out of memory (builtin:flaky, call {self.calls})")
        if self.error_every and self.calls % self.error_every == 0:
            raise RuntimeError(f"builtin:flaky failed on purpose (call {self.calls})")
        return x


class Hang(nn.Module):
    """Answers ``after`` calls (warmup included), then blocks forever: a wedged kernel or driver
    call, for the watchdog's tests. The wait releases the GIL, as a stuck CUDA call does."""

    def __init__(self, after: int = 100) -> None:
        super().__init__()
        self.after = after
        self.calls = 0
        self._never = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after:
            self._never.wait()
        return x


BUILTINS: dict[str, Callable[..., nn.Module]] = {
    "flaky": Flaky,
    "hang": Hang,
    "convnet": ConvNet,
    "noop": Noop,
    "sleep": Sleep,
    "detector": Detector,  # output needs NMS: exercises input.postprocess = detect
    "leak_host": LeakHost,  # leak tests and demos (soakd/models/leaky.py)
    "leak_cuda": LeakCuda,
    "fragment_cuda": FragmentCuda,
}
