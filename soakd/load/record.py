"""``--record-requests FILE``: soakd's own request log, JSON lines that ``--replay`` reads back.

The first line names the format (``{"soakd_request_log": 1, ...}``); then one line per finished
request: ``t`` (its intended send time, seconds from the soak's start), its size (``in``: input
tokens or sequence length, ``out``: max_tokens, ``shape``: the tensor's shape, ``bytes``: a
body's length), its ``outcome`` and, for a request that got an answer (ok or timeout), ``e2e_ms``:
its latency from the intended send time, the value the e2e histogram counted (so percentiles of
the raw log can be checked against the histograms'). Lines go in completion order; the reader
sorts them (:data:`soakd.workload.traces.SOAKD_SORT_WINDOW`).

Off the request path: completing threads append one small tuple each to a bounded deque (no
formatting, no I/O); the ``soakd-record`` thread formats and writes. A writer that falls behind
loses records (counted, never blocking a request), and the file stops growing at
``output.record_max_bytes`` (said in the log once).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from soakd.errors import ConfigError
from soakd.request import Request
from soakd.tensors import is_tensor
from soakd.workload.prompts import Prompt
from soakd.workload.traces import LOG_HEADER_KEY

log = logging.getLogger("soakd")

QUEUE_MAX = 65536  # records waiting for the writer; past it they are lost (counted)
WRITE_INTERVAL = 0.2  # seconds between the writer's rounds

ANSWERED = ("ok", "timeout")  # outcomes whose latency the histograms count (errors fail fast)
Size = tuple[int | None, int | None, tuple[int, ...] | None, int | None]  # in, out, shape, bytes


def size_of(payload: Any) -> Size:
    """What the log keeps of a request's payload: cheap, on the completing thread."""
    if isinstance(payload, Prompt):
        return payload.input_tokens, payload.max_tokens, None, None
    if is_tensor(payload):
        shape = tuple(payload.shape)
        tokens = shape[0] if len(shape) == 1 and not payload.is_floating_point() else None
        return tokens, None, shape, None
    if isinstance(payload, bytes | bytearray):
        return None, None, None, len(payload)
    return None, None, None, None


class RequestRecorder:
    def __init__(self, path: str, max_bytes: int, *, api: str) -> None:
        self.path = path
        self.max_bytes = max_bytes
        try:
            self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115  (closed in close())
        except OSError as exc:
            raise ConfigError(f"output.record_requests: {path}: cannot write ({exc.strerror})") from None
        header = {LOG_HEADER_KEY: 1, "api": api, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        line = json.dumps(header) + "\n"
        self._fh.write(line)
        self.bytes = len(line)
        self.origin = 0.0  # the soak's start on the engine's clock (set by the engine)
        self.written = 0
        self.lost = 0
        self.full = False  # the size limit was reached: nothing more is written
        self._queue: deque[tuple[float, Size, str, float]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soakd-record", daemon=True)
        self._thread.start()

    def add(self, batch: Sequence[Request], outcome: str, done: float) -> None:
        """On the request path: one append per request (deque.append is atomic), nothing else.
        ``done``: when the batch completed (the engine's clock), for the latency."""
        if self.full or len(self._queue) >= QUEUE_MAX:
            self.lost += len(batch)
            return
        append = self._queue.append
        for r in batch:
            append((r.intended, size_of(r.tensor), outcome, done))

    def _run(self) -> None:
        while not self._stop.wait(WRITE_INTERVAL):
            self._write()
        self._write()

    def _write(self) -> None:
        q, lines = self._queue, list[str]()
        size = self.bytes
        while q and not self.full:
            intended, (n_in, n_out, shape, n_bytes), outcome, done = q.popleft()
            row: dict[str, Any] = {"t": round(intended - self.origin, 6), "in": n_in, "out": n_out}
            if shape is not None:
                row["shape"] = list(shape)
            if n_bytes is not None:
                row["bytes"] = n_bytes
            row["outcome"] = outcome
            if outcome in ANSWERED:
                row["e2e_ms"] = round((done - intended) * 1e3, 4)
            line = json.dumps(row, separators=(",", ":")) + "\n"
            if size + len(line) > self.max_bytes:
                self.full = True
                self.lost += 1 + len(q)
                q.clear()
                log.warning(
                    "output.record_requests: %s reached output.record_max_bytes (%d bytes) after %d requests: "
                    "recording stopped, the soak goes on",
                    self.path,
                    self.max_bytes,
                    self.written + len(lines),
                )
                break
            size += len(line)
            lines.append(line)
        if lines:
            try:
                self._fh.write("".join(lines))
                self._fh.flush()
            except OSError as exc:  # a full disk: stop recording, not the soak
                self.full = True
                log.error("output.record_requests: %s: cannot write (%s): recording stopped", self.path, exc)
                return
            self.bytes = size
            self.written += len(lines)

    def close(self) -> dict[str, Any]:
        """Write what is queued, close the file; the summary's ``record_requests`` block."""
        self._stop.set()
        self._thread.join()
        self._fh.close()
        lost = f", {self.lost} not recorded" if self.lost else ""
        log.info("request log %s: %d requests, %d bytes%s", self.path, self.written, self.bytes, lost)
        return {
            "path": self.path,
            "requests": self.written,
            "bytes": self.bytes,
            "lost": self.lost,
            "stopped_at_limit": self.full,
        }
