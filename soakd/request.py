"""One request as it moves through the pipeline, with the times that become its stage latencies."""

from __future__ import annotations

from typing import Any, Protocol


class Request:
    """Times are ``time.perf_counter()`` seconds.

    ``intended`` is when the arrival process meant to send it; latency counts from there, so a
    stall delays (and shows up in) every request scheduled behind it. ``key`` groups requests
    that can share a batch (their input shape).
    """

    __slots__ = ("enqueued", "intended", "key", "payload", "pre_s", "sent", "tensor")

    def __init__(self, intended: float, sent: float, key: Any, tensor: Any, payload: Any = None) -> None:
        self.intended = intended
        self.sent = sent
        self.key = key
        self.tensor = tensor
        self.payload = payload
        self.enqueued = sent
        self.pre_s = 0.0


class Inlet(Protocol):
    """Where the engine (or its preprocess pool) hands requests on: the batcher, or a request
    target that takes them one by one."""

    def put(self, req: Request) -> None: ...

    def put_many(self, reqs: list[Request]) -> None: ...
