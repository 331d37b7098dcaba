"""The target protocol, the way httpx's client sees a transport: the engine hands it batches on
the target's own worker threads and never knows what is behind it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from soakd.request import Request


@dataclass
class WarmupResult:
    """What warm-up showed: the cold-start figures and the calls that failed (a flaky model)."""

    first_seconds: float = 0.0  # the first call alone: lazy init, kernel selection, allocator growth
    total_seconds: float = 0.0
    calls: int = 0
    failures: int = 0
    failure_kinds: dict[str, int] = field(default_factory=dict)
    stopped: bool = False  # a stop request (SIGTERM) ended it early

    def cold_start(self, runs: int) -> dict[str, Any]:
        """The summary's cold-start figures of this warm-up (after the model's load or the
        target's connect time, which the caller puts first)."""
        out: dict[str, Any] = {
            "first_inference_seconds": round(self.first_seconds, 4),
            "warmup_seconds": round(self.total_seconds, 4),
            "warmup_runs": runs,
        }
        if self.failures:
            out["warmup_failures"] = self.failures
        return out


# A request target reports each finished request: (request, sent, finished, outcome); times on the
# engine's perf_counter clock. ``sent`` is when it left the client (after waiting for a connection).
Done = Callable[[Request, float, float, str], None]


class Target(Protocol):
    """Warm up, run batches, close. ``workers`` threads belong to the target: every call into the
    model (warm-up, inference, the offline probe) happens on them, never on the caller's thread.
    soakd batches for it (``batches`` True): the engine's batcher feeds ``serve``'s loop."""

    spec: str
    workers: int

    @property
    def batches(self) -> Literal[True]: ...

    def start(self) -> None:
        """Start the worker threads (idempotent)."""

    def warm_up(self, inputs: Sequence[Any], runs: int, max_batch: int, stop: threading.Event) -> WarmupResult:
        """Run ``runs`` calls per worker outside measurement; raise ModelLoadError if every call failed."""

    def serve(self, loop: Callable[[int], None]) -> None:
        """Run ``loop(worker_index)`` on every worker thread until it returns."""

    def hold_pool(self, inputs: Sequence[Any]) -> None:
        """Inputs the request source hands out again and again: make what a batch needs of each
        once, before ``serve``."""

    def assemble(self, worker: int, tensors: Sequence[Any], pad: bool) -> Any:
        """The batch worker ``worker`` hands to ``run_batch``, from the requests' inputs."""

    def run_batch(self, batch: Any) -> Any:
        """One batch through the model, on the calling worker thread; the result is the model's output."""

    def dead(self) -> BaseException | None:
        """The error that ended a worker thread, if one ended while it should still run."""

    def join(self, timeout: float) -> bool:
        """Wait for the served loops to return; True when all did."""

    def close(self) -> None:
        """Release the workers and what the model holds."""


class RequestTarget(Protocol):
    """A served model: the server batches, so the engine hands over requests one by one
    (``submit``, thread-safe and non-blocking) and the target reports each when it finishes.
    Its client's wait for a connection is the request's ``queue`` stage."""

    spec: str

    @property
    def batches(self) -> Literal[False]: ...

    def start(self, done: Done) -> None:
        """Open the client; from now on every submitted request ends in one ``done`` call."""

    def submit(self, reqs: Sequence[Request]) -> None: ...

    def dead(self) -> BaseException | None:
        """The error that ended the client's thread, if it ended while it should still run."""

    def join(self, timeout: float) -> bool:
        """Wait until no submitted request is left unfinished; True when none is."""

    def close(self) -> None: ...


AnyTarget = Target | RequestTarget
